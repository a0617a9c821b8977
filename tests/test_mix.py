"""headrace.mix: mx8's exact SWRR schedules, proportions, exhaustion policies, stats, snapshots,
exact resume of every source, and one shared byte budget that is never exceeded."""

import logging
import threading

import numpy as np
import pytest

import headrace
from headrace import CheckpointError, ConfigError, LoaderError
from headrace._engine.shared_budget import SharedBudget
from headrace._multi.mix import MixedLoader, mix
from headrace._multi.mix_schedule import SmoothRoundRobin, exact_weights

LETTERS = "ABCD"
OFF = 100_000  # record values of source i are i * OFF + record id


def _loader(tag, n=100, batch=5, **kw):
    """A real Loader over in-memory records whose values encode the source: tag*OFF + i."""
    kw.setdefault("threads", 1)
    return headrace.Loader({"x": np.arange(n, dtype=np.int64) + OFF * tag}, batch=batch, **kw)


def _who(batch):
    return LETTERS[int(batch["x"][0]) // OFF]


def _schedule(weights, seed, ticks, epoch=0):
    sources = [_loader(i, n=5 * ticks) for i in range(len(weights))]
    with mix(sources, weights=weights, seed=seed, epoch=epoch) as m:
        return "".join(_who(b) for _, b in zip(range(ticks), m, strict=False))


# -- the schedule ------------------------------------------------------------------------------


@pytest.mark.parametrize(("weights", "seed", "expected"), [
    ([7, 3], 0, "ABAAABAABA" * 2),
    ([7, 3], 1, "ABAABAAABA" * 2),
    ([0.7, 0.3], 0, "ABAAABAABA"),  # only ratios matter
    ([1, 1], 0, "ABAB"),
    ([1, 1], 1, "BABA"),
    ([1, 1, 1], 1, "BCABCA"),
])
def test_swrr_matches_mx8_golden_sequences(weights, seed, expected):
    sched = SmoothRoundRobin(exact_weights(weights), tie_break_offset=seed % len(weights))
    assert "".join(LETTERS[i] for i in sched.sequence(len(expected))) == expected


def test_mixed_loader_delivers_the_golden_schedule_with_unchanged_batches():
    assert _schedule([7, 3], 0, 20) == "ABAAABAABA" * 2
    assert _schedule([7, 3], 1, 10) == "ABAABAAABA"
    assert _schedule([1, 1, 1], 1, 6) == "BCABCA"
    # epoch rotates the tie break the same way the seed does: (seed + epoch) mod n
    assert _schedule([1, 1], 0, 4, epoch=1) == "BABA"
    a, b = _loader(0), _loader(1)
    with mix([a, b], weights=[1, 1]) as m:
        first, second = next(m), next(m)
    np.testing.assert_array_equal(first["x"], np.arange(5))
    np.testing.assert_array_equal(second["x"], np.arange(OFF, OFF + 5))


def test_scheduler_state_after_five_ticks_matches_mx8_token():
    sched = SmoothRoundRobin((7, 3))
    sched.sequence(5)
    assert sched.current == [-5, 5]  # mx8's token: scheduler_current=-5,5


def test_exact_weights():
    assert exact_weights([7, 3]) == (7, 3)
    assert exact_weights([0.7, 0.3]) == (7, 3)
    assert exact_weights(np.array([2.0, 4.0])) == (1, 2)
    assert exact_weights([1 / 3, 2 / 3]) == (1, 2)


@pytest.mark.parametrize(("weights", "count", "fragment"), [
    ([], None, "at least one source"),
    ([1], 2, r"length \(1\) must match loader count \(2\)"),
    ([0, 1], 2, "index 0 must be > 0"),
    ([1, -2], 2, "index 1 must be > 0"),
    ([float("nan"), 1], 2, "index 0 is not finite"),
    ([1, float("inf")], 2, "index 1 is not finite"),
    ([1, "x"], 2, "index 1 must be a number"),
    ([True, 1], 2, "index 0 must be a number"),
])
def test_weights_are_validated_naming_index_and_value(weights, count, fragment):
    with pytest.raises(ConfigError, match=fragment):
        exact_weights(weights, count=count)


def test_mix_argument_errors():
    a, b = _loader(0), _loader(1)
    try:
        with pytest.raises(ConfigError, match="at least one loader"):
            mix([])
        with pytest.raises(ConfigError, match=r"weights length \(3\)"):
            mix([a, b], weights=[1, 2, 3])
        with pytest.raises(ConfigError, match="invalid on_source_exhausted='skip'"):
            mix([a, b], on_source_exhausted="skip")
        with pytest.raises(ConfigError, match="identical batch sizes"):
            mix([a, _loader(2, batch=7)])
        with pytest.raises(ConfigError, match=r"index 1 is a list without .*headrace loaders"):
            mix([a, [1, 2, 3]])
        with pytest.raises(ConfigError, match="starvation"):
            mix([a, b], starvation=0)
    finally:
        a.close()
        b.close()


# -- proportions, stats, exhaustion ------------------------------------------------------------


def test_realized_proportions_and_stats():
    sources = [_loader(0, n=5000, batch=5), _loader(1, n=5000, batch=5)]
    with mix(sources, weights=[0.7, 0.3]) as m:
        got = [_who(b) for _, b in zip(range(500), m, strict=False)]
        s = m.stats()
        summary = headrace.stats(m)
    assert "Mode: mixed" in summary and "Step: 500" in summary
    assert got.count("A") == 350 and got.count("B") == 150
    assert s["mix_normalized_weights"] == [0.7, 0.3]  # normalized (mx8 reports raw weights)
    assert s["mix_requested_weights"] == [0.7, 0.3]
    assert s["mix_realized_ratio"] == [0.7, 0.3]
    assert s["mix_source_delivered_batches_total"] == [350, 150]
    assert s["mix_source_delivered_samples_total"] == [1750, 750]
    assert s["mix_source_delivered_bytes_total"] == [1750 * 8, 750 * 8]
    assert s["delivered_batches_total"] == 500 and s["mix_schedule_ticks"] == 500
    assert s["mix_source_starvation_total"] == [0, 0]
    assert s["active_sources"] == 2 and s["mix_source_exhaustion_policy"] == "error"
    src = s["mix_sources"][1]
    assert src["source_idx"] == 1 and src["source_weight_normalized"] == 0.3
    assert src["source_delivered_batches_total"] == 150
    assert src["metrics"]["delivered_batches_total"] == 150  # the source's own stats
    assert set(s) >= {"seed", "epoch", "mix_snapshot_emitted_total", "mix_total_inflight_bytes",
                      "mix_shared_max_inflight_bytes", "mix_shared_inflight_violation_total",
                      "process_rss_bytes", "elapsed_seconds"}


def test_starvation_counter():
    sources = [_loader(0, n=2000, batch=5), _loader(1, n=2000, batch=5)]
    with mix(sources, weights=[99, 1], starvation=10) as m:
        for _ in zip(range(100), m, strict=False):
            pass
        assert m.stats()["mix_source_starvation_total"] == [0, 9]


def test_exhausted_source_error_policy():
    with mix([_loader(0, n=10), _loader(1, n=100)], weights=[1, 1]) as m:
        with pytest.raises(LoaderError, match=r"source_idx=0, policy=error, schedule_ticks=4"):
            for _ in m:
                pass
        assert next(m, None) is None  # ended: no batch, and a new pass says how to rewind
        with pytest.raises(LoaderError, match=r"stopped at an error.*set_epoch"):
            iter(m)


def test_error_policy_ends_cleanly_when_every_source_ends_together():
    with mix([_loader(0, n=10), _loader(1, n=15)], weights=[2, 3]) as m:
        assert [_who(b) for b in m] == ["B", "A", "B", "A", "B"]
        s = m.stats()
        assert s["active_sources"] == 0 and s["mix_source_exhausted_total"] == [1, 1]
        assert next(m, None) is None


@pytest.mark.parametrize("policy", ["drop", "allow"])
def test_exhausted_source_drop_policy_reads_everything(policy):
    with mix([_loader(0, n=20), _loader(1, n=50)], weights=[3, 1],
             on_source_exhausted=policy) as m:
        ids = np.concatenate([b["x"] for b in m])
        s = m.stats()
    assert sorted(ids.tolist()) == list(range(20)) + list(range(OFF, OFF + 50))
    assert s["mix_source_exhausted_total"] == [1, 1] and s["active_sources"] == 0


def test_restart_policy_reads_the_next_epoch():
    a = _loader(0, n=10, order="shuffle", seed=3)
    with mix([a, _loader(1, n=1000)], weights=[1, 1], on_source_exhausted="restart") as m:
        firsts = [b["x"] for _, b in zip(range(12), m, strict=False)]
        s = m.stats()
    a_batches = [x for x in firsts if x[0] < OFF]
    epoch0 = np.concatenate(a_batches[:2])
    epoch1 = np.concatenate(a_batches[2:4])
    assert sorted(epoch0.tolist()) == sorted(epoch1.tolist()) == list(range(10))
    assert epoch0.tolist() != epoch1.tolist()  # a fresh shuffle: the next epoch, not a replay
    assert s["mix_source_restarts_total"] == [2, 0]


# -- snapshots ---------------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", ["HEADRACE", "MX8"])
def test_snapshot_events(monkeypatch, caplog, prefix):
    monkeypatch.setenv(f"{prefix}_MIX_SNAPSHOT", "1")
    monkeypatch.setenv(f"{prefix}_MIX_SNAPSHOT_PERIOD_TICKS", "4")
    with caplog.at_level(logging.INFO, logger="headrace.mix"), \
            mix([_loader(0), _loader(1)], weights=[1, 1]) as m:
        for _ in zip(range(10), m, strict=False):
            pass
        s = m.stats()
    events = [r for r in caplog.records if r.name == "headrace.mix" and "mix_snapshot" in r.message]
    assert len(events) == 2 == s["mix_snapshot_emitted_total"]
    assert s["mix_snapshot_enabled"] and s["mix_snapshot_period_ticks"] == 4
    assert '"schedule_ticks": 8' in events[-1].message


def test_snapshot_off_by_default_and_bad_values(monkeypatch):
    monkeypatch.delenv("HEADRACE_MIX_SNAPSHOT", raising=False)
    monkeypatch.delenv("MX8_MIX_SNAPSHOT", raising=False)
    with mix([_loader(0)]) as m:
        assert m.stats()["mix_snapshot_enabled"] is False
        assert m.stats()["mix_snapshot_period_ticks"] == 64
    monkeypatch.setenv("HEADRACE_MIX_SNAPSHOT_PERIOD_TICKS", "0")
    a = _loader(0)
    with pytest.raises(ConfigError, match="HEADRACE_MIX_SNAPSHOT_PERIOD_TICKS='0'"):
        mix([a])
    a.close()


# -- checkpoint / resume -----------------------------------------------------------------------


def _fresh(policy_n=(40, 100), order="shuffle"):
    return [_loader(0, n=policy_n[0], order=order, seed=5),
            _loader(1, n=policy_n[1], order=order, seed=6)]


def _drain(m, limit=10_000):
    return [b["x"].tolist() for _, b in zip(range(limit), m, strict=False)]


@pytest.mark.parametrize(("policy", "stop"), [("drop", 0), ("drop", 1), ("drop", 7), ("drop", 13),
                                              ("restart", 17), ("error", 5)])
def test_resume_restores_every_source_exactly(policy, stop):
    kwargs = {"weights": [2, 1], "seed": 1, "on_source_exhausted": policy}
    limit = 60
    with mix(_fresh(), **kwargs) as m:
        _drain(m, stop)
        token = m.checkpoint()
        try:
            rest = _drain(m, limit)
        except LoaderError:
            rest = None
    with mix(_fresh(), resume=token, **kwargs) as resumed:
        try:
            again = _drain(resumed, limit)
        except LoaderError:
            again = None
        if rest is not None:
            assert again == rest
            assert resumed.stats()["mix_schedule_ticks"] == stop + len(rest)
    if rest is None:
        assert again is None


def test_resume_after_restarts_continues_the_later_epoch():
    kwargs = {"weights": [3, 1], "on_source_exhausted": "restart"}
    with mix(_fresh((10, 1000)), **kwargs) as m:
        _drain(m, 30)  # source 0 restarted several times
        token = m.checkpoint()
        rest = _drain(m, 20)
        assert m.stats()["mix_source_restarts_total"][0] >= 3
    with mix(_fresh((10, 1000)), resume=token, **kwargs) as resumed:
        assert _drain(resumed, 20) == rest


def test_resume_refuses_other_weights_seed_or_sources():
    with mix(_fresh(), weights=[2, 1]) as m:
        _drain(m, 3)
        token = m.checkpoint()
    for kwargs, fragment in [({"weights": [1, 1]}, "weights mismatch"),
                             ({"weights": [2, 1], "seed": 9}, "seed mismatch")]:
        sources = _fresh()
        with pytest.raises(CheckpointError, match=fragment):
            mix(sources, resume=token, **kwargs)
        for s in sources:
            s.close()
    one = [_loader(0)]
    with pytest.raises(CheckpointError, match="source_count mismatch"):
        mix(one, resume=token)
    one[0].close()
    sources = _fresh()
    with pytest.raises(CheckpointError, match="not a headrace token"):
        mix(sources, resume=b"garbage")
    with pytest.raises(CheckpointError, match="kind 'loader' for a mix"):
        mix(sources, resume=sources[0].checkpoint())
    # a source that refuses its state is named
    other = [_loader(0, n=41, order="shuffle", seed=5), _loader(1, n=100, order="shuffle", seed=6)]
    with pytest.raises(CheckpointError, match="length mismatch") as info:
        mix(other, resume=token, weights=[2, 1])
    assert "restoring mix source 0" in "\n".join(info.value.__notes__)
    for s in sources + other:
        s.close()


def test_resume_adopts_the_token_epoch():
    kwargs = {"weights": [1, 1], "on_source_exhausted": "drop"}
    with mix(_fresh(), epoch=2, **kwargs) as m:
        _drain(m, 3)
        token = m.checkpoint()
        rest = _drain(m)
    with mix(_fresh(), epoch=0, resume=token, **kwargs) as resumed:
        assert resumed.epoch == 2
        assert _drain(resumed) == rest


# -- one shared budget -------------------------------------------------------------------------


def test_sources_share_one_budget_that_is_never_exceeded():
    batch_bytes = 64 * 8  # 64 int64 records
    cap = 8 * batch_bytes
    sources = [_loader(i, n=6400, batch=64, threads=2, prefetch=8, queue=16, inflight=1 << 20)
               for i in range(3)]
    m = mix(sources, weights=[5, 3, 1], inflight=cap, on_source_exhausted="drop")
    assert isinstance(m.budget, SharedBudget) and m.budget.cap_bytes == cap
    assert [s.stats()["max_inflight_bytes"] for s in m.sources] == [1 << 20] * 3
    seen = []
    peak = 0
    with m:
        for b in m:
            seen.append(b["x"])
            peak = max(peak, sum(s.stats()["inflight_bytes"] for s in m.sources))
        s = m.stats()
    ids = np.sort(np.concatenate(seen))
    expected = np.concatenate([np.arange(6400) + OFF * i for i in range(3)])
    np.testing.assert_array_equal(ids, expected)  # no deadlock, nothing lost
    assert peak <= cap
    assert 0 < m.budget.high_water_bytes <= cap
    assert s["mix_inflight_high_water_bytes"] <= cap
    assert s["mix_shared_budget"] and s["mix_shared_max_inflight_bytes"] == cap
    assert s["mix_shared_inflight_violation_total"] == 0
    # the pool is really shared: some source held more than its guaranteed reserve at some point
    assert m.budget.high_water_bytes > max(sh.reserve_bytes for sh in m.budget.shares)


def test_shared_cap_smaller_than_one_batch_each_is_an_error():
    sources = [_loader(i, n=100, batch=10) for i in range(2)]
    with pytest.raises(ConfigError, match="smaller than one batch of every source"):
        mix(sources, inflight=100)  # each batch is 80 bytes
    for s in sources:
        s.close()


def test_shared_budget_invariant_under_contention():
    shared = SharedBudget(1000)
    shares = [shared.share(100) for _ in range(4)]
    errors = []
    over = []

    def hammer(share, size):
        rng = np.random.default_rng(size)
        try:
            for _ in range(300):
                n = int(rng.integers(1, size + 1))
                assert share.acquire(n, timeout_s=5)
                if shared.used_bytes > shared.cap_bytes:
                    over.append(shared.used_bytes)
                share.release(n)
        except Exception as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=hammer, args=(sh, 100)) for sh in shares]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors and not over
    assert shared.high_water_bytes <= 1000 and shared.used_bytes == 0
    with pytest.raises(ConfigError, match="guaranteed share"):
        shares[0].acquire(101)


