"""``read_batches``: the bytes of many files, in bounded batches read a little ahead."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

__all__ = ["read_batches"]

_BATCH_BYTES = 32 << 20
_BATCH_FILES = 1024
_READ_THREADS = 4


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _batches(sizes: np.ndarray, batch_bytes: int, batch_files: int) -> list[tuple[int, int]]:
    """[start, end) ranges of at most ``batch_files`` files / ``batch_bytes`` bytes (>= 1 file)."""
    out, start, acc = [], 0, 0
    for i, s in enumerate(sizes.tolist()):
        if i > start and (i - start >= batch_files or acc + s > batch_bytes):
            out.append((start, i))
            start, acc = i, 0
        acc += s
    if start < len(sizes):
        out.append((start, len(sizes)))
    return out


def read_batches(root: str, paths: Sequence[str], sizes: np.ndarray, *,
                 batch_bytes: int | None = None, batch_files: int | None = None
                 ) -> Iterator[tuple[int, int, list[bytes]]]:
    """``(start, end, file bytes)`` per bounded batch of ``paths`` (relative to ``root``).

    Files are read by a small thread pool, one batch ahead of the one handed out, so at most two
    batches are in memory (the defaults are read when called, so tests can shrink them).
    """
    spans = _batches(sizes, _BATCH_BYTES if batch_bytes is None else batch_bytes,
                     _BATCH_FILES if batch_files is None else batch_files)
    with ThreadPoolExecutor(_READ_THREADS, thread_name_prefix="headrace-pack") as pool:
        pending = None
        for k in range(len(spans) + 1):
            nxt = None
            if k < len(spans):
                a, b = spans[k]
                nxt = (a, b, pool.map(_read, [os.path.join(root, p) for p in paths[a:b]]))
            if pending is not None:
                pa, pb, datas = pending
                yield pa, pb, list(datas)
            pending = nxt
