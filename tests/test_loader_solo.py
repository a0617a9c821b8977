"""The consumer gathering alone: ``_engine.solo.SoloProbe`` and the engine parking its workers."""

from __future__ import annotations

import itertools
import threading
import time

import numpy as np

import headrace
from headrace._engine import solo
from headrace._engine.budget import ByteBudget
from headrace._engine.solo import SoloProbe


def _drive(probe: SoloProbe, batches: int, *, solo_s: float, workers_s: float,
           own_s: float | None = None, outside_s: float = 0.0,
           clock: list[float] | None = None) -> list[bool]:
    """Feeds ``batches`` deliveries to ``probe`` on a fake clock: each takes ``solo_s`` or
    ``workers_s`` inside ``next()`` (by the probe's current way) and ``outside_s`` outside; with
    the workers running the consumer gathers every other batch itself, in ``own_s`` (default:
    ``solo_s``). Returns the switches it asked for."""
    now = clock if clock is not None else [0.0]
    own = [0.0, 0]
    asked = []
    for i in range(batches):
        probe.enter(now[0])
        now[0] += solo_s if probe.solo else workers_s
        if probe.solo or i % 2:
            own[0] += solo_s if probe.solo or own_s is None else own_s
            own[1] += 1
        got = probe.leave(now[0], own[0], own[1])
        if got is not None:
            asked.append(got)
        now[0] += outside_s
    return asked


def test_a_faster_solo_is_kept_then_both_are_timed_again():
    probe = SoloProbe(settle=3)
    per_cycle = 3 + solo._TIMED + 3 + solo._TIMED + solo._KEEP
    asked = _drive(probe, per_cycle + 3 + solo._TIMED + 3 + 1, solo_s=40e-6, workers_s=90e-6)
    # workers timed -> solo timed and kept -> workers timed again -> solo timed again
    assert asked == [True, False, True]
    assert probe.solo


def test_each_won_trial_after_a_won_one_keeps_solo_twice_as_long():
    # steady work pays for its trials ever more rarely: the stretches before the workers are
    # timed again grow 1, 2, 4 times _KEEP; a new probe over the same work starts with the last
    probe = SoloProbe(settle=3, key="steady")
    now, own, starts = 0.0, [0.0, 0], []
    for i in range(40 * solo._KEEP):
        probe.enter(now)
        now += 40e-6 if probe.solo else 90e-6
        if probe.solo or i % 2:
            own[0] += 40e-6
            own[1] += 1
        if probe.leave(now, own[0], own[1]) is False:
            starts.append(i)
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert len(gaps) >= 3
    keeps = [g - (3 + solo._TIMED + 3 + solo._TIMED) for g in gaps]
    assert keeps[:3] == [2 * solo._KEEP, 4 * solo._KEEP, 8 * solo._KEEP]
    assert solo._VERDICTS["steady"] == probe._keep
    assert SoloProbe(settle=3, key="steady")._keep == probe._keep


def test_a_source_with_a_copy_lane_gets_a_trial_even_when_workers_keep_ahead():
    # parked, such a source's reads run on the lane beside the consumer: the consumer's own
    # gathers (none here: the workers keep ahead) do not predict that, so it is timed anyway
    def drive(probe: SoloProbe) -> list[bool]:
        asked = []
        for i in range(3 + solo._TIMED + 2):  # a batch each 400 us: not short enough to try
            probe.enter(i * 4e-4)
            got = probe.leave(i * 4e-4 + 3.9e-4, 0.0, 0)
            if got is not None:
                asked.append(got)
        return asked

    assert drive(SoloProbe(settle=3)) == []
    assert drive(SoloProbe(settle=3, lane=True)) == [True]


def test_a_solo_that_won_keeps_its_place_unless_clearly_slower():
    # after a won trial, the next one is lost only when solo takes 15% longer than the workers
    def retimed(solo_s: float) -> bool:
        probe = SoloProbe(settle=3)
        _drive(probe, 3 + solo._TIMED + 3 + solo._TIMED + 1, solo_s=40e-6, workers_s=90e-6)
        assert probe.solo  # won, kept
        _drive(probe, solo._KEEP + 3 + solo._TIMED + 3 + solo._TIMED + 1, solo_s=solo_s,
               workers_s=solo_s / 1.1 if solo_s < 90e-6 else 90e-6)
        return probe.solo

    assert retimed(88e-6)  # 10% slower than the workers now: still solo
    assert not retimed(120e-6)  # a third slower: the workers