def test_mixed_loader_is_exported():
    assert headrace.mix is mix and headrace.MixedLoader is MixedLoader


def test_distributed_loaders_mix_and_resume():
    """A rank's DistributedDataLoaders are mix sources too (shared budget, exact resume)."""

    def sources():
        return [headrace.DistributedDataLoader({"x": np.arange(40) + OFF * i}, batch=4, rank=1,
                                               world_size=2, check=False, threads=1)
                for i in range(2)]

    with mix(sources(), weights=[1, 1], on_source_exhausted="drop") as m:
        assert m.stats()["mix_shared_budget"]
        first = _drain(m, 3)
        token = m.checkpoint()
        rest = _drain(m)
    assert sorted(v for b in first + rest for v in b) == sorted(
        [v for i in range(2) for k in range(5) for v in range(OFF * i + 8 * k + 4,
                                                              OFF * i + 8 * k + 8)])
    with mix(sources(), weights=[1, 1], on_source_exhausted="drop", resume=token) as resumed:
        assert _drain(resumed) == rest


# -- any loader kind as a source (the conformance suite runs every kind; these are the LLM case) --


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from _kinds import Data

    return Data(tmp_path_factory.mktemp("mix-kinds"))


def _texts(data, **kw):
    return [headrace.text(str(path), batch=4, seq_len=8, shuffle=True, seed=seed, threads=2,
                          prefetch=4, **kw)
            for path, seed in ((data.tokens, 1), (data.tokens_b, 2))]


