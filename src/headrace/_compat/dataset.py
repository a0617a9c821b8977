"""``Dataset``: loaderx's indexable dataset over a store field, a ``.npy``, a ``.b2nd`` or a zrecord.

loaderx users write ``Dataset("train_data.b2nd")`` and hand it to a loader that calls
``__getitems__(indices)`` per batch; this class keeps that spelling and adds headrace stores and
plain ``.npy`` files, so switching the data format does not change the training script.
Blosc2 is imported only when a ``.b2nd`` file is opened.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from headrace._base.errors import ConfigError, NotAStoreError, RecordIndexError
from headrace._store import lane
from headrace._store.recycle import Recycler

__all__ = ["Dataset"]

_NPY_MAGIC = b"\x93NUMPY"
_INT64 = np.dtype(np.int64)
_UINT64 = np.dtype(np.uint64)
_MAX = np.maximum.reduce


def _normalize_indices(indices: Any, n: int) -> np.ndarray:
    """Int64 record ids in ``[0, n)`` from any integer array-like (negatives count from the end)."""
    # What a loader's sampler gives: one reduction checks both ends (negatives turn huge as
    # unsigned), and in-range ids are used as they are (read only, never copied).
    if (type(indices) is np.ndarray and indices.dtype == _INT64 and indices.ndim == 1
            and (not len(indices) or int(_MAX(indices.view(_UINT64))) < n)):
        return indices
    idx = np.asarray(indices)
    if idx.ndim > 1:
        raise IndexError(f"indices must be 1-D, got shape {idx.shape}")
    idx = idx.reshape(-1)
    if idx.size == 0:
        return np.zeros(0, dtype=np.int64)
    if idx.dtype.kind not in "iu":
        raise IndexError(f"indices must be integers, got dtype {idx.dtype}")
    if idx.dtype.kind == "u":
        bad = idx >= n
        if bad.any():
            first = int(idx[bad].flat[0])
            raise RecordIndexError(f"index {first} is out of range for a dataset of {n} records")
        return idx.astype(np.int64)
    idx = idx.astype(np.int64)
    bad = (idx < -n) | (idx >= n)
    if bad.any():
        first = int(idx[bad].flat[0])
        raise RecordIndexError(f"index {first} is out of range for a dataset of {n} records")
    return np.where(idx < 0, idx + n, idx)


class _StoreBackend:
    """One field of a store, opened through the process's shared stores: the datasets of one
    store's fields (and loaders of it built later) map and checksum it once."""

    def __init__(self, path: str, field: str | None) -> None:
        from headrace._sources.shared_store import open_shared

        self.source = open_shared(path)
        self.store = self.source.store
        names = list(self.store.fields)
        if field is None:
            if len(names) != 1:
                self.source.close()
                raise ConfigError(f"store {path!r} has {len(names)} fields {names}; pick one "
                                  f"with Dataset(path, field=...)")
            field = names[0]
        elif field not in names:
            self.source.close()
            raise ConfigError(f"store {path!r} has no field {field!r}; its fields are {names}")
        self.field = field
        self._fields = (field,)  # a tuple: the store memoizes its steady read plan by it
        spec = self.store.fields[field]
        self.dtype = np.dtype(spec.dtype)
        self.item_shape = None if spec.shape is None else tuple(spec.shape)

    def __len__(self) -> int:
        return len(self.store)

    def gather(self, idx: np.ndarray) -> Any:
        return self._field_of(self.store.gather(idx, self._fields))

    def gather_start(self, idx: np.ndarray) -> Any:
        started = self.store.gather_start(idx, self._fields)
        return None if started is None else lane.Then(started, self._field_of)

    def _field_of(self, got: dict[str, Any]) -> Any:
        return got[self.field]

    def close(self) -> None:
        self.source.close()


