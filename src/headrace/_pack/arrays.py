"""``pack_arrays``: NumPy arrays and ``.npy`` files into a new store, streamed in bounded slices.

Each keyword argument is one field. A ``.npy`` path is never loaded whole: its header is read through
``numpy.load(mmap_mode="r")`` and its rows are then read with plain ``readinto`` calls into a fresh
buffer of at most ``slice_bytes`` per append. Reading through the memory map itself would leave every
touched page resident in this process (it counts as RSS until the kernel reclaims it), so packing a
20 GB file would *look* like it needs 20 GB; ``readinto`` keeps the resident set at one slice while
the data still goes through the page cache.
"""

from __future__ import annotations

import mmap
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from headrace._base.errors import ConfigError, SchemaError, StoreExistsError
from headrace._base.fsutil import publish_dir
from headrace._base.progress import progress as _progress_bar
from headrace._base.staging import make_staging
from headrace._pack import parallel as _parallel_pack

__all__ = ["pack_arrays"]

# Upper bound of bytes read and appended per step (sum over all fields).
DEFAULT_SLICE_BYTES = 64 * 1024 * 1024

_BYTES_LIKE = (bytes, bytearray, memoryview)


@dataclass(frozen=True)
class _Source:
    """One field to pack: its schema and a way to read rows ``[start, stop)``."""

    name: str
    length: int
    dtype: np.dtype[Any]
    shape: tuple[int, ...] | None  # None = ragged
    row_bytes: int  # fixed fields: exact; ragged: mean (for slicing and the progress bar)
    array: Any = None  # in-memory ndarray, or list of 1-D arrays for ragged fields
    npy_path: str | None = None
    npy_offset: int = 0

    def spec(self, codec: str) -> dict[str, Any]:
        shape = None if self.shape is None else list(self.shape)
        return {"dtype": self.dtype.str, "shape": shape, "codec": codec}

    def read(self, start: int, stop: int) -> Any:
        if self.npy_path is None:
            return self.array[start:stop]
        assert self.shape is not None
        out = np.empty((stop - start, *self.shape), dtype=self.dtype)
        want = out.nbytes
        with open(self.npy_path, "rb", buffering=0) as f:
            f.seek(self.npy_offset + start * self.row_bytes)
            view = out.reshape(-1).view(np.uint8).data
            got = 0
            while got < want:
                n = f.readinto(view[got:])
                if not n:
                    raise SchemaError(
                        f"{self.npy_path!r} ended early: rows {start}..{stop} of field "
                        f"{self.name!r} are missing ({got} of {want} bytes read); the .npy file "
                        "is truncated, re-create it")
                got += n
        return out


def _from_memmap(name: str, mm: np.memmap, path: str, offset: int) -> _Source:
    """Streams a file-backed array with ``readinto`` when its rows are contiguous native bytes."""
    if mm.ndim == 0:
        raise SchemaError(f"field {name!r}: a 0-d array is not a field; pass shape (N, ...)")
    dtype = _native(mm.dtype)
    if mm.dtype != dtype or mm.dtype.hasobject or (mm.ndim > 1 and not mm.flags.c_contiguous):
        # Byte-swapped or Fortran-ordered: rows are not contiguous little-endian bytes, so
        # fall back to slicing the map (converted per slice; still bounded per step).
        return _fixed_source(name, mm)
    shape = tuple(int(s) for s in mm.shape[1:])
    row_bytes = int(dtype.itemsize * int(np.prod(shape, dtype=np.int64)))
    return _Source(name=name, length=int(mm.shape[0]), dtype=dtype, shape=shape,
                   row_bytes=row_bytes, npy_path=path, npy_offset=offset)


def _from_npy(name: str, path: str) -> _Source:
    try:
        mm = np.load(path, mmap_mode="r", allow_pickle=False)
    except FileNotFoundError:
        raise ConfigError(f"field {name!r}: no such .npy file {path!r}") from None
    except ValueError as e:  # object arrays cannot be memory-mapped
        raise SchemaError(
            f"field {name!r}: {path!r} cannot be streamed ({e}); object/pickled .npy files are "
            "not supported, pass the loaded array (a list of arrays or bytes) instead") from None
    if not isinstance(mm, np.memmap):
        raise ConfigError(f"field {name!r}: {path!r} is not a single-array .npy file")
    if mm.ndim == 0:
        raise SchemaError(f"field {name!r}: {path!r} holds a 0-d array; a field needs one entry "
                          "per record (shape (N, ...))")
    return _from_memmap(name, mm, path, int(mm.offset))


def _native(dtype: np.dtype[Any]) -> np.dtype[Any]:
    """The little-endian (or byte-order-free) equivalent of ``dtype``; the format stores LE."""
    return dtype.newbyteorder("<") if dtype.byteorder == ">" else dtype


