"""The autotuner (``tune=True``): its decisions on measured signals, and a tuned loader's
guarantees: the same batches and checkpoints as untuned, the caps never passed."""

from __future__ import annotations

import time

import numpy as np
import pytest

import headrace
from headrace._engine.autotune import GAIN, Signals, Tuner


class Feed:
    """Cumulative signals of a pipeline whose behaviour each interval is given: ``rate`` batches/s,
    the consumer waiting ``wait`` of the time, workers busy ``busy`` of the active threads' time."""

    def __init__(self, tuner: Tuner) -> None:
        self.tuner = tuner
        self.s = Signals(now=0.0, batches=0, consumer_wait_s=0.0, busy_s=0.0, capped_s=0.0,
                         ram_wait_s=0.0)
        tuner.start(self.s)

    def run(self, *, rate: float, wait: float, busy: float, capped: float = 0.0,
            ram: float = 0.0, dt: float = 0.2) -> bool:
        s = self.s
        self.s = Signals(now=s.now + dt, batches=s.batches + max(1, round(rate * dt)),
                         consumer_wait_s=s.consumer_wait_s + wait * dt,
                         busy_s=s.busy_s + busy * dt * self.tuner.threads,
                         capped_s=s.capped_s + (capped + ram) * dt,
                         ram_wait_s=s.ram_wait_s + ram * dt)
        return self.tuner.step(self.s)


def test_a_waiting_consumer_with_busy_workers_gets_more_threads_while_they_pay() -> None:
    t = Tuner(max_threads=8, max_window=64, cores=8)
    f = Feed(t)
    rate = 100.0
    assert f.run(rate=rate, wait=0.9, busy=1.0) and t.threads == 2
    for _ in range(4):  # each thread adds throughput until 4: then the rate stops rising
        rate = 100.0 * min(t.threads, 4)
        f.run(rate=rate, wait=0.5, busy=1.0)
    assert t.threads == 4, t.last_reason
    assert t.reverted == 1  # the step past 4 was tried and undone
    # the machine is saturated: a deeper window is tried once, does not pay either, is undone
    assert t.prefetch == 1 and t.last_reason.startswith("prefetch 0 -> 1"), t.last_reason
    f.run(rate=400.0, wait=0.5, busy=1.0)
    assert (t.threads, t.prefetch) == (4, 0) and t.reverted == 2, t.last_reason
    settings = []
    for _ in range(11):  # retried only after cooldowns that double: 2 tries of each in 2.2 s
        f.run(rate=400.0, wait=0.5, busy=1.0)
        settings.append((t.threads, t.prefetch))
    assert settings.count((8, 0)) == 2 and settings.count((4, 1)) == 2, settings
    assert settings[-1] == (4, 0) and t.reverted == 6
    assert "nothing left to raise" in t.last_reason


def test_a_deeper_window_that_pays_is_kept_when_threads_do_not() -> None:
    t = Tuner(max_threads=8, max_window=64, threads=4, cores=8)
    f = Feed(t)
    f.run(rate=200.0, wait=0.9, busy=1.0)
    assert t.threads == 8
    f.run(rate=200.0, wait=0.9, busy=1.0)  # four more threads did not pay: undone
    assert (t.threads, t.prefetch) == (4, 0), t.last_reason
    f.run(rate=200.0, wait=0.9, busy=1.0)  # the consumer waits hard: the window doubles
    assert (t.threads, t.prefetch) == (4, 1), t.last_reason
    seen = []
    for _ in range(12):  # each doubling pays, up to as many batches as threads; threads do not
        f.run(rate=200.0 + 20 * t.prefetch, wait=0.9, busy=1.0)
        seen.append((t.threads, t.prefetch))
    assert (4, 4) in seen and seen[-1] == (4, 4), seen
    assert max(p for _, p in seen) == 4, seen


def test_work_on_the_cpu_gets_no_more_threads_than_cpus() -> None:
    t = Tuner(max_threads=8, max_window=64, cores=2)
    f = Feed(t)
    f.run(rate=100.0, wait=0.9, busy=1.0)
    assert t.threads == 2, t.last_reason
    for _ in range(3):  # the work would scale further, but 2 CPUs run 2 threads at a time
        f.run(rate=100.0 * t.threads, wait=0.9, busy=1.0)
        assert t.threads == 2, t.last_reason


