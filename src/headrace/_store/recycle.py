"""Output arrays that gathers write into again once no one else holds them: ``Recycler``.

A batch of 256 rows of 3 KB is a 786 KB allocation. glibc serves it with fresh pages whenever the
arena it came from was trimmed (a loader's worker threads allocate in their own arenas, the
consumer frees there, and the batches in flight make the arena's top grow and shrink), so each
batch paid 10-45 page faults and 100-250 us of kernel time to zero them, more than the copy
itself. Writing a batch into an array the program has let go of pays none of that.

An array is free when the recycler's own list holds the only reference to it: the caller, any
view (NumPy views keep their base), a torch tensor or JAX array that aliases it, a memoryview:
each holds a reference. The reference count of a probe kept the same way is the count that means
"free" on this interpreter, so no version's constant is assumed.

Held arrays start on a 64-byte boundary: XLA:CPU adopts a host buffer without a copy only when it
is so aligned (``headrace.jax`` on the CPU then places a batch with no copy at all), and rows
then start on cache lines. Such an array is a view of a slightly larger allocation, and a view of
it (or JAX's alias) may reference that allocation rather than the array itself, so "free" asks
both reference counts.
"""

from __future__ import annotations

import math
import sys
import threading

import numpy as np

__all__ = ["Recycler"]

_MAX_ARRAY_BYTES = 16 << 20  # larger batches: the allocator's own mmap path is as good
_MIN_ARRAY_BYTES = 64 << 10  # smaller ones come from the allocator's bins without faults
_ALIGN = 64


def _aligned_empty(shape: tuple[int, ...], dtype: np.dtype, nbytes: int) -> np.ndarray:
    """An uninitialized array starting on an ``_ALIGN``-byte boundary; its ``base`` owns it."""
    raw = np.empty(nbytes + _ALIGN, np.uint8)
    start = -raw.ctypes.data % _ALIGN
    return raw[start:start + nbytes].view(dtype).reshape(shape)


class Recycler:
    """Keeps up to ``max_arrays`` gather outputs (at most ``max_bytes`` in all) for reuse.

    Idle arrays stay allocated while their store is open: that is the memory a loader's batches
    in flight use anyway, bounded by ``max_bytes``. Arrays outside 64 KiB..``max_array_bytes``
    are never kept.
    """

    def __init__(self, max_arrays: int = 16, max_bytes: int = 32 << 20,
                 max_array_bytes: int = _MAX_ARRAY_BYTES) -> None:
        self._held: list[np.ndarray] = []
        self._max_array_bytes = max_array_bytes
        self._bytes = 0
        self._max_arrays = max_arrays
        self._max_bytes = max_bytes
        self._lock = threading.Lock()
        self._probe = [_aligned_empty((1,), np.dtype(np.uint8), 1)]
        self._free_count = self._count(self._probe, 0)

    @staticmethod
    def _count(held: list[np.ndarray], j: int) -> tuple[int, int]:
        a = held[j]
        return sys.getrefcount(a), sys.getrefcount(a.base)

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """An array of ``shape`` and ``dtype`` (contents undefined): a free held one, else new."""
        nbytes = math.prod(shape) * dtype.itemsize
        if not _MIN_ARRAY_BYTES <= nbytes <= self._max_array_bytes:
            return np.empty(shape, dtype)
        free = self._free_count
        held = self._held
        with self._lock:
            for j in range(len(held)):
                a = held[j]
                if a.shape == shape and a.dtype == dtype:
                    del a  # only the list's reference may remain for the array to be free
                    if self._count(held, j) == free:
                        return held[j]
            out = _aligned_empty(shape, dtype, nbytes)
            if len(held) < self._max_arrays and self._bytes + nbytes <= self._max_bytes:
                held.append(out)
                self._bytes += nbytes
            return out

    def clear(self) -> None:
        """Drops every held array (callers keep theirs)."""
        with self._lock:
            self._held = []
            self._bytes = 0
