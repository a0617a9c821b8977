"""The threaded, ordered, bounded loader.

Pipeline (one direction)::

    worker threads, each in turn:                          reorder buffer ──▶ consumer next()
    [dispatch lock: plan → ids → nbytes → window, RAM, budget]  (dict keyed by   (in batch order,
    then, in parallel: gather + transform (GIL released)         batch number)     releases budget)

Invariants:

* Batch ``k`` is dispatched only after ``k - delivered < window`` and after its bytes are reserved
  in the budget; reservations happen in batch order (one dispatching worker at a time). The batch the consumer waits for is
  therefore always dispatched or dispatchable (everything before it was delivered and released),
  so the loader cannot deadlock on its own cap.
* Delivered batches belong to the consumer and are not counted: the budget is released in
  ``next()``, so a consumer holding batches never stalls the loader (see ``docs/memory.md``).
* Each buffered result carries the stream position after it; ``checkpoint()`` encodes the position
  after the last *delivered* batch, so buffered batches are never counted as consumed.
* Threads hold a reference to the engine only, never to the ``Loader``: when a loader is dropped
  without ``close()`` its ``weakref.finalize`` stops and joins the threads.
* A consumer about to wait dispatches and gathers the next batch itself when that needs no wait
  (``_Engine._inline``): same reservation, same posting, so order, caps and checkpoints do not
  change; a producer-bound loop then pays no thread hand-off for that batch.
* A consumer waiting for a batch checks every ``_LIVENESS_S`` that a worker is still alive, so
  workers killed outside the guarded code give a ``LoaderError``, never a hang.
* An engine whose consumer waits on it times batches with and without its workers and parks
  them while the consumer alone is faster (``_engine.solo``: cheap gathers, where thread
  hand-offs cost more than they save); a consumer that cannot gather without waiting unparks them.
"""

from __future__ import annotations

import os
import threading
import time
import traceback
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from headrace._base.errors import ConfigError, HeadraceError, LoaderError, MemoryCapError
from headrace._engine import checkpoint as _checkpoint
from headrace._engine.autotune import Signals, Tuner, tune_max_threads
from headrace._engine.budget import ByteBudget
from headrace._engine.config import (
    Constraints,
    ResolvedConfig,
    RuntimeConfig,
    default_threads,
    resolve_config,
)
from headrace._engine.history import delivered, token_at, tracked
from headrace._engine.keywords import checked
from headrace._engine.launcher import resolve as resolve_launch
from headrace._engine.seeds import SeededUser, wanted
from headrace._engine.solo import SoloProbe
from headrace._engine.stats import LoaderCounters, print_line
from headrace._engine.timeline import Recorder
from headrace._order.byte_plan import BytePlan
from headrace._order.make import make_order
from headrace._order.order import Mode, Order
from headrace._order.plan import BatchPlan, Step
from headrace._sources.base import Source, is_source, payload_nbytes, record_sizes
from headrace._sources.shared_store import open_data

__all__ = ["Loader"]

Transform = Callable[[dict[str, Any], np.ndarray], Any]
_TAILS = ("partial", "drop", "pad")
_JOIN_TIMEOUT_S = 10.0
_RAM_POLL_S = 0.005
_RAM_SAMPLE_AGE_S = 0.01  # reuse a memory sample this young when far from the RAM cap
_RAM_WAIT_S = 5.0  # how long next() waits on an over-cap process before raising MemoryCapError
_LIVENESS_S = 1.0  # while next() waits, check this often that some worker is still alive


_AHEAD = 2  # batches a parked consumer keeps started on the copy lane
_NO_IDS = np.empty(0, np.int64)
_NO_IDS.flags.writeable = False


@dataclass(slots=True, eq=False)  # compared by identity (``in`` the queue of aheads)
class _Result:
    k: int
    ids: np.ndarray
    nbytes: int
    after: int
    batch: Any = None
    error: BaseException | None = None
    where: str = "worker"
    retry: bool = False  # the consumer was interrupted gathering it: gather it again
    epoch: int = 0  # the epoch of the batch's first sample (for a transform that takes it)
    pending: Any = None  # its gather started on the copy lane (``source.gather_start``)