def test_faster_workers_are_kept():
    # the consumer's own gathers looked fast, but alone it was slower: tried once, then kept off
    probe = SoloProbe(settle=3)
    asked = _drive(probe, 3 + solo._TIMED + 3 + solo._TIMED + solo._KEEP, solo_s=200e-6,
                   workers_s=90e-6, own_s=60e-6)
    assert asked == [True, False]
    assert not probe.solo


def test_gathers_slower_than_the_delivery_rate_get_no_trial():
    # the consumer's own gathers take longer than the workers deliver a batch (expensive gathers
    # that the threads split well): the consumer alone cannot be faster, and is never tried
    probe = SoloProbe(settle=3)
    assert _drive(probe, 5000, solo_s=600e-6, workers_s=300e-6) == []


def test_a_consumer_with_work_of_its_own_keeps_the_workers():
    # a training step between batches: the workers gather while it runs, never parked
    probe = SoloProbe(settle=3)
    assert _drive(probe, 2000, solo_s=40e-6, workers_s=90e-6, outside_s=2e-3) == []


def test_a_kept_solo_stretch_ends_once_the_consumer_works_elsewhere():
    # solo won and is kept; then the consumer starts a training step between batches: the
    # workers run again within one timed run, not at the end of the kept stretch
    probe = SoloProbe(settle=3)
    clock = [0.0]
    assert _drive(probe, 3 + solo._TIMED + 3 + solo._TIMED + 5, solo_s=40e-6, workers_s=90e-6,
                  clock=clock) == [True]
    assert probe.solo
    asked = _drive(probe, solo._TIMED, solo_s=40e-6, workers_s=90e-6, outside_s=2e-3,
                   clock=clock)
    assert asked == [False] and not probe.solo


def test_too_few_own_gathers_to_tell_get_no_trial():
    # the consumer never gathered (workers keep ahead, or no room in the window): no telling
    probe = SoloProbe(settle=3)
    now = 0.0
    for _ in range(3000):
        probe.enter(now)
        now += 300e-6
        assert probe.leave(now, 0.0, 0) is None


def test_batches_that_come_as_often_as_hand_offs_cost_get_a_trial_anyway():
    # a batch every 90 us is about what moving it between threads costs: the consumer may be
    # faster alone though it gathered none itself (big windows leave it none), so it is tried
    probe = SoloProbe(settle=3)
    now, asked = 0.0, []
    for _ in range(3 + solo._TIMED + 2):
        probe.enter(now)
        now += 90e-6
        got = probe.leave(now, 0.0, 0)
        if got is not None:
            asked.append(got)
    assert asked == [True]


def test_a_refused_inline_gather_runs_the_workers_and_times_afresh():
    probe = SoloProbe(settle=2)
    clock = [0.0]
    assert _drive(probe, 2 + solo._TIMED, solo_s=1e-5, workers_s=1e-4, clock=clock) == [True]
    assert probe.refused() is False and not probe.solo
    assert _drive(probe, 2 + solo._TIMED, solo_s=1e-5, workers_s=1e-4, clock=clock) == [True]


def test_parked_workers_change_nothing_of_the_stream(monkeypatch):
    # the engine parks and runs its workers every few batches: same batches, same order
    x = np.arange(4000 * 3, dtype=np.int64).reshape(4000, 3)
    with headrace.Loader({"x": x}, batch=16, order="shuffle", seed=5, threads=2) as ld:
        ref = [b["x"].copy() for b in ld]
    flips = []

    def flip(self, now, *own):
        flips.append(not self.solo)
        self.solo = not self.solo
        return self.solo

    monkeypatch.setattr(SoloProbe, "leave", flip)
    parked = []
    with headrace.Loader({"x": x}, batch=16, order="shuffle", seed=5, threads=2) as ld:
        got = []
        for b in ld:
            got.append(b["x"].copy())
            parked.append(ld.stats()["workers_parked"])
    assert len(flips) == len(ref) and any(flips)
    assert parked == flips  # stats() says which way the engine runs after each batch
    assert len(got) == len(ref) and all(np.array_equal(a, b) for a, b in zip(got, ref, strict=True))


