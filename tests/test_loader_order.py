"""Delivered order: deterministic, independent of threads, epochs/endless, rank sharding."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import headrace
from _loader_util import take
from headrace._order.make import make_order
from headrace._order.plan import BatchPlan
from headrace._sources.base import ArraySource

pytestmark = pytest.mark.timeout(120)

N = 37
COLS = {"v": np.arange(N, dtype=np.int64) * 10, "r": np.arange(N * 2, dtype=np.uint8).reshape(N, 2)}


def _ids(loader, count=None):
    return [ids for ids, _ in take(loader, count)]


@pytest.mark.parametrize("order", ["sequential", "shuffle", "iid"])
def test_order_is_the_pure_function_and_independent_of_threads(order):
    # A slow, jittery transform reorders completion; delivery must stay in batch order.
    rng = np.random.default_rng(0)
    delays = rng.uniform(0, 0.003, 64)

    def jitter(batch, ids):
        time.sleep(delays[int(ids[0]) % 64])
        return batch

    streams = []
    for threads in (1, 2, 5):
        with headrace.Loader(COLS, batch=5, order=order, seed=9, epochs=2, threads=threads,
                             transform=jitter) as ld:
            batches = take(ld, None)
        streams.append(batches)
    assert streams[0] == streams[1] == streams[2]
    flat = [i for ids, _ in streams[0] for i in ids]
    expected = make_order(order, N, seed=9).range(0, 2 * N).tolist()
    assert flat == expected
    for ids, batch in streams[0]:  # data matches ids
        assert batch["v"][2] == [10 * i for i in ids]


def test_epoch_mode_partial_and_drop_last():
    with headrace.Loader(COLS, batch=10, threads=2) as ld:
        assert len(ld) == 4
        assert [len(i) for i in _ids(ld)] == [10, 10, 10, 7]
    with headrace.Loader(COLS, batch=10, drop_last=True, epochs=2, threads=2) as ld:
        assert len(ld) == 6
        assert [len(i) for i in _ids(ld)] == [10] * 6
    with headrace.Loader(COLS, batch=10, epochs=0) as ld:
        assert len(ld) == 0 and _ids(ld) == []


def test_shuffle_epochs_are_permutations_and_differ():
    with headrace.Loader(COLS, batch=N, order="shuffle", seed=1, epochs=3, threads=2) as ld:
        epochs = _ids(ld)
    assert all(sorted(e) == list(range(N)) for e in epochs)
    assert epochs[0] != epochs[1] != epochs[2]


def test_endless_mode_runs_across_epochs_and_has_no_length():
    with headrace.Loader(COLS, batch=10, epochs=None, threads=2) as ld:
        with pytest.raises(TypeError, match="Eternal loader has no length"):
            len(ld)
        ids = _ids(ld, 8)
    flat = [i for b in ids for i in b]
    assert flat == [p % N for p in range(80)]  # the circular sliding window of loaderx
    with headrace.Loader(COLS, batch=10, epochs=None, epoch=2, order="shuffle", seed=3) as ld:
        first = _ids(ld, 1)[0]
    assert first == make_order("shuffle", N, seed=3).range(2 * N, 10).tolist()


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("tail", ["drop", "pad", "partial"])
def test_ranks_cover_the_epoch_disjointly(world, tail):
    per_rank = []
    for r in range(world):
        with headrace.Loader(COLS, batch=4, order="shuffle", seed=7, rank=r, world_size=world,
                             tail=tail, threads=2) as ld:
            batches = _ids(ld)
            assert len(ld) == len(batches)
        per_rank.append(batches)
    counts = [len(b) for b in per_rank]
    flat = [i for rank in per_rank for b in rank for i in b]
    g = world * 4
    if tail == "drop":
        assert counts == [N // g] * world
        assert len(set(flat)) == len(flat) == (N // g) * g
    elif tail == "pad":
        assert counts == [-(-N // g)] * world
        # pad fills samples, not batches: ceil(N / W) per rank, fewer than W read twice
        assert [sum(map(len, b)) for b in per_rank] == [-(-N // world)] * world
        assert set(flat) == set(range(N)) and len(flat) - N < world
    else:
        assert sorted(flat) == list(range(N))
    # Rank r's k-th batch holds global positions (k*W + r)*B .. +B.
    order = make_order("shuffle", N, seed=7)
    assert per_rank[1][0] == order.range(4, 4).tolist()


def test_start_end_range_maps_the_order_into_the_range():
    with headrace.Loader(COLS, batch=4, start=10, end=20, order="shuffle", seed=0) as ld:
        flat = [i for b in _ids(ld) for i in b]
    assert sorted(flat) == list(range(10, 20))
    assert flat == (make_order("shuffle", 10, seed=0).range(0, 10) + 10).tolist()


def test_bad_arguments():
    with pytest.raises(headrace.ConfigError, match="unknown order 'random'"):
        headrace.Loader(COLS, order="random")
    with pytest.raises(headrace.ConfigError, match="batch must be >= 1"):
        headrace.Loader(COLS, batch=0)
    with pytest.raises(headrace.ConfigError, match="rank must be < world_size"):
        headrace.Loader(COLS, rank=2, world_size=2)
    with pytest.raises(headrace.ConfigError, match="unknown tail"):
        headrace.Loader(COLS, tail="wrap")
    with pytest.raises(headrace.ConfigError, match="conflicts"):
        headrace.Loader(COLS, drop_last=True, tail="pad")
    for epochs in (None, 1):  # empty data: never an empty epoch nor a spin
        with pytest.raises(headrace.ConfigError, match="the dict given holds no records"):
            headrace.Loader({"v": np.zeros(0)}, epochs=epochs)
    with pytest.raises(headrace.ConfigError, match="needs at least one record"):
        headrace.Loader(COLS, epochs=None, start=2, end=2)


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 40), b=st.integers(1, 9), w=st.integers(1, 4), epochs=st.integers(1, 3),
       tail=st.sampled_from(["drop", "pad", "partial"]), data=st.data())
def test_plan_properties(n, b, w, epochs, tail, data):
    plans = [BatchPlan(length=n, batch=b, rank=r, world_size=w, tail=tail, start_position=0,
                       end_position=epochs * n) for r in range(w)]
    steps = [list(p.steps()) for p in plans]
    for p, s in zip(plans, steps, strict=True):
        assert p.count() == len(s)
        afters = [x.after for x in s]
        assert afters == sorted(afters) and all(a <= epochs * n for a in afters)
    for e in range(epochs):  # per epoch, ranks together read each position at most once
        pos = [q for s in steps for x in s if x.positions is None and e * n <= x.start < (e + 1) * n
               for q in range(x.start, x.start + x.count)]
        assert len(pos) == len(set(pos))
        assert all(e * n <= q < (e + 1) * n for q in pos)
        if tail == "partial":
            assert sorted(pos) == list(range(e * n, (e + 1) * n))
    # Resuming rank 0 from any step's `after` (same world size) gives the rest of its stream.
    s0 = steps[0]
    if s0:
        k = data.draw(st.integers(0, len(s0) - 1))
        resumed = BatchPlan(length=n, batch=b, rank=0, world_size=w, tail=tail,
                            start_position=s0[k].after, end_position=epochs * n)
        rest = [(x.start, x.count, x.after) for x in resumed.steps()]
        assert rest == [(x.start, x.count, x.after) for x in s0[k + 1:]]


@pytest.mark.parametrize("start", [None, 3])
def test_sources_read_shared_read_only_ids_and_transforms_get_their_own(start):
    # The dispatcher hands sources the order's memoized block itself (no copy per batch); a
    # source must not be able to scribble on it, and a transform (user code that may keep or
    # edit its ids) gets a writable copy.
    seen = []

    class Probe(ArraySource):
        def gather(self, ids):
            seen.append(ids.flags.writeable)
            with pytest.raises(ValueError):
                ids[0] = -1
            return super().gather(ids)

    def edit(batch, ids):
        ids += 0  # writable, and editing it changes nothing the loader or the order holds
        batch["ids"] = ids
        return batch

    with headrace.Loader(Probe(COLS), batch=5, order="shuffle", seed=4, epochs=2, start=start,
                         end=N if start else None, transform=edit) as ld:
        got = [(b["ids"].copy(), ld.last_ids.copy()) for b in ld]
    order = make_order("shuffle", N - (start or 0), seed=4)
    assert seen and not any(seen)
    want = np.concatenate([o for o, _ in got])
    assert np.array_equal(want, np.concatenate([last for _, last in got]))
    n = len(want)
    assert np.array_equal(np.sort(want[: n // 2]), np.arange(start or 0, N))
    assert np.array_equal(want[: n // 2], order.range(0, n // 2) + (start or 0))