class _Engine:
    """The worker threads and the state they share. Knows nothing of the ``Loader`` object.

    Workers dispatch for themselves: a worker waits for room in the window, then under
    ``dispatch_lock`` (one worker at a time) takes the next step of the plan, computes its ids and
    bytes, waits for RAM and budget, and only then releases the lock and gathers. Reservation is
    therefore in batch order (no deadlock, see the module docstring) while gathers and transforms
    run in parallel. One hand-off per batch (worker -> consumer) keeps the per-batch overhead low,
    and every wake is for a thread that waits: a post notifies the consumer only while it waits
    (``consumer_waits``), a delivery notifies a worker only while one waits for room
    (``idle_workers``). Each wake of a sleeping thread costs futex calls and GIL hand-offs, and
    on a shared machine a vCPU that idles comes back with cold caches.
    """

    def __init__(self, *, source: Source, order: Order | None, offset: int, steps: Iterator[Step],
                 transform: Transform | None, transform_nbytes: Callable[[int], int] | None,
                 cfg: ResolvedConfig, budget: ByteBudget, counters: LoaderCounters,
                 length: int = 0, tuner: Tuner | None = None,
                 work_key: Any = None) -> None:
        self.source = source
        self.order = order
        self.offset = offset
        self.transform = transform
        # a seeded user transform (``_engine.seeds``) is called with the batch's epoch
        self.takes_epoch = bool(getattr(transform, "takes_epoch", False))
        self.length = length
        self.transform_nbytes = transform_nbytes
        self.cfg = cfg
        # A tuned engine starts every thread it may use and parks those past ``active``
        # (``resize``); the window is the tuner's. Either way batches reserve bytes as always.
        count = cfg.threads if tuner is None else tuner.max_threads
        self.active = cfg.threads if tuner is None else tuner.threads
        self.window = cfg.window_batches if tuner is None else tuner.window
        self.budget = budget
        self.counters = counters
        # Reentrant only so that the consumer can tell whether it holds it: a Ctrl-C that lands
        # while ``Condition.wait`` takes the lock back leaves it untaken (see _consumer_wait).
        self.lock = threading.RLock()
        self.ready_cv = threading.Condition(self.lock)  # the consumer waits here
        self.space_cv = threading.Condition(self.lock)  # workers wait here for room
        self.dispatch_cv = threading.Condition(self.lock)  # the dispatch_lock holder waits here
        self.dispatcher_waits = False  # the dispatch_lock holder is in dispatch_cv.wait (locked)
        self.park_cv = threading.Condition(self.lock)  # workers past ``active`` wait here
        # re-entrant only so that its owner can be asked (``_dispatch_if_free``)
        self.dispatch_lock = threading.RLock()
        self.ready: dict[int, _Result] = {}
        self.next_dispatch = 0
        self.next_deliver = 0
        self.reserved = 0  # bytes of dispatched batches not yet delivered (under lock)
        self.window_wait_s = 0.0  # the dispatcher's seconds waiting for room in the window
        # Workers waiting for room in the window (under lock): the consumer's notify wakes one,
        # so the consumer gathers inline only when none is (it would take a woken one's batch).
        self.idle_workers = 0
        self.end_k: int | None = None
        self.closed = False
        self.ram_blocked_since: float | None = None
        self._steps = steps
        # A step taken from the plan whose bytes could not be reserved without waiting (by the
        # consumer's inline dispatch): the next dispatcher starts from it, so no step is skipped.
        self._pending: Step | None = None
        # The batch the consumer reserved for itself (inline dispatch, or a retry it took back
        # from ``ready``) and has not posted yet. A Ctrl-C can land anywhere in the consumer's
        # code; ``take`` puts such a batch back in ``ready`` to be gathered again, so a batch that
        # was reserved is never lost (it would hold the window and the consumer would wait for it
        # forever). Set and cleared only by straight runs of stores, which no signal splits.
        self.inline_task: _Result | None = None
        # threads do not survive fork(): a child must build its own (see _forks)
        self.forks = _FORKS[0]
        self.consumer_waits = False  # the consumer is in ready_cv.wait (under lock)
        # The consumer found ``dispatch_lock`` taken when it meant to gather inline (a worker
        # was dispatching, which takes microseconds): the holder, on release, invites it to try
        # again instead of leaving it asleep until the next post, a whole gather later.
        self.inline_wanted = False
        self.inline_invited = False  # (under lock) set by that release, taken by the consumer
        # Seconds each worker spent in [gather, transform, gather on the CPU]; one slot per
        # worker, so each is written by one thread only and no lock is needed.
        # The last slot is the consumer's (batches it gathers inline, see take()).
        self.busy = [[0.0, 0.0, 0.0] for _ in range(count + 1)]
        self.cpu_clock = tuner is not None  # gather CPU seconds (busy[i][2]) are the tuner's
        self.tids = [0] * count  # each worker's native thread id, for runqueue_seconds()
        # whether the consumer gathers faster alone is measured (``_engine.solo``); parked, no
        # worker runs, whatever the tuner's thread count (``workers``, which applies again after)
        self.lane = getattr(source, "gather_start", None)
        # (a transform the consumer would run alone: its own gathers do predict that)
        self.probe = SoloProbe(settle=self.window + 1, key=work_key,
                               lane=self.lane is not None and transform is None,
                               tuned=tuner is not None)
        # Parked, the consumer starts the next batches' gathers on the copy lane before it
        # hands over the current one (``_start_ahead``): the copies run on a native thread
        # while the consumer does its bookkeeping and its own work, and ``take`` finishes them
        # in order. Reserved as the consumer's own, they stay here until delivered or posted.
        self.aheads: deque[_Result] = deque()
        self.lane_batches = 0  # batches copied on the lane (the consumer's thread counts them)
        self.workers = self.active
        self.parked = self.probe.solo  # the same work went faster solo in this process
        if self.parked:
            self.active = 0
        # batches the consumer gathered itself, and its CPU seconds on them (their wall time,
        # busy[-1], also counts waits for the GIL, which two threads trade on every batch)
        self.own_batches = 0
        self.own_cpu_s = 0.0
        self.threads = [threading.Thread(target=self._work, args=(i,),
                                         name=f"headrace-worker-{i}", daemon=True)
                        for i in range(count)]
        for t in self.threads:
            t.start()

    # -- dispatch (one worker at a time, under dispatch_lock) ------------------------------------

    def _ids(self, step: Step) -> np.ndarray:
        assert self.order is not None
        if step.positions is not None:
            ids = self.order.indices(step.positions)
        else:
            ids = self.order.shared_range(step.start, step.count)  # read-only, maybe shared
        if self.offset:
            ids = ids + self.offset
            ids.flags.writeable = False  # the same either way: sources only read their ids
        return ids

    def _wait_ram(self, nbytes: int) -> bool:
        """Pause while the process's counted RSS plus this batch would pass the RAM cap."""
        cap = self.cfg.max_ram_bytes
        if self._ram_room(nbytes):
            return True
        start = time.monotonic()
        with self.lock:
            self.ram_blocked_since = start
            self.ready_cv.notify_all()
        try:
            while not self.closed:
                if self.counters.sample().counted_bytes + nbytes <= cap:
                    return True
                with self.lock:
                    self.space_cv.wait(_RAM_POLL_S)
            return False
        finally:
            with self.lock:
                self.ram_blocked_since = None
            self.counters.ram_wait_s += time.monotonic() - start

    def _ram_room(self, nbytes: int) -> bool:
        """Whether counted RSS plus ``nbytes`` fits the RAM cap now.

        A sample up to ``_RAM_SAMPLE_AGE_S`` old is reused only when it is far from the cap: so
        far that even the whole byte budget allocated since would not reach it (everything the
        loader allocates is reserved there first). Near the cap every dispatch reads memory
        afresh, so the cap stays hard while a loop far below it reads ``/proc`` every 10 ms.
        """
        cap = self.cfg.max_ram_bytes
        m = self.counters.sample(max_age_s=_RAM_SAMPLE_AGE_S)
        if m.counted_bytes + self.budget.cap_bytes + nbytes <= cap:
            return True
        return self.counters.sample().counted_bytes + nbytes <= cap

    def _next_task(self) -> _Result | None:
        """Reserve the next batch (window, RAM, budget, in batch order); None = stop working.

        A worker waits for room in the window before it takes ``dispatch_lock``: the others then
        wait on the same condition, and the consumer's one ``notify`` per delivered batch wakes
        one worker, instead of waking the lock holder, whose release then wakes the next worker
        only for it to wait on the window again. The lock holder, when it must wait for room
        too, waits on ``dispatch_cv``, which a delivery notifies first: a notify given to a
        worker outside the lock instead would leave the holder asleep and that worker blocked on
        the lock, with the window open and nothing dispatched.
        """
        with self.lock:
            self._wait_window(self.space_cv)
        with self.dispatch_lock:
            task = self._dispatch(wait=True)
        if self.inline_wanted:  # read after the release: see _inline for why none is missed
            with self.lock:
                self.inline_wanted = False
                self.inline_invited = True
                if self.consumer_waits:
                    self.ready_cv.notify()
        return task

    def _wait_window(self, cv: threading.Condition) -> None:
        """Wait (locked) on ``cv`` until the window has room for the next batch, or the engine
        stops. ``dispatch_cv`` is the ``dispatch_lock`` holder's; it sets ``dispatcher_waits``,
        which the delivery that notifies it clears."""
        holder = cv is self.dispatch_cv
        while (not self.closed and self.end_k is None
               and self.next_dispatch - self.next_deliver >= self.window):
            w0 = time.monotonic()
            self.idle_workers += 1
            if holder:
                self.dispatcher_waits = True
            try:
                cv.wait()
            finally:
                self.idle_workers -= 1
                if holder:
                    self.dispatcher_waits = False
            self.window_wait_s += time.monotonic() - w0

    def _dispatch(self, *, wait: bool, window: int = 0) -> _Result | None:
        """Take the next step and reserve its bytes; called under ``dispatch_lock``.

        ``wait=False`` (the consumer's inline dispatch) never blocks: when the window, RAM or
        budget has no room now it leaves the step in ``_pending`` for the next dispatcher and
        returns None. ``window``: the window it may fill, when larger than the engine's.
        """
        with self.lock:
            k = self.next_dispatch
            if wait:
                self._wait_window(self.dispatch_cv)
            elif k - self.next_deliver >= max(self.window, window):
                return None
            if self.closed or self.end_k is not None:
                return None
        step, self._pending = self._pending, None
        if step is None:
            step = next(self._steps, None)
        if step is None:
            with self.lock:
                self.end_k = k
                self.ready_cv.notify_all()
            return None
        ids = _NO_IDS
        try:
            ids = self._ids(step)
            nbytes = int(self.source.nbytes(ids))
            if self.transform_nbytes is not None:
                nbytes += int(self.transform_nbytes(len(ids)))
            if nbytes < 0:
                raise ConfigError(f"batch {k} would need {nbytes} bytes; source.nbytes and "
                                  "transform_nbytes must return sizes >= 0")
            try:  # the message naming the batch is built only when it is raised
                self.budget.check_fits(nbytes)
            except ConfigError:
                self.budget.check_fits(nbytes, what=f"batch {k} ({len(ids)} records)")
                raise
            result = _Result(k, ids, nbytes, step.after,
                             epoch=step.start // self.length if self.length else 0)
            if not wait:
                if not self._ram_room(nbytes) or not self.budget.acquire(nbytes, timeout_s=0.0):
                    self._pending = step
                    return None
                # stores only, no call between them: the consumer's reservation is either all
                # made and known as its own (``inline_task``), or not made at all
                # (and, as no thread switch splits them either, ``reserved`` needs no lock here)
                self.inline_task = result
                self.next_dispatch = k + 1
                self.reserved += nbytes
                return result
            elif not self._wait_ram(nbytes) or not self.budget.acquire(nbytes):
                return None  # closed while waiting
        except BaseException as e:  # posted in order: the consumer raises it at batch k
            if not wait:  # the consumer's own dispatch: ``e`` holds the consumer's frames
                if isinstance(e, KeyboardInterrupt | SystemExit):
                    self._pending = step  # Ctrl-C: nothing was reserved, the step waits
                    raise
                _detach(e)
            self._post(_Result(k, ids, 0, step.after, error=e, where="dispatcher"))
            return None
        with self.lock:
            self.next_dispatch = k + 1
            self.reserved += nbytes
        return result

    # -- workers ---------------------------------------------------------------------------------

    def _work(self, slot: int) -> None:
        busy = self.busy[slot]
        self.tids[slot] = threading.get_native_id()
        while True:
            if slot >= self.active and not self._park(slot):
                return
            try:
                task = self._next_task()
            except BaseException as e:  # e.g. the step plan raised: never leave the consumer waiting
                with self.lock:
                    k = self.next_dispatch
                self._post(_Result(k, np.empty(0, np.int64), 0, 0, error=e, where="dispatcher"))
                return
            if task is None:
                return
            self._run(task, busy)

    def _park(self, slot: int) -> bool:
        """Wait while the tuner keeps worker ``slot`` inactive; False once closed."""
        with self.lock:
            while slot >= self.active and not self.closed:
                self.park_cv.wait()
            return not self.closed

    def resize(self, threads: int, window: int) -> None:
        """Run ``threads`` workers with a window of ``window`` batches (the tuner's setting).

        A smaller window only delays the next dispatch until deliveries catch up; bytes are
        still reserved per batch, so the byte and RAM caps hold through any resize.
        """
        with self.lock:
            self.workers = max(1, min(threads, len(self.threads)))
            self.active = 0 if self.parked else self.workers
            self.window = max(1, window)
            self.park_cv.notify_all()
            self.space_cv.notify_all()
            self.dispatch_cv.notify_all()

    def busy_seconds(self) -> float:
        """Gather and transform seconds of the workers and of the consumer's own gathers."""
        return sum(b[0] + b[1] for b in self.busy)

    def gather_seconds(self) -> tuple[float, float]:
        """Gather seconds: wall time, and the part the gathering threads ran on a CPU (the rest
        waited: on I/O, a remote round trip, a lock)."""
        return sum(b[0] for b in self.busy), sum(b[2] for b in self.busy)

    def runqueue_seconds(self) -> float:
        """Seconds the workers and the calling (consumer) thread waited for a CPU while ready to
        run (Linux schedstat; 0 elsewhere): the part of a gather's time off the CPU that is a
        loaded machine, not I/O. Read once per tuner interval, never per batch."""
        total = 0
        for tid in [t for t in self.tids if t] + [threading.get_native_id()]:
            try:
                with open(f"/proc/self/task/{tid}/schedstat", "rb") as f:
                    total += int(f.read().split()[1])
            except (OSError, IndexError, ValueError):  # no schedstat, or the thread ended
                pass
        return total / 1e9

    def _run(self, task: _Result, busy: list[float], *, inline: bool = False,
             post: bool = True) -> None:
        """Gather and transform one reserved batch, then post it (or its error) in order.

        ``inline``: the consumer runs it. A Ctrl-C there propagates as ``KeyboardInterrupt``
        and leaves the batch to be gathered again by the next ``take``; any other error loses
        its traceback frames (kept as a note), which would otherwise hold the consumer's stack,
        the ``Loader`` included, for as long as the engine keeps the error. ``post=False``: the
        batch (or its error) is left to the caller (``take`` delivers it without the round trip
        through ``ready``); it stays the consumer's ``inline_task`` until then.
        """
        t0 = time.monotonic()
        cpu = self.cpu_clock  # a system call per read: only the tuner uses it
        c0 = time.thread_time() if cpu else 0.0
        try:
            started = task.pending
            if started is not None:
                task.pending = None
                batch = started.wait()
                self.lane_batches += 1
            else:
                batch = self.source.gather(task.ids)
            t1 = time.monotonic()
            busy[0] += t1 - t0
            if cpu:
                busy[2] += time.thread_time() - c0
            if self.transform is not None:
                task.where = "transform"
                # the transform is user code that may keep or edit its ids (e.g. put them in the
                # batch): it gets its own writable copy, not the order's shared read-only block
                if self.takes_epoch:
                    batch = self.transform(batch, task.ids.copy(), task.epoch)  # type: ignore[call-arg]
                else:
                    batch = self.transform(batch, task.ids.copy())
                busy[1] += time.monotonic() - t1
            task.batch = batch
        except BaseException as e:
            if inline:
                if isinstance(e, KeyboardInterrupt | SystemExit):
                    task.retry, task.where = True, "worker"
                    self._post(task)
                    raise
                _detach(e)
            task.error = e
        if post:
            self._post(task)

    def _post(self, result: _Result) -> None:
        with self.lock:
            self._post_locked(result)

    def _post_locked(self, result: _Result) -> None:
        """``_post`` with the lock held."""
        if self.closed:  # e.g. a consumer's inline gather that close() overtook: drop it
            return
        self.ready[result.k] = result
        if self.inline_task is result:  # posted: no longer the consumer's to recover
            self.inline_task = None
        if self.aheads and self.aheads[0] is result:
            self.aheads.popleft()
        if len(self.ready) > self.counters.queue_high_water:
            self.counters.queue_high_water = len(self.ready)
        if result.error is not None and result.where == "dispatcher":
            self.end_k = result.k + 1  # nothing after a failed dispatch
            self.space_cv.notify_all()
            self.dispatch_cv.notify_all()
        if self.consumer_waits and (result.k == self.next_deliver or self.end_k is not None):
            self.ready_cv.notify()

    # -- consumer --------------------------------------------------------------------------------

    def _dispatch_if_free(self, window: int = 0, *, invite: bool = False) -> _Result | None:
        """The consumer's ``_dispatch(wait=False)``, under ``dispatch_lock`` when no worker
        holds it now; else None. ``invite``: ask the holder for an invitation, then look once
        more: the holder reads the flag after its release, so either this second try comes after
        the release and takes the lock, or the holder sees the flag and invites (a spurious
        invite costs one try).

        A Ctrl-C is raised in the consumer's thread right after a C call returns (CPython looks
        for signals there), so it can come between ``acquire`` succeeding and any statement
        that would record it: the ``finally`` releases the lock by asking who owns it. That
        narrows the window to the step between the ask and the release; a lock still left
        taken there is given back on the consumer's next call (it never holds it on entry), so
        the workers' dispatch stops at most until then, not for good."""
        lock = self.dispatch_lock
        if lock._is_owned():  # type: ignore[attr-defined]  # left taken by a Ctrl-C
            lock.release()
        try:
            if not lock.acquire(blocking=False):
                if not invite:
                    return None
                self.inline_wanted = True
                if not lock.acquire(blocking=False):
                    return None
            return self._dispatch(wait=False, window=window)
        finally:
            if lock._is_owned():  # type: ignore[attr-defined]
                lock.release()

    def _inline(self) -> _Result | None:
        """The consumer, about to wait, gathers the next undispatched batch itself; returns it
        gathered (or with its error), not posted, or None when it could not reserve one.

        Only when that needs no wait (no worker is dispatching, and window, RAM and budget have
        room now) and every worker is busy (one waiting for room would take the batch: the
        consumer then waits instead of gathering a later batch while its own is posted). A
        consumer that would otherwise sleep does the work a worker would do, so a producer-bound
        loop pays no thread hand-off for that batch; order, caps and checkpoints are unchanged
        (the batch is reserved and posted exactly as a worker's).
        """
        task = self._dispatch_if_free(invite=True)
        if task is None:
            return None
        if self.parked:  # the probe judges the consumer's own gathers while the workers run
            self._run(task, self.busy[-1], inline=True, post=False)
            return task
        c0 = time.thread_time()
        self._run(task, self.busy[-1], inline=True, post=False)
        self.own_cpu_s += time.thread_time() - c0
        self.own_batches += 1
        return task

    def _check_alive(self) -> None:
        """Raise if every worker thread has exited while batches are still owed (called locked)."""
        if any(t.is_alive() for t in self.threads):
            return
        if self.closed or self.end_k is not None or self.next_deliver in self.ready:
            return
        raise LoaderError(
            f"all {len(self.threads)} loader worker threads exited without delivering batch "
            f"{self.next_deliver} (they were killed or failed outside the loader's error "
            "handling); the loader cannot continue: close it and create a new one "
            "(resume=loader.checkpoint() continues after the last delivered batch)")

    def take(self, ram_wait_s: float) -> _Result | None:
        """The next batch in order, or None at the end / after close.

        The lock is only ever held by ``with`` blocks (never released and re-taken by hand), so
        a ``KeyboardInterrupt`` anywhere here leaves it consistent and the loader usable.
        """
        if _FORKS[0] != self.forks:
            raise LoaderError("this loader was created in another process and its threads did "
                              "not survive fork(); create the loader in the process that "
                              "iterates it (e.g. inside each DataLoader worker)")
        tried_inline = False
        own: _Result | None = None  # gathered by the consumer (``_inline``), not posted yet
        result: _Result | None
        probe = self.probe
        probe.enter(time.monotonic())
        if self.parked and self.lane is not None:
            # before anything is delivered: a Ctrl-C in here loses nothing (a batch reserved
            # and not yet queued is the consumer's ``inline_task``, gathered again)
            self._start_ahead()
        if self.aheads:  # started before: wait for its copy; delivered (or posted) below
            own = self.aheads[0]
            self._run(own, self.busy[-1], inline=True, post=False)
        while True:
            inline = False
            rerun: _Result | None = None
            with self.lock:
                if own is not None:  # the batch the consumer just gathered itself
                    mine, own = own, None
                    if mine.k == self.next_deliver and mine.error is None and not self.closed:
                        if self.inline_task is mine:  # delivered straight, not via ``ready``
                            self.inline_task = None
                        if self.aheads and self.aheads[0] is mine:
                            self.aheads.popleft()
                        self._delivered_locked(mine)
                        result = mine
                        break
                    self._post_locked(mine)  # later than the next (workers run) or failed
                orphan = self.inline_task
                if orphan is not None and orphan not in self.aheads:
                    # a Ctrl-C came between its reservation and its post
                    self.inline_task = None
                    if orphan.k not in self.ready and not self.closed:
                        orphan.retry, orphan.where, orphan.error = True, "worker", None
                        self.ready[orphan.k] = orphan
                k = self.next_deliver
                result = self.ready.get(k)
                if result is not None:
                    if result.retry:
                        rerun = result
                        self.inline_task = rerun  # ours again until it is posted
                        del self.ready[k]
                    else:
                        del self.ready[k]
                        self._delivered_locked(result)
                        break
                elif self.closed or (self.end_k is not None and k >= self.end_k):
                    return None
                elif ((not tried_inline or self.inline_invited) and self.ram_blocked_since is None
                      and not self.idle_workers and self.next_dispatch - k < self.window):
                    self.inline_invited = False
                    inline = True
                else:
                    tried_inline = False
                    self._wait_locked(k, ram_wait_s)
            if rerun is not None:  # interrupted before: this batch is still reserved
                rerun.retry, rerun.error = False, None
                self._run(rerun, self.busy[-1], inline=True)
            elif inline:
                own = self._inline()
                tried_inline = own is None
                if tried_inline and self.parked:
                    self._set_solo(probe.refused())  # a parked worker reserves it, waiting
        self.budget.release(result.nbytes)
        solo = probe.leave(time.monotonic(), self.own_cpu_s, self.own_batches)
        if solo is not None:
            self._set_solo(solo)
        return result

    def _start_ahead(self) -> None:
        """Reserve the next batches (up to ``_AHEAD`` started) as the consumer's own and start
        their gathers on the copy lane (``source.gather_start``); ``take`` waits for each in
        turn. Two, so the lane has the next copy queued while ``take`` waits on one and while
        the program uses the batch it was handed.
        Where the lane cannot copy a batch (first reads verifying records, say), ``take``
        gathers it as before."""
        aheads = self.aheads
        orphan = self.inline_task
        if orphan is not None and orphan not in aheads:
            return  # a Ctrl-C left a reservation behind: ``take`` recovers it first
        while len(aheads) < _AHEAD:
            # the lane's batches may pass a smaller window (no prefetch, one thread: a tuner's
            # first setting): the byte budget and the RAM cap still hold them
            task = self._dispatch_if_free(window=1 + _AHEAD)
            if task is None:
                return
            aheads.append(task)  # recovered from here, not as ``inline_task``, after a Ctrl-C
            assert self.lane is not None
            try:
                task.pending = self.lane(task.ids)
            except Exception:  # the plain gather in ``take`` raises it again, named and in place
                task.pending = None

    def _delivered_locked(self, result: _Result) -> None:
        """Batch ``result`` (the next in order) goes to the consumer: its room in the window is
        free again (called locked; its bytes are released once the lock is let go)."""
        self.next_deliver = result.k + 1
        self.reserved -= result.nbytes
        if self.dispatcher_waits:  # the one worker that can dispatch now
            self.dispatcher_waits = False
            self.dispatch_cv.notify()
        elif self.idle_workers or self.ram_blocked_since is not None:
            self.space_cv.notify()  # a worker waits for this room

    def _set_solo(self, solo: bool) -> None:
        """Park every worker (the consumer gathers alone) or run them again (``workers`` of
        them: all, or as many as the tuner set)."""
        with self.lock:
            self.parked = solo
            self.active = 0 if solo else self.workers
            if not solo:
                self.park_cv.notify_all()

    def _wait_locked(self, k: int, ram_wait_s: float) -> None:
        """Wait (locked) for batch ``k``; raise when the RAM cap or dead workers stop it."""
        blocked = self.ram_blocked_since
        if blocked is not None and self.next_dispatch == k:
            # Nothing in flight and producers paused on the RAM cap: memory the loader
            # does not own is holding the process over the cap.
            if time.monotonic() - blocked >= ram_wait_s:
                m = self.counters.sample()
                raise MemoryCapError(
                    f"process rss {m.counted_bytes} bytes (excluding "
                    f"{m.page_cache_bytes} bytes of page cache) exceeds "
                    f"max_process_rss_bytes {self.cfg.max_ram_bytes} and no batch is in "
                    "flight; free batches the program holds, or raise ram_gb / "
                    "Constraints(max_ram_bytes=...)")
            self._consumer_wait(_RAM_POLL_S * 10)
        elif not self._consumer_wait(_LIVENESS_S):
            self._check_alive()

    def _consumer_wait(self, timeout: float) -> bool:
        """``ready_cv.wait`` (locked) with ``consumer_waits`` set: posts notify only then."""
        self.consumer_waits = True
        try:
            return self.ready_cv.wait(timeout)
        except BaseException:
            # A Ctrl-C while the wait re-took the lock leaves it untaken; the caller's ``with``
            # would then release a lock it does not hold (RuntimeError instead of the Ctrl-C).
            if not self.lock._is_owned():  # type: ignore[attr-defined]
                self.lock.acquire()
            raise
        finally:
            self.consumer_waits = False

    def queue_depth(self) -> int:
        return len(self.ready)

    def in_flight(self) -> int:
        return self.next_dispatch - self.next_deliver

    def shutdown(self) -> None:
        """Stop and join the threads (idempotent; safe from any thread and from a finalizer)."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
            self.ready_cv.notify_all()
            self.space_cv.notify_all()
            self.dispatch_cv.notify_all()
            self.park_cv.notify_all()
        self.budget.close()
        me = threading.current_thread()
        for t in self.threads:
            if t is not me and t.is_alive():
                t.join(_JOIN_TIMEOUT_S)
        with self.lock:
            self.ready.clear()
            held, self.reserved = self.reserved, 0
        self.aheads.clear()  # a copy still running finishes first (its read holds the buffers)
        # Batches reserved but never delivered give their bytes back: a budget shared with other
        # loaders (a mix's share, which outlives this engine) would otherwise lose them for good.
        if held:
            self.budget.release(held)


_FORKS = [0]  # fork()s of this process so far, as seen by its child (a pid read is a syscall)


def _forked() -> None:
    _FORKS[0] += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def as_mode(order: Any) -> Mode:
    if isinstance(order, Mode):
        return order
    if isinstance(order, str):
        try:
            return Mode[order.strip().upper()]
        except KeyError:
            pass
    elif isinstance(order, int) and not isinstance(order, bool):
        try:
            return Mode(order)
        except ValueError:
            pass
    valid = ", ".join(repr(m.name.lower()) for m in Mode)
    raise ConfigError(f"unknown order {order!r}; use one of {valid} (or headrace.Sampler.Mode)")


def resolve_order(order: Any, shuffle: bool) -> Any:
    """``order=`` with ``shuffle=True`` as a spelling of ``order="shuffle"`` (None: sequential)."""
    if not isinstance(shuffle, bool | np.bool_):
        raise ConfigError(f"shuffle must be True or False, got {shuffle!r}")
    if order is None:
        return "shuffle" if shuffle else "sequential"
    if shuffle and as_mode(order) is not Mode.SHUFFLE:
        raise ConfigError(f"shuffle=True conflicts with order={order!r}; pass only one")
    return order


def check_tune(tune: Any) -> bool:
    """``tune=`` as a bool (``None``: off, mx8's unset)."""
    if tune is None:
        return False
    if not isinstance(tune, bool | np.bool_):
        raise ConfigError(f"tune must be True or False, got {tune!r}")
    return bool(tune)


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ConfigError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {value}")
    return int(value)



def _refuse_empty(given: Any, source: Source) -> None:
    """As the image/audio/video/text loaders: empty data is a mistake (a wrong path, an unfinished
    pack), never an epoch that silently yields nothing. An empty range of non-empty data
    (``start == end``, a resume at the end) and a rank with no full batch stay legitimate."""
    if isinstance(given, str | os.PathLike):
        what = repr(os.fspath(given))
    else:
        path = getattr(getattr(source, "store", None), "path", None)
        what = f"store {path!r}" if path is not None else f"the {type(given).__name__} given"
    raise ConfigError(f"{what} holds no records: there is nothing to load; check the path, or "
                      "pack the data before loading it")


def _token_encoder(loader: Loader) -> Callable[[int, int], bytes]:
    """``loader._encode_token`` through a weak reference: the marks each ``next()`` keeps in the
    loader's token log hold this, and a bound method there would tie the loader to itself in a
    cycle only the garbage collector breaks, keeping an abandoned loader's threads running."""
    ref = weakref.ref(loader)

    def encode(position: int, epoch: int) -> bytes:
        alive = ref()
        if alive is None:  # tokens are asked for through their loader, so it is alive
            raise LoaderError("this loader is gone: take tokens from a loader still referenced")
        return alive._encode_token(position, epoch)

    return encode

class Loader:
    """Deterministic, threaded batches from a source, under hard memory caps.

    Example::

        with headrace.Loader("train.hr", batch=256, order="shuffle", seed=1, epochs=None) as ld:
            for step, batch in zip(range(1000), ld):
                train_step(batch["image"], batch["label"])
            token = ld.checkpoint()        # later: Loader(..., resume=token)

    Args:
        source: a ``Source``, a ``Store``, a store path, an array or a dict of arrays.
        batch: records per batch (>= 1).
        order: ``"sequential"`` (circular window; the default), ``"shuffle"`` (a new permutation
            per epoch) or ``"iid"`` (draws with replacement); also a ``Mode`` or its int value.
        shuffle: ``True`` is ``order="shuffle"`` (every loader takes both spellings).
        seed: order seed (0 .. 2**64-1).
        epoch: the first epoch (positions start at ``epoch * N``).
        epochs: how many epochs to read; ``None`` = endless (step-based; batches run across epoch
            boundaries and each epoch is reshuffled).
        drop_last: drop an incomplete last batch of each epoch (same as ``tail="drop"``).
        rank, world_size: read rank ``rank``'s share of the global stream (see
            ``headrace._order.plan.BatchPlan``). ``None`` (default) reads them from the launcher:
            torchrun (``RANK``/``WORLD_SIZE``), a SLURM job step, or ``jax.distributed`` when
            initialized; one process is rank 0 of 1.
        tail: incomplete last global step of an epoch: ``"partial"`` (default for one rank),
            ``"pad"`` (default for several ranks: every rank reads ``ceil(N / world_size)``
            samples, the last batch shorter, fewer than ``world_size`` read twice, as torch's
            ``DistributedSampler``) or ``"drop"`` (full batches only). ``pad`` and ``drop``
            give every rank the same batch count. ``tail`` and ``drop_last`` only matter in
            epoch mode: an endless loader's batches are always full and run across epochs.
        check: compare dataset fingerprint, order, seed, batch, tail and position across ranks
            before reading, through the launcher's engine (``torch.distributed``,
            ``jax.distributed`` or torchrun's store); a difference raises ``ConfigError`` on
            every rank. ``None`` (default): when rank and world size came from the launcher.
            Every rank must then build its loaders in the same sequence; a loader only some
            ranks build passes ``world_size=1``.
        start, end: read only records ``[start, end)`` (the order maps into that range).
        transform: ``fn(batch, ids) -> batch`` (``ids``: the batch's record ids, an int64 array
            of its own), runs in worker threads (or in the consumer's,
            when it gathers a batch itself instead of waiting; see ``docs/memory.md``).
            A transform that declares ``rng`` and/or ``seeds`` parameters also gets a
            ``numpy.random.Generator`` / one ``uint64`` per record, a pure function of
            ``(seed, epoch, record id)``: random augmentations replay exactly on resume.
        transform_nbytes: ``fn(n_records) -> bytes`` the transform allocates (counted in the cap).
        threads: worker threads (default: one fewer than the usable cores, 1..8; the consumer
            gathers too whenever it would wait, see ``default_threads``).
        inflight, ram_gb, queue, prefetch, profile, constraints, runtime: memory and queue knobs,
            resolved as described in ``headrace._engine.config`` and ``docs/memory.md``.
        resume: a token from ``checkpoint()``; continues right after the last delivered batch.
        close_source: close the source with the loader (default: only if the loader opened it).
        budget: a ``ByteBudget`` to reserve from instead of a private one (``headrace.mix`` passes
            each source a share of one cap).
        timeline: record periodic ``stats()`` snapshots for ``stats_timeline()`` /
            ``headrace.plot``: ``True`` (every 0.5 s) or a period in seconds.
        batch_bytes: hard per-batch ceiling on the records' bytes (variable-size fields, see
            ``docs/memory.md``): batches are cut before passing it (still at most ``batch``
            records); a single record larger than it is a ``ConfigError``. Alone, it implies a
            ``target_bytes`` of 90% of it, as in mx8.
        target_bytes: soft per-batch byte target with mx8's rule: a batch ends once it holds
            the target, or, holding 85% of it, before a record that would take it past 115%
            (``_order.byte_plan``).
        tune: adjust the active worker threads (up to ``threads``, or a default ceiling) and
            the prefetch depth while running, to keep the consumer from waiting; batches still
            reserve their bytes, so ``inflight``/``ram_gb`` stay hard caps, and order, batches
            and checkpoints are the same as untuned (``docs/autotune.md``).

    Raises:
        ConfigError: a bad knob, or a cap smaller than one batch (the message says the minimum).
        CheckpointError: ``resume`` was taken on other data, seed, order or batch size.

    One thread consumes a loader (``next()`` is not meant to be called from several threads at
    once); any number of worker threads produce for it.
    """

    @checked("Loader()")
    def __init__(self, source: Any, *, batch: int = 256, order: Any = None,
                 shuffle: bool = False, seed: int = 0, epoch: int = 0, epochs: int | None = 1, drop_last: bool = False,
                 rank: int | None = None, world_size: int | None = None,
                 tail: str | None = None, check: bool | None = None,
                 start: int | None = None, end: int | None = None,
                 transform: Transform | None = None,
                 transform_nbytes: Callable[[int], int] | None = None,
                 threads: int | None = None, inflight: int | None = None,
                 ram_gb: float | None = None, queue: int | None = None,
                 prefetch: int | None = None, profile: str | None = None,
                 constraints: Constraints | None = None, runtime: RuntimeConfig | None = None,
                 resume: bytes | None = None, close_source: bool | None = None,
                 budget: ByteBudget | None = None, timeline: bool | float = False,
                 batch_bytes: int | None = None, target_bytes: int | None = None,
                 tune: bool = False) -> None:
        # The settings as given; budget= lets a mix hand every source one shared byte budget
        # (a _shared_budget.BudgetShare).
        self._init_kwargs = {k: v for k, v in locals().items() if k not in ("self", "source")}
        self._engine: _Engine | None = None
        self._closed = False
        self._ckpt: tuple[str, Callable[[int, int], bytes]] | None = None
        self._encode = _token_encoder(self)
        self._timeline: Recorder | None = None
        self._tuner: Tuner | None = None
        self._tune = check_tune(tune)
        if timeline is True:  # True = the default period, a number = period_s
            self.enable_timeline()
        elif timeline is not False:
            self.enable_timeline(period_s=float(timeline))
        self.batch_size = _check_int("batch", batch, 1)
        self.seed = _check_int("seed", seed, 0)
        self._mode = as_mode(resolve_order(order, shuffle))
        first_epoch = _check_int("epoch", epoch, 0)
        if epochs is not None:
            epochs = _check_int("epochs", epochs, 0)
        if world_size is not None:
            world_size = _check_int("world_size", world_size, 1)
        if rank is not None:
            rank = _check_int("rank", rank, 0)
            if world_size is not None and rank >= world_size:
                raise ConfigError(f"rank must be < world_size, got rank={rank} "
                                  f"world_size={world_size}")
        launch, self._agree = resolve_launch(rank=rank, world_size=world_size, check=check)
        self.rank, self.world_size = launch.rank, launch.world_size
        self._launch = launch
        self.batch_bytes = None if batch_bytes is None else _check_int("batch_bytes", batch_bytes, 1)
        self.target_bytes = (None if target_bytes is None
                             else _check_int("target_bytes", target_bytes, 1))
        by_bytes = self.batch_bytes is not None or self.target_bytes is not None
        if tail is None:
            # Byte-cut batches have no fixed share to pad to: several ranks drop the last
            # incomplete round, so every rank reads the same number of batches.
            tail = "drop" if drop_last else ("partial" if self.world_size == 1
                                             else ("drop" if by_bytes else "pad"))
        elif by_bytes and tail == "pad":
            raise ConfigError('tail="pad" does not apply to byte-aware batches (batch_bytes/'
                              'target_bytes); use tail="drop" or tail="partial"')
        elif drop_last and tail != "drop":
            raise ConfigError(f"drop_last=True conflicts with tail={tail!r}; pass only one")
        if tail not in _TAILS:
            raise ConfigError(f"unknown tail {tail!r}; use one of {', '.join(_TAILS)}")
        self.tail = tail
        self._cfg = resolve_config(profile=profile, inflight=inflight, ram_gb=ram_gb,
                                   queue=queue, prefetch=prefetch, threads=threads,
                                   constraints=constraints, runtime=runtime)
        opened = not is_source(source)
        self.source: Source = open_data(source) if opened else source
        self._owns_source = opened if close_source is None else close_source
        try:
            if len(self.source) == 0:
                _refuse_empty(source, self.source)
            self._setup(first_epoch, epochs, start, end, transform, transform_nbytes, resume)
        except BaseException:
            if self._owns_source:
                self.source.close()
            raise

    def _setup(self, first_epoch: int, epochs: int | None, start: int | None, end: int | None,
               transform: Transform | None, transform_nbytes: Callable[[int], int] | None,
               resume: Any) -> None:
        total = len(self.source)
        lo = 0 if start is None else _check_int("start", start, 0)
        hi = total if end is None else _check_int("end", end, 0)
        if lo > hi or hi > total:
            raise ConfigError(f"invalid range [start={lo}, end={hi}) for a source of {total} "
                              "records; use 0 <= start <= end <= N")
        n = hi - lo
        self.length = n
        self._range = (lo, hi)
        if epochs is None and n == 0:
            raise ConfigError("an endless loader needs at least one record; the source is empty")
        self._epochs = epochs
        self._first_epoch = first_epoch
        self._end_epoch = None if epochs is None else first_epoch + epochs
        self._position = first_epoch * n
        if transform is not None and not getattr(transform, "takes_epoch", False) and \
                wanted(transform):
            transform = SeededUser(transform, self.seed)
        self._transform = transform
        self._transform_nbytes = transform_nbytes
        self._order = make_order(self._mode, n, seed=self.seed) if n else None
        self.last_ids = np.empty(0, np.int64)
        self._counters = LoaderCounters()
        shared = self._init_kwargs.get("budget")  # a mix's share of its one byte budget
        self._budget = shared if shared is not None else ByteBudget(self._cfg.max_inflight_bytes)
        self._ram_wait_s = _RAM_WAIT_S
        # budget wait, gather, transform seconds and lane batches of past engines
        self._done = [0.0, 0.0, 0.0, 0]
        self._done_high = 0
        if resume is not None:
            self._adopt(resume)
        if self._agree:
            self._agree_with_ranks()
        self._plan = self._make_plan()
        self._check_first_batch()
        if self._tune:
            self._make_tuner()
        self._start()

    def _adopt(self, token: Any) -> None:
        """Move to where ``token`` (bytes or a state dict) says, adopting its epochs."""
        tok = _checkpoint.decode(token)
        _checkpoint.validate(tok, self._state(self._position))
        self._first_epoch, self._end_epoch = _checkpoint.adopt_epochs(
            tok, first_epoch=self._first_epoch, epochs=self._epochs)
        self._position = tok.position

    def _epoch_sizes(self, epoch: int) -> np.ndarray:
        """Bytes of every record of ``epoch`` in read order; a record past ``batch_bytes`` is
        refused here, before any batch of that epoch is read."""
        assert self._order is not None
        ids = self._order.range(epoch * self.length, self.length) + self._range[0]
        sizes = record_sizes(self.source, ids)
        if self.batch_bytes is not None:
            over = np.flatnonzero(sizes > self.batch_bytes)
            if len(over):
                j = int(over[0])
                raise ConfigError(f"record {int(ids[j])} has {int(sizes[j])} bytes > batch_bytes "
                                  f"{self.batch_bytes}; raise batch_bytes to at least "
                                  f"{int(sizes.max())} (the largest record) or leave it unset")
        return sizes

    def _make_plan(self) -> BatchPlan | BytePlan:
        n = self.length
        if self.batch_bytes is not None or self.target_bytes is not None:
            return BytePlan(length=n, batch=self.batch_size, rank=self.rank,
                            world_size=self.world_size, tail=self.tail,
                            start_position=self._position,
                            end_position=None if self._end_epoch is None else self._end_epoch * n,
                            sizes=self._epoch_sizes, batch_bytes=self.batch_bytes,
                            target_bytes=self.target_bytes)
        return BatchPlan(length=n, batch=self.batch_size, rank=self.rank,
                         world_size=self.world_size, tail=self.tail,
                         start_position=self._position,
                         end_position=None if self._end_epoch is None else self._end_epoch * n)

    def _start(self) -> None:
        """Start the threads reading from ``_position`` (after ``_plan`` was made for it)."""
        self._exhausted = self._finished = False
        self._failed: str | None = None
        self._fresh = True  # nothing delivered since this start
        self._engine = _Engine(source=self.source, order=self._order, offset=self._range[0],
                               steps=self._plan.steps(), transform=self._transform,
                               transform_nbytes=self._transform_nbytes, cfg=self._cfg,
                               budget=self._budget, counters=self._counters,
                               length=self.length, tuner=self._tuner,
                               work_key=self._work_key())
        self._finalizer = weakref.finalize(self, _finalize, self._engine, self.source,
                                           self._owns_source)

    def _work_key(self) -> Any:
        """What names this loader's work for the solo probe's verdicts (``_engine.solo``): the
        data (its ``work_state``, which may say whether its reads still verify records, or its
        fingerprint), the batch, the threads, the transform object and whether it is tuned."""
        state = getattr(self.source, "work_state", None)  # optional (``Source``)
        return (type(self.source).__qualname__,
                state() if callable(state) else self.source.fingerprint, self.batch_size,
                self._cfg.threads, id(self._transform) if self._transform is not None else None,
                self._tuner is not None)

    def _restart(self, budget: ByteBudget | None = None) -> None:
        """Stop the threads and start again from ``_position`` (the source stays open), on
        ``budget`` when given (``headrace.mix`` moves a source onto a share this way)."""
        if self._closed:
            raise LoaderError("this loader is closed; create a new one (pass "
                              "resume=loader.checkpoint() to continue where it was)")
        self._finalizer.detach()
        old = self._engine
        if old is not None:
            old.shutdown()
            # stats() counters stay cumulative across restarts (the timeline derives rates)
            self._done[0] += self._budget.wait_seconds
            self._done[1] += sum(b[0] for b in old.busy)
            self._done[2] += sum(b[1] for b in old.busy)
            self._done[3] += old.lane_batches
        self._done_high = max(self._done_high, self._budget.high_water_bytes)
        # The stopped threads may keep bytes reserved they will never release: start on a fresh
        # budget (a mix's share is renewed the same way, see BudgetShare.renew).
        if budget is None:
            renew = getattr(self._budget, "renew", None)
            budget = renew() if renew is not None else ByteBudget(self._cfg.max_inflight_bytes)
        self._budget = budget
        self._plan = self._make_plan()
        if self._tuner is not None:  # what the tuner learnt holds; measuring starts afresh
            self._tuner.reset(self._window_room())
        self._start()

    # -- autotune --------------------------------------------------------------------------------

    def _window_room(self) -> int:
        """The most batches a tuned window may hold: the queue cap, and as many of the largest
        batch measured as the byte budget holds (more could only wait on the budget)."""
        need = max(1, self._batch_need())
        return max(1, min(self._cfg.max_queue_batches, self._budget.cap_bytes // need))

    def _make_tuner(self) -> None:
        cfg = self._cfg
        given = cfg.threads if cfg.sources["threads"] == "threads=" else None
        self._tuner = Tuner(max_threads=tune_max_threads(given, default_threads()),
                            max_window=self._window_room())

    def _signals(self, engine: _Engine, now: float) -> Signals:
        c = self._counters
        gather_s, gather_cpu_s = engine.gather_seconds()
        return Signals(now=now, batches=c.delivered_batches, consumer_wait_s=c.consumer_wait_s,
                       busy_s=engine.busy_seconds(), gather_s=gather_s, gather_cpu_s=gather_cpu_s,
                       window_wait_s=engine.window_wait_s, runq_s=engine.runqueue_seconds(),
                       capped_s=self._budget.wait_seconds + c.ram_wait_s,
                       ram_wait_s=c.ram_wait_s)

    def _tune_step(self, engine: _Engine, now: float) -> None:
        tuner = self._tuner
        assert tuner is not None
        if engine.parked:
            tuner.pause(now)
        elif tuner.step(self._signals(engine, now)):
            engine.resize(tuner.threads, tuner.window)
        # paused, the tuner is unsettled until it measured again after the workers restart: no
        # trial of the consumer alone meanwhile
        engine.probe.hold = not tuner.settled

    def _enable_tune(self) -> None:
        """Turn autotuning on, in place (``headrace.mix(tune=True)`` does it for its sources):
        the threads restart at the delivered position."""
        if self._tuner is not None:
            return
        if self._closed:
            raise LoaderError(self._why_over())
        self._tune = True
        self._make_tuner()
        self._restart()

    def _agree_with_ranks(self) -> None:
        """Every rank must read the same data in the same order with the same batch and tail,
        from the same position: exchanged through the launcher's engine, refused on every rank
        when any differs (``headrace._engine.agree``)."""
        from headrace._engine.agree import agree

        lo, hi = self._range
        agree(self._launch, {
            "fingerprint": _checkpoint.fingerprint_key(self.source.fingerprint),
            "length": self.length, "start": lo, "end": hi, "order": self._mode.name.lower(),
            "seed": self.seed, "batch": self.batch_size, "epoch": self._first_epoch,
            "epochs": self._epochs, "tail": self.tail, "position": self._position,
            "world_size": self.world_size,
        }, what="the dataset, order and batch")

    def _check_first_batch(self) -> None:
        """A cap smaller than one batch is an error now, with the minimum, never a hang later."""
        need = self._batch_need()
        if need > self._cfg.max_inflight_bytes:
            count = min(self.batch_size, self.length)
            raise ConfigError(
                f"max_inflight_bytes {self._cfg.max_inflight_bytes} "
                f"({self._cfg.sources['max_inflight_bytes']}) is smaller than one batch of "
                f"{count} records ({need} bytes); raise inflight to at least {need} bytes or "
                "lower batch")

    def _batch_need(self) -> int:
        """Bytes one full batch reserves, measured where this rank's next batch starts (0 when
        nothing is left): exact for fixed-shape records; with ragged records a later, larger
        batch is caught when it comes. ``headrace.mix`` sizes a source's guaranteed share by it."""
        first = next(self._make_plan().steps(), None)
        if self._order is None or first is None:
            return 0
        count = first.count if self.batch_bytes or self.target_bytes else min(self.batch_size,
                                                                              self.length)
        need = int(self.source.nbytes(self._order.range(first.start, count) + self._range[0]))
        if self._transform_nbytes is not None:
            need += int(self._transform_nbytes(count))
        return need

    def _use_budget(self, budget: ByteBudget) -> None:
        """Reserve from ``budget`` from now on (a ``headrace.mix`` share), in place: the threads
        restart at the delivered position; prefetched batches are read again."""
        self._restart(budget=budget)

    def _state(self, position: int) -> _checkpoint.LoaderState:
        n = self.length
        return _checkpoint.LoaderState(
            position=position, epoch=position // n if n else self._first_epoch,
            seed=self.seed, order=self._mode.name.lower(), batch=self.batch_size, length=n,
            start=self._range[0], end=self._range[1], fingerprint=self.source.fingerprint,
            rank=self.rank, world_size=self.world_size)

    # -- iteration -------------------------------------------------------------------------------

    def __iter__(self) -> Loader:
        """The loader itself; a loader that has delivered all its epochs refuses a new pass.

        A ``for`` over a loader part-way through continues where it is. Once every epoch was
        delivered, a new ``for`` raises ``LoaderError`` (never an empty pass): call
        ``set_epoch(e)`` to read from epoch ``e`` again.
        """
        if self._finished or self._failed is not None or self._closed:
            raise LoaderError(self._why_over())
        return self

    def _why_over(self) -> str:
        if self._closed:
            return ("this loader is closed; create a new one (resume=loader.checkpoint() "
                    "continues after the last delivered batch)")
        if self._failed is not None:
            return (f"this loader stopped at an error ({self._failed}); create a new one "
                    "(resume=loader.checkpoint() continues after the last delivered batch)")
        last = self._end_epoch - 1 if self._end_epoch is not None else self._first_epoch
        span = (f"epoch {last}" if last == self._first_epoch
                else f"epochs {self._first_epoch}..{last}")
        return (f"this loader has delivered all its epochs ({span}); call "
                f"loader.set_epoch(E) to read epoch E again, or build it with "
                f"epochs=None (endless) or epochs=N")

    @tracked
    def __next__(self) -> Any:
        engine = self._engine
        if engine is None or self._exhausted:
            raise StopIteration
        t0 = time.monotonic()
        result = engine.take(self._ram_wait_s)
        waited = time.monotonic() - t0
        if result is None:
            self._exhausted = True
            self._finished = not self._closed
            engine.shutdown()
            if self._timeline is not None:
                self._timeline.record(self.stats())  # the end of the run
            raise StopIteration
        if result.error is not None:
            self._exhausted = True
            engine.shutdown()
            err = result.error
            result.error = None  # the engine keeps no reference to it (nor its frames)
            if isinstance(err, KeyboardInterrupt | SystemExit):
                self._failed = type(err).__name__
                raise err
            wrapped = _wrap_error(result, err)
            self._failed = f"{type(err).__name__} in batch {result.k}"
            if wrapped is err:
                raise wrapped
            raise wrapped from err
        self._position = result.after
        self.last_ids = result.ids
        self._fresh = False
        self._counters.on_delivery(samples=len(result.ids), nbytes=payload_nbytes(result.batch),
                                   waited_s=waited)
        now = t0 + waited
        tuner = self._tuner
        if tuner is not None and now >= tuner.next_at:  # one compare per batch otherwise
            self._tune_step(engine, now)
        tl = self._timeline
        if tl is not None and now >= tl.next_at:  # one compare per batch otherwise
            tl.record(self.stats())
        return result.batch

    # -- state -----------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Where the delivered stream ends, as a JSON-able dict (``checkpoint()``'s token, decoded).

        The torchdata ``StatefulDataLoader`` convention: save it with the model, give it back to
        ``load_state_dict`` (or ``resume=``) to continue right after the last delivered batch.
        """
        return _checkpoint.as_state(self.checkpoint())

    def load_state_dict(self, state: Any) -> None:
        """Continue from ``state`` (a ``state_dict()`` or a ``checkpoint()`` token), in place.

        Batches buffered but not delivered are dropped and read again from the restored
        position. The token's epoch is adopted: restoring a token of epoch 2 into a loader
        built with ``epoch=0, epochs=1`` reads the rest of epoch 2.

        Raises:
            CheckpointError: the state was taken on other data, seed, order or batch size.
            LoaderError: the loader is closed.
        """
        if self._closed:
            raise LoaderError(self._why_over())
        self._adopt(state)
        self._restart()

    def set_epoch(self, epoch: int) -> None:
        """Rewind to the start of ``epoch``: the next ``for`` reads epochs ``epoch`` ..
        ``epoch + epochs - 1`` (``DistributedSampler.set_epoch``'s spelling).

        A loader that has delivered nothing since it was built (or last rewound) at that epoch
        keeps the batches it already prefetched.
        """
        e = _check_int("epoch", epoch, 0)
        if self._closed:
            raise LoaderError(self._why_over())
        at = e * self.length
        same = e == self._first_epoch and self._position == at
        self._first_epoch = e
        self._end_epoch = None if self._epochs is None else e + self._epochs
        self._position = at
        if same and self._fresh and self._failed is None and not self._exhausted:
            return
        self._restart()

    def __len__(self) -> int:
        """Batches this loader yields from where it started (a resumed loader: the rest)."""
        return self._plan.count()

    @property
    def epoch(self) -> int:
        """The epoch of the next batch to deliver; once every epoch was delivered, the last one
        (a loader built with ``epoch=4`` says 4 after its run, not 5)."""
        if not self.length:
            return self._first_epoch
        e = self._position // self.length
        if self._end_epoch is not None and e >= self._end_epoch:
            return max(self._first_epoch, self._end_epoch - 1)
        return e

    @property
    def position(self) -> int:
        """Global position of the first sample not yet delivered (what ``checkpoint()`` saves)."""
        return self._position

    @property
    def config(self) -> ResolvedConfig:
        """The resolved memory/queue knobs and where each came from."""
        return self._cfg

    def checkpoint(self, at: int | None = None) -> bytes:
        """A token (<= 1 KB) for ``resume=``: continues right after the last delivered batch.

        ``at=i``: the token that resumes at delivered batch ``i`` (0-based, counted since this
        loader was built; ``delivered`` is how many it has delivered), for loops that fetch
        ahead: ``checkpoint(at=loader.delivered - 1)`` resumes at the batch fetched but not yet
        trained on. The last 256 batches' tokens are kept.
        """
        if at is not None:
            return token_at(self, at)
        encode, pos, epoch = self._token_mark()
        return encode(pos, epoch)

    def _token_mark(self) -> tuple[Callable[[int, int], bytes], int, int]:
        """``(encode, position, epoch)``: ``encode(position, epoch)`` is ``checkpoint()`` now.
        Each ``next()`` keeps one (``history.tracked``) and encodes it only if asked."""
        pos, n = self._position, self.length
        return self._encode, pos, pos // n if n else self._first_epoch

    def _encode_token(self, position: int, epoch: int) -> bytes:
        """The token at ``position``. The source's fingerprint is read here, when a token is
        asked for, not at every ``next()``: a store's is hashed on first use."""
        fp = self.source.fingerprint
        ck = self._ckpt
        if ck is None or ck[0] != fp:  # serialize the constant part once
            ck = self._ckpt = (fp, _checkpoint.encoder(self._state(self._position)))
        return ck[1](position, epoch)

    @property
    def delivered(self) -> int:
        """Batches this loader object has delivered (the index ``checkpoint(at=)`` counts)."""
        return delivered(self)

    # -- stats -----------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters and memory figures; every key is documented in ``docs/memory.md``."""
        self._counters.sample()
        s = self._counters.snapshot()
        engine = self._engine
        blocked = engine.ram_blocked_since if engine else None
        if blocked is not None:  # include a wait still in progress
            s["ram_wait_seconds"] += time.monotonic() - blocked
        cfg = self._cfg
        status = ("CLOSED" if self._closed else "DONE" if self._exhausted
                  else "RUNNING" if s["delivered_batches_total"] else "WARMING")
        s.update({
            "status": status,
            "mode": "local",
            "epoch": self.epoch,
            "position": self._position,
            "inflight_bytes": self._budget.used_bytes,
            "inflight_high_water_bytes": max(self._budget.high_water_bytes, self._done_high),
            "max_inflight_bytes": cfg.max_inflight_bytes,
            "max_process_rss_bytes": cfg.max_ram_bytes,
            "budget_wait_seconds": self._budget.wait_seconds + self._done[0],
            "gather_busy_seconds": sum(b[0] for b in engine.busy) + self._done[1] if engine
            else self._done[1],
            "transform_busy_seconds": sum(b[1] for b in engine.busy) + self._done[2] if engine
            else self._done[2],
            "queue_depth": engine.queue_depth() if engine else 0,
            "batches_in_flight": engine.in_flight() if engine else 0,
            "batch_size_samples": self.batch_size,
            "max_queue_batches": cfg.max_queue_batches,
            "prefetch_batches": cfg.prefetch_batches,
            "effective_max_queue_batches": cfg.window_batches,
            "threads": cfg.threads,
            "workers_parked": bool(engine.parked) if engine else False,
            "lane_batches_total": (engine.lane_batches if engine else 0) + int(self._done[3]),
            "profile": cfg.profile,
            "want": cfg.want,
            "rank": self.rank,
            "world_size": self.world_size,
        })
        tuner = self._tuner
        if tuner is not None:  # the tuner's current setting replaces the fixed one
            s["autotune_enabled"] = True
            s.update(tuner.stats())
            s["threads"] = tuner.threads
            s["prefetch_batches"] = tuner.prefetch
            s["effective_max_queue_batches"] = tuner.window
        return s

    def enable_timeline(self, *, period_s: float = 0.5, capacity: int = 512) -> None:
        """Record a snapshot of ``stats()`` every ``period_s`` seconds (see ``stats_timeline()``).

        Sampling happens in ``next()`` once the period has passed (one clock compare per batch
        otherwise); at most ``capacity`` snapshots are kept: when full, every other one is dropped
        and the period doubles, so a long run stays covered end to end in bounded memory.
        """
        self._timeline = Recorder(period_s=period_s, capacity=capacity)

    def stats_timeline(self) -> dict[str, Any]:
        """The recorded snapshots as a JSON-serializable dict (``headrace.plot`` draws it).

        Raises:
            ConfigError: the timeline was never enabled (``timeline=True`` or ``enable_timeline``).
        """
        if self._timeline is None:
            raise ConfigError("this loader records no timeline; pass Loader(..., timeline=True) "
                              "or call loader.enable_timeline() before iterating")
        return self._timeline.export(self.stats(), kind="loader")

    def print_stats(self) -> None:
        """One line on stderr: batches, samples, inflight, RSS, high water, rate, consumer wait."""
        print_line(self.stats())

    # -- lifecycle -------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop and join the threads, release the source if the loader opened it (idempotent)."""
        self._closed = True
        self._exhausted = True
        fin = getattr(self, "_finalizer", None)
        if fin is not None:
            fin()
        elif self._engine is None and getattr(self, "_owns_source", False):
            self.source.close()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Loader({self.source!r}, batch={self.batch_size}, "
                f"order={self._mode.name.lower()!r}, seed={self.seed}, position={self._position})")


def _finalize(engine: _Engine, source: Source, owned: bool) -> None:
    engine.shutdown()
    if owned:
        source.close()


def _detach(err: BaseException) -> None:
    """Drop the traceback frames of ``err`` and of its causes, keeping them as a note.

    A frame references the frame that called it, so a stored error raised under the consumer's
    ``next()`` keeps that whole stack alive (the ``Loader`` in it): an abandoned loader would
    then never be collected and its threads never stopped.
    """
    tb = err.__traceback__
    if tb is not None:
        err.add_note("traceback in the loader (most recent call last):\n"
                     + "".join(traceback.format_tb(tb)).rstrip())
    seen: set[int] = set()
    todo: list[BaseException | None] = [err]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        e.__traceback__ = None
        todo += [e.__cause__, e.__context__]
        todo += list(getattr(e, "exceptions", ()))


def _wrap_error(result: _Result, err: BaseException) -> HeadraceError:
    if isinstance(err, ConfigError):  # a batch over the cap: the message already says the fix
        return err
    ids = result.ids.tolist()
    shown = ids[:16] + (["..."] if len(ids) > 16 else [])
    wrapped = LoaderError(f"{type(err).__name__} in the loader's {result.where} for batch "
                          f"{result.k}: {err}", record_ids=ids)
    wrapped.add_note(f"record ids of the failed batch: {shown}")
    err.add_note(f"headrace: raised in the loader's {result.where} for record ids {shown}")
    return wrapped
