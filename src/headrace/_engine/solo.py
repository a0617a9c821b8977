"""Whether the consumer should gather every batch alone: ``SoloProbe``.

A consumer that keeps asking for batches faster than they come already gathers inline whenever
every worker is busy, so the two share the batches. When a batch's gather is cheap (a sequential
read is one ``memcpy`` of 40 us), that sharing costs more than it gains: each batch moves the GIL
between threads and each worker wake-up crosses CPUs, which on a VM costs as much as the copy.
The consumer gathering alone, workers parked, then delivers more batches per second at less CPU
per batch. Which side wins depends on the machine, the source and the transform, so it is
measured.

While the consumer waits on the loader (it spends under ``_BUSY_SHARE`` of its time outside
``next()``), the probe times a run of batches with the workers. When the consumer gathered a
quarter of them itself, with less CPU per batch than ``_CONTENTION`` times the time the loader
took to deliver one (beside the workers its gathers cost more than alone), or when batches came
faster than one each ``_SHORT_BATCH_S`` (hand-offs then cost about what the work does), a run is
timed with the workers parked, and the faster way is kept for a longer stretch before both are
timed again; a solo that won its last trial keeps its place unless it now takes ``_INCUMBENT``
times as long as the workers (32 batches on a noisy machine decide little: the workers' run starts
with the batches they had ready). Each trial that ends as the one before it did (alone lost
again, or won again) doubles that stretch, so steady work pays for its trials ever more rarely. Expensive gathers that the
threads split well (image decoding, shuffled reads) and latency-bound sources, where the consumer
gathers little or slowly, get no trial and pay nothing for it. CPU time, not wall time, is the
measure of the consumer's gathers: their wall time counts the waits for the GIL that two threads
trade, two to three times the work on a 2-vCPU VM. A consumer that spends real time between
batches (a training step) always keeps the workers: they gather while it computes; one that
starts doing so while solo is kept gets them back within a run of ``_TIMED`` batches. Under
``tune=True`` the tuner pauses while the workers are parked and measures afresh once they run;
the consumer alone is tried only against the setting the tuner settled on (``hold`` while it
is still raising threads or prefetch: against its first setting, one thread and no prefetch,
the consumer alone would win trials that the workers at their settled setting win), and a
tuned engine starts with its workers whatever the last verdict (parked from the start, its
tuner would never run, and each later trial would compare the consumer with one thread).

A loader built for each epoch (``Loader(..., seed=epoch, epochs=1)`` in a loop) would pay for
the same trial every epoch: the last verdict for the same work (a ``key`` naming the source's data,
the batch size, the threads and the transform) is kept for this process, and a new engine whose
work solo last won starts with its workers parked, as if that trial had just been won (with the
stretch that trial earned); both ways are timed again after it, and a consumer busy elsewhere
gets the workers back within a run of batches, as always.

Parking workers changes who gathers, never what is gathered: batches are reserved, posted and
delivered in the same order under the same caps either way.
"""

from __future__ import annotations

from collections.abc import Hashable

__all__ = ["SoloProbe"]

_TIMED = 32  # batches timed each way
_KEEP = 480  # batches the faster way is kept before both are timed again
_KEEP_MAX = 16 * _KEEP  # each trial that ends as the last one did doubles the keep, up to this
_BUSY_SHARE = 0.2  # the consumer counts as waiting on the loader below this share outside next()
# The consumer's gathers timed beside the workers cost up to this much more CPU than alone (the
# threads share the memory bandwidth and the caches: a sequential copy took 51-63 us a batch
# beside a worker against 45 alone on the 2-vCPU VM), so a trial is worth it below this times
# the delivery interval.
_CONTENTION = 1.3
_INCUMBENT = 1.15  # a solo that won its last trial loses the next only when this much slower
# Batches the workers deliver this often are tens of microseconds of work each, about what each
# hand-off between threads costs (a GIL switch, a wake-up across CPUs): alone, the consumer may
# well be faster, and a trial costs little (a cheap transform over a local store read 20-26k
# batches/s alone against 8-10k with two workers on the 2-vCPU VM, whose big windows left the
# consumer too few gathers of its own to tell).
_SHORT_BATCH_S = 150e-6
# Kinds of work whose last trial the consumer alone won (this process), with the stretch that
# trial earned; a lost trial, or a consumer found busy elsewhere, removes its kind.
# Insertion-ordered: the oldest goes first.
_VERDICTS: dict[Hashable, int] = {}
_VERDICTS_MAX = 64