def test_text_mixture_restarts_for_ever_on_one_budget_and_resumes(data):
    """Two text loaders, on_source_exhausted="restart": hundreds of batches (many epochs of
    each), one byte budget holding a few batches, and an exact resume in the middle."""
    need = sum(s._batch_need() for s in _texts(data))
    cap = 2 * need

    def make(resume=None):
        return mix(_texts(data), weights=[3, 1], on_source_exhausted="restart", inflight=cap,
                   resume=resume)

    with make() as m:
        ref = [b["tokens"].tolist() for _, b in zip(range(200), m, strict=False)]
        s = m.stats()
    assert len(ref) == 200
    assert s["mix_shared_budget"] and s["mix_shared_max_inflight_bytes"] == cap
    assert 0 < s["mix_inflight_high_water_bytes"] <= cap
    assert s["mix_source_restarts_total"][0] > 30 and s["mix_source_restarts_total"][1] > 10
    # every epoch of a source is a new shuffle of all its windows
    with make() as m:
        head = [b["tokens"].tolist() for _, b in zip(range(100), m, strict=False)]
        token = m.checkpoint()
    assert head == ref[:100]
    with make(resume=token) as again:
        assert [b["tokens"].tolist() for _, b in zip(range(100), again, strict=False)] == ref[100:]


