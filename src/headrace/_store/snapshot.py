"""One commit of a store, mapped: the files, lookup tables, entry checks and verification state.

``Store`` holds one ``Snapshot`` at a time and swaps it on ``refresh``; every read works on the
snapshot it started with. A snapshot maps every index, aux and chunk file that its ``meta.json``
names, so it keeps working after a writer commits (appends add bytes past what is mapped; rewrites
go to new files and unlink the old ones, which stay valid while mapped). ``_verify`` uses the same
entry checks as the reader.
"""

from __future__ import annotations

import mmap
import os
import stat
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from headrace._base.errors import CorruptionError
from headrace._base.fsutil import open_regular
from headrace._store import format as _format
from headrace._store.codecs import Codec, get_codec
from headrace._store.format import AUX_DTYPE, INDEX_DTYPE, FieldSpec, Meta
from headrace._store.vmap import map_concat

__all__ = ["MappedField", "Snapshot", "Verified", "check_entries", "chunk_slots", "corrupt",
           "fetch", "load_snapshot", "row_slots"]

_MAP_RETRIES = 20  # a concurrent commit may unlink files between reading meta.json and mapping them
NOPOS = np.zeros(0, np.int64)
_BIT = np.left_shift(1, np.arange(8)).astype(np.uint8)

try:  # one C call per batch for the bitmap (the NumPy passes below give the same results)
    from headrace._store._crcrows import mark as _c_mark
    from headrace._store._crcrows import unset as _c_unset
except ImportError:
    _c_mark = _c_unset = None
try:  # the layout scan in one pass (``_scan_layout``'s NumPy blocks give the same result)
    from headrace._store._layout import scan as _c_scan
except ImportError:
    _c_scan = None


class Verified:
    """Which records this process has verified (entry + crc), per field: a bitmap of N/8 bytes.

    Committed index entries and chunk bytes never change within a generation, so a record checked
    once stays good. A per-field count of verified records makes the steady state (everything
    verified, e.g. from the second epoch on) cost nothing per gather.
    """

    def __init__(self, names: Iterable[str], n: int, old: Verified | None = None) -> None:
        self.n = n
        self._lock = threading.Lock()
        nbytes = (n + 7) // 8
        self.bits: dict[str, np.ndarray] = {}
        self.count: dict[str, int] = {}
        self.reads: dict[str, int] = {}  # records read while unverified ones remained (``read``)
        for name in names:
            bm = np.zeros(nbytes, np.uint8)
            count = 0
            prev = old.bits.get(name) if old is not None else None
            if prev is not None and old is not None:  # same generation, more records: keep
                k = min(len(prev), nbytes)
                bm[:k] = prev[:k]
                count = old.count[name] if k == len(prev) else int(np.unpackbits(bm).sum())
            self.bits[name] = bm
            self.count[name] = count

    def read(self, name: str, count: int) -> bool:
        """Counts ``count`` records of ``name`` read while some were unverified; True once as
        many were read as the field holds (the reader then verifies in spans)."""
        got = self.reads.get(name, 0) + count  # a race only delays the switch by one batch
        self.reads[name] = got
        return got >= self.n

    def todo(self, name: str, idx: np.ndarray) -> np.ndarray:
        """Positions in ``idx`` whose records are not verified yet."""
        if self.count[name] >= self.n:
            return NOPOS
        if _c_unset is not None and idx.dtype == np.int64 and idx.flags.c_contiguous:
            return np.frombuffer(_c_unset(self.bits[name], idx), np.int64)
        done = self.bits[name].take(idx >> 3) & _BIT.take(idx & 7)
        return np.flatnonzero(done == 0)

    def add(self, name: str, count: int) -> None:
        """Counts ``count`` records of ``name`` whose bits a caller set itself (atomically, as
        ``crc_rows.take_checked`` does)."""
        if count:
            with self._lock:
                self.count[name] += count

    def mark(self, name: str, ids: np.ndarray) -> None:
        """Records ``ids`` passed their checks."""
        if not len(ids):
            return
        with self._lock:  # the count must not double-count records marked by two threads
            bm = self.bits[name]
            if _c_mark is not None:  # atomic ORs, like take_checked's, which sets bits unlocked
                self.count[name] += _c_mark(bm, np.ascontiguousarray(ids, np.int64))
                return
            new = ids[(bm.take(ids >> 3) & _BIT.take(ids & 7)) == 0]
            if not len(new):
                return
            new = np.sort(new)  # a batch may hold a record twice (iid): count it once
            np.bitwise_or.at(bm, new >> 3, _BIT.take(new & 7))
            self.count[name] += int(np.count_nonzero(new[1:] != new[:-1])) + 1


