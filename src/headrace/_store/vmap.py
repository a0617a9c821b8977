"""Maps several chunk files back to back into ONE virtual address range (read-only).

A fixed-shape raw field spread over many chunks then reads as a single 2-D array, and a gather is
one ``numpy.take`` over all chunks, exactly like indexing one big ``.npy`` memmap: no per-chunk
take followed by a scatter into the output.

How: reserve an anonymous read-only range with Python's ``mmap`` (which owns it and unmaps the
whole range when the last array viewing it is freed), then map each chunk file over its part with
``MAP_FIXED``. Chunk ``k`` starts at a multiple of ``lcm(record size, 2 MiB)`` (or of the page size
when that would take too much address space, or for a field under 4 MiB), so record rows never
straddle a hole. Only used where ``libc.mmap`` is reachable through ctypes (Linux, macOS);
callers fall back to one mapping per chunk when this returns ``None``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import mmap
import os

import numpy as np

__all__ = ["map_concat"]

_MAX_VIRTUAL_BYTES = 1 << 44  # 16 TiB of address space, far below the 128 TiB user space
_HUGE = 2 << 20
_SMALL_FIELD_BYTES = 4 << 20  # about what 4 KiB pages in the TLB reach
_libc: ctypes.CDLL | None = None


def _mmap_fn() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    global _libc
    if _libc is None:
        try:
            # the process's own symbols hold libc's mmap: no ``find_library``, which runs
            # ``ldconfig -p`` in a subprocess (milliseconds at every process's first open)
            _libc = ctypes.CDLL(None, use_errno=True)
            if getattr(_libc, "mmap", None) is None:
                _libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        except (OSError, AttributeError):
            return None
    fn = getattr(_libc, "mmap", None)
    if fn is not None:
        fn.restype = ctypes.c_void_p
        fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int64]
    return fn


def map_concat(files: list[tuple[str, int]], align: int) -> tuple[np.ndarray, list[int]] | None:
    """Maps ``files`` (path, bytes to map) into one read-only uint8 array.

    Returns:
        ``(array, starts)`` where file ``k``'s bytes are ``array[starts[k]:starts[k] + size_k]``
        and every start is a multiple of ``align``; or ``None`` if this platform cannot do it
        (the caller then maps files one by one).
    """
    fn = _mmap_fn()
    if fn is None or align <= 0 or not hasattr(mmap, "MAP_ANONYMOUS"):
        return None
    # Chunk starts on 2 MiB boundaries (when affordable) let the kernel map page-cache huge
    # pages with one TLB entry each, as it does for a plain mmap of one big file; with 4 KiB
    # boundaries random row reads were ~1.5x slower.
    step = math.lcm(align, _HUGE)
    if (step * len(files) > _MAX_VIRTUAL_BYTES // 4
            or sum(size for _path, size in files) <= _SMALL_FIELD_BYTES):
        # A small field (labels) fits the TLB's reach in 4 KiB pages anyway: page steps let
        # chunks that end on a page (a part of a parallel pack) sit back to back, ids = rows.
        step = math.lcm(align, mmap.PAGESIZE)
    starts, total = [], 0
    for _path, size in files:
        starts.append(total)
        total += -(-size // step) * step
    if total > _MAX_VIRTUAL_BYTES:
        return None
    total = max(total, mmap.PAGESIZE)
    reserve = mmap.mmap(-1, total + _HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
                        prot=mmap.PROT_READ)
    whole = np.frombuffer(reserve, np.uint8)  # keeps `reserve` (and so the whole range) alive
    skip = -whole.ctypes.data % _HUGE
    arr = whole[skip:skip + total]
    base = arr.ctypes.data
    try:
        for (path, size), start in zip(files, starts, strict=True):
            if size == 0:
                continue
            fd = os.open(path, os.O_RDONLY)
            try:
                got = fn(base + start, size, mmap.PROT_READ, mmap.MAP_SHARED | _MAP_FIXED, fd, 0)
            finally:
                os.close(fd)
            if got != base + start:
                return None  # `arr` dies here and unmaps the whole range, file maps included
    except OSError:
        return None
    _ask_huge_pages(reserve)
    arr.flags.writeable = False
    return arr, starts


def _ask_huge_pages(reserve: mmap.mmap) -> None:
    """Lets the kernel back the file mappings with 2 MiB pages (THP in "madvise" mode).

    Records read from disk through the range then land in 2 MiB page-cache folios, and folios of
    that size (also those a writer made with 2 MiB-aligned writes, see ``_writer``) map with one
    TLB entry each: random row gathers over a large field were ~1.3-1.5x faster with them. Only
    advice: kernels without file THP ignore it, and nothing here depends on it.
    """
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is None:
        return
    try:
        reserve.madvise(advice)
    except OSError:
        pass


_MAP_FIXED = 0x10  # the same value on Linux and macOS; the mmap module does not export it
