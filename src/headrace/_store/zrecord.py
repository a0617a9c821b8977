"""Reads loaderx 2.8.19 "zrecord" containers in place (no conversion, no loaderx install).

A container is one typed stream of records in a directory (``docs/migration-loaderx.md`` has the
layout; it was reverse-engineered from files loaderx 2.8.19 writes):

* ``meta.zr``: a 4 KiB header (record count N, schema JSON length, number of data shards, codec
  tag, the byte size of every ``data_<k>.zr``, the schema JSON at 0x808) followed by N 16-byte
  locations ``(u64 offset, u32 physical length, u32 logical length)``;
* ``data_<k>.zr``: record i is in shard ``i % data_shards`` at its offset;
* ``dict.zr``: the zstd dictionary of a ``zstd_dict`` container.

Dense records are ``item_shape`` arrays; a ragged record is ``ndim`` u32 dimensions followed by
its values. Every location is checked once, vectorized, when the container opens, so a gather
only indexes. A container is opened under a shared ``flock`` of its directory, as loaderx does: a
loaderx writer still creating it (exclusive lock) makes opening fail instead of reading a
half-written container.
"""

from __future__ import annotations

import fcntl
import json
import math
import mmap
import os
from typing import Any

import numpy as np

from headrace._base.errors import (
    CorruptionError,
    FormatVersionError,
    NotAStoreError,
    WriterBusyError,
)
from headrace._store.codecs import Codec, get_codec
from headrace._store.reader import Ragged, record_ids

__all__ = ["CODEC_TAGS", "LOC_DTYPE", "ZrecordContainer", "is_container"]

META_NAME = "meta.zr"
DICT_NAME = "dict.zr"
HEADER_BYTES = 0x1000
SCHEMA_AT = 0x808
MAX_SCHEMA_BYTES = 2040
MAX_SHARDS = 255
CODEC_TAGS = {0: "raw", 1: "zstd", 2: "zstd_dict"}
LOC_DTYPE = np.dtype([("offset", "<u8"), ("physical", "<u4"), ("logical", "<u4")])
assert LOC_DTYPE.itemsize == 16

# records larger than this are copied one by one (a byte index array would cost 8x their size)
_VECTOR_MAX_MEAN = 4096


def is_container(path: Any) -> bool:
    """True when ``path`` is a directory holding a ``meta.zr``."""
    try:
        text = os.fspath(path)
    except TypeError:
        return False
    return isinstance(text, str) and os.path.isfile(os.path.join(text, META_NAME))


def shard_name(k: int) -> str:
    return f"data_{k}.zr"


def _dtype(name: Any, where: str) -> np.dtype:
    if not isinstance(name, str):
        raise CorruptionError(f"{where}: the schema's dtype {name!r} is not a dtype name")
    try:
        dt = np.dtype(name)
    except TypeError:
        try:  # bfloat16, float8_*: loaderx takes them from ml_dtypes
            import ml_dtypes

            dt = np.dtype(getattr(ml_dtypes, name))
        except (ImportError, AttributeError, TypeError):
            raise CorruptionError(
                f"{where}: dtype {name!r} is unknown here; if it is an ml_dtypes type "
                "(bfloat16, float8_*), pip install ml-dtypes") from None
    if dt.hasobject or dt.itemsize == 0:
        raise CorruptionError(f"{where}: dtype {name!r} cannot hold records")
    return dt


def _map(path: str, size: int) -> np.ndarray:
    if size == 0:
        return np.empty(0, np.uint8)
    with open(path, "rb") as f:
        have = os.fstat(f.fileno()).st_size
        if have < size:
            raise CorruptionError(f"{path} holds {have} bytes but meta.zr says {size}; the "
                                  "container is truncated: rebuild it")
        arr = np.frombuffer(mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ), np.uint8)
    arr.flags.writeable = False
    return arr


def concat_ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Positions ``starts[j] .. starts[j] + lengths[j] - 1`` for every j, back to back (int64)."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    ends = np.cumsum(lengths)
    shift = np.repeat(starts.astype(np.int64) - (ends - lengths), lengths)
    return shift + np.arange(total, dtype=np.int64)


