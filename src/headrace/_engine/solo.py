"""Whether the consumer should gather every batch alone: ``SoloProbe``.

A consumer that keeps asking for batches faster than they come already gathers inline whenever
every worker is busy, so the two share the batches. When a batch's gather is cheap (a sequential
read is one ``memcpy`` of 40 us), that sharing costs more than it gains: each batch moves the GIL
between threads and each worker wake-up crosses CPUs, which on a VM costs as much as the copy.
The consumer gathering alone, workers parked, then delivers more batches per second at less CPU
per batch. Which side wins depends on the machine, the source and the transform, so this is
measured, not guessed: while the consumer is the bottleneck's victim (it spends little time
outside ``next()``), the probe times a run of batches with the workers and a run without, keeps
the faster for a longer stretch, and times both again after it. A consumer that spends real time
between batches (a training step) always keeps the workers: they gather while it computes.

Parking workers changes who gathers, never what is gathered: batches are reserved, posted and
delivered in the same order under the same caps either way.
"""

from __future__ import annotations

__all__ = ["SoloProbe"]

_TIMED = 32  # batches timed each way
_KEEP = 480  # batches the faster way is kept before both are timed again
_BUSY_SHARE = 0.2  # the consumer counts as waiting on the loader below this share outside next()


class SoloProbe:
    """Times batches with and without the workers and says which way to run.

    ``leave(now)`` is called as each ``next()`` returns a batch, ``enter(now)`` as the next one
    starts; ``leave`` returns ``True`` (park the workers), ``False`` (run them) or ``None`` (no
    change). ``settle`` batches after each switch are not timed (the batches in flight drain, or
    the workers start again).
    """

    def __init__(self, settle: int) -> None:
        self._settle = max(1, settle)
        self.solo = False
        self._phase = "workers"  # "workers" / "solo": timing that way; "keep": running the faster
        self._count = -self._settle  # batches into the phase; negative while settling
        self._start = 0.0
        self._outside = 0.0  # seconds the consumer spent outside next() in this phase
        self._left_at: float | None = None
        self._workers_s = 0.0

    def enter(self, now: float) -> None:
        if self._left_at is not None:
            self._outside += now - self._left_at

    def leave(self, now: float) -> bool | None:
        self._left_at = now
        self._count += 1
        if self._count <= 0:
            if self._count == 0:  # settled: time from here
                self._start, self._outside = now, 0.0
            return None
        if self._count < (_KEEP if self._phase == "keep" else _TIMED):
            return None
        elapsed = now - self._start
        busy_elsewhere = self._outside > _BUSY_SHARE * elapsed
        if self._phase == "workers" and not busy_elsewhere:
            self._workers_s = elapsed
            return self._switch("solo", True)
        if self._phase == "solo" and not busy_elsewhere:
            return self._switch("keep", elapsed < self._workers_s)
        # kept long enough, or the consumer has work of its own: the workers gather meanwhile
        return self._switch("workers", False)

    def refused(self) -> bool:
        """The consumer could not gather the next batch without waiting (window, RAM or budget):
        run the workers again (a parked one must reserve it, waiting as workers do) and time
        both ways afresh later. Returns ``False``."""
        self._phase, self.solo = "workers", False
        self._count, self._outside = -self._settle, 0.0
        return False

    def _switch(self, phase: str, solo: bool) -> bool | None:
        changed = solo != self.solo
        self._phase, self.solo = phase, solo
        self._count = -self._settle if changed else 0
        self._outside = 0.0
        if not changed:  # nothing drains or restarts: time from this batch on
            self._start = self._left_at if self._left_at is not None else 0.0
            return None
        return solo