@pytest.mark.parametrize("kind", ["image", "text", "Loader"])
def test_restarted_sources_give_their_prefetched_bytes_back(data, kind):
    """set_epoch / load_state_dict stop a source mid-stream: the bytes of the batches it had
    prefetched go back to the shared budget (else the pool shrinks until the mix deadlocks)."""
    from _kinds import KINDS

    sources = [KINDS[kind].make(data, seed=i, prefetch=4, queue=8) for i in (1, 2)]
    cap = 3 * sum(s._batch_need() for s in sources)
    m = mix(sources, weights=[1, 1], on_source_exhausted="restart", inflight=cap)
    for _ in zip(range(40), m, strict=False):
        pass
    token = m.checkpoint()
    for _ in range(5):
        m.load_state_dict(token)  # every source stopped with its prefetch in flight
        m.set_epoch(3)
        next(m)
    assert m.budget.used_bytes <= cap
    m.close()
    assert m.budget.used_bytes == 0  # nothing held by stopped or closed sources


def test_a_source_with_nothing_to_yield_is_an_error_not_a_spin(tmp_path):
    empty = headrace.Loader({"x": np.arange(10)}, batch=5, start=5, end=5, threads=1)
    with mix([empty, _loader(1)], on_source_exhausted="restart") as m:
        with pytest.raises(LoaderError, match="no batch to yield even after a restart"):
            next(m)
        with pytest.raises(LoaderError, match="stopped at an error"):
            iter(m)