class _ArrayBackend:
    """A ``.npy`` memmap or a Blosc2 NDArray: both index like NumPy.

    A ``.npy`` gathers as a store's fixed-shape field does: one ``take`` from the mapping (a plain
    ndarray view of it, not the ``memmap`` subclass, whose indexing wraps every result) into an
    output the program has let go of (``Recycler``), so a batch pays no fresh pages.
    """

    def __init__(self, array: Any) -> None:
        self.dtype = np.dtype(array.dtype)
        self.item_shape: tuple[int, ...] | None = tuple(int(s) for s in array.shape[1:])
        self._mapped = isinstance(array, np.ndarray)
        self.array = np.asarray(array) if self._mapped else array  # the view keeps the map
        self._recycler = Recycler()

    def __len__(self) -> int:
        return int(self.array.shape[0])

    def gather(self, idx: np.ndarray) -> Any:
        if idx.size == 0:
            assert self.item_shape is not None
            return np.empty((0, *self.item_shape), dtype=self.dtype)
        if self._mapped:
            out = self._recycler.empty((len(idx), *self.array.shape[1:]), self.dtype)
            # ids were checked against [0, N) (_normalize_indices): "clip" never clips, and
            # unlike "raise" writes straight into ``out`` with no per-index bounds check
            return self.array.take(idx, axis=0, out=out, mode="clip")
        return np.asarray(self.array[idx])

    def gather_start(self, idx: np.ndarray) -> Any:
        if not self._mapped or not idx.size:
            return None
        got = lane.take_started(self.array, idx, self._recycler.empty(
            (len(idx), *self.array.shape[1:]), self.dtype))
        return None if got is None else lane.Started(got[0], [got[1]])

    def close(self) -> None:
        self._recycler.clear()  # the arrays handed out stay valid


class _ZrecordBackend:
    """A loaderx 2.8.19 zrecord container: dense -> arrays, ragged -> ``Ragged`` (flat values)."""

    def __init__(self, path: str) -> None:
        from headrace._store.zrecord import ZrecordContainer

        self.container = ZrecordContainer(path)
        self.dtype = self.container.dtype
        self.item_shape = self.container.item_shape

    def __len__(self) -> int:
        return len(self.container)

    def gather(self, idx: np.ndarray) -> Any:
        if self.container.kind == "dense":
            return self.container.dense(idx)
        return self.container.ragged(idx)[0]

    def close(self) -> None:
        self.container.close()


def _open_npy(path: str) -> _ArrayBackend:
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as e:
        raise ConfigError(f"{path!r} cannot be memory-mapped ({e}); Dataset reads numeric .npy "
                          "files, pack object arrays with headrace.pack_arrays instead") from None
    if not isinstance(arr, np.ndarray) or arr.ndim == 0:
        raise ConfigError(f"{path!r} holds no array of shape (N, ...); Dataset needs one entry "
                          "per record")
    return _ArrayBackend(arr)


def _open_b2nd(path: str) -> _ArrayBackend:
    import blosc2  # lazy: optional dependency, never imported by `import headrace`

    try:
        arr = blosc2.open(path, mode="r")
    except Exception as e:  # blosc2 raises RuntimeError/ValueError for non-Blosc2 files
        raise ConfigError(f"{path!r} is not a readable Blosc2 .b2nd file ({e})") from None
    if not hasattr(arr, "shape") or len(arr.shape) == 0:
        raise ConfigError(f"{path!r} holds no Blosc2 NDArray of shape (N, ...)")
    return _ArrayBackend(arr)


def _is_npy(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(_NPY_MAGIC)) == _NPY_MAGIC
    except OSError:
        return False


