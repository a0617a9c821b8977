"""Which global positions each batch of a rank holds: pure arithmetic, no threads, no I/O.

The loader reads a global stream of positions ``p = 0, 1, 2, ...`` (``order.indices(p)`` turns them
into record ids). Rank ``r`` of ``W`` with batch ``B`` reads positions ``base + (k*W + r)*B .. + B``
for its ``k``-th batch, ``base`` being where the loader (or the current epoch) starts. Every batch
carries ``after``: the global position of the first sample not consumed once all ranks have taken
that step, which is what a checkpoint stores.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

__all__ = ["BatchPlan", "Step"]


@dataclass(frozen=True)
class Step:
    """Rank-local batch ``k``: positions ``[start, start+count)`` or explicit (padded) positions."""

    start: int
    count: int
    positions: np.ndarray | None  # set only for a padded tail that wraps around the epoch
    after: int  # global position of the first sample not consumed once this batch is delivered


class BatchPlan:
    """Pure arithmetic: which global positions each of this rank's batches holds.

    Rank ``r`` of ``W`` with batch ``B`` reads positions ``base + (k*W + r)*B .. + B`` where
    ``base`` is the position the loader (or the epoch) starts from. In epoch mode a segment ends
    at the epoch boundary; ``tail`` decides the incomplete last global step (``rem < W*B``
    positions): ``"drop"`` it, give ``"partial"`` batches (ranks may then differ by one batch), or
    ``"pad"``: every rank takes ``ceil(rem / W)`` consecutive positions of it, the last ranks
    wrapping around to the epoch's first positions. So with ``"pad"`` each rank reads
    ``ceil(R / W)`` samples of the ``R`` left in the epoch, and fewer than ``W`` are read twice,
    as torch's ``DistributedSampler`` pads samples (not batches).
    """

    def __init__(self, *, length: int, batch: int, rank: int, world_size: int, tail: str,
                 start_position: int, end_position: int | None) -> None:
        self.length = length
        self.batch = batch
        self.rank = rank
        self.world_size = world_size
        self.tail = tail
        self.start_position = start_position
        self.end_position = end_position  # None = endless

    def _segment_count(self, remaining: int) -> int:
        g = self.world_size * self.batch
        full, rem = divmod(remaining, g)
        if rem and (self.tail == "pad" or (self.tail == "partial" and rem > self.rank * self.batch)):
            full += 1
        return full

    def count(self) -> int:
        """Batches this rank will read (TypeError when endless)."""
        if self.end_position is None:
            raise TypeError("Eternal loader has no length.")
        n, pos, total = self.length, self.start_position, 0
        if n == 0 or pos >= self.end_position:
            return 0
        first_end = (pos // n + 1) * n
        total += self._segment_count(first_end - pos)
        whole = (self.end_position - first_end) // n
        return total + whole * self._segment_count(n)

    def steps(self) -> Iterator[Step]:
        b, w, r = self.batch, self.world_size, self.rank
        g = w * b
        if self.end_position is None:
            base = self.start_position
            k = 0
            while True:
                yield Step(base + (k * w + r) * b, b, None, base + (k + 1) * g)
                k += 1
        n = self.length
        seg = self.start_position
        while n and seg < self.end_position:
            epoch_start = (seg // n) * n
            epoch_end = epoch_start + n
            full, rem = divmod(epoch_end - seg, g)
            for s in range(full):
                after = seg + (s + 1) * g
                if s == full - 1 and (rem == 0 or self.tail == "drop"):
                    after = epoch_end
                yield Step(seg + s * g + r * b, b, None, after)
            last = seg + full * g + r * b
            if rem and self.tail == "partial" and rem > r * b:
                yield Step(last, min(b, rem - r * b), None, epoch_end)
            elif rem and self.tail == "pad":
                share = -(-rem // w)  # <= b, since rem < w*b
                first = seg + full * g + r * share
                if first + share <= epoch_end:
                    yield Step(first, share, None, epoch_end)
                else:  # past the epoch's end: wrap to its first positions
                    pos = first + np.arange(share, dtype=np.int64)
                    wrapped = epoch_start + (pos - epoch_start) % n
                    yield Step(first, share, wrapped, epoch_end)
            seg = epoch_end