def test_a_parked_engine_whose_consumer_cannot_reserve_runs_its_workers(monkeypatch):
    # Another holder of a shared budget takes every byte the loader gives back: the consumer's
    # inline dispatch cannot reserve without waiting, so the parked workers must run again (one
    # waits for the budget, as workers do) or next() would wait for a batch nobody reserves.
    monkeypatch.setattr(SoloProbe, "leave", lambda self, *args: None)  # parked until refused
    refusals = []
    refused = SoloProbe.refused
    monkeypatch.setattr(SoloProbe, "refused", lambda self: refusals.append(1) or refused(self))
    x = np.zeros((64, 1024), np.uint8)
    budget = ByteBudget(64 << 10)
    held = [0]
    stop = threading.Event()

    def hog():  # holds whatever is free until told to stop, then gives it all back
        while not stop.is_set():
            if budget.acquire(1024, timeout_s=0.005):
                held[0] += 1024
        budget.release(held[0])

    with headrace.Loader({"x": x}, batch=8, threads=1, budget=budget) as ld:
        first = next(ld)["x"].copy()
        ld._engine.probe.solo = True
        ld._engine._set_solo(True)
        hogger = threading.Thread(target=hog)
        hogger.start()
        # the budget holds every batch at once: until the hog has taken what was free, the
        # consumer could reserve all the rest before it (no refusal to see)
        deadline = time.monotonic() + 5.0
        while budget.used_bytes < budget.cap_bytes and time.monotonic() < deadline:
            time.sleep(0.001)
        threading.Timer(0.3, stop.set).start()
        t0 = time.monotonic()
        rest = [b["x"].copy() for b in ld]
        hogger.join()
    assert first.shape == (8, 1024) and len(rest) == 7
    assert refusals, "the consumer never found the budget taken"
    assert time.monotonic() - t0 < 5.0


def test_each_lost_trial_doubles_the_stretch_before_the_next():
    probe = SoloProbe(settle=3)
    now, own, trials = [0.0], [0.0, 0], []
    for i in range(20_000):
        probe.enter(now[0])
        now[0] += 200e-6 if probe.solo else 90e-6  # alone is slower...
        own[0] += 60e-6  # ...though its own gathers looked fast
        own[1] += 1
        if probe.leave(now[0], own[0], own[1]) is True:
            trials.append(i)
    gaps = [b - a for a, b in itertools.pairwise(trials)]
    assert len(gaps) >= 3 and all(b > 1.8 * a for a, b in itertools.pairwise(gaps)), gaps


def test_a_tuned_engine_pauses_its_tuner_while_the_workers_are_parked(monkeypatch):
    x = np.arange(3000 * 2, dtype=np.int64).reshape(3000, 2)
    kw = {"batch": 8, "order": "shuffle", "seed": 1}
    with headrace.Loader({"x": x}, **kw) as ld:
        ref = [b["x"].copy() for b in ld]
    monkeypatch.setattr(SoloProbe, "leave", lambda self, *args: None if self.solo else True)
    with headrace.Loader({"x": x}, tune=True, timeline=False, **kw) as ld:
        got = []
        for b in ld:
            got.append(b["x"].copy())
            time.sleep(0.0002)  # lets the tuner's intervals pass
        s = ld.stats()
    assert all(np.array_equal(a, b) for a, b in zip(got, ref, strict=True))
    assert s["autotune_last_reason"].startswith("paused"), s["autotune_last_reason"]


def test_a_verdict_for_the_same_work_starts_the_next_engine_parked():
    probe = SoloProbe(settle=3, key="work")
    assert not probe.solo
    assert _drive(probe, 3 + solo._TIMED + 3 + solo._TIMED + 1, solo_s=40e-6,
                  workers_s=90e-6) == [True]
    again = SoloProbe(settle=3, key="work")
    assert again.solo and not SoloProbe(settle=3, key="other work").solo
    # started parked, its consumer now busy elsewhere: the workers run again within one timed
    # run, and the verdict is withdrawn
    assert _drive(again, 3 + solo._TIMED, solo_s=40e-6, workers_s=90e-6,
                  outside_s=2e-3) == [False]
    assert not SoloProbe(settle=3, key="work").solo


def test_a_loader_over_the_same_work_starts_parked_once_solo_won():
    # a loader per epoch: the next one over the same data, batch and threads starts with the way
    # the last trial chose (stats say so), another batch size does not; the batches are the same
    x = np.arange(6_000 * 8, dtype=np.int64).reshape(6_000, 8)
    with headrace.Loader({"x": x}, batch=64, order="sequential", threads=2, epochs=1) as ld:
        next(ld)
        assert not ld.stats()["workers_parked"]  # no verdict yet: the workers run
        key = ld._work_key()
    solo._VERDICTS[key] = True  # what a won trial records
    with headrace.Loader({"x": x}, batch=64, order="sequential", seed=1, threads=2,
                         epochs=1) as ld:
        first = next(ld)
        assert ld.stats()["workers_parked"]
        got = [first["x"].copy()] + [b["x"].copy() for b in ld]
    assert np.array_equal(np.concatenate(got), x)
    with headrace.Loader({"x": x}, batch=32, order="sequential", threads=2, epochs=1) as ld:
        next(ld)
        assert not ld.stats()["workers_parked"]


