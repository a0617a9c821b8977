"""Compaction (the design's "rebalance"): rewrite live records into fresh chunks."""

from __future__ import annotations

import mmap
import os
from typing import TYPE_CHECKING

import numpy as np

from headrace import _format
from headrace._errors import CorruptionError
from headrace._fsutil import pwrite_all
from headrace._progress import progress as progress_bar

if TYPE_CHECKING:
    from headrace._writer import Writer

__all__ = ["compact_writer"]

_WRITE_BATCH_BYTES = 16 << 20  # records are copied in writes of about this size


def compact_writer(self: Writer, progress: bool | None) -> tuple[float, float]:
    """Rewrites the writer's live records into fresh chunks; see ``Writer.compact``.

    Records are copied as stored (no re-encoding, checksums unchanged) in (chunk, offset) order,
    into chunks with ids above every existing one; the index is rewritten in the writer's
    copy-on-write files, so nothing is visible (or lost) before the commit.
    """
    before = self._utilization()
    self._folios.flush_all()  # records appended since the commit are read back from the files
    self._begin_cow()
    plans = []
    live = 0
    for fw in self._fields.values():
        ent, _aux = self._get_entries(fw, 0, self._n)
        plans.append((fw, ent))
        live += int(ent["length"].sum(dtype=np.int64))
    old = {cid: info for cid, info in self._chunks.items()}
    for fw in self._fields.values():
        fw.open_chunk = None
    for cid in old:
        del self._chunks[cid]
    maps: dict[int, np.ndarray] = {}
    with progress_bar(live, desc="compact", unit="B", enabled=progress) as bar:
        for fw, ent in plans:
            present = np.flatnonzero(ent["length"] > 0)
            order = present[np.lexsort((ent["offset"][present], ent["chunk"][present]))]
            new = ent.copy()
            start = 0
            while start < len(order):
                # a run of records small enough to copy with one write per chunk placed
                stop, acc = start, 0
                while stop < len(order) and (acc == 0 or acc < _WRITE_BATCH_BYTES):
                    acc += int(ent["length"][order[stop]])
                    stop += 1
                sel = order[start:stop]
                data = []
                for j in sel.tolist():
                    c, o, n = int(ent["chunk"][j]), int(ent["offset"][j]), int(ent["length"][j])
                    src = maps.get(c)
                    if src is None:
                        if c not in old:
                            raise CorruptionError(
                                f"field {fw.spec.name!r}, record id {j}: its index entry names "
                                f"chunk {c}, which does not exist; run `headrace verify`",
                                field=fw.spec.name, record_ids=[j])
                        src = maps[c] = _map_chunk(self.path, c, old[c][1])
                    if o + n > len(src):
                        raise CorruptionError(
                            f"field {fw.spec.name!r}, record id {j}: its index entry points "
                            f"past the end of chunk {c}; run `headrace verify`",
                            field=fw.spec.name, record_ids=[j])
                    data.append(src[o:o + n])
                lengths = ent["length"][sel].astype(np.int64)
                if fw.rec > 0 and fw.spec.codec == "raw":
                    cids, offs = self._place(fw, np.stack(data), lengths)
                else:
                    cids, offs = self._place(fw, [d.tobytes() for d in data], lengths)
                new["chunk"][sel] = cids
                new["offset"][sel] = offs
                bar.update(acc)
                start = stop
            pwrite_all(fw.index_fd, new, 0)
    self._folios.flush_all()  # a full disk fails compact() itself, not the commit after it
    after = self._utilization()
    self._dirty = True
    return before, after


def _map_chunk(path: str, cid: int, size: int) -> np.ndarray:
    with open(os.path.join(path, _format.chunk_name(cid)), "rb") as f:
        avail = min(size, os.fstat(f.fileno()).st_size)
        if avail == 0:
            return np.empty(0, np.uint8)
        return np.frombuffer(mmap.mmap(f.fileno(), avail, access=mmap.ACCESS_READ), np.uint8)