def _map_file(path: str, size: int, missing: list[str] | None = None) -> np.ndarray:
    """Read-only uint8 view of the first ``size`` bytes (fewer if the file is shorter).

    A missing file, or something else in its place (a directory, a FIFO), maps as empty (and is
    listed in ``missing``): the damage then surfaces as a ``CorruptionError`` naming the records
    that need it, and the rest of the store stays readable.
    """
    try:
        fd = open_regular(path)
    except (FileNotFoundError, CorruptionError):
        if missing is None:
            raise
        missing.append(path)
        return np.empty(0, np.uint8)
    try:
        avail = min(size, os.fstat(fd).st_size)
        if avail <= 0:
            arr = np.empty(0, np.uint8)
        else:
            arr = np.frombuffer(mmap.mmap(fd, avail, access=mmap.ACCESS_READ), np.uint8)
    finally:
        os.close(fd)  # the mapping outlives the fd
    arr.flags.writeable = False
    return arr


@dataclass(frozen=True)
class MappedField:
    spec: FieldSpec
    fidx: int
    codec: Codec
    rec: int  # decoded bytes per record for fixed-shape fields, -1 for ragged
    index: np.ndarray  # INDEX_DTYPE, len <= N (shorter only if the index file was truncated)
    aux: np.ndarray  # AUX_DTYPE
    index_u4: np.ndarray  # the same bytes as (len, 4) uint32: fast to take and split
    aux_u4: np.ndarray  # (len, 2) uint32
    plain: bool = False  # uint8 records of shape (rec,): gathered rows need no view/reshape


@dataclass
class Snapshot:
    meta: Meta
    fields: dict[str, MappedField]
    chunks: dict[int, np.ndarray]  # id -> uint8 view of the committed bytes actually present
    # The per-chunk tables below are indexed by chunk id while ids are dense (what writers make);
    # when they are sparse (``chunk_ids`` is the sorted array of ids) by the id's position in
    # ``chunk_ids`` instead, so memory follows the chunks that exist, never the largest id.
    # ``chunk_slots`` turns ids into table positions either way.
    chunk_size: np.ndarray  # int64 by slot: usable bytes, -1 where no chunk has that id
    chunk_field: np.ndarray  # int64 by slot: field number, -1 where none
    rows: dict[int, np.ndarray]  # chunk id -> 2-D (rows, rec) view, fixed-shape raw fields only
    # field -> (2-D rows over ALL its chunks mapped back to back, row start by slot, every chunk
    # under 4 GiB); fixed-shape raw fields where _vmap works: a gather is then one take, whatever
    # the number of chunks
    vrows: dict[str, tuple[np.ndarray, np.ndarray, bool]]
    # field -> usable bytes by slot (-1: no such chunk, or another field's), one extra -1 at the
    # end for every id past the last chunk (or, when sparse, that names no chunk)
    limits: dict[str, np.ndarray]
    verified: Verified = field(default_factory=lambda: Verified({}, 0))
    views: dict[int, memoryview] = field(default_factory=dict)  # chunk id -> memoryview of chunks
    # field -> (first record id of each run, virtual-row shift of each run) when the field's index
    # is the plain appended layout, else None; computed once per snapshot (see sequential_layout)
    layouts: dict[str, Layout | None] = field(default_factory=dict)
    chunk_ids: np.ndarray | None = None  # sorted chunk ids when they are sparse, else None
    missing: tuple[str, ...] = ()  # files meta.json names that are missing or not regular files


