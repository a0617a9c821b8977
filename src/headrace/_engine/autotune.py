"""The autotuner: worker threads and prefetch depth adjusted while a loader runs (``tune=True``).

The tuner only moves two knobs of a running engine: how many of its worker threads are active
(``1 .. max_threads``) and its prefetch depth, which together set the dispatch window (batches
dispatched but not delivered, ``min(max_queue_batches, threads + prefetch)``). Every batch still
reserves its bytes in the byte budget and waits on the RAM cap before it is read, exactly as with
fixed knobs, so the caps stay hard caps whatever the tuner decides. Order and batch content do
not depend on the thread count (batches are posted by number), so tuning never changes what is
delivered nor what a checkpoint says; the tuner's state is not checkpointed.

Signals, measured over an interval of at least ``min_batches`` delivered batches and
``min_seconds`` (the consumer's ``next()`` steps the tuner; a clock compare per batch otherwise):

* ``wait``: the share of the interval the consumer spent waiting for batches;
* ``busy``: gather and transform seconds (the workers' and the consumer's own) over the active
  workers' time;
* ``capped``: the share of the interval producers spent blocked on the byte budget or RAM cap;
* ``rate``: batches delivered per second.

Decisions, one per interval:

* the consumer waits (``wait > WAIT_HIGH``) on average over this interval and the one before,
  and in this one, or ``WAIT_STRONG`` or more in one (a noisy interval alone never costs
  memory), and the workers are busy:
  more threads, toward the parallelism the measured per-batch work needs (``work per batch /
  consumer time per batch``), at most doubling; the workers are not busy, busy at the thread
  ceiling, or their last added thread did not pay: more prefetch, one batch, or doubling while
  the consumer waits ``WAIT_STRONG`` or more (the window is what limits, batches finishing out of
  order need slack, and room in the window lets the waiting consumer build a batch itself).
  Never past the byte budget's room (``budget // bytes per batch`` batches in the window) and
  never while producers already wait on a cap.
* the consumer waits on latency-bound gathers (off the CPU ``IO_BOUND`` times the on-CPU work,
  gathers' CPU time and transforms, or more; the threads' time waiting for a CPU, ``runq_s``,
  is not off the CPU: a loaded machine is not a slow source): straight to the threads Little's law needs (``work per
  batch / interval``, the interval the consumer's own time per batch or the on-CPU work over the
  cores), decided after ``min_batches`` already; when the thread ceiling is below that need, as
  many batches of prefetch as threads come with the jump. Otherwise the window of such workers
  grows only while the dispatcher waits for room in it (``BLOCKED``), doubling, to at most as
  much prefetch as threads. Such steps are kept unless the rate fell (``FELL``), a jump when the
  rate reached ``HOLDS`` of its prediction; so is a prefetch step of on-CPU work at its thread
  ceiling taken while the dispatcher waited for room (the same direct evidence: a batch that
  finishes late holds up the finished ones behind it), which a 2% gain would judge by one noisy
  interval;
* every increase is checked on the next interval: when the rate did not rise by ``GAIN`` or
  more and the consumer's wait did not halve (or fall under ``WAIT_LOW``), it is undone (both knobs, when it moved both) and that knob is not raised again for a
  cooldown that doubles on each failure (hysteresis: no oscillating between two settings);
* the consumer has not waited (``wait < WAIT_LOW``) for ``CALM`` intervals: one step down, the
  prefetch first, then a thread when the others could carry its work, to give memory back; a
  step down after which the consumer waits again is undone with the same doubling cooldown;
* producers blocked on the RAM cap: the prefetch is lowered.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from headrace._engine.config import usable_cores

__all__ = ["Signals", "Tuner", "tune_max_threads"]

WAIT_HIGH = 0.05  # the consumer waited this share of the time or more: the loader limits it
WAIT_LOW = 0.01  # below this share the consumer is not held up
WAIT_STRONG = 0.25  # a wait this large is acted on at once; a smaller one only when the mean of
# this interval and the one before passes WAIT_HIGH (one noisy interval must not cost memory)
GAIN = 0.02  # an increase must raise the delivered rate by this much to be kept (an extra
# thread costs one batch of memory; a missing one costs throughput: in doubt, keep it)
CALM = 3  # intervals without waiting before a step down
BUSY = 0.6  # workers busy this share of their time: more of them would help
COOLDOWN_S = 0.5  # the first cooldown after an undone change; doubles on each failure
IO_BOUND = 2.0  # gathers waited off the CPU this many times the on-CPU work: latency-bound
HOLDS = 0.75  # a Little's-law jump whose rate reaches this share of its prediction is kept
BLOCKED = 0.25  # the dispatcher waited for window room this share of the time: the window limits
FELL = 0.1  # a step taken on a direct signal is undone only when the rate fell this much


def tune_max_threads(threads: int | None, default: int) -> int:
    """The most threads a tuned loader may run: ``threads=`` when given (a ceiling), else twice
    the default (I/O-bound sources gain from more threads than cores), at least 8."""
    return threads if threads is not None else max(8, 2 * default)


@dataclass(frozen=True)
class Signals:
    """Cumulative readings the tuner differentiates (seconds and counts since the engine started).

    ``busy_s`` counts gather and transform time: the worker threads', and the consumer's when
    it gathers a batch itself instead of waiting (that work, too, is what more threads take on).
    """

    now: float
    batches: int
    consumer_wait_s: float
    busy_s: float
    capped_s: float
    ram_wait_s: float
    gather_s: float = 0.0  # gather wall seconds (within busy_s)
    gather_cpu_s: float = 0.0  # the part of gather_s its threads ran on a CPU
    window_wait_s: float = 0.0  # the dispatcher's seconds waiting for room in the window
    runq_s: float = 0.0  # the loader's threads' seconds ready to run but waiting for a CPU


@dataclass
class _Move:
    knob: str  # "threads" or "prefetch"
    before: int
    other: int  # the other knob's value before (a step may move both: undoing restores both)
    rate_before: float
    up: bool
    wait_before: float = 0.0  # the consumer's wait share before the step
    predicted: float = 0.0  # a Little's-law jump's predicted rate (0: a plain step)
    signalled: bool = False  # taken on a direct signal (the window blocked the dispatcher)


class Tuner:
    """Decides the active threads and the prefetch of one engine (see the module docstring).

    Args:
        max_threads: the ceiling of active threads (>= 1).
        max_window: the most batches the window may hold: the queue cap, and what the byte
            budget holds of the largest batch measured so far.
        threads, prefetch: where to start (the smallest setting, by default: the tuner grows
            from there only while the consumer waits, so it never holds more than it needs).
        min_batches, min_seconds: the shortest interval a decision is based on.
    """

    def __init__(self, *, max_threads: int, max_window: int, threads: int = 1, prefetch: int = 0,
                 min_batches: int = 8, min_seconds: float = 0.1, cores: int | None = None) -> None:
        self.cores = max(1, cores if cores is not None else usable_cores())
        self.max_threads = max(1, max_threads)
        self.max_window = max(1, max_window)
        self.threads = max(1, min(threads, self.max_threads, self.max_window))
        self.prefetch = max(0, min(prefetch, self.max_window - self.threads))
        self.min_batches = min_batches
        self.min_seconds = min_seconds
        self.adjustments = 0
        self.reverted = 0
        self.last_reason = "not measured yet"
        self.next_at = 0.0  # the consumer steps the tuner once time passes this
        self._last: Signals | None = None
        self._move: _Move | None = None
        self._calm = 0
        self._prev_wait = 0.0  # the interval before's wait share
        self._cool_until = {"threads": 0.0, "prefetch": 0.0, "down": 0.0}
        self._cool_s = {"threads": COOLDOWN_S, "prefetch": COOLDOWN_S, "down": COOLDOWN_S}
        self.rate = 0.0
        self.wait = 0.0
        self.busy = 0.0
        self.blocked = 0.0

    @property
    def settled(self) -> bool:
        """Whether the last decision raised nothing: the setting is what the tuner found, not a
        step on its way there (no increase waits to be judged, and an interval was measured)."""
        return self._last is not None and self.rate > 0 and \
            (self._move is None or not self._move.up)

    @property
    def window(self) -> int:
        return max(1, min(self.max_window, self.threads + self.prefetch))

    def start(self, signals: Signals) -> None:
        """Begin measuring from ``signals`` (after the first batch: start-up is not a wait)."""
        self._last = signals
        # a latency-bound start is recognised within a few batches (see _early)
        self.next_at = signals.now + self.min_seconds / 4

    def _early(self, last: Signals, signals: Signals, dt: float, db: int) -> bool:
        """Decide before ``min_seconds`` when nothing is being judged and the interval already
        shows the consumer waiting on latency-bound gathers: the gathers' wall and CPU times per
        batch are steady after a few batches (unlike a rate), and the jump they call for is too
        large for one interval's noise to hide."""
        if self._move is not None or db < self.min_batches or dt <= 0 or \
                self.threads >= self.max_threads:
            return False
        wait = (signals.consumer_wait_s - last.consumer_wait_s) / dt
        gather = signals.gather_s - last.gather_s
        off = gather - (signals.gather_cpu_s - last.gather_cpu_s) - \
            max(0.0, signals.runq_s - last.runq_s)
        cpu = signals.busy_s - last.busy_s - off  # the gathers' CPU time and the transforms
        return wait > WAIT_HIGH and off > 0 and off >= IO_BOUND * cpu

    def step(self, signals: Signals) -> bool:
        """One decision from the interval since the last one; True when a knob changed."""
        last = self._last
        if last is None:
            self.start(signals)
            return False
        dt = signals.now - last.now
        db = signals.batches - last.batches
        if (db < self.min_batches or dt < self.min_seconds) and \
                not self._early(last, signals, dt, db):
            self.next_at = signals.now + max(0.0, self.min_seconds - dt) / 2
            return False
        self._last = signals
        self.next_at = signals.now + self.min_seconds
        self.rate = db / dt
        self.wait = min(1.0, (signals.consumer_wait_s - last.consumer_wait_s) / dt)
        self.busy = min(1.0, (signals.busy_s - last.busy_s) / (dt * self.threads))
        capped = (signals.capped_s - last.capped_s) / dt
        self.blocked = min(1.0, (signals.window_wait_s - last.window_wait_s) / dt)
        ram = signals.ram_wait_s - last.ram_wait_s
        # per batch: the workers' work, and the consumer's own time between batches
        work = (signals.busy_s - last.busy_s) / db
        own = max(dt - (signals.consumer_wait_s - last.consumer_wait_s), 0.0) / db
        # per batch: the gathers' time off the CPU (waiting on I/O), the rest of the work
        gather = (signals.gather_s - last.gather_s) / db
        gather_cpu = (signals.gather_cpu_s - last.gather_cpu_s) / db
        # off the CPU and not waiting for one: I/O, a round trip (the run-queue wait is the
        # threads' whole interval's, so this errs toward "not latency-bound")
        runq = max(0.0, signals.runq_s - last.runq_s) / db
        off = max(0.0, gather - gather_cpu - runq)
        # The rest of the work is on a CPU or waits for one (where no schedstat tells, a gather
        # descheduled on a loaded machine counts as off the CPU, which the transforms' time
        # outweighs unless it is I/O).
        cpu = max(work - off, 0.0)
        before = (self.threads, self.prefetch)
        self._decide(signals.now, capped, ram > 0, work, own, off, cpu)
        return (self.threads, self.prefetch) != before

    # -- the decision ----------------------------------------------------------------------------

    def _decide(self, now: float, capped: float, ram_blocked: bool, work: float,
                own: float, off: float = 0.0, cpu: float = 0.0) -> None:
        move, self._move = self._move, None
        prev, self._prev_wait = self._prev_wait, self.wait
        if move is not None and self._judge(move, now):
            return
        if ram_blocked and self.prefetch > 0:
            self._set("prefetch", self.prefetch - 1, now, up=False,
                      why="producers waited on the RAM cap")
            return
        if self.wait > WAIT_HIGH:
            self._calm = 0
            if self.wait >= WAIT_STRONG or (self.wait + prev) / 2 > WAIT_HIGH:
                self._grow(now, capped, work, own, off, cpu)
            else:
                self.last_reason = (f"watching: the consumer waited {self.wait:.1%}, "
                                    f"{prev:.1%} the interval before (a step needs over "
                                    f"{WAIT_HIGH:.0%} over both, or {WAIT_STRONG:.0%} in one)")
            return
        if self.wait < WAIT_LOW:
            self._calm += 1
            if self._calm >= CALM:
                self._calm = 0
                self._shrink(now)
            else:
                self.last_reason = f"holding: the consumer waited {self.wait:.1%}"
            return
        self._calm = 0
        self.last_reason = f"holding: the consumer waited {self.wait:.1%}"

    def _judge(self, move: _Move, now: float) -> bool:
        """Undo ``move`` when it did not pay; True when it was undone."""
        if move.up:
            gained = self.rate >= move.rate_before * (1 + GAIN)
            # a jump whose prediction holds is kept unless the rate actually fell
            held = move.predicted > 0 and self.rate >= HOLDS * move.predicted and \
                self.rate >= move.rate_before
            held = held or (move.signalled and self.rate >= move.rate_before * (1 - FELL))
            # a consumer that waits half as much is what the step is for, whatever the rate
            # (a slow consumer's rate moves by less than the noise when its waits shrink)
            eased = self.wait < WAIT_LOW or self.wait <= move.wait_before / 2
            if gained or held or eased:
                return False
            why = (f"{move.knob} {getattr(self, move.knob)} -> {move.before}: the rate went "
                   f"{move.rate_before:.1f} -> {self.rate:.1f} batches/s (< +{GAIN:.0%})")
            self._undo(move, move.knob, now, why)
            return True
        if self.wait <= WAIT_HIGH:
            return False
        why = (f"{move.knob} {getattr(self, move.knob)} -> {move.before}: the consumer waited "
               f"{self.wait:.1%} after the step down")
        self._undo(move, "down", now, why)
        return True

    def _undo(self, move: _Move, cool: str, now: float, why: str) -> None:
        setattr(self, move.knob, move.before)
        setattr(self, "prefetch" if move.knob == "threads" else "threads", move.other)
        self._clamp()
        self._cool_until[cool] = now + self._cool_s[cool]
        self._cool_s[cool] *= 2
        self.adjustments += 1
        self.reverted += 1
        self.last_reason = "undone " + why

    def _grow(self, now: float, capped: float, work: float, own: float,
              off: float = 0.0, cpu: float = 0.0) -> None:
        if capped > self.wait / 2:
            self.last_reason = (f"at a cap: producers waited {capped:.1%} of the time on the "
                                "byte budget or RAM cap")
            return
        room = self.max_window - self.window
        if self._little(now, work, own, off, cpu, room):
            return
        # Work that runs on a CPU (gathers mostly on it) cannot use more threads than there are
        # CPUs: past them a thread only takes turns (and the consumer builds batches, too).
        on_cpu = off < cpu
        ceiling = min(self.max_threads, self.cores) if on_cpu else self.max_threads
        if self.busy >= BUSY and self.threads < ceiling and now >= self._cool_until["threads"]:
            need = math.ceil(1.1 * work / own) if own > 0 else ceiling
            target = min(ceiling, 2 * self.threads, max(need, self.threads + 1))
            # the new threads need room in the window: take it from the prefetch if needed
            target = min(target, self.threads + room + self.prefetch)
            if target > self.threads:
                grow = target - self.threads
                prefetch, self.prefetch = self.prefetch, max(0, self.prefetch - max(0, grow - room))
                self._set("threads", target, now, up=True, other=prefetch,
                          why=f"the consumer waited {self.wait:.1%}, workers {self.busy:.0%} busy")
                return
        # idle workers: the window is what limits; busy ones at the thread ceiling, or whose
        # last added thread did not pay (the CPUs are saturated): batches that finish out of
        # order need slack, and a window with room lets the waiting consumer build a batch
        # itself, on the CPU time it would otherwise sleep. At most as many batches of prefetch
        # as threads (one finished behind each one in flight): past that a deeper window only
        # absorbs noise, and a step kept on one lucky interval would hold its memory for good.
        # Latency-bound workers are "busy" waiting, not computing: their window is what limits
        # (a slow gather holds up the ones behind it), and it grows by doubling, a step large
        # enough to show above the noise of one interval.
        # A latency-bound window grows only on that direct evidence, up to as many batches of
        # slack as threads: past it the busy share says nothing about the window.
        waits_io = off > 0.0 and off >= IO_BOUND * cpu
        latent = waits_io and self.blocked >= BLOCKED and self.prefetch < self.threads
        saturated = self.threads >= ceiling or now < self._cool_until["threads"]
        plain = not waits_io and (self.busy < BUSY or saturated) and \
            self.prefetch < max(1, self.threads)
        # On-CPU work at its thread ceiling whose dispatcher waits for window room has the same
        # direct evidence as latency-bound work: a batch that finishes late holds up the finished
        # ones behind it while a CPU idles. Such a step, like a latency-bound one, is undone
        # only when the rate fell: judged by a 2% gain, one noisy interval of a loader that
        # already keeps its CPUs busy would decide (and the prefetch would swing between 0 and
        # the threads from interval to interval). The limit stays as many batches as threads.
        windowed = plain and on_cpu and saturated and self.blocked >= BLOCKED
        if room > 0 and now >= self._cool_until["prefetch"] and (latent or plain):
            # at most as much slack as threads: each thread a batch in flight and one finished
            if latent:
                step = min(room, max(1, self.prefetch, self.threads // 4),
                           self.threads - self.prefetch)
            elif self.wait >= WAIT_STRONG:  # the loader is far behind: doubling
                step = min(room, max(1, self.prefetch), max(1, self.threads) - self.prefetch)
            else:
                step = 1
            signalled = latent or windowed
            self._set("prefetch", self.prefetch + step, now, up=True,
                      why=(f"the consumer waited {self.wait:.1%}, workers {self.busy:.0%} busy"
                           + (f", dispatch waited {self.blocked:.0%} for window room"
                              if signalled else "")))
            if signalled:
                assert self._move is not None
                self._move.signalled = True
            return
        self.last_reason = (f"the consumer waited {self.wait:.1%}; nothing left to raise "
                            f"(threads {self.threads}/{self.max_threads}, window "
                            f"{self.window}/{self.max_window}, or cooling down)")

    def _little(self, now: float, work: float, own: float, off: float, cpu: float,
                room: int) -> bool:
        """Latency-bound workers (gathers mostly wait off the CPU): jump straight to the threads
        Little's law needs, ``ceil(work per batch / interval between batches)``, the interval
        being the consumer's own time per batch or what the CPUs allow of the on-CPU work,
        whichever is longer. Stepping there by doublings takes several noisy intervals."""
        if off <= 0.0 or off < IO_BOUND * cpu or self.threads >= self.max_threads or \
                now < self._cool_until["threads"]:
            return False
        interval = max(own, cpu / self.cores, 1e-9)
        need = math.ceil(work / interval)
        target = min(self.max_threads, need, self.threads + room + self.prefetch)
        if target <= self.threads + 1:  # a step the ordinary rules take as well
            return False
        predicted = min(1 / interval, target / work) if work > 0 else 0.0
        grow = target - self.threads
        prefetch, self.prefetch = self.prefetch, max(0, self.prefetch - max(0, grow - room))
        slack = ""
        if need > target:
            # Even the most threads the ceiling allows leave the consumer waiting: the loader
            # stays the limit, and a gather that finishes late holds up the finished ones behind
            # it. Slack of as many batches as threads comes with the jump (the window-wait rule
            # would reach it by doublings, an interval each, of a loader that cannot keep up).
            self.prefetch = max(self.prefetch, min(target, self.max_window - target))
            slack = f" (ceiling {target}), and as many batches of prefetch"
        self._set("threads", target, now, up=True, other=prefetch,
                  why=(f"the consumer waited {self.wait:.1%}, gathers waited {off * 1e3:.1f} ms "
                       f"off the CPU per batch: Little's law needs {need}{slack}"))
        assert self._move is not None
        self._move.predicted = predicted
        return True

    def _shrink(self, now: float) -> None:
        if now < self._cool_until["down"]:
            self.last_reason = f"holding: the consumer waited {self.wait:.1%} (cooling down)"
            return
        if self.prefetch > 0:
            self._set("prefetch", self.prefetch - 1, now, up=False,
                      why=f"the consumer waited {self.wait:.1%}: fewer batches held")
        elif self.threads > 1 and self.busy * self.threads <= BUSY * (self.threads - 1):
            self._set("threads", self.threads - 1, now, up=False,
                      why=f"the consumer waited {self.wait:.1%} with workers {self.busy:.0%} busy")
        else:
            self.last_reason = f"holding: the consumer waited {self.wait:.1%}"

    def _set(self, knob: str, value: int, now: float, *, up: bool, why: str,
             other: int | None = None) -> None:
        """Set ``knob``; ``other``: what the other knob was before, when the step moved it too."""
        before = getattr(self, knob)
        if other is None:
            other = getattr(self, "prefetch" if knob == "threads" else "threads")
        setattr(self, knob, value)
        self._clamp()
        self._move = _Move(knob, before, other, self.rate, up, wait_before=self.wait)
        self.adjustments += 1
        self.last_reason = f"{knob} {before} -> {getattr(self, knob)}: {why}"

    def _clamp(self) -> None:
        self.threads = max(1, min(self.threads, self.max_threads, self.max_window))
        self.prefetch = max(0, min(self.prefetch, self.max_window - self.threads))

    def reset(self, max_window: int) -> None:
        """Keep the setting, start measuring afresh (the engine restarted, e.g. on a new byte
        budget whose room is ``max_window`` batches)."""
        self.max_window = max(1, max_window)
        self._clamp()
        self._last = None
        self._move = None
        self.next_at = 0.0

    def pause(self, now: float) -> None:
        """The workers are parked (the consumer gathers faster alone, ``_engine.solo``): nothing
        to tune meanwhile; measuring starts afresh once they run again (an interval spanning the
        parked time would judge the workers by the consumer's batches)."""
        self._last = None
        self._move = None
        self.next_at = now + self.min_seconds
        self.last_reason = "paused: the consumer gathers alone, faster than with the workers"

    def stats(self) -> dict[str, Any]:
        """The tuner's readings and decisions, for ``stats()``."""
        return {"autotune_threads": self.threads, "autotune_prefetch_batches": self.prefetch,
                "autotune_max_threads": self.max_threads,
                "autotune_max_window_batches": self.max_window,
                "autotune_adjustments": self.adjustments, "autotune_reverted": self.reverted,
                "autotune_last_reason": self.last_reason,
                "autotune_consumer_wait_fraction": self.wait,
                "autotune_worker_busy_fraction": self.busy,
                "autotune_batches_per_second": self.rate}

