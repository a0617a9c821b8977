"""Page-cache states a benchmark starts its readers from: ``drop_page_cache``, ``read_files``."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["WARM_HELP", "drop_page_cache", "read_files"]

WARM_HELP = (
    "how the page cache gets warm after its pages are dropped: 'own' (default): each reader reads "
    "all of its data once through its own path (NumPy a pass over its memmap, headrace its first "
    "epoch), as in training; 'read': every file is read once with read() first")


def _files(paths: list[Path]) -> list[Path]:
    return [q for p in paths for q in ([p] if p.is_file() else sorted(p.rglob("*"))) if q.is_file()]


def drop_page_cache(paths: list[Path]) -> None:
    """Drops the cached pages of ``paths`` (files, or every file under a directory).

    Why a benchmark starts from here: Linux sizes cached folios after the write or readahead that
    made them (up to 2 MiB, which maps with one TLB entry), and random row reads ran ~1.3-2x
    faster over 2 MiB folios than over small ones. Left alone, the cache state would be whatever
    packed, copied or last read each file. Pages some process still maps are not dropped: call
    this before mapping.
    """
    for f in _files(paths):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_files(paths: list[Path]) -> None:
    """Reads every file once sequentially with ``read()``: readahead picks the folio sizes
    (small ones for the first tens of MB of each file, then growing), the same for every file."""
    buf = bytearray(1 << 24)
    for f in _files(paths):
        with open(f, "rb", buffering=0) as fh:
            while fh.readinto(buf):
                pass