def chunk_slots(st: Snapshot, cid: np.ndarray) -> np.ndarray:
    """Table positions of chunk ids ``cid``: ``len(st.chunk_size)`` for ids that name no chunk."""
    ids = st.chunk_ids
    if ids is None:
        return np.minimum(cid, len(st.chunk_size))
    pos = np.searchsorted(ids, cid)
    pos[ids.take(pos, mode="clip") != cid] = len(ids)
    return pos


def row_slots(st: Snapshot, cid: np.ndarray) -> np.ndarray:
    """``chunk_slots`` of ids already checked to name chunks (the identity while ids are dense)."""
    return cid if st.chunk_ids is None else chunk_slots(st, cid)


# A decoded record can be at most this many times its stored size, plus a constant, for a valid
# record of each codec: zstd blocks decode to <= 128 KiB from >= 4 bytes, an LZ4 length byte adds
# <= 255 bytes, deflate's best is 258 bytes from ~2 bits. A larger ``nbytes`` is corruption (never
# a reason to budget gigabytes). Codecs not listed here are not bounded.
MAX_EXPANSION = {"zstd": (32768, 1 << 17), "lz4": (256, 64), "deflate": (1040, 1024)}


# Scanning a larger index once to prove it sequential costs more than it would save.
SEQUENTIAL_SCAN_MAX_RECORDS = 1 << 24


@dataclass(frozen=True)
class Layout:
    """Where the records of an append-only fixed-shape raw field sit in its virtual rows.

    Run ``k`` covers ids ``starts[k] <= i < starts[k+1]``. ``shifts[j]`` is the shift (virtual row
    minus id) of the run that ``searchsorted(starts, i, "right") == j`` names, so ``shifts[k + 1]``
    is run ``k``'s and ``shifts[0]`` (never named) repeats ``shifts[1]``: a row lookup is then two
    array ops and no ``- 1``.
    """

    starts: np.ndarray
    shifts: np.ndarray

    @property
    def identity(self) -> bool:
        """A single run with shift 0: record i is row i (what a fresh pack makes)."""
        return len(self.starts) == 1 and int(self.shifts[1]) == 0

    def rows(self, idx: np.ndarray) -> np.ndarray:
        """Virtual rows of ids ``idx`` (checked to be ``< N``)."""
        if len(self.starts) == 1:
            shift = int(self.shifts[1])
            return idx + shift if shift else idx
        rows = self.shifts.take(np.searchsorted(self.starts, idx, side="right"), mode="clip")
        rows += idx
        return rows


def sequential_layout(st: Snapshot, name: str) -> Layout | None:
    """Whether record i of fixed-shape raw field ``name`` sits at virtual row ``i + shift``.

    That holds for a field filled by appends only (no modify/delete since the last compact): the
    records of a chunk are consecutive ids at consecutive rows, so the whole index reduces to one
    shift per chunk run, and a gather needs no random reads of the index at all (one
    ``searchsorted`` over the run starts instead). The scan also proves every entry valid (full
    length, aligned, inside its chunk's committed bytes, aux size equal to the record size), which
    is all the per-record entry check (``check_entries``) establishes: with a layout, a record's
    first read checks only its crc32c.

    Returns:
        The ``Layout``, or ``None`` when the layout is not sequential (use the index).
    """
    if name in st.layouts:
        return st.layouts[name]
    result: Layout | None = None
    f = st.fields[name]
    virtual = st.vrows.get(name)
    n = len(f.index)
    if (virtual is not None and 0 < n <= SEQUENTIAL_SCAN_MAX_RECORDS and f.rec > 0
            and n == st.meta.length and len(f.aux_u4) >= n):
        scan = _scan_layout if _c_scan is None else _scan_layout_c
        result = scan(st, f, virtual[0], virtual[1], n)
    st.layouts[name] = result
    return result


