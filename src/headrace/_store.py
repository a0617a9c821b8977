"""``Store``: the read-only view of a committed store, read through mmaps.

A ``Store`` maps every index, aux and chunk file of the commit it loaded (``open`` or ``refresh``),
so it keeps working when a writer later commits: appends only add bytes past what is mapped, and a
commit that rewrites records switches ``meta.json`` to new index files and unlinks the old ones,
which stay valid for as long as they are mapped. Readers never lock.

Thread-safety: ``gather``/``record``/``views``/``nbytes`` may be called from many threads; each call
works on one immutable ``_State`` snapshot, and ``refresh`` swaps the snapshot atomically. The
verification bitmap is shared; a lost bit under a race only means a record is verified twice.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import google_crc32c
import numpy as np

from headrace import _format
from headrace._codecs import Codec, get_codec
from headrace._errors import (
    ConfigError,
    CorruptionError,
    RecordIndexError,
    SchemaError,
    WriterClosedError,
)
from headrace._format import AUX_DTYPE, INDEX_DTYPE, FieldSpec, Meta

__all__ = ["Ragged", "Store", "open"]

VerifyMode = Literal["first", "always", "never"]
_VERIFY_MODES = ("first", "always", "never")
_MAP_RETRIES = 20
_EMPTY = np.empty(0, np.uint8)
_EMPTY.flags.writeable = False  # a concurrent commit may unlink files between reading meta.json and mapping them


builtin_open = open  # this module defines its own open()


class Ragged(NamedTuple):
    """A batch of variable-length records: record ``i`` is ``values[offsets[i]:offsets[i+1]]``.

    Attributes:
        values: all records' elements back to back, 1-D, in the field's dtype.
        offsets: int64 element offsets, ``len(records) + 1`` of them, starting at 0.
    """

    values: np.ndarray
    offsets: np.ndarray

    def __len__(self) -> int:  # number of records, not the tuple's 2
        return len(self.offsets) - 1

    def __getitem__(self, i: Any) -> Any:
        """Record ``i`` as a 1-D array (a view of ``values``); ``r[0:2]`` works on the tuple."""
        if isinstance(i, int | np.integer):
            n = len(self)
            j = int(i) + n if i < 0 else int(i)
            if not 0 <= j < n:
                raise IndexError(f"record {i} out of range for a Ragged of {n} records")
            return self.values[self.offsets[j]:self.offsets[j + 1]]
        return tuple.__getitem__(self, i)

    def __iter__(self) -> Any:  # keep tuple unpacking: values, offsets = r
        return tuple.__iter__(self)

    def to_list(self) -> list[np.ndarray]:
        """The records as a list of 1-D arrays (views of ``values``)."""
        o = self.offsets.tolist()
        return [self.values[o[j]:o[j + 1]] for j in range(len(o) - 1)]


def _map_file(path: str, size: int, missing: list[str] | None = None) -> np.ndarray:
    """Read-only uint8 view of the first ``size`` bytes (fewer if the file is shorter).

    A missing file maps as empty (and is listed in ``missing``): the damage then surfaces as a
    ``CorruptionError`` naming the records that need it, and the rest of the store stays readable.
    """
    try:
        f = builtin_open(path, "rb")
    except FileNotFoundError:
        if missing is None:
            raise
        missing.append(path)
        return np.empty(0, np.uint8)
    with f:
        avail = min(size, os.fstat(f.fileno()).st_size)
        if avail <= 0:
            arr = np.empty(0, np.uint8)
        else:
            arr = np.frombuffer(mmap.mmap(f.fileno(), avail, access=mmap.ACCESS_READ), np.uint8)
    arr.flags.writeable = False
    return arr


@dataclass(frozen=True)
class _Field:
    spec: FieldSpec
    fidx: int
    codec: Codec
    rec: int  # decoded bytes per record for fixed-shape fields, -1 for ragged
    index: np.ndarray  # INDEX_DTYPE, len <= N (shorter only if the index file was truncated)
    aux: np.ndarray  # AUX_DTYPE


@dataclass(frozen=True)
class _State:
    meta: Meta
    fields: dict[str, _Field]
    chunks: dict[int, np.ndarray]  # id -> uint8 view of the committed bytes actually present
    chunk_size: np.ndarray  # int64 by chunk id: usable bytes, -1 where no chunk has that id
    chunk_field: np.ndarray  # int64 by chunk id: field number, -1 where none
    rows: dict[int, np.ndarray]  # chunk id -> 2-D (rows, rec) view, fixed-shape raw fields only


def _load_state(path: str) -> _State:
    for attempt in range(_MAP_RETRIES):
        meta = _format.read_meta(path)
        missing: list[str] = []
        state = _map_state(path, meta, missing)
        # Files missing because a writer committed (and unlinked them) since we read meta.json:
        # load the newer commit. Missing with meta.json unchanged: damage, reported per record.
        if not missing or attempt == _MAP_RETRIES - 1 or _format.read_meta(path).commit == meta.commit:
            return state
    raise AssertionError("unreachable")


def _map_state(path: str, meta: Meta, missing: list[str]) -> _State:
    n = meta.length
    fields: dict[str, _Field] = {}
    for fidx, fe in enumerate(meta.fields):
        spec = fe.spec
        index = _map_file(os.path.join(path, fe.index), n * INDEX_DTYPE.itemsize, missing)
        aux = _map_file(os.path.join(path, fe.aux), n * AUX_DTYPE.itemsize, missing)
        m = min(len(index) // INDEX_DTYPE.itemsize, len(aux) // AUX_DTYPE.itemsize)
        rec = -1 if spec.shape is None else spec.record_nbytes
        fields[spec.name] = _Field(
            spec, fidx, get_codec(spec.codec), rec,
            index[: m * INDEX_DTYPE.itemsize].view(INDEX_DTYPE),
            aux[: m * AUX_DTYPE.itemsize].view(AUX_DTYPE))
    top = max((c.id for c in meta.chunks), default=-1) + 1
    chunk_size = np.full(top, -1, np.int64)
    chunk_field = np.full(top, -1, np.int64)
    chunks: dict[int, np.ndarray] = {}
    rows: dict[int, np.ndarray] = {}
    fnum = {fe.spec.name: i for i, fe in enumerate(meta.fields)}
    for c in meta.chunks:
        arr = _map_file(os.path.join(path, _format.chunk_name(c.id)), c.size, missing)
        chunks[c.id] = arr
        chunk_size[c.id] = len(arr)
        chunk_field[c.id] = fnum[c.field]
        f = fields[c.field]
        if f.rec > 0 and f.spec.codec == "raw":
            k = len(arr) // f.rec
            rows[c.id] = arr[: k * f.rec].reshape(k, f.rec)
    return _State(meta, fields, chunks, chunk_size, chunk_field, rows)


def _check_entries(st: _State, f: _Field, idx: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Vectorized consistency check of the entries of ``idx`` (all < len(f.index)).

    Returns ``(bad, chunk, offset, length, nbytes, crc)``; ``bad`` marks entries that point outside
    their chunk (or into another field's chunk) or disagree with the field's schema.
    """
    ent = f.index[idx]
    aux = f.aux[idx]
    cid = ent["chunk"].astype(np.int64)
    off = ent["offset"].astype(np.int64)
    ln = ent["length"].astype(np.int64)
    nb = aux["nbytes"].astype(np.int64)
    present = ln > 0
    top = len(st.chunk_size)
    c = np.minimum(cid, top - 1) if top else np.zeros_like(cid)
    csize = st.chunk_size[c] if top else np.full_like(cid, -1)
    bad = present & ((cid >= top) | (off < 0) | (off > csize - ln))
    if top:
        bad |= present & (st.chunk_field[c] != f.fidx)
    bad |= ~present & (nb != 0)
    if f.rec >= 0:
        bad |= present & (nb != f.rec)
        if f.spec.codec == "raw":
            bad |= present & ((ln != f.rec) | (off % max(f.rec, 1) != 0))
    else:
        bad |= (nb % f.spec.dtype.itemsize) != 0
        if f.spec.codec == "raw":
            bad |= nb != ln
    return bad, cid, off, ln, nb, aux["crc"]