def test_one_interval_of_a_little_wait_costs_no_memory() -> None:
    t = Tuner(max_threads=8, max_window=64)
    f = Feed(t)
    assert not f.run(rate=200.0, wait=0.08, busy=0.3) and t.window == 1, t.last_reason
    assert t.last_reason.startswith("watching"), t.last_reason
    assert not f.run(rate=200.0, wait=0.0, busy=0.3) and t.window == 1
    assert not f.run(rate=200.0, wait=0.08, busy=0.3) and t.window == 1
    # the consumer waits again: over both intervals it waited more than 5%
    assert f.run(rate=200.0, wait=0.08, busy=0.3) and t.window == 2, t.last_reason


def test_an_increase_that_does_not_pay_is_undone_and_not_retried_at_once() -> None:
    t = Tuner(max_threads=8, max_window=64)
    f = Feed(t)
    f.run(rate=100, wait=0.9, busy=1.0)
    assert t.threads == 2
    f.run(rate=100 * (1 + GAIN / 2), wait=0.9, busy=1.0)  # no gain from the second thread
    assert t.threads == 1 and t.reverted == 1 and t.last_reason.startswith("undone threads 2 -> 1")
    f.run(rate=100, wait=0.9, busy=1.0)  # inside the cooldown: threads stay
    assert t.threads == 1


def test_idle_workers_or_the_thread_ceiling_raise_the_prefetch() -> None:
    t = Tuner(max_threads=8, max_window=64)
    f = Feed(t)
    assert f.run(rate=100, wait=0.3, busy=0.2) and (t.threads, t.prefetch) == (1, 1)
    top = Tuner(max_threads=2, max_window=64, threads=2)
    g = Feed(top)
    assert g.run(rate=100, wait=0.3, busy=1.0) and (top.threads, top.prefetch) == (2, 1)


def test_a_calm_consumer_gives_memory_back_and_a_step_down_that_hurts_is_undone() -> None:
    t = Tuner(max_threads=8, max_window=64, threads=2, prefetch=2)
    f = Feed(t)
    for _ in range(3):
        f.run(rate=100, wait=0.0, busy=0.2)
    assert t.prefetch == 1, t.last_reason
    for _ in range(6):
        f.run(rate=100, wait=0.0, busy=0.2)
    assert (t.threads, t.prefetch) == (1, 0), t.last_reason  # one thread carries the work
    t2 = Tuner(max_threads=8, max_window=64, threads=1, prefetch=1)
    f2 = Feed(t2)
    for _ in range(3):
        f2.run(rate=100, wait=0.0, busy=0.5)
    assert t2.prefetch == 0
    f2.run(rate=90, wait=0.3, busy=0.5)  # the consumer waits again: undone
    assert t2.prefetch == 1 and t2.last_reason.startswith("undone prefetch 0 -> 1")


def test_nothing_grows_at_a_cap_and_the_ram_cap_lowers_the_prefetch() -> None:
    t = Tuner(max_threads=8, max_window=4, threads=2, prefetch=2)
    f = Feed(t)
    assert not f.run(rate=100, wait=0.5, busy=1.0, capped=0.4)
    assert "at a cap" in t.last_reason
    assert f.run(rate=100, wait=0.5, busy=1.0, ram=0.1) and t.prefetch == 1
    w = Tuner(max_threads=8, max_window=3)
    g = Feed(w)
    for _ in range(8):
        g.run(rate=100 * w.threads, wait=0.9, busy=1.0)
        assert w.window <= 3 and w.threads <= 3


# -- a tuned loader -----------------------------------------------------------------------------

X = np.arange(4000 * 8, dtype=np.float32).reshape(4000, 8)


def _sleepy(batch, ids):
    time.sleep(0.002)  # releases the GIL like I/O: more threads deliver faster
    return batch


def _firsts(ld, n=None):
    out = []
    for i, b in enumerate(ld):
        out.append(b["x"][:, 0].tolist())
        if n is not None and i + 1 == n:
            break
    return out


def test_a_tuned_loader_delivers_the_untuned_batches_and_grows_its_threads() -> None:
    kw = {"batch": 16, "order": "shuffle", "seed": 5, "transform": _sleepy}
    with headrace.Loader({"x": X}, **kw) as plain:
        want = _firsts(plain)
    with headrace.Loader({"x": X}, tune=True, **kw) as tuned:
        got = _firsts(tuned)
        s = tuned.stats()
    assert got == want
    assert s["autotune_enabled"] is True and s["autotune_adjustments"] >= 1
    assert s["threads"] > 1, s["autotune_last_reason"]  # the consumer always waited
    assert s["effective_max_queue_batches"] == min(s["max_queue_batches"],
                                                   s["threads"] + s["prefetch_batches"])
    assert s["inflight_high_water_bytes"] <= s["max_inflight_bytes"]