class _Foreign:
    """A loader-like object of the user's: the mix contract, but no way onto a shared budget."""

    def __init__(self, loader):
        self.loader, self.batch_size = loader, loader.batch_size

    def __next__(self):
        return next(self.loader)

    def state_dict(self):
        return self.loader.state_dict()

    def load_state_dict(self, state):
        self.loader.load_state_dict(state)

    def stats(self):
        return self.loader.stats()

    def close(self):
        self.loader.close()


def test_a_source_that_cannot_share_the_budget_is_named():
    with pytest.raises(ConfigError, match="cannot cap source 0 \\(a _Foreign\\)"):
        mix([_Foreign(_loader(0)), _loader(2)], inflight=1 << 20)
    with mix([_Foreign(_loader(0)), _loader(2)]) as m:  # without a cap each keeps its own
        assert not m.stats()["mix_shared_budget"]
        assert len(_drain(m, 4)) == 4


def test_a_mix_as_a_source_splits_its_share_of_the_outer_budget():
    inner = mix([_loader(0, threads=2, prefetch=4), _loader(1, threads=2, prefetch=4)],
                on_source_exhausted="drop")
    need = inner._batch_need()
    assert need == 2 * 5 * 8  # a batch of each of its two sources (5 int64 records)
    outer = mix([inner, _loader(2)], weights=[2, 1], inflight=8 * need,
                on_source_exhausted="drop")
    block = inner.shared_max_inflight_bytes
    assert outer.budget.shares[0].reserve_bytes == block  # the inner mix's guaranteed reserve
    assert inner.budget is not None and inner.budget.cap_bytes == block
    with outer:
        got = _drain(outer)
        assert outer.budget.high_water_bytes <= 8 * need
        assert inner.budget.high_water_bytes <= block
    assert sorted(v for b in got for v in b) == sorted(
        [*range(100), *range(OFF, OFF + 100), *range(2 * OFF, 2 * OFF + 100)])
    assert outer.budget.used_bytes == 0  # the block came back at close


def test_stats_are_measured():
    """No constant keys: a resume mismatch is refused (CheckpointError), never counted."""
    with mix([_loader(0), _loader(1)]) as m:
        s = m.stats()
    assert "mix_resume_source_checkpoint_mismatch_total" not in s


def test_mixes_of_mixes_checkpoint_and_resume():
    def make(resume=None):
        inner = [mix([_loader(0, n=20), _loader(1, n=20)], on_source_exhausted="drop")
                 for _ in range(2)]
        middle = [mix(inner, on_source_exhausted="drop"),
                  mix([mix([_loader(2, n=20), _loader(3, n=20)], on_source_exhausted="drop")],
                      on_source_exhausted="drop")]
        return mix(middle, on_source_exhausted="drop", resume=resume)

    with make() as m:
        head = _drain(m, 7)
        token = m.checkpoint()
        rest = _drain(m)
    assert len(head) + len(rest) == 24  # 6 sources x 4 batches
    with make(resume=token) as again:
        assert _drain(again) == rest