class SoloProbe:
    """Times batches with and without the workers and says which way to run.

    ``leave(now, own_s, own_n)`` is called as each ``next()`` returns a batch, with the consumer's
    cumulative CPU seconds gathering (and transforming) batches itself and their count;
    ``enter(now)`` as the next ``next()`` starts. ``leave`` returns ``True`` (park the workers),
    ``False`` (run them) or ``None`` (no change). ``settle`` batches after each switch are not
    timed (the batches in flight drain, or the workers start again).
    """

    def __init__(self, settle: int, key: Hashable | None = None, *, lane: bool = False,
                 tuned: bool = False) -> None:
        self._settle = max(1, settle)
        # (set by the engine) the tuner is still raising a knob: the workers' timing is of a
        # setting on its way, so no trial of the consumer alone starts from it
        self.hold = tuned
        # the source can start its reads on the copy lane: parked is then not the consumer
        # alone but the consumer and the lane, which its own gathers beside the workers do not
        # predict (workers that keep ahead leave it none to time), so every timing gets a trial
        self._lane = lane
        self._key = key
        # a solo verdict for the same work: start parked, as after a won trial
        kept = _VERDICTS.get(key, 0) if key is not None and not tuned else 0
        self.solo = bool(kept)
        self._phase = "keep" if self.solo else "workers"  # "workers" / "solo": timing that way;
        # "keep": running the faster way
        self._count = -self._settle  # batches into the phase; negative while settling
        self._start = 0.0
        self._outside = 0.0  # seconds the consumer spent outside next() in this phase
        self._left_at: float | None = None
        self._workers_s = 0.0
        self._own = (0.0, 0)  # the consumer's own gathers (CPU seconds, batches) when timing began
        self._last_own = (0.0, 0)
        self._keep = max(_KEEP, int(kept)) if kept else _KEEP
        self._won: bool | None = True if kept else None  # how the last trial ended

    def enter(self, now: float) -> None:
        if self._left_at is not None:
            self._outside += now - self._left_at

    def leave(self, now: float, own_s: float = 0.0, own_n: int = 0) -> bool | None:
        self._left_at, self._last_own = now, (own_s, own_n)
        self._count += 1
        if self._count <= 0:
            if self._count == 0:  # settled: time from here
                self._start, self._outside, self._own = now, 0.0, (own_s, own_n)
            return None
        if self._phase == "keep" and self.solo and self._count % _TIMED == 0 \
                and self._count < self._keep:
            # a kept solo stretch is checked every run of batches: a consumer that started
            # spending time elsewhere (training after a fast warm-up) gets its workers back now
            if self._outside > _BUSY_SHARE * (now - self._start):
                self._remember(False)
                self._won, self._keep = None, _KEEP  # other work now: trials start afresh
                return self._switch("workers", False)
            self._start, self._outside = now, 0.0
            return None
        if self._count < (self._keep if self._phase == "keep" else _TIMED):
            return None
        elapsed = now - self._start
        busy_elsewhere = self._outside > _BUSY_SHARE * elapsed
        if self._phase == "workers" and not busy_elsewhere:
            self._workers_s = elapsed
            mine = own_n - self._own[1]
            # It gathered often enough to tell (a quarter of the batches), and faster than
            # batches came: worth a trial. Slower, alone it cannot be faster; and with too few
            # of its own (workers keep ahead, or the window has no room for it) there is no
            # telling, while a trial on a latency-bound source would cost a run of slow batches,
            # unless batches come so often that the hand-offs are most of their cost. A solo
            # that won its last trial is the incumbent: it is timed again, not dropped for want
            # of evidence (with the workers running, the consumer may gather none itself).
            if self.hold:  # the tuner is on its way to a setting: time the workers again
                return self._switch("workers", False)
            promising = self._lane or self._won is True or \
                elapsed < _SHORT_BATCH_S * self._count or (
                mine * 4 >= self._count
                and (own_s - self._own[0]) / mine < _CONTENTION * elapsed / self._count)
            return self._switch("solo", True) if promising else self._switch("keep", False)
        if self._phase == "solo" and not busy_elsewhere:
            # solo won the last trial: it keeps its place unless clearly slower now (a run of
            # 32 batches on a noisy machine, the workers' helped by the batches they had ready)
            won = elapsed < self._workers_s * (_INCUMBENT if self._won else 1.0)
            # a loss always doubles (alone is tried ever more rarely); a win doubles after a win
            again = not won or self._won is True
            self._keep = min(2 * self._keep, _KEEP_MAX) if again else _KEEP
            self._won = won
            self._remember(won)
            return self._switch("keep", won)
        # kept long enough, or the consumer has work of its own: the workers gather meanwhile
        return self._switch("workers", False)

    def refused(self) -> bool:
        """The consumer could not gather the next batch without waiting (window, RAM or budget):
        run the workers again (a parked one must reserve it, waiting as workers do) and time
        both ways afresh later. Returns ``False``."""
        self._phase, self.solo = "workers", False
        self._count, self._outside = -self._settle, 0.0
        return False

    def _remember(self, solo: bool) -> None:
        """Keep ``solo`` as the verdict for this probe's work (for the next engine doing it)."""
        key = self._key
        if key is None:
            return
        _VERDICTS.pop(key, None)
        if solo:  # only solo verdicts change where an engine starts
            _VERDICTS[key] = self._keep
            while len(_VERDICTS) > _VERDICTS_MAX:
                del _VERDICTS[next(iter(_VERDICTS))]

    def _switch(self, phase: str, solo: bool) -> bool | None:
        changed = solo != self.solo
        self._phase, self.solo = phase, solo
        self._count = -self._settle if changed else 0
        self._outside = 0.0
        if not changed:  # nothing drains or restarts: time from this batch on
            self._start = self._left_at if self._left_at is not None else 0.0
            self._own = self._last_own
            return None
        return solo