# Entries scanned at a time: temporaries of this size stay in the cache and the allocator's
# pools (whole-index temporaries cost a process's first gather tens of ms in page faults).
_SCAN_BLOCK = 1 << 15


def _scan_layout_c(st: Snapshot, f: MappedField, vrows: np.ndarray, vstart: np.ndarray,
                   n: int) -> Layout | None:
    """``_scan_layout`` in one pass of C (``_layout.c``)."""
    assert _c_scan is not None
    ids = st.chunk_ids
    got = _c_scan(np.ascontiguousarray(f.index_u4[:n]), np.ascontiguousarray(f.aux_u4[:n]),
                  f.rec, None if ids is None else np.ascontiguousarray(ids, np.int64),
                  len(st.chunk_size), np.ascontiguousarray(vstart, np.int64),
                  np.ascontiguousarray(st.limits[f.spec.name], np.int64), len(vrows))
    if got is None:
        return None
    first = np.frombuffer(got[0], np.int64)
    shifts = np.frombuffer(got[1], np.int64)
    return Layout(first, np.concatenate([shifts[:1], shifts]))


def _scan_layout(st: Snapshot, f: MappedField, vrows: np.ndarray, vstart: np.ndarray,
                 n: int) -> Layout | None:
    """``sequential_layout``'s scan, ``_SCAN_BLOCK`` entries at a time."""
    ent, aux, rec = f.index_u4, f.aux_u4, f.rec
    limits = st.limits[f.spec.name]
    starts: list[np.ndarray] = []
    runs: list[np.ndarray] = []
    prev_row = -1
    prev_shift: int | None = None
    for lo in range(0, n, _SCAN_BLOCK):
        hi = min(n, lo + _SCAN_BLOCK)
        e = ent[lo:hi]
        if not (bool((e[:, 3] == rec).all()) and bool((aux[lo:hi, 1] == rec).all())):
            return None
        off = e[:, 1].astype(np.int64)
        if e[:, 2].any():  # offsets past 4 GiB
            off |= e[:, 2].astype(np.int64) << 32
        slot = chunk_slots(st, e[:, 0].astype(np.int64))
        if not (bool((off % rec == 0).all()) and bool((slot < len(vstart)).all())
                and bool((off + rec <= limits[slot]).all())):
            return None
        start = vstart[slot]
        if not bool((start >= 0).all()):
            return None
        rows = start + off // rec
        if not (int(rows[0]) > prev_row and bool((rows[1:] > rows[:-1]).all())
                and int(rows[-1]) < len(vrows)):
            return None
        prev_row = int(rows[-1])
        shift = rows - np.arange(lo, hi, dtype=np.int64)
        cut = np.flatnonzero(shift[1:] != shift[:-1]) + 1  # a new run where the shift changes
        if prev_shift is None or int(shift[0]) != prev_shift:
            cut = np.concatenate([[0], cut])
        starts.append(cut + lo)
        runs.append(shift[cut])
        prev_shift = int(shift[-1])
    first = np.concatenate(starts).astype(np.int64)
    shifts = np.concatenate(runs).astype(np.int64)
    return Layout(first, np.concatenate([shifts[:1], shifts]))


def load_snapshot(path: str) -> Snapshot:
    for attempt in range(_MAP_RETRIES):
        meta = _format.read_meta(path)
        missing: list[str] = []
        state = _map_snapshot(path, meta, missing)
        # Files missing because a writer committed (and unlinked them) since we read meta.json:
        # load the newer commit. Missing with meta.json unchanged: damage, reported per record.
        if not missing or attempt == _MAP_RETRIES - 1 or _format.read_meta(path).commit == meta.commit:
            _check_length(path, state)
            return state
    raise AssertionError("unreachable")