def test_a_verifying_epoch_is_other_work_than_a_steady_one(tmp_path):
    # a verdict found while first reads still check records is not applied to epochs that
    # check nothing (their gathers cost differently)
    x = np.arange(2_000 * 16, dtype=np.uint8).reshape(2_000, 16)
    headrace.pack_arrays(tmp_path / "s.hr", x=x, progress=False)
    with headrace.open(tmp_path / "s.hr") as st:
        assert not st.checked_all()
        with headrace.Loader(st, batch=64, order="sequential", epochs=1) as ld:
            verifying = ld._work_key()
            assert sum(len(b["x"]) for b in ld) == 2_000
            steady = ld._work_key()
        assert st.checked_all() and st.checked_all(["x"])
    # the same store and work, one verifying and one not
    assert verifying != steady and verifying[1][:-1] == steady[1][:-1]
    assert verifying[2:] == steady[2:]
    with headrace.open(tmp_path / "s.hr", verify="never") as st:
        assert st.checked_all()


def test_a_parked_consumer_gets_its_own_batches_straight(monkeypatch):
    # parked for the whole run: every batch the consumer gathered went straight to it, never
    # through the queue of finished batches (one post and one more locked pass each)
    monkeypatch.setattr(SoloProbe, "leave", lambda self, *args: None)
    x = np.arange(3_000 * 8, dtype=np.int64).reshape(3_000, 8)
    with headrace.Loader({"x": x}, batch=64, order="sequential", threads=2, epochs=1) as ld:
        key = ld._work_key()
    solo._VERDICTS[key] = True  # the next such loader starts parked
    with headrace.Loader({"x": x}, batch=64, order="sequential", threads=2, epochs=1) as ld:
        got = [b["x"].copy() for b in ld]
        assert ld.stats()["queue_high_water"] == 0
    assert np.array_equal(np.concatenate(got), x)


def test_a_held_probe_times_the_workers_again_instead_of_trying_solo():
    # under a tuner still raising its knobs the workers' timing is of a setting on its way:
    # no trial of the consumer alone starts from it, however promising; once released, one does
    probe = SoloProbe(settle=3, tuned=True)
    assert probe.hold
    clock = [0.0]
    assert _drive(probe, 3 + 4 * solo._TIMED, solo_s=40e-6, workers_s=90e-6, clock=clock) == []
    assert not probe.solo
    probe.hold = False
    assert _drive(probe, solo._TIMED + 1, solo_s=40e-6, workers_s=90e-6, clock=clock) == [True]


def test_a_tuned_engine_starts_with_its_workers_whatever_the_last_verdict():
    # parked from the start, its tuner would never run and each later trial would compare the
    # consumer with one worker: a tuned engine earns its parking against its settled setting
    x = np.arange(6_000 * 8, dtype=np.int64).reshape(6_000, 8)
    with headrace.Loader({"x": x}, batch=64, order="sequential", tune=True, epochs=1) as ld:
        next(ld)
        key = ld._work_key()
        assert key[-1] is True  # tuned work is its own kind
    solo._VERDICTS[key] = solo._KEEP
    try:
        assert not SoloProbe(settle=3, key=key, tuned=True).solo
        assert SoloProbe(settle=3, key=key).solo  # an untuned probe of that key would start parked
        with headrace.Loader({"x": x}, batch=64, order="sequential", tune=True, epochs=1) as ld:
            first = next(ld)
            assert not ld.stats()["workers_parked"]
            got = [first["x"].copy()] + [b["x"].copy() for b in ld]
        assert np.array_equal(np.concatenate(got), x)
    finally:
        solo._VERDICTS.pop(key, None)


def test_the_tuner_holds_the_probe_until_it_settles(monkeypatch):
    # the engine releases the probe once a tuner step raised nothing
    from headrace._engine.autotune import Tuner

    x = np.arange(4_000 * 8, dtype=np.int64).reshape(4_000, 8)
    holds: list[tuple[bool, bool]] = []
    step = Tuner.step

    def watched(self, signals):
        before = (self.threads, self.prefetch)
        changed = step(self, signals)
        raised = self.threads > before[0] or self.prefetch > before[1]
        holds.append((raised, self.settled))
        return changed

    monkeypatch.setattr(Tuner, "step", watched)
    with headrace.Loader({"x": x}, batch=16, order="shuffle", tune=True, epochs=None) as ld:
        it = iter(ld)
        deadline = time.monotonic() + 0.6
        while time.monotonic() < deadline:
            next(it)
        engine = ld._engine
        assert engine is not None
        assert engine.probe.hold == (not ld._tuner.settled)
    # a step that raised a knob waits to be judged: unsettled (an undo or a step down is not)
    assert holds and all(not settled for raised, settled in holds if raised)
