"""loaderx 2.8.19's ``DenseStore`` / ``RaggedStore`` spelling over headrace's zrecord reader.

A 2.8.19 program opens its containers as before and indexes them the same way (ints, lists,
arrays, slices, bool masks; nested lists flattened; order and duplicates kept). What comes back
is NumPy: a dense gather is an ndarray, a ragged gather a :class:`RaggedBatch` of ndarrays.
NumPy arrays are DLPack producers, so ``np.from_dlpack`` / ``torch.from_dlpack`` /
``jax.dlpack.from_dlpack`` calls on them keep working. Differences from 2.8.19, on purpose:

* ``bind(allocator)`` is optional (CPU only): an unbound store indexes directly;
* negative ids count from the end (2.8.19 rejects them, although its slices take negatives);
* errors are headrace's (``NotAStoreError`` is a ``FileNotFoundError``, ``SchemaError`` a
  ``ValueError``, ``RecordIndexError`` an ``IndexError``), naming the value and the fix.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from headrace._base.errors import ConfigError, RecordIndexError, SchemaError
from headrace._store.zrecord import ZrecordContainer

__all__ = ["DenseStore", "DenseView", "RaggedBatch", "RaggedStore", "RaggedView"]

_CPU = (1, 0)  # DLPack's (kDLCPU, device 0)


class RaggedBatch:
    """Variable-shape records packed back to back, as loaderx 2.8.19's ``RaggedBatch``.

    Attributes:
        values: every record's elements, C order, 1-D.
        cu_seqlens: int32 ``[0, end_0, end_1, ...]`` (``len + 1`` entries) into ``values``.
        shapes: uint32 ``(len, ndim)``: each record's dimensions.
    """

    def __init__(self, values: Any, cu_seqlens: Any, shapes: Any) -> None:
        self.values = np.asarray(values)
        self.cu_seqlens = np.asarray(cu_seqlens)
        self.shapes = np.asarray(shapes)
        if self.values.ndim != 1 or self.cu_seqlens.ndim != 1 or self.shapes.ndim != 2:
            raise SchemaError("RaggedBatch takes 1-D values, 1-D cu_seqlens and 2-D shapes, got "
                              f"{self.values.shape}, {self.cu_seqlens.shape}, {self.shapes.shape}")
        if len(self.cu_seqlens) != len(self.shapes) + 1 or (
                len(self.cu_seqlens) and int(self.cu_seqlens[-1]) != len(self.values)):
            raise SchemaError("ragged cu_seqlens must span all values and have one entry more "
                              "than shapes")

    @classmethod
    def from_records(cls, records: Iterable[Any]) -> RaggedBatch:
        """Packs arrays of one dtype and rank (>= 1) into a batch."""
        arrs = [np.ascontiguousarray(r) for r in records]
        if not arrs:
            raise SchemaError("RaggedBatch.from_records needs at least one record")
        dt, nd = arrs[0].dtype, arrs[0].ndim
        if nd < 1 or any(a.dtype != dt or a.ndim != nd for a in arrs):
            raise SchemaError("RaggedBatch records must share one dtype and one rank >= 1; got "
                              f"{sorted({(str(a.dtype), a.ndim) for a in arrs})}")
        cu = np.zeros(len(arrs) + 1, np.int32)
        np.cumsum([a.size for a in arrs], out=cu[1:])
        shapes = np.array([a.shape for a in arrs], np.uint32).reshape(len(arrs), nd)
        return cls(np.concatenate([a.reshape(-1) for a in arrs]), cu, shapes)

    def __len__(self) -> int:
        return len(self.shapes)

    def to_tensors(self) -> list[np.ndarray]:
        """Each record as an array of its shape (views of ``values``)."""
        cu = self.cu_seqlens.tolist()
        return [self.values[cu[j]:cu[j + 1]].reshape(tuple(int(d) for d in self.shapes[j]))
                for j in range(len(self))]

    def __repr__(self) -> str:
        return (f"RaggedBatch(n={len(self)}, values={self.values.shape}, "
                f"cu_seqlens={self.cu_seqlens.shape}, shapes={self.shapes.shape})")


def _ids(idx: Any, n: int) -> tuple[np.ndarray, bool]:
    """Record ids for a 2.8.19 index (and whether it was a single int)."""
    if isinstance(idx, bool | np.bool_):
        raise TypeError("indices must be integers or a bool mask")
    if isinstance(idx, int | np.integer):
        i = int(idx)
        if not -n <= i < n:
            raise RecordIndexError(f"record index {i} is out of range for a container of "
                                   f"{n} records")
        return np.array([i % n if n else i], np.int64), True
    if isinstance(idx, slice):
        return np.arange(*idx.indices(n), dtype=np.int64), False
    arr = np.asarray(idx)
    if arr.dtype == np.bool_:
        if arr.ndim != 1 or arr.size != n:
            raise RecordIndexError(f"a boolean mask must be one-dimensional with length {n}, "
                                   f"got shape {arr.shape}")
        return np.flatnonzero(arr).astype(np.int64), False
    arr = arr.reshape(-1)  # nested lists are one record set, as in 2.8.19
    if arr.size and arr.dtype.kind not in "iu":
        raise TypeError(f"indices must be integers or a bool mask, got dtype {arr.dtype}")
    arr = arr.astype(np.int64)
    bad = (arr < -n) | (arr >= n)
    if bad.any():
        raise RecordIndexError(f"record index {int(arr[bad][0])} is out of range for a "
                               f"container of {n} records")
    return np.where(arr < 0, arr + n, arr), False


def _check_allocator(allocator: Any) -> None:
    kind = getattr(allocator, "device_type", "cpu")
    if allocator is not None and kind != "cpu":
        raise ConfigError(f"headrace reads zrecord containers into CPU memory; allocator device "
                          f"{kind!r} is not supported: bind a CPU allocator (or none) and move "
                          "batches with torch/jax")


class _Base:
    _kind = ""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        c = ZrecordContainer(path)
        if c.kind != self._kind:
            c.close()
            expected = ["dtype", "item_shape"] if self._kind == "dense" else ["dtype", "ndim"]
            other = "RaggedStore" if self._kind == "dense" else "DenseStore"
            raise SchemaError(f"invalid {self._kind} schema fields, expected {expected}: "
                              f"{os.fspath(path)} is a {c.kind} container; open it with {other}")
        self._c: ZrecordContainer | None = c
        self.path = Path(path)
        self.dtype = c.dtype
        self.codec = c.codec
        self.data_shards = c.data_shards
        self._length = len(c)

    def _container(self) -> ZrecordContainer:
        if self._c is None:
            raise RuntimeError(f"the Store of {self.path} is closed; open it again")
        return self._c

    def __len__(self) -> int:
        return self._length

    def bind(self, allocator: Any = None) -> Any:
        """A view of this store (2.8.19's placement step; optional here, CPU only)."""
        _check_allocator(allocator)
        self._container()
        return (DenseView if self._kind == "dense" else RaggedView)(self)

    def __getitem__(self, idx: Any) -> Any:
        ids, single = _ids(idx, self._length)
        return self._gather(ids, single)

    def __getitems__(self, idxs: Any) -> Any:
        return self._gather(_ids(idxs, self._length)[0], False)

    def __iter__(self) -> Iterator[Any]:
        for i in range(self._length):
            yield self[i]

    def _gather(self, ids: np.ndarray, single: bool) -> Any:
        raise NotImplementedError

    def close(self) -> None:
        """Releases the container (idempotent); views of it stop working."""
        if self._c is not None:
            self._c.close()
            self._c = None

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class DenseStore(_Base):
    """A fixed-shape container: ``store[ids]`` is a ``(len(ids), *item_shape)`` ndarray.

    Attributes: ``path``, ``dtype``, ``item_shape``, ``codec``, ``data_shards``, ``len()``.
    """

    _kind = "dense"

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(path)
        assert self._c is not None and self._c.item_shape is not None
        self.item_shape: tuple[int, ...] = self._c.item_shape

    @property
    def shape(self) -> tuple[int, ...]:
        """``(len, *item_shape)``: what headrace.Dataset and the byte budget read."""
        return (self._length, *self.item_shape)

    def _gather(self, ids: np.ndarray, single: bool) -> Any:
        out = self._container().dense(ids)
        return out[0] if single else out


class RaggedStore(_Base):
    """A variable-shape container: ``store[ids]`` is a :class:`RaggedBatch`.

    Attributes: ``path``, ``dtype``, ``ndim``, ``codec``, ``data_shards``, ``len()``.
    """

    _kind = "ragged"

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(path)
        assert self._c is not None
        self.ndim: int = self._c.ndim

    def _gather(self, ids: np.ndarray, single: bool) -> Any:
        values, dims = self._container().ragged(ids)
        return RaggedBatch(values.values, values.offsets.astype(np.int32), dims)


class _View:
    def __init__(self, store: Any) -> None:
        self._store = store

    path = property(lambda self: self._store.path)
    dtype = property(lambda self: self._store.dtype)
    codec = property(lambda self: self._store.codec)
    data_shards = property(lambda self: self._store.data_shards)
    device = property(lambda self: _CPU)

    def __len__(self) -> int:
        return len(self._store)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._store)

    def __getitem__(self, idx: Any) -> Any:
        self._store._container()
        return self._store[idx]

    def __getitems__(self, idxs: Any) -> Any:
        self._store._container()
        return self._store.__getitems__(idxs)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} of {len(self)} records, device={self.device}>"


class DenseView(_View):
    """A bound :class:`DenseStore` (2.8.19's ``DenseView``)."""

    item_shape = property(lambda self: self._store.item_shape)


class RaggedView(_View):
    """A bound :class:`RaggedStore` (2.8.19's ``RaggedView``)."""

    ndim = property(lambda self: self._store.ndim)
