"""Chunk appends written in whole 2 MiB-aligned pieces, so the page cache keeps them in huge folios.

Linux sizes a page-cache folio after the write that creates it (ext4, xfs and others since 6.x):
a ``pwrite`` covering an aligned 2 MiB span fills one 2 MiB folio, while appends of a few hundred
KiB leave 4-64 KiB folios behind. A reader mapping the chunk with ``MADV_HUGEPAGE`` (``_vmap``)
maps a 2 MiB folio with a single TLB entry; random row gathers over a large raw field ran
~1.3-1.5x faster that way than over small folios (``benchmarks/bench_store.py``).

So appends to a chunk go out up to the last 2 MiB boundary they reach and the rest (under 2 MiB
per chunk) is held in memory until the next append to that chunk completes the span, or until
``flush`` (the writer flushes a chunk when it opens the field's next one, and everything before
a commit's fsync). Held bytes are uncommitted bytes: dropping them on rollback loses nothing.
"""

from __future__ import annotations

from typing import Any

from headrace._base.fsutil import pwrite_all

__all__ = ["FOLIO_BYTES", "FolioWrites"]

FOLIO_BYTES = 2 << 20  # the PMD size on x86-64 and arm64 (4 KiB pages)


class FolioWrites:
    """Per-writer buffer of chunk tails not yet written: at most ``FOLIO_BYTES`` per chunk."""

    def __init__(self) -> None:
        self._held: dict[int, tuple[int, int, bytearray]] = {}  # chunk -> (fd, offset, bytes)

    def write(self, cid: int, fd: int, data: Any, offset: int) -> None:
        """Appends ``data`` at ``offset`` of chunk ``cid`` (appends to a chunk are contiguous)."""
        view = memoryview(data).cast("B")
        end = offset + view.nbytes
        held = self._held.pop(cid, None)
        if held is not None:
            _fd, start, buf = held
            if start + len(buf) != offset:  # not a continuation: keep the file exact regardless
                pwrite_all(fd, buf, start)
            else:
                boundary = start - start % FOLIO_BYTES + FOLIO_BYTES
                take = min(boundary, end) - offset
                buf += view[:take]
                view, offset = view[take:], offset + take
                if offset < boundary:  # the span is still open: keep holding it
                    self._held[cid] = (fd, start, buf)
                    return
                pwrite_all(fd, buf, start)  # one write fills the whole aligned span
        cut = end - end % FOLIO_BYTES
        if cut > offset:
            pwrite_all(fd, view[:cut - offset], offset)
            view, offset = view[cut - offset:], cut
        if view.nbytes:
            self._held[cid] = (fd, offset, bytearray(view))

    def flush(self, cid: int) -> None:
        """Writes what is held for chunk ``cid``."""
        held = self._held.pop(cid, None)
        if held is not None:
            fd, start, buf = held
            pwrite_all(fd, buf, start)

    def flush_all(self) -> None:
        for cid in list(self._held):
            self.flush(cid)

    def discard(self) -> None:
        """Forgets everything held (rollback: those bytes were never committed)."""
        self._held.clear()