def _corrupt(spec: FieldSpec, ids: np.ndarray, what: str) -> CorruptionError:
    ids_l = sorted(set(np.asarray(ids).tolist()))
    shown = ", ".join(map(str, ids_l[:10])) + (" ..." if len(ids_l) > 10 else "")
    return CorruptionError(
        f"field {spec.name!r}, record ids [{shown}]: {what}; run `headrace verify` on the store "
        "to list every damaged record, and restore them from the source data",
        field=spec.name, record_ids=ids_l)


class Store:
    """A read-only view of a store's last commit (at open or at the last ``refresh()``).

    Use ``headrace.open(path)``. ``verify`` chooses when checksums are checked: ``"first"`` (the
    first time this process reads a record: committed bytes never change), ``"always"`` or
    ``"never"``.
    """

    def __init__(self, path: str | os.PathLike[str], *, verify: VerifyMode = "first") -> None:
        if verify not in _VERIFY_MODES:
            raise ConfigError(f"verify={verify!r} is not a mode; use one of {_VERIFY_MODES}")
        self.path = os.fspath(path)
        self.verify: VerifyMode = verify
        self._state: _State | None = _load_state(self.path)
        self._verified: dict[str, np.ndarray] = {}
        self._reset_bitmaps(None)

    # -- lifecycle -------------------------------------------------------------------------------

    def _reset_bitmaps(self, old: _State | None) -> None:
        st = self._st
        nbits = (st.meta.length + 7) // 8
        keep = old is not None and old.meta.generation == st.meta.generation
        bitmaps = {}
        for name in st.fields:
            bm = np.zeros(nbits, np.uint8)
            prev = self._verified.get(name)
            if keep and prev is not None:
                k = min(len(prev), nbits)
                bm[:k] = prev[:k]
            bitmaps[name] = bm
        self._verified = bitmaps

    @property
    def _st(self) -> _State:
        st = self._state
        if st is None:
            raise WriterClosedError(f"store {self.path} is closed; open it again to read")
        return st

    def refresh(self) -> bool:
        """Loads the newest commit. Returns True if it differs from the one held before."""
        old = self._st
        new_meta = _format.read_meta(self.path)
        if new_meta.commit == old.meta.commit:
            return False
        self._state = _load_state(self.path)
        self._reset_bitmaps(old)
        return True

    def close(self) -> None:
        """Drops the mappings (idempotent). Arrays returned earlier stay valid."""
        self._state = None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:  # pickles as (path, verify): reopened on load
        return {"path": self.path, "verify": self.verify}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], verify=state["verify"])  # type: ignore[misc]

    def __repr__(self) -> str:
        if self._state is None:
            return f"Store({self.path!r}, closed)"
        return (f"Store({self.path!r}, length={len(self)}, generation={self.generation}, "
                f"fields={list(self.fields)})")

    # -- metadata --------------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._st.meta.length

    @property
    def generation(self) -> int:
        """Changes on every commit that rewrote existing records (modify, delete, compact)."""
        return self._st.meta.generation

    @property
    def commit_id(self) -> int:
        """Increments on every commit."""
        return self._st.meta.commit

    @property
    def fields(self) -> dict[str, FieldSpec]:
        return {name: f.spec for name, f in self._st.fields.items()}

    @property
    def attrs(self) -> dict[str, Any]:
        return dict(self._st.meta.attrs)

    @property
    def meta(self) -> Meta:
        """The parsed ``meta.json`` of the loaded commit."""
        return self._st.meta

    # -- reads -----------------------------------------------------------------------------------

    def _indices(self, st: _State, indices: Any) -> np.ndarray:
        idx = np.asarray(indices)
        if idx.ndim != 1:
            idx = idx.reshape(-1) if idx.ndim == 0 else idx
            if idx.ndim != 1:
                raise RecordIndexError(f"indices must be 1-D, got shape {idx.shape}")
        if idx.dtype.kind not in "iu":
            if idx.size == 0:
                return np.empty(0, np.int64)
            raise RecordIndexError(f"indices must be integers, got dtype {idx.dtype}")
        n = st.meta.length
        if idx.size:
            bad = (idx < 0) | (idx >= n)
            if bad.any():
                first = int(idx[np.argmax(bad)])
                raise RecordIndexError(
                    f"record id {first} is out of range for a store of N={n} records "
                    f"(valid ids are 0..{n - 1}); {int(bad.sum())} of {idx.size} ids are out of "
                    "range")
        return idx.astype(np.int64, copy=False)

    def _pick(self, st: _State, fields: str | Iterable[str] | None) -> list[str]:
        if fields is None:
            return list(st.fields)
        names = [fields] if isinstance(fields, str) else list(fields)
        for name in names:
            if name not in st.fields:
                raise SchemaError(f"unknown field {name!r}; this store has {list(st.fields)}")
        return names

    def _entries(self, st: _State, f: _Field, idx: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Index/aux entries of ``idx``, bounds-checked in one vectorized pass."""
        if len(f.index) < st.meta.length:
            short = idx >= len(f.index)
            if short.any():
                raise _corrupt(f.spec, idx[short], "the index or aux file is shorter than N "
                               "(truncated), so these entries are missing")
        bad, *rest = _check_entries(st, f, idx)
        if bad.any():
            raise _corrupt(f.spec, idx[bad], "index/aux entries point outside their chunk or "
                           "disagree with the field's schema (corrupted index or truncated chunk)")
        return rest[0], rest[1], rest[2], rest[3], rest[4]

    def _to_check(self, f: _Field, idx: np.ndarray) -> np.ndarray:
        """Positions in ``idx`` whose checksum must be checked now."""
        if self.verify == "never":
            return np.empty(0, np.int64)
        if self.verify == "always":
            return np.arange(len(idx))
        bm = self._verified[f.spec.name]
        seen = (bm[idx >> 3] >> (idx & 7).astype(np.uint8)) & 1
        return np.flatnonzero(seen == 0)

    def _mark(self, f: _Field, ids: np.ndarray) -> None:
        if self.verify == "first" and len(ids):
            np.bitwise_or.at(self._verified[f.spec.name], ids >> 3,
                             np.left_shift(1, ids & 7).astype(np.uint8))

    def _check_crcs(self, f: _Field, idx: np.ndarray, pos: np.ndarray, crc: np.ndarray,
                    data: list[np.ndarray]) -> None:
        got = np.fromiter((google_crc32c.value(d) for d in data), np.uint32, len(data))
        bad = got != crc[pos]
        if bad.any():
            raise _corrupt(f.spec, idx[pos[bad]], "stored bytes do not match their crc32c")
        self._mark(f, idx[pos])

    def gather(self, indices: Sequence[int] | np.ndarray,
               fields: str | Iterable[str] | None = None) -> dict[str, np.ndarray | Ragged]:
        """Reads records ``indices`` (any order, repeats allowed) of ``fields`` (default: all).

        Returns:
            ``{field: array}``: fixed-shape fields give an array of shape ``(n, *shape)`` (absent
            records are zeros); ragged fields give a ``Ragged``.

        Raises:
            RecordIndexError: an id outside ``[0, N)``.
            CorruptionError: a record's bytes or index entry are damaged (names field and ids).
        """
        st = self._st
        idx = self._indices(st, indices)
        return {name: self._gather_field(st, st.fields[name], idx)
                for name in self._pick(st, fields)}

    def _gather_field(self, st: _State, f: _Field, idx: np.ndarray) -> np.ndarray | Ragged:
        cid, off, ln, nb, crc = self._entries(st, f, idx)
        if f.rec >= 0 and f.spec.codec == "raw":
            return self._gather_fixed_raw(st, f, idx, cid, off, ln, crc)
        check = self._to_check(f, idx)
        if len(check):
            self._check_crcs(f, idx, check, crc, [
                st.chunks[c][o:o + n] if n else _EMPTY for c, o, n in zip(
                    cid[check].tolist(), off[check].tolist(), ln[check].tolist(), strict=True)])
        out: np.ndarray
        if f.rec >= 0:
            out = np.zeros((len(idx), f.rec), np.uint8)
            starts = np.arange(len(idx)) * f.rec
        else:
            starts = np.zeros(len(idx) + 1, np.int64)
            np.cumsum(nb, out=starts[1:])
            out = np.empty(int(starts[-1]), np.uint8)
        flat = out.reshape(-1)
        for j, c, o, n, m, s in zip(range(len(idx)), cid.tolist(), off.tolist(), ln.tolist(),
                                     nb.tolist(), starts.tolist(), strict=False):
            if n == 0:
                continue
            src = st.chunks[c][o:o + n]
            if f.spec.codec == "raw":
                flat[s:s + n] = src
                continue
            try:
                dec = f.codec.decode(src, m)
            except Exception as e:
                raise _corrupt(f.spec, idx[j:j + 1], f"{f.spec.codec} data does not decode "
                               f"({type(e).__name__}: {e})") from e
            if len(dec) != m:
                raise _corrupt(f.spec, idx[j:j + 1], f"decodes to {len(dec)} bytes, expected {m}")
            flat[s:s + m] = np.frombuffer(dec, np.uint8)
        if f.rec >= 0:
            return self._as_fixed(f, out)
        isz = f.spec.dtype.itemsize
        return Ragged(out.view(f.spec.dtype) if isz else np.empty(0, f.spec.dtype), starts // max(isz, 1))

    def _as_fixed(self, f: _Field, rows: np.ndarray) -> np.ndarray:
        shape = f.spec.shape or ()
        if f.rec == 0:
            return np.zeros((len(rows), *shape), f.spec.dtype)
        return rows.view(f.spec.dtype).reshape((len(rows), *shape))

    def _gather_fixed_raw(self, st: _State, f: _Field, idx: np.ndarray, cid: np.ndarray,
                          off: np.ndarray, ln: np.ndarray, crc: np.ndarray) -> np.ndarray:
        n = len(idx)
        if f.rec == 0:
            return self._as_fixed(f, np.empty((n, 0), np.uint8))
        row = off // f.rec
        present = ln > 0
        first = int(cid[0]) if n else -1
        if n and bool(present.all()) and bool((cid == first).all()):
            out = st.rows[first].take(row, axis=0)  # the common case: one vectorized take
        else:
            out = np.zeros((n, f.rec), np.uint8)
            for c in np.unique(cid[present]).tolist():
                sel = np.flatnonzero(present & (cid == c))
                out[sel] = st.rows[c].take(row[sel], axis=0)
        check = self._to_check(f, idx)
        if len(check):
            ro = out.view()
            ro.flags.writeable = False
            self._check_crcs(f, idx, check, crc, [
                ro[j] if p else ro[j, :0] for j, p in zip(check.tolist(),
                                                          present[check].tolist(), strict=True)])
        return self._as_fixed(f, out)

    def nbytes(self, indices: Sequence[int] | np.ndarray,
               fields: str | Iterable[str] | None = None) -> int:
        """Exact decoded bytes ``gather(indices, fields)`` returns (reads index/aux only)."""
        st = self._st
        idx = self._indices(st, indices)
        total = 0
        for name in self._pick(st, fields):
            f = st.fields[name]
            if f.rec >= 0:
                total += f.rec * len(idx)
            else:
                if len(f.aux) < st.meta.length and idx.size and idx.max() >= len(f.aux):
                    raise _corrupt(f.spec, idx[idx >= len(f.aux)], "the aux file is truncated")
                total += int(f.aux["nbytes"][idx].sum(dtype=np.int64))
        return total

    def record(self, i: int, field: str) -> np.ndarray:
        """One record of ``field``. Raw records are zero-copy read-only views of the mmap."""
        st = self._st
        idx = self._indices(st, [i])
        f = st.fields[self._pick(st, field)[0]]
        if f.spec.codec != "raw":
            got = self._gather_field(st, f, idx)
            return got[0]
        view = self._raw_views(st, f, idx)[0]
        if f.rec >= 0:
            if f.rec == 0 or len(view) == 0:
                return np.zeros(f.spec.shape or (), f.spec.dtype)
            return view.view(f.spec.dtype).reshape(f.spec.shape or ())
        return view.view(f.spec.dtype) if f.spec.dtype.itemsize else view

    def views(self, indices: Sequence[int] | np.ndarray, field: str) -> list[memoryview]:
        """Zero-copy memoryviews of the stored bytes of a raw field's records (absent: empty).

        For other codecs the decoded bytes are returned (a copy).
        """
        st = self._st
        idx = self._indices(st, indices)
        f = st.fields[self._pick(st, field)[0]]
        if f.spec.codec != "raw":
            got = self._gather_field(st, f, idx)
            if isinstance(got, Ragged):
                return [memoryview(a.view(np.uint8)) for a in got.to_list()]  # type: ignore[arg-type]
            rows = np.ascontiguousarray(got).reshape(len(idx), -1).view(np.uint8)
            return [memoryview(r) for r in rows]  # type: ignore[arg-type]
        return [memoryview(v) for v in self._raw_views(st, f, idx)]  # type: ignore[arg-type]

    def _raw_views(self, st: _State, f: _Field, idx: np.ndarray) -> list[np.ndarray]:
        cid, off, ln, _nb, crc = self._entries(st, f, idx)
        views = [st.chunks[c][o:o + n] if n else _EMPTY
                 for c, o, n in zip(cid.tolist(), off.tolist(), ln.tolist(), strict=True)]
        check = self._to_check(f, idx)
        if len(check):
            self._check_crcs(f, idx, check, crc, [views[j] for j in check.tolist()])
        return views


def open(path: str | os.PathLike[str], *, mode: str = "r", verify: VerifyMode = "first") -> Any:
    """Opens a store: ``mode="r"`` (default) gives a read-only ``Store``, ``mode="a"`` a ``Writer``.

    Args:
        path: the store directory.
        mode: ``"r"`` to read, ``"a"`` to append/modify/delete/compact (takes the writer lock).
        verify: for readers, when to check checksums: ``"first"`` read of each record in this
            process (default), ``"always"``, or ``"never"``.

    Raises:
        NotAStoreError, FormatVersionError, CorruptionError (meta.json damaged), WriterBusyError.
    """
    if mode == "r":
        return Store(path, verify=verify)
    if mode == "a":
        from headrace._writer import Writer
        return Writer._open_existing(os.fspath(path))
    raise ConfigError(f"mode={mode!r} is not a mode; use 'r' to read or 'a' to write")