def test_a_tuned_loader_never_passes_its_byte_cap_and_resumes_exactly() -> None:
    per_batch = 16 * 8 * 4
    kw = {"batch": 16, "order": "shuffle", "seed": 2, "transform": _sleepy,
          "inflight": 3 * per_batch}
    with headrace.Loader({"x": X}, tune=True, **kw) as ld:
        head = _firsts(ld, 60)
        token = ld.checkpoint()
        s = ld.stats()
        assert s["inflight_high_water_bytes"] <= 3 * per_batch
        assert s["autotune_max_window_batches"] == 3 and s["effective_max_queue_batches"] <= 3
        rest = _firsts(ld)
    with headrace.Loader({"x": X}, resume=token, **kw) as again:
        assert _firsts(again) == rest
    with headrace.Loader({"x": X}, **kw) as plain:
        assert _firsts(plain) == head + rest


def test_tune_must_be_a_bool() -> None:
    with pytest.raises(headrace.ConfigError, match="tune must be True or False"):
        headrace.Loader({"x": X}, tune="yes")


def test_an_untuned_loader_reports_no_autotune_keys() -> None:
    with headrace.Loader({"x": X}, batch=64) as ld:
        next(ld)
        assert not any(k.startswith("autotune") for k in ld.stats())


def test_the_timeline_records_the_tuned_setting_and_the_plot_draws_it(tmp_path) -> None:
    with headrace.Loader({"x": X}, batch=16, transform=_sleepy, tune=True, timeline=0.01) as ld:
        _firsts(ld)
        s = ld.stats()
        tl = ld.stats_timeline()
    assert tl["autotune_enabled"] and tl["autotune_adjustments"] == s["autotune_adjustments"]
    assert tl["samples"][-1]["threads"] == s["threads"]
    assert max(x["threads"] for x in tl["samples"]) > 1  # the consumer waited: threads grew
    out = headrace.plot(tl, tmp_path / "tuned.png")
    assert out.stat().st_size > 0


def _io(s: Signals, *, dt: float, rate: float, wait: float, threads: int, gather: float,
        gather_cpu: float, blocked: float = 0.0) -> Signals:
    """The next interval of a pipeline whose threads each spend ``gather`` s per batch gathering,
    ``gather_cpu`` of it on a CPU (the rest waiting on I/O)."""
    db = round(rate * dt)
    return Signals(now=s.now + dt, batches=s.batches + db,
                   consumer_wait_s=s.consumer_wait_s + wait * dt,
                   busy_s=s.busy_s + min(gather * db, dt * threads), capped_s=s.capped_s,
                   ram_wait_s=s.ram_wait_s, gather_s=s.gather_s + gather * db,
                   gather_cpu_s=s.gather_cpu_s + gather_cpu * db,
                   window_wait_s=s.window_wait_s + blocked * dt)


def test_latency_bound_gathers_jump_to_the_threads_littles_law_needs() -> None:
    t = Tuner(max_threads=8, max_window=64, cores=2)
    s = Signals(now=0.0, batches=0, consumer_wait_s=0.0, busy_s=0.0, capped_s=0.0,
                ram_wait_s=0.0)
    t.start(s)
    # 4 ms per gather, 0.1 ms of it on a CPU, a consumer that waits: one step to the ceiling,
    # which is below what Little's law needs: as many batches of slack come with it
    s = _io(s, dt=0.2, rate=240, wait=0.95, threads=1, gather=0.004, gather_cpu=0.0001)
    assert t.step(s) and (t.threads, t.prefetch) == (8, 8), t.last_reason
    assert "Little's law" in t.last_reason and "prefetch" in t.last_reason, t.last_reason
    # a jump whose rate stays far below its prediction is undone, both knobs
    s = _io(s, dt=0.2, rate=236, wait=0.95, threads=8, gather=0.004, gather_cpu=0.0001)
    assert t.step(s) and (t.threads, t.prefetch) == (1, 0), t.last_reason
    # a consumer that needs the 8 threads of the ceiling: the jump, no slack; the dispatcher
    # waits for window room: the window doubles from a quarter of the threads, never past as
    # many batches of slack as threads
    u = Tuner(max_threads=8, max_window=64, cores=2)
    u.start(s)
    s = _io(s, dt=0.2, rate=240, wait=0.88, threads=1, gather=0.004, gather_cpu=0.0001)
    assert u.step(s) and (u.threads, u.prefetch) == (8, 0), u.last_reason
    # (8 threads keep pace: the consumer's 0.5 ms per batch is a quarter of the time)
    s = _io(s, dt=0.2, rate=1500, wait=0.25, threads=8, gather=0.004, gather_cpu=0.0001,
            blocked=0.5)
    assert u.step(s) and (u.threads, u.prefetch) == (8, 2), u.last_reason
    for _ in range(4):
        s = _io(s, dt=0.2, rate=1500, wait=0.25, threads=8, gather=0.004, gather_cpu=0.0001,
                blocked=0.5)
        u.step(s)
    assert (u.threads, u.prefetch) == (8, 8), u.last_reason
    # no window wait: the busy share of waiting threads is no reason for a deeper window
    v = Tuner(max_threads=8, max_window=64, threads=8, cores=2)
    v.start(s)
    s = _io(s, dt=0.2, rate=1500, wait=0.9, threads=8, gather=0.004, gather_cpu=0.0001)
    assert not v.step(s) and v.prefetch == 0 and "nothing left to raise" in v.last_reason