class ZrecordContainer:
    """One loaderx 2.8.19 container opened read-only.

    Attributes:
        path: the container directory.
        kind: ``"dense"`` or ``"ragged"``.
        dtype: element dtype.
        item_shape: dense records' shape (``None`` for ragged).
        ndim: ragged records' rank (``len(item_shape)`` for dense).
        codec: ``raw``, ``zstd`` or ``zstd_dict``.
        data_shards: number of ``data_<k>.zr`` files.
        dictionary: the zstd dictionary (``zstd_dict`` only).

    Raises:
        NotAStoreError: no ``meta.zr`` at ``path``.
        WriterBusyError: a loaderx writer is still creating the container (it holds the lock).
        FormatVersionError: a codec tag this reader does not know.
        CorruptionError: a header, schema or location that does not fit the files.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        meta_path = os.path.join(self.path, META_NAME)
        if not os.path.isfile(meta_path):
            raise NotAStoreError(f"{self.path} is not a loaderx zrecord container: it has no "
                                 f"{META_NAME}")
        self._lock_fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                raise WriterBusyError(f"{self.path} is locked by a loaderx writer that is still "
                                 "creating it; open it after the writer's close()") from None
            self._open(meta_path)
        except BaseException:
            self.close()
            raise

    def _open(self, meta_path: str) -> None:
        where = self.path
        size = os.path.getsize(meta_path)
        if size < HEADER_BYTES:
            raise CorruptionError(f"{meta_path} is {size} bytes, shorter than the "
                                  f"{HEADER_BYTES}-byte header; the container is damaged")
        with open(meta_path, "rb") as f:
            head = f.read(HEADER_BYTES)
        n = int.from_bytes(head[0:8], "little")
        schema_len = int.from_bytes(head[8:10], "little")
        shards, tag = head[10], head[11]
        if tag not in CODEC_TAGS:
            raise FormatVersionError(f"{where}: codec tag {tag} is not one of loaderx 2.8.19's "
                                     f"{CODEC_TAGS}; this container needs a newer reader")
        if not 1 <= shards <= MAX_SHARDS or not 0 < schema_len <= MAX_SCHEMA_BYTES:
            raise CorruptionError(f"{meta_path}: data_shards={shards}, schema length "
                                  f"{schema_len}: not a valid zrecord header")
        self.length = n
        self.data_shards = shards
        self.codec = CODEC_TAGS[tag]
        self._sizes = np.frombuffer(head, "<u8", MAX_SHARDS, 0x10).astype(np.int64)
        try:
            schema = json.loads(head[SCHEMA_AT:SCHEMA_AT + schema_len])
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CorruptionError(f"{meta_path}: the schema is not JSON ({e})") from e
        if isinstance(schema, dict) and set(schema) == {"dtype", "item_shape"}:
            self.kind = "dense"
            shape = schema["item_shape"]
            if not isinstance(shape, list) or not all(
                    isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
                raise CorruptionError(f"{meta_path}: item_shape {shape!r} is not a shape")
            self.item_shape: tuple[int, ...] | None = tuple(shape)
            self.ndim = len(shape)
        elif isinstance(schema, dict) and set(schema) == {"dtype", "ndim"}:
            self.kind = "ragged"
            self.item_shape = None
            ndim = schema["ndim"]
            if not isinstance(ndim, int) or isinstance(ndim, bool) or not 1 <= ndim <= 64:
                raise CorruptionError(f"{meta_path}: ndim {ndim!r} is not between 1 and 64")
            self.ndim = ndim
        else:
            raise CorruptionError(f"{meta_path}: schema {schema!r} is neither dense "
                                  "(dtype, item_shape) nor ragged (dtype, ndim)")
        self.dtype = _dtype(schema["dtype"], meta_path)
        want = HEADER_BYTES + 16 * n
        if size < want:
            raise CorruptionError(f"{meta_path} holds {size} bytes, too few for {n} record "
                                  f"locations ({want}); the container is truncated: rebuild it")
        self.locs = _map(meta_path, want)[HEADER_BYTES:].view(LOC_DTYPE)
        self.shards = [_map(os.path.join(self.path, shard_name(k)), int(self._sizes[k]))
                       for k in range(shards)]
        self.dictionary: bytes | None = None
        if self.codec == "zstd_dict":
            try:
                with open(os.path.join(self.path, DICT_NAME), "rb") as f:
                    self.dictionary = f.read()
            except FileNotFoundError:
                raise CorruptionError(f"{where} uses codec zstd_dict but has no {DICT_NAME}; "
                                      "the container is damaged") from None
        try:
            self._codec: Codec = get_codec(self.codec, self.dictionary)
        except ValueError as e:  # zstandard rejects a damaged dictionary
            raise CorruptionError(f"{where}: {DICT_NAME} is not a zstd dictionary ({e})") from e
        self._check_locations()

    def _check_locations(self) -> None:
        n, where = self.length, self.path
        off = self.locs["offset"].astype(np.int64)
        phys = self.locs["physical"].astype(np.int64)
        logical = self.locs["logical"].astype(np.int64)
        self._shard = (np.arange(n, dtype=np.int64) % self.data_shards).astype(np.int64)
        bad = np.flatnonzero(off + phys > self._sizes[self._shard])
        if not len(bad) and self.codec == "raw":
            bad = np.flatnonzero(phys != logical)
        if self.kind == "dense":
            assert self.item_shape is not None
            self.row_bytes = int(self.dtype.itemsize * math.prod(self.item_shape))
            if not len(bad):
                bad = np.flatnonzero(logical != self.row_bytes)
        else:
            head = 4 * self.ndim
            if not len(bad):
                bad = np.flatnonzero((logical < head) | ((logical - head) % self.dtype.itemsize != 0))
        if len(bad):
            i = int(bad[0])
            raise CorruptionError(
                f"{where}: record {i}'s location (shard {int(self._shard[i])}, offset "
                f"{int(off[i])}, stored {int(phys[i])} / decoded {int(logical[i])} bytes) does not "
                f"fit the {self.kind} schema or the shard files; the container is damaged: rebuild it")
        self._off, self._phys, self._logical = off, phys, logical
        # raw dense: a shard whose offsets are whole rows reads as a 2-D array (one take per shard)
        self._rows: list[np.ndarray] | None = None
        if self.kind == "dense" and self.codec == "raw" and self.row_bytes > 0 and (
                not n or not (off % self.row_bytes).any()):
            self._rows = [s[:len(s) // self.row_bytes * self.row_bytes].reshape(-1, self.row_bytes)
                          for s in self.shards]
            self._row_of = off // self.row_bytes

    # -- reading -------------------------------------------------------------------------------

    def __len__(self) -> int:
        return self.length

    def nbytes(self, ids: np.ndarray) -> int:
        """Decoded bytes of records ``ids`` (the headers of ragged records excluded)."""
        idx = record_ids(ids, self.length)
        if self.kind == "dense":
            return len(idx) * self.row_bytes
        return int(self._logical[idx].sum()) - 4 * self.ndim * len(idx)

    def decoded(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The decoded bytes of records ``idx`` back to back, and each record's start in them."""
        logical = self._logical[idx]
        starts = np.zeros(len(idx) + 1, np.int64)
        np.cumsum(logical, out=starts[1:])
        if self.codec == "raw":
            return self._copy(idx, self._off[idx], logical, starts), starts
        out = np.empty(int(starts[-1]), np.uint8)
        frames = [self.shards[s][o:o + p] for s, o, p in zip(
            self._shard[idx].tolist(), self._off[idx].tolist(), self._phys[idx].tolist(),
            strict=True)]
        view = memoryview(out)  # type: ignore[arg-type]
        try:
            assert self._codec.decode_many is not None
            got = self._codec.decode_many(frames, logical.astype(np.uint64)) if frames else []
            for s, m, dec in zip(starts.tolist(), logical.tolist(), got, strict=False):
                view[s:s + m] = dec
        except Exception as e:
            for j, frame in enumerate(frames):  # name the first record that does not decode
                try:
                    dec = self._codec.decode(frame, int(logical[j]))
                    ok = len(dec) == int(logical[j])
                except Exception:
                    ok = False
                if not ok:
                    raise CorruptionError(
                        f"{self.path}: record {int(idx[j])} does not decode with {self.codec} "
                        f"to its {int(logical[j])} bytes; the container is damaged") from e
            raise
        return out, starts

    def _copy(self, idx: np.ndarray, off: np.ndarray, lengths: np.ndarray,
              starts: np.ndarray) -> np.ndarray:
        """Raw bytes ``shard[off:off+len]`` of every record, back to back."""
        out = np.empty(int(starts[-1]), np.uint8)
        if not len(idx):
            return out
        shard = self._shard[idx]
        if int(lengths.sum()) <= _VECTOR_MAX_MEAN * len(idx):
            for k in np.unique(shard).tolist():
                sel = np.flatnonzero(shard == k) if self.data_shards > 1 else slice(None)
                out[concat_ranges(starts[:-1][sel], lengths[sel])] = \
                    self.shards[k][concat_ranges(off[sel], lengths[sel])]
            return out
        view = memoryview(out)  # type: ignore[arg-type]
        for k, o, m, s in zip(shard.tolist(), off.tolist(), lengths.tolist(),
                              starts.tolist(), strict=False):
            view[s:s + m] = self.shards[k][o:o + m]
        return out

    def dense(self, ids: Any) -> np.ndarray:
        """Records ``ids`` of a dense container as one ``(len(ids), *item_shape)`` array."""
        assert self.item_shape is not None
        idx = record_ids(ids, self.length)
        shape = (len(idx), *self.item_shape)
        if self._rows is not None:
            shard = self._shard[idx]
            rows = self._row_of[idx]
            if self.data_shards == 1:
                got = self._rows[0].take(rows, axis=0)
            else:
                got = np.empty((len(idx), self.row_bytes), np.uint8)
                for k in np.unique(shard).tolist():
                    sel = np.flatnonzero(shard == k)
                    got[sel] = self._rows[k].take(rows[sel], axis=0)
            return got.view(self.dtype).reshape(shape)
        if self.row_bytes == 0:
            return np.zeros(shape, self.dtype)
        buf, _starts = self.decoded(idx)
        return buf.view(self.dtype).reshape(shape)

    def ragged(self, ids: Any) -> tuple[Ragged, np.ndarray]:
        """Records ``ids`` of a ragged container: flat values (``Ragged``) and their shapes.

        Returns:
            ``(Ragged(values, offsets), shapes)``: record j's values are
            ``values[offsets[j]:offsets[j+1]]`` in C order, ``shapes[j]`` its dimensions
            (uint32, ``(len(ids), ndim)``).
        """
        idx = record_ids(ids, self.length)
        head = 4 * self.ndim
        isz = self.dtype.itemsize
        n = len(idx)
        if self.codec == "raw":
            off = self._off[idx]
            vlen = self._logical[idx] - head
            hstarts = np.arange(n + 1, dtype=np.int64) * head
            shapes = self._copy(idx, off, np.full(n, head, np.int64), hstarts)
            vstarts = np.zeros(n + 1, np.int64)
            np.cumsum(vlen, out=vstarts[1:])
            values = self._copy(idx, off + head, vlen, vstarts)
        else:
            buf, starts = self.decoded(idx)
            shapes = buf[concat_ranges(starts[:-1], np.full(n, head, np.int64))]
            vlen = np.diff(starts) - head
            vstarts = np.zeros(n + 1, np.int64)
            np.cumsum(vlen, out=vstarts[1:])
            values = buf[concat_ranges(starts[:-1] + head, vlen)]
        dims = shapes.view("<u4").reshape(n, self.ndim)
        counts = np.prod(dims.astype(np.int64), axis=1) if n else np.zeros(0, np.int64)
        bad = np.flatnonzero(counts * isz != vlen)
        if len(bad):
            j = int(bad[0])
            raise CorruptionError(
                f"{self.path}: record {int(idx[j])} has shape {dims[j].tolist()} but "
                f"{int(vlen[j])} bytes of {self.dtype} values; the container is damaged")
        return Ragged(values.view(self.dtype), vstarts // isz), dims

    def record(self, i: int) -> np.ndarray:
        """Record ``i`` as an array of its own shape."""
        if self.kind == "dense":
            return self.dense(np.array([i], np.int64))[0]
        values, dims = self.ragged(np.array([i], np.int64))
        return values.values.reshape(tuple(int(d) for d in dims[0]))

    def close(self) -> None:
        """Releases the lock and the mappings (idempotent; arrays returned earlier stay valid)."""
        fd, self._lock_fd = getattr(self, "_lock_fd", -1), -1
        if fd >= 0:
            os.close(fd)  # drops the flock
        self.shards = []
        self._rows = None

    def __enter__(self) -> ZrecordContainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        geo = f"item_shape={self.item_shape}" if self.kind == "dense" else f"ndim={self.ndim}"
        return (f"ZrecordContainer({self.path!r}, {self.kind}, {self.length} records, "
                f"dtype={self.dtype}, {geo}, codec={self.codec!r}, data_shards={self.data_shards})")
