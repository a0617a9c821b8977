"""Byte-aware batch planning: batches cut by record sizes, not a fixed count (mx8's
``batch_bytes`` / ``target_bytes``). Pure arithmetic over the sizes of an epoch's records in
read order, one ``searchsorted`` per batch (no per-record Python).

Rule (mx8 1.0.7's, checked against its wheel on records of 10 bytes to 9 KB): a batch has a
target ``T``, ``target_bytes`` or, when only ``batch_bytes`` is given, 90% of it (rounded up; with
both, the smaller). Records are added greedily, and the batch ends

* at ``batch`` records;
* before a record that would pass the hard ceiling ``batch_bytes``;
* once it holds ``T`` bytes or more;
* before a record that would take it past 115% of ``T`` once it holds 85% of ``T`` (both in
  whole bytes, rounded up).

A batch always holds at least one record and never crosses an epoch boundary.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from headrace._order.plan import Step

__all__ = ["BAND_LOWER_PCT", "BAND_UPPER_PCT", "IMPLIED_TARGET_PCT", "BytePlan", "byte_split",
           "target_of"]

BAND_LOWER_PCT = 85
BAND_UPPER_PCT = 115
IMPLIED_TARGET_PCT = 90  # the target a ceiling alone implies


def target_of(batch_bytes: int | None, target_bytes: int | None) -> int | None:
    """The byte target batches are cut to: ``target_bytes``, else 90% of ``batch_bytes``
    (rounded up), never above ``batch_bytes``; None without either."""
    if batch_bytes is None:
        return target_bytes
    implied = -(-batch_bytes * IMPLIED_TARGET_PCT // 100)
    return max(1, min(batch_bytes, implied if target_bytes is None else target_bytes))


def byte_split(sizes: np.ndarray, *, batch: int, batch_bytes: int | None,
               target_bytes: int | None) -> np.ndarray:
    """Batch ends (exclusive indices into ``sizes``) for records of ``sizes`` bytes, in order.

    Callers check first that no record alone passes ``batch_bytes``.
    """
    sizes = np.asarray(sizes, np.int64)
    n = len(sizes)
    c = np.zeros(n + 1, np.int64)
    np.cumsum(sizes, out=c[1:])
    target = target_of(batch_bytes, target_bytes)
    if target is not None:  # the band in whole bytes, rounded up (as mx8's: its wheel agrees)
        low_bytes = -(-BAND_LOWER_PCT * target // 100)
        up_bytes = -(-BAND_UPPER_PCT * target // 100)
    ends: list[int] = []
    i = 0
    while i < n:
        end = min(n, i + batch)
        if batch_bytes is not None:  # largest j with c[j] - c[i] <= batch_bytes
            end = min(end, int(np.searchsorted(c, c[i] + batch_bytes, "right")) - 1)
        if target is not None:
            # the first j whose bytes reach the target ends the batch there
            reach = int(np.searchsorted(c, c[i] + target, "left"))
            # first j whose bytes reach 85% of the target
            low = int(np.searchsorted(c, c[i] + low_bytes, "left"))
            # largest j whose bytes stay within 115%: the next record would pass it
            up = int(np.searchsorted(c, c[i] + up_bytes, "right")) - 1
            end = min(end, reach, max(i + 1, low, up))
        end = max(end, i + 1)
        ends.append(end)
        i = end
    return np.asarray(ends, np.int64)


class BytePlan:
    """``BatchPlan``'s interface (``count``, ``steps``) with batches cut by bytes.

    ``sizes(e)`` gives the byte size of every record of epoch ``e`` in read order (``length`` of
    them). Global batch ``k`` of an epoch goes to rank ``k % world_size``; an incomplete last
    round of batches is dropped (``tail="drop"``) or read by the ranks it reaches
    (``"partial"``). ``after`` is the position past the round, what a checkpoint stores.
    """

    def __init__(self, *, length: int, batch: int, rank: int, world_size: int, tail: str,
                 start_position: int, end_position: int | None,
                 sizes: Callable[[int], np.ndarray], batch_bytes: int | None,
                 target_bytes: int | None) -> None:
        self.length = length
        self.batch = batch
        self.rank = rank
        self.world_size = world_size
        self.tail = tail
        self.start_position = start_position
        self.end_position = end_position
        self._sizes = sizes
        self.batch_bytes = batch_bytes
        self.target_bytes = target_bytes
        self._cache: dict[tuple[int, int], np.ndarray] = {}

    def _bounds(self, epoch: int, first: int) -> np.ndarray:
        """Batch starts and ends (epoch-relative) for epoch ``epoch`` read from ``first``."""
        key = (epoch, first)
        got = self._cache.get(key)
        if got is None:
            sizes = self._sizes(epoch)[first:]
            ends = byte_split(sizes, batch=self.batch, batch_bytes=self.batch_bytes,
                              target_bytes=self.target_bytes) + first
            got = np.concatenate([[first], ends])
            if len(self._cache) > 4:
                self._cache.clear()
            self._cache[key] = got
        return got

    def _epoch_steps(self, epoch: int, first: int) -> Iterator[Step]:
        n, w, r = self.length, self.world_size, self.rank
        bounds = self._bounds(epoch, first)
        total = len(bounds) - 1
        rounds, rem = divmod(total, w)
        base = epoch * n
        yielded = rounds + (1 if rem and self.tail == "partial" else 0)
        for q in range(yielded):
            last = min((q + 1) * w, total)
            after = base + n if q == yielded - 1 else base + int(bounds[last])
            k = q * w + r
            if k < total:
                yield Step(base + int(bounds[k]), int(bounds[k + 1] - bounds[k]), None, after)

    def steps(self) -> Iterator[Step]:
        n = self.length
        if n == 0:
            return
        pos = self.start_position
        while self.end_position is None or pos < self.end_position:
            epoch, first = divmod(pos, n)
            yield from self._epoch_steps(epoch, first)
            pos = (epoch + 1) * n

    def count(self) -> int:
        if self.end_position is None:
            raise TypeError("Eternal loader has no length.")
        return sum(1 for _ in self.steps())