class Dataset:
    """A loaderx-style dataset: ``len()``, ``ds[i]``, ``ds[a:b]``, ``ds.__getitems__(indices)``.

    Example::

        images = headrace.Dataset("train", field="image")   # a headrace store
        labels = headrace.Dataset("train_label.b2nd")        # loaderx's Blosc2 files still work
        batch = images.__getitems__([5, 3, 3, 17])            # fancy gather, order kept

    Args:
        path: a headrace store directory, a ``.npy`` file (memory-mapped), a Blosc2 ``.b2nd``,
            or a loaderx 2.8.19 zrecord container directory (``meta.zr``).
        field: the store field to read; may be left out when the store has exactly one field.
            Must be ``None`` for ``.npy``, ``.b2nd`` files and zrecord containers.

    Raises:
        NotAStoreError: ``path`` does not exist, or is a directory that is not a store.
        ConfigError: several fields and no ``field=``, an unknown field, an unreadable file.

    A ragged store field (e.g. image bytes) returns a ``Ragged`` from gathers and slices, and a 1-D
    array for ``ds[i]``; its ``shape`` is ``(N,)``.
    """

    def __init__(self, path: str | os.PathLike[str], field: str | None = None) -> None:
        self.path = os.fspath(path)
        self.field = field
        backend: _StoreBackend | _ArrayBackend | _ZrecordBackend
        if os.path.isfile(os.path.join(self.path, "meta.zr")):
            if field is not None:
                raise ConfigError(f"field={field!r} only applies to headrace stores; "
                                  f"{self.path!r} is a one-stream zrecord container, leave it out")
            backend = _ZrecordBackend(self.path)
        elif os.path.isdir(self.path):
            backend = _StoreBackend(self.path, field)
            self.field = backend.field
        elif not os.path.exists(self.path):
            raise NotAStoreError(f"no such dataset {self.path!r}; pass a headrace store "
                                 "directory, a .npy file or a .b2nd file")
        else:
            if field is not None:
                raise ConfigError(f"field={field!r} only applies to headrace stores; "
                                  f"{self.path!r} is a single-array file, leave field out")
            if self.path.endswith(".npy") or _is_npy(self.path):
                backend = _open_npy(self.path)
            elif self.path.endswith((".b2nd", ".b2frame")):
                backend = _open_b2nd(self.path)
            else:
                raise ConfigError(f"{self.path!r} is neither a headrace store directory, a .npy "
                                  "file nor a Blosc2 .b2nd file")
        self._backend = backend

    @property
    def dtype(self) -> np.dtype[Any]:
        """The element dtype of each record."""
        return self._backend.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        """``(N, *record_shape)``; ``(N,)`` for a ragged store field."""
        item = self._backend.item_shape
        return (len(self._backend), *(item or ()))

    def __len__(self) -> int:
        return len(self._backend)

    def __getitem__(self, key: Any) -> Any:
        """``ds[i]`` (negative counts from the end) -> one record; ``ds[a:b:s]`` -> a batch."""
        n = len(self._backend)
        if isinstance(key, tuple):  # ds[i, j], ds[a:b, ::2]: records first, then NumPy indexing
            if not key:
                return self[:]
            head = self[key[0]]
            rest = key[1:]
            if not rest:
                return head
            if isinstance(head, np.ndarray):
                records_axis = isinstance(key[0], slice) or not np.isscalar(key[0])
                return head[(slice(None), *rest)] if records_axis else head[rest]
            raise IndexError(f"{type(head).__name__} records take no further index {rest!r}")
        if isinstance(key, slice):
            return self._backend.gather(np.arange(*key.indices(n), dtype=np.int64))
        if isinstance(key, int | np.integer) and not isinstance(key, bool | np.bool_):
            i = int(key)
            if not -n <= i < n:
                raise RecordIndexError(f"index {i} is out of range for a dataset of {n} records")
            return self._backend.gather(np.array([i % n], dtype=np.int64))[0]
        return self.__getitems__(key)

    def _store(self) -> Any:
        """The open ``Store`` a store field's dataset reads (shared in this process), else None."""
        backend = self._backend
        return backend.store if isinstance(backend, _StoreBackend) else None

    def __getitems__(self, indices: Any) -> Any:
        """A batch of records in the order of ``indices`` (unsorted and repeated ids are fine)."""
        return self._backend.gather(_normalize_indices(indices, len(self._backend)))

    def gather_start(self, indices: Any) -> Any:
        """``__getitems__(indices)`` started on the copy lane (``wait()`` gives the records), or
        None where the read is not a plain copy."""
        fn = getattr(self._backend, "gather_start", None)
        return None if fn is None else fn(_normalize_indices(indices, len(self._backend)))

    def close(self) -> None:
        """Gives back the store (shared in this process while its files are unchanged: closed
        once nothing uses it and newer ones push it out); for files, drops the recycled outputs.
        Arrays returned earlier stay valid."""
        self._backend.close()

    def __enter__(self) -> Dataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickles as (path, field) so worker processes reopen their own maps.
        return (Dataset, (self.path, self.field))

    def __repr__(self) -> str:
        field = f", field={self.field!r}" if self.field is not None else ""
        return f"Dataset({self.path!r}{field}, shape={self.shape}, dtype={self.dtype})"