def _check_length(path: str, st: Snapshot) -> None:
    """N is bounded by what the files hold: some field's index and aux must hold N entries.

    (One field's short index is reported per record; N past every field's means ``length`` in
    ``meta.json`` is damaged, and trusting it would size per-record state by a made-up number.)
    """
    n = st.meta.length
    held = max((min(len(f.index), len(f.aux)) for f in st.fields.values()), default=0)
    if n > held:
        raise CorruptionError(
            f"{os.path.join(path, _format.META_NAME)} commits {n} records, but no field's index "
            f"and aux files hold more than {held}; the store is damaged: restore it from a backup, "
            "or run `headrace verify` to see what else is affected")


def _map_snapshot(path: str, meta: Meta, missing: list[str]) -> Snapshot:
    n = meta.length
    fields: dict[str, MappedField] = {}
    for fidx, fe in enumerate(meta.fields):
        spec = fe.spec
        index = _map_file(os.path.join(path, fe.index), n * INDEX_DTYPE.itemsize, missing)
        aux = _map_file(os.path.join(path, fe.aux), n * AUX_DTYPE.itemsize, missing)
        m = min(len(index) // INDEX_DTYPE.itemsize, len(aux) // AUX_DTYPE.itemsize)
        rec = -1 if spec.shape is None else spec.record_nbytes
        ib = index[: m * INDEX_DTYPE.itemsize]
        ab = aux[: m * AUX_DTYPE.itemsize]
        fields[spec.name] = MappedField(
            spec, fidx, get_codec(spec.codec, _format.read_dict(path, fe)), rec, ib.view(INDEX_DTYPE), ab.view(AUX_DTYPE),
            ib.view("<u4").reshape(m, 4), ab.view("<u4").reshape(m, 2),
            plain=spec.dtype == np.uint8 and spec.shape == (rec,))
    ids = sorted(c.id for c in meta.chunks)
    chunk_ids: np.ndarray | None = None
    top = ids[-1] + 1 if ids else 0
    slot = {c.id: c.id for c in meta.chunks}
    if top > 2 * len(ids) + 4096:  # sparse ids: tables by position, not by id
        chunk_ids = np.array(ids, np.int64)
        top = len(ids)
        slot = {cid: k for k, cid in enumerate(ids)}
    chunk_size = np.full(top, -1, np.int64)
    chunk_field = np.full(top, -1, np.int64)
    chunks: dict[int, np.ndarray] = {}
    rows: dict[int, np.ndarray] = {}
    vrows: dict[str, tuple[np.ndarray, np.ndarray, bool]] = {}
    fnum = {fe.spec.name: i for i, fe in enumerate(meta.fields)}
    for c in meta.chunks:
        chunk_field[slot[c.id]] = fnum[c.field]
    for name, f in fields.items():
        mine = [c for c in meta.chunks if c.field == name]
        if f.rec > 0 and f.spec.codec == "raw" and mine:
            files = [(os.path.join(path, _format.chunk_name(c.id)), c.size) for c in mine]
            sizes = [_present_size(p, size, missing) for p, size in files]
            got = map_concat([(p, k) for (p, _), k in zip(files, sizes, strict=True)], f.rec)
            if got is not None:
                arr, starts = got
                vstart = np.full(top, -1, np.int64)
                for c, start, k in zip(mine, starts, sizes, strict=True):
                    chunks[c.id] = arr[start:start + k]
                    chunk_size[slot[c.id]] = k
                    vstart[slot[c.id]] = start // f.rec
                usable = len(arr) // f.rec * f.rec
                small = max(sizes) < 2**32
                vrows[name] = (arr[:usable].reshape(-1, f.rec), vstart, small)
                continue
        for c in mine:
            arr = _map_file(os.path.join(path, _format.chunk_name(c.id)), c.size, missing)
            chunks[c.id] = arr
            chunk_size[slot[c.id]] = len(arr)
            if f.rec > 0 and f.spec.codec == "raw":
                k = len(arr) // f.rec
                rows[c.id] = arr[: k * f.rec].reshape(k, f.rec)
    limits = {name: np.append(np.where(chunk_field == f.fidx, chunk_size, -1), -1)
              for name, f in fields.items()}
    held = max((min(len(f.index), len(f.aux)) for f in fields.values()), default=0)
    # (past what the files hold, N is damage that load_snapshot reports: no per-record state)
    return Snapshot(meta, fields, chunks, chunk_size, chunk_field, rows, vrows, limits,
                    Verified(fields, n) if n <= held else Verified({}, 0),
                    {cid: memoryview(a) for cid, a in chunks.items()},  # type: ignore[arg-type]
                    chunk_ids=chunk_ids, missing=tuple(missing))


def _present_size(path: str, size: int, missing: list[str]) -> int:
    """Bytes of a chunk that can be mapped: its committed size, less if the file is truncated."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        missing.append(path)
        return 0
    if not stat.S_ISREG(info.st_mode):  # a directory or FIFO in its place: damage, as missing
        missing.append(path)
        return 0
    return min(size, info.st_size)


def check_entries(st: Snapshot, f: MappedField, idx: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Vectorized consistency check of the entries of ``idx`` (all < len(f.index)).

    Returns ``(bad, chunk, offset, length, nbytes, crc)``; ``bad`` marks entries that point outside
    their chunk (or into another field's chunk) or disagree with the field's schema. Kept to a few
    whole-array operations because it runs on every gather.
    """
    cid, off, ln, nb, crc = fetch(f, idx)
    present = ln != 0
    limit = st.limits[f.spec.name][chunk_slots(st, cid)]  # -1: not this field's
    bad = present & ((off + ln > limit) | (off < 0))
    bad |= ~present & ((cid != 0) | (off != 0) | (nb != 0))  # an absent entry is all zeros
    if f.rec >= 0:
        if f.spec.codec == "raw":  # stored == decoded, whole aligned rows
            bad |= (nb != ln) | (present & (ln != f.rec)) | (off % max(f.rec, 1) != 0)
        else:
            bad |= nb != present * f.rec
    else:
        if f.spec.dtype.itemsize > 1:
            bad |= (nb % f.spec.dtype.itemsize) != 0
        if f.spec.codec == "raw":
            bad |= nb != ln
        else:
            bound = MAX_EXPANSION.get(f.spec.codec)
            if bound is not None:
                bad |= nb > ln * bound[0] + bound[1]
    return bad, cid, off, ln, nb, crc


def fetch(f: MappedField, idx: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(chunk, offset, length, nbytes, crc)`` of ``idx`` as int64 arrays (crc: uint32)."""
    ent = f.index_u4.take(idx, axis=0)  # columns: chunk, offset lo, offset hi, length
    aux = f.aux_u4.take(idx, axis=0)  # columns: crc, nbytes
    off = ent[:, 1].astype(np.int64)
    off |= ent[:, 2].astype(np.int64) << 32  # an offset >= 2**63 turns negative: caught as bad
    return (ent[:, 0].astype(np.int64), off, ent[:, 3].astype(np.int64),
            aux[:, 1].astype(np.int64), aux[:, 0])


def corrupt(spec: FieldSpec, ids: np.ndarray, what: str) -> CorruptionError:
    ids_l = sorted(set(np.asarray(ids).tolist()))
    shown = ", ".join(map(str, ids_l[:10])) + (" ..." if len(ids_l) > 10 else "")
    return CorruptionError(
        f"field {spec.name!r}, record ids [{shown}]: {what}; run `headrace verify` on the store "
        "to list every damaged record, and restore them from the source data",
        field=spec.name, record_ids=ids_l)