def _fixed_source(name: str, array: np.ndarray) -> _Source:
    if array.ndim == 0:
        raise SchemaError(f"field {name!r}: a 0-d array is not a field; pass shape (N, ...)")
    if array.dtype.hasobject:
        return _ragged_source(name, list(array))
    dtype = _native(array.dtype)
    shape = tuple(int(s) for s in array.shape[1:])
    row_bytes = int(dtype.itemsize * int(np.prod(shape, dtype=np.int64)))

    class _Rows:
        """Slices the source and converts each slice to contiguous little-endian rows."""

        def __getitem__(self, key: slice) -> np.ndarray:
            return np.ascontiguousarray(array[key], dtype=dtype)

    return _Source(name=name, length=int(array.shape[0]), dtype=dtype, shape=shape,
                   row_bytes=row_bytes, array=_Rows())


def _ragged_source(name: str, items: Sequence[Any]) -> _Source:
    """A list of bytes or 1-D arrays: every record becomes a 1-D array of one common dtype."""
    records: list[np.ndarray] = []
    dtypes: list[np.dtype[Any]] = []
    all_bytes = True
    for i, item in enumerate(items):
        if isinstance(item, _BYTES_LIKE):
            rec = np.frombuffer(item, dtype=np.uint8)
        elif isinstance(item, str):
            raise SchemaError(f"field {name!r}, record {i}: got str; encode text to bytes "
                              "(e.g. s.encode()) to store it")
        else:
            all_bytes = False
            rec = np.asarray(item)
            if rec.ndim != 1:
                raise SchemaError(
                    f"field {name!r}, record {i}: ragged records must be 1-D, got shape "
                    f"{rec.shape}; ravel it before packing (and keep the shape in another field)")
            if rec.dtype.hasobject or rec.dtype.kind in "UMmV":
                raise SchemaError(f"field {name!r}, record {i}: dtype {rec.dtype} cannot be "
                                  "stored; use numeric arrays or bytes")
            if rec.size:
                dtypes.append(rec.dtype)
        records.append(rec)
    dtype = np.dtype(np.uint8) if all_bytes or not dtypes else _native(np.result_type(*dtypes))
    records = [r if r.dtype == dtype else r.astype(dtype) for r in records]
    total = sum(r.nbytes for r in records)
    row_bytes = max(1, total // max(1, len(records)))
    return _Source(name=name, length=len(records), dtype=dtype, shape=None,
                   row_bytes=row_bytes, array=records)


def _not_npy(name: str, path: str) -> str:
    msg = (f"field {name!r}: {path!r} is not a .npy file; pass a NumPy array or the path of a "
           ".npy file")
    if path.endswith(".bin"):  # a headerless array, as nanoGPT's train.bin: its dtype is unsaid
        msg += (f". A flat token file needs no packing: headrace.text({path!r}, dtype='uint16', "
                "seq_len=...) reads it mapped, as it is; to pack a raw array file as a field, "
                f"pass it mapped with its dtype: {name}=np.memmap({path!r}, dtype='uint16', "
                "mode='r')")
    return msg


def _source(name: str, value: Any) -> _Source:
    if isinstance(value, str | os.PathLike):
        path = os.fspath(value)
        if not path.endswith(".npy"):
            raise ConfigError(_not_npy(name, path))
        return _from_npy(name, path)
    if (isinstance(value, np.memmap) and isinstance(value.base, mmap.mmap) and value.filename
            and value.mode != "c"):  # copy-on-write maps hold changes the file does not
        # A whole memmap (e.g. np.load(..., mmap_mode="r")): read its file like a .npy path.
        return _from_memmap(name, value, str(value.filename), int(value.offset))
    if isinstance(value, np.ndarray):
        return _fixed_source(name, value)
    if isinstance(value, list | tuple):
        if any(isinstance(v, (*_BYTES_LIKE, np.ndarray, list, tuple)) for v in value):
            return _ragged_source(name, value)
        return _fixed_source(name, np.asarray(value))
    raise ConfigError(f"field {name!r}: cannot pack a {type(value).__name__}; pass a NumPy "
                      "array, a .npy path, or a list of bytes/1-D arrays")


def _codecs(codec: str | Mapping[str, str], names: Sequence[str]) -> dict[str, str]:
    if isinstance(codec, str):
        return dict.fromkeys(names, codec)
    unknown = sorted(set(codec) - set(names))
    if unknown:
        raise ConfigError(f"codec= names unknown fields {unknown}; the fields are {list(names)}")
    return {n: codec.get(n, "raw") for n in names}


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def pack_arrays(out: str | os.PathLike[str], *, codec: str | Mapping[str, str] = "raw",
                chunk_mb: int = 256, progress: bool | None = None,
                slice_bytes: int = DEFAULT_SLICE_BYTES, workers: int | None = None,
                executor: Executor | None = None, **arrays: Any) -> dict[str, Any]:
    """Packs NumPy arrays and/or ``.npy`` files into a new store at ``out``, one field per keyword.

    Example::

        headrace.pack_arrays("train", x="x.npy", y=labels, codec={"x": "zstd"})

    A 1-D array is a scalar field; ``(N, *shape)`` a fixed-shape field; a list (or object array) of
    bytes / 1-D arrays a ragged field. ``.npy`` files are streamed: memory use is bounded by
    ``slice_bytes`` (plus one chunk of compressed output), whatever the file size.

    Args:
        out: the new store's directory (must not exist, or be empty).
        codec: one codec (``raw``, ``zstd``, ``lz4``, ``deflate``, ``zstd_dict``) for every
            field, or a dict ``{field: codec}`` (fields left out are ``raw``). ``zstd_dict``
            trains a dictionary on the field's first slice and packs in this process.
        chunk_mb: the size bound of each chunk file in MiB.
        progress: show a progress bar (``None``: only when stderr is a terminal).
        slice_bytes: bytes read and appended per step, summed over the fields.
        workers: local processes packing contiguous row ranges in parallel (``None``: all cores,
            but inputs under 64 MiB per process stay in this one; ``1``: this process). With
            ``executor``: the number of tasks. ``.npy`` inputs are read by the workers; in-memory
            arrays are sliced here and sent with each task. Fields cannot be named ``workers``
            or ``executor``.
        executor: a ``concurrent.futures.Executor`` to run the tasks on (e.g. a Dask
            ``client.get_executor()``); ``out`` must be on storage its workers share. The store
            has the same records in the same order as one process's; chunk boundaries differ.
        **arrays: the fields: ``name=ndarray``, ``name="file.npy"``, or ``name=[b"..", ...]``.

    Returns:
        ``{"path", "samples", "fields", "bytes_written", "seconds"}``: ``fields`` maps each name to its
        spec (dtype, shape or ``None`` for ragged, codec); ``bytes_written`` is the store's size on
        disk.

    Raises:
        ConfigError: no fields, a bad path or value, a codec dict naming unknown fields.
        SchemaError: fields of different lengths, unsupported dtypes, unknown codec.
        StoreExistsError: ``out`` is not empty.
        PackWorkerError: a parallel task raised or its worker died (nothing is left at ``out``).
    """
    from headrace._store.writer import create

    if not arrays:
        raise ConfigError("pack_arrays() needs at least one field, e.g. "
                          "pack_arrays(out, x=array, y='labels.npy')")
    if slice_bytes <= 0:
        raise ConfigError(f"slice_bytes must be positive, got {slice_bytes}")
    _parallel_pack.check_workers(workers, executor)
    t0 = time.perf_counter()
    sources = [_source(name, value) for name, value in arrays.items()]
    lengths = {s.name: s.length for s in sources}
    if len(set(lengths.values())) > 1:
        listed = ", ".join(f"{k}={v}" for k, v in lengths.items())
        raise SchemaError(f"fields have different lengths ({listed}); every field needs exactly "
                          "one entry per record")
    n = sources[0].length
    codecs = _codecs(codec, list(lengths))
    specs = {s.name: s.spec(codecs[s.name]) for s in sources}

    out_path = Path(out)
    if out_path.exists() and (not out_path.is_dir() or any(out_path.iterdir())):
        raise StoreExistsError(f"cannot create a store at {out_path}: it exists and is not "
                               "an empty directory; pick a new path")
    row_bytes = max(1, sum(s.row_bytes for s in sources))
    rows_per_step = max(1, slice_bytes // row_bytes)
    tasks = _parallel_pack.plan_array_tasks(sources, n, row_bytes, workers=workers,
                                            executor=executor)
    if "zstd_dict" in codecs.values():  # one dictionary per field: trained by one writer
        if executor is not None:
            raise ConfigError("codec zstd_dict packs in this process (a field trains one "
                              "dictionary); drop executor= or use codec 'zstd'")
        tasks = 1
    if _parallel_pack.use_parallel(tasks, executor):
        _parallel_pack.pack_sources(os.path.abspath(out_path), sources=sources, specs=specs,
                                    chunk_mb=chunk_mb, rows_per_step=rows_per_step, tasks=tasks,
                                    workers=workers, executor=executor, progress=progress)
        return {"path": str(out_path), "samples": n, "fields": specs,
                "bytes_written": _dir_bytes(out_path), "seconds": time.perf_counter() - t0}
    # Built in a private sibling folder and published with one rename: a kill leaves nothing at
    # ``out`` (never an empty or half-written store), and two packs to the same path cannot
    # touch each other's files (the second to finish is refused, the first's store kept).
    target = os.path.abspath(out_path)
    parent = os.path.dirname(target)
    os.makedirs(parent, exist_ok=True)
    staging = make_staging(target)
    try:
        with create(staging, fields=specs, chunk_mb=chunk_mb) as writer, _progress_bar(
                n * row_bytes, desc=f"pack {out_path.name}", unit="B", enabled=progress) as bar:
            for start in range(0, n, rows_per_step):
                stop = min(n, start + rows_per_step)
                writer.append({s.name: s.read(start, stop) for s in sources})
                bar.update((stop - start) * row_bytes)
        publish_dir(staging, target, who="pack_arrays")
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return {
        "path": str(out_path),
        "samples": n,
        "fields": specs,
        "bytes_written": _dir_bytes(out_path),
        "seconds": time.perf_counter() - t0,
    }
