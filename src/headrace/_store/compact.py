"""Compaction (the design's "rebalance"): rewrite live records into fresh chunks."""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from headrace._base.errors import CorruptionError
from headrace._store import format as _format

__all__ = ["ChunkMaps", "rewrite_field"]

_WRITE_BATCH_BYTES = 16 << 20  # records are copied in writes of about this size

# Places records in fresh chunks: (records, their lengths) -> (chunk ids, offsets).
Place = Callable[[Any, np.ndarray], tuple[np.ndarray, np.ndarray]]


class ChunkMaps:
    """Read-only maps of the chunks being compacted away, opened on first use and kept."""

    def __init__(self, path: str, sizes: dict[int, int]) -> None:
        self._path = path
        self._sizes = sizes
        self._maps: dict[int, np.ndarray] = {}

    def get(self, cid: int, field: str, record: int) -> np.ndarray:
        src = self._maps.get(cid)
        if src is None:
            if cid not in self._sizes:
                raise CorruptionError(
                    f"field {field!r}, record id {record}: its index entry names chunk {cid}, "
                    "which does not exist; run `headrace verify`",
                    field=field, record_ids=[record])
            src = self._maps[cid] = _map_chunk(self._path, cid, self._sizes[cid])
        return src


def rewrite_field(field: str, ent: np.ndarray, *, stacked: bool, maps: ChunkMaps,
                  place: Place, advance: Callable[[int], Any]) -> np.ndarray:
    """Copies one field's live records into fresh chunks; returns its new index entries.

    Records are copied as stored (no re-encoding, checksums unchanged) in (chunk, offset) order,
    so reads of the old chunks are sequential, in runs of about ``_WRITE_BATCH_BYTES``.

    Args:
        field: the field's name, for errors.
        ent: its index entries (``chunk``, ``offset``, ``length``) for every record.
        stacked: hand ``place`` one 2-D array (fixed-size raw records) instead of a list of bytes.
        maps: the chunks the entries point into.
        place: writes records to fresh chunks, returning (chunk ids, offsets).
        advance: called with the bytes copied after each run (a progress bar's update).
    """
    present = np.flatnonzero(ent["length"] > 0)
    order = present[np.lexsort((ent["offset"][present], ent["chunk"][present]))]
    new = ent.copy()
    start = 0
    while start < len(order):
        stop, acc = start, 0
        while stop < len(order) and (acc == 0 or acc < _WRITE_BATCH_BYTES):
            acc += int(ent["length"][order[stop]])
            stop += 1
        sel = order[start:stop]
        data = []
        for j in sel.tolist():
            c, o, n = int(ent["chunk"][j]), int(ent["offset"][j]), int(ent["length"][j])
            src = maps.get(c, field, j)
            if o + n > len(src):
                raise CorruptionError(
                    f"field {field!r}, record id {j}: its index entry points past the end of "
                    f"chunk {c}; run `headrace verify`", field=field, record_ids=[j])
            data.append(src[o:o + n])
        lengths = ent["length"][sel].astype(np.int64)
        records = np.stack(data) if stacked else [d.tobytes() for d in data]
        new["chunk"][sel], new["offset"][sel] = place(records, lengths)
        advance(acc)
        start = stop
    return new


def _map_chunk(path: str, cid: int, size: int) -> np.ndarray:
    with open(os.path.join(path, _format.chunk_name(cid)), "rb") as f:
        avail = min(size, os.fstat(f.fileno()).st_size)
        if avail == 0:
            return np.empty(0, np.uint8)
        return np.frombuffer(mmap.mmap(f.fileno(), avail, access=mmap.ACCESS_READ), np.uint8)