def test_gathers_that_wait_for_a_cpu_are_not_latency_bound() -> None:
    # a loaded machine: 0.2 ms per gather off the CPU, 0.05 ms on it, but 0.4 ms of transform
    t = Tuner(max_threads=8, max_window=64, cores=2)
    s = Signals(now=0.0, batches=0, consumer_wait_s=0.0, busy_s=0.0, capped_s=0.0,
                ram_wait_s=0.0)
    t.start(s)
    db = 400
    s = Signals(now=0.2, batches=db, consumer_wait_s=0.19, busy_s=db * 0.00065, capped_s=0.0,
                ram_wait_s=0.0, gather_s=db * 0.00025, gather_cpu_s=db * 0.00005)
    assert t.step(s) and t.threads == 2 and "Little" not in t.last_reason, t.last_reason
    # 4 ms off the CPU per gather, all of it ready to run but waiting for a CPU (schedstat)
    u = Tuner(max_threads=8, max_window=64, cores=2)
    u.start(s)
    s = Signals(now=0.4, batches=2 * db, consumer_wait_s=0.38, busy_s=s.busy_s + db * 0.0041,
                capped_s=0.0, ram_wait_s=0.0, gather_s=s.gather_s + db * 0.0041,
                gather_cpu_s=s.gather_cpu_s + db * 0.0001, runq_s=db * 0.004)
    assert u.step(s) and u.threads == 2 and "Little" not in u.last_reason, u.last_reason


def test_cpu_bound_gathers_still_grow_by_doubling() -> None:
    t = Tuner(max_threads=8, max_window=64, cores=2)
    s = Signals(now=0.0, batches=0, consumer_wait_s=0.0, busy_s=0.0, capped_s=0.0,
                ram_wait_s=0.0)
    t.start(s)
    s = _io(s, dt=0.2, rate=240, wait=0.95, threads=1, gather=0.004, gather_cpu=0.0039)
    assert t.step(s) and t.threads == 2, t.last_reason


def test_a_step_that_halves_the_consumers_wait_is_kept_at_a_flat_rate() -> None:
    t = Tuner(max_threads=8, max_window=64, cores=2)
    f = Feed(t)
    assert f.run(rate=200.0, wait=0.3, busy=0.3) and t.prefetch == 1, t.last_reason
    assert not f.run(rate=200.0, wait=0.04, busy=0.3) and t.prefetch == 1, t.last_reason
    u = Tuner(max_threads=8, max_window=64, cores=2)
    g = Feed(u)
    assert g.run(rate=200.0, wait=0.3, busy=0.3) and u.prefetch == 1
    assert g.run(rate=200.0, wait=0.2, busy=0.3) and u.prefetch == 0, u.last_reason  # undone


def test_on_cpu_work_at_its_ceiling_whose_dispatch_waits_for_room_keeps_a_flat_prefetch_step():
    # two threads on two CPUs, a consumer that always waits, the dispatcher waiting a third of
    # the time for window room: a prefetch step is taken on that direct evidence and kept
    # unless the rate fell (a flat rate, within one interval's noise, keeps it), never past as
    # many batches as threads; without the window wait the same flat step is undone
    def run(blocked: float) -> Tuner:
        t = Tuner(max_threads=8, max_window=64, threads=2, cores=2)
        s = Signals(now=0.0, batches=0, consumer_wait_s=0.0, busy_s=0.0, capped_s=0.0,
                    ram_wait_s=0.0)
        t.start(s)
        for _ in range(6):
            s = _io(s, dt=0.2, rate=3000, wait=0.97, threads=2, gather=0.0006,
                    gather_cpu=0.0006, blocked=blocked)
            t.step(s)
        return t

    t = run(blocked=0.33)
    assert (t.threads, t.prefetch) == (2, 2) and t.reverted == 0, t.last_reason
    assert t.settled and "nothing left to raise" in t.last_reason, t.last_reason
    u = run(blocked=0.0)
    assert u.reverted >= 1 and u.prefetch < 2, u.last_reason
