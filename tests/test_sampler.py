"""Samplers: order as a pure function of (mode, seed, N, position), and the loaderx ``Sampler``."""

from __future__ import annotations

import itertools
import math
import os
import pickle
import shutil
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import headrace
from headrace import ConfigError
from headrace._order import shuffle as _shuffle
from headrace._order.sampler import Mode, Sampler, make_order
from headrace._order.shuffle import _BLOCK_BITS

MODES = [Mode.SEQUENTIAL, Mode.IID, Mode.SHUFFLE]


def take(sampler: Sampler, n: int) -> list[list[int]]:
    return [b.tolist() for b in itertools.islice(sampler, n)]


# ---------------------------------------------------------------------------- SEQUENTIAL golden

def test_sequential_is_loaderx_circular_window():
    s = Sampler(10, 4, Sampler.Mode.SEQUENTIAL)
    assert take(s, 4) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 1], [2, 3, 4, 5]]
    assert take(Sampler(3, 5, Sampler.Mode.SEQUENTIAL), 2) == [[0, 1, 2, 0, 1], [2, 0, 1, 2, 0]]
    assert take(Sampler(1, 3, 0), 2) == [[0, 0, 0], [0, 0, 0]]


def test_next_returns_fresh_int64_arrays():
    for mode in MODES:
        s = Sampler(50, 8, mode)
        a = s.next()
        b = s.next()
        assert a.dtype == np.int64 and a.shape == (8,)
        assert not np.shares_memory(a, b)
        a[:] = -1  # the caller owns it: the next batch is unaffected
        assert (s.next() >= 0).all()


def test_mode_spellings():
    for spelled in ("iid", "IID", " Iid ", 1, Mode.IID, np.int64(1)):
        assert Sampler(10, 2, spelled).mode is Mode.IID
    assert Sampler(10, 2, "shuffle").mode is Mode.SHUFFLE
    assert Sampler.Mode.SEQUENTIAL == 0 and Sampler.Mode.IID == 1 and Sampler.Mode.SHUFFLE == 2
    assert headrace.Sampler is Sampler


# ---------------------------------------------------------------------------- determinism

@pytest.mark.parametrize("mode", MODES)
def test_same_seed_same_stream_different_seed_different_stream(mode):
    a = take(Sampler(1000, 64, mode, seed=7), 40)
    assert take(Sampler(1000, 64, mode, seed=7), 40) == a
    if mode != Mode.SEQUENTIAL:
        assert take(Sampler(1000, 64, mode, seed=8), 40) != a
        assert take(Sampler(1000, 64, mode, seed=0), 40) != take(
            Sampler(1000, 64, mode, seed=2**64 - 1), 40)


def test_iid_and_shuffle_streams_are_fixed_across_releases():
    # Pinned values: a change here breaks every checkpoint in the wild. Update only on purpose.
    assert make_order("iid", 10, seed=42).range(0, 12).tolist() == [
        1, 2, 1, 8, 5, 8, 1, 7, 1, 0, 3, 5]
    o = make_order("shuffle", 10, seed=42)
    assert sorted(o.range(0, 10).tolist()) == list(range(10))
    assert o.range(0, 10).tolist() == GOLDEN_SHUFFLE_10
    assert make_order("shuffle", 10**6, seed=42).range(0, 10).tolist() == GOLDEN_SHUFFLE_1E6


GOLDEN_SHUFFLE_10 = [0, 6, 7, 3, 5, 1, 2, 9, 8, 4]  # N <= 4096: sorted random keys
GOLDEN_SHUFFLE_1E6 = [510170, 44950, 155379, 325382, 965334, 116114, 61753, 345602, 315639,
                      316252]  # larger N: the Feistel network


def test_shuffle_epochs_differ():
    o = make_order("shuffle", 1000, seed=1)
    epochs = [o.range(e * 1000, 1000).tolist() for e in range(5)]
    assert len({tuple(e) for e in epochs}) == 5


@pytest.mark.parametrize("mode", MODES)
def test_seek_equals_advancing(mode):
    ref = Sampler(97, 10, mode, seed=3)
    stream = take(ref, 60)
    s = Sampler(97, 10, mode, seed=3)
    for step in (0, 59, 13, 14, 1, 40, 0, 33):
        s.seek(step)
        assert s.step == step
        assert take(s, 60 - step) == stream[step:], step
    s.seek(2**40)  # far ahead is O(1) and exact
    far = s.next()
    s.seek(2**40)
    assert s.next().tolist() == far.tolist()


@pytest.mark.parametrize("mode", MODES)
def test_state_round_trip(mode):
    s = Sampler(1234, 32, mode, seed=9, rank=1, world_size=3)
    take(s, 17)
    st = s.state()
    assert all(isinstance(v, int) for v in st.values())
    assert st["step"] == 17 and st["position"] == (17 * 3 + 1) * 32
    r = Sampler.from_state(st)
    assert take(r, 20) == take(s, 20)


@pytest.mark.parametrize("mode", MODES)
def test_pickle_round_trip(mode):
    s = Sampler(20_000, 64, mode, seed=5, rank=1, world_size=2)
    take(s, 3)
    r = pickle.loads(pickle.dumps(s))
    assert r.state() == s.state()
    assert take(r, 5) == take(s, 5)
    o = make_order(mode, 20_000, seed=5)
    assert np.array_equal(pickle.loads(pickle.dumps(o)).range(7, 300), o.range(7, 300))


def test_epoch_of():
    s = Sampler(100, 30, "shuffle")
    assert [s.epoch_of(k) for k in range(5)] == [0, 0, 0, 0, 1]
    assert s.epoch_of() == 0
    s.seek(10)
    assert s.epoch_of() == 3
    w = Sampler(100, 10, "shuffle", rank=1, world_size=4)
    assert w.epoch_of(2) == ((2 * 4 + 1) * 10) // 100


# ---------------------------------------------------------------------------- purity

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("n", [1, 2, 7, 100, 2**20 + 3, 2**40 + 5, 2**63])
def test_indices_equal_range_pieces(mode, n):
    o = make_order(mode, n, seed=5)
    start = 3 * n + 5 if n < 2**20 else 2**30 + 7  # crosses epoch boundaries for small n
    total = 300
    whole = o.range(start, total)
    assert whole.dtype == np.int64
    assert ((whole >= 0) & (whole < n)).all()
    pos = np.arange(start, start + total, dtype=np.uint64)
    assert np.array_equal(o.indices(pos), whole)
    assert np.array_equal(o.indices(pos.astype(np.int64)), whole)
    rng = np.random.default_rng(n % 1000)
    cuts = np.sort(rng.choice(np.arange(1, total), size=9, replace=False)).tolist()
    parts = [o.range(start + a, b - a) for a, b in itertools.pairwise([0, *cuts, total])]
    assert np.array_equal(np.concatenate(parts), whole)
    perm = rng.permutation(total)  # any order, any shape
    assert np.array_equal(o.indices(pos[perm].reshape(20, 15)), whole[perm].reshape(20, 15))
    out = np.empty(total, dtype=np.int64)
    assert o.range(start, total, out=out) is out and np.array_equal(out, whole)


@pytest.mark.parametrize("mode", MODES)
def test_empty_requests(mode):
    o = make_order(mode, 10**6, seed=1)
    assert o.range(123, 0).shape == (0,) and o.range(123, 0).dtype == np.int64
    assert o.indices(np.zeros((0, 3), dtype=np.uint64)).shape == (0, 3)


def test_indices_spanning_many_epochs_match_range():
    for n in (2, 3, 5, 64, 1000, 5000):
        o = make_order("shuffle", n, seed=11)
        whole = o.range(0, 40 * n)  # many epochs at once: batched keys / per-element round keys
        for e in range(40):
            assert sorted(whole[e * n:(e + 1) * n].tolist()) == list(range(n))
            assert np.array_equal(whole[e * n:(e + 1) * n], o.range(e * n, n))
        pos = np.random.default_rng(n).integers(0, 40 * n, size=500)
        assert np.array_equal(o.indices(pos), whole[pos])


@pytest.mark.parametrize("mode", MODES)
def test_one_order_shared_by_threads(mode):
    # the loader's workers share one Order: caches and IID's generator must not mix streams
    n, b = 50_000, 300
    expected = make_order(mode, n, seed=8).range(0, 64 * b)
    o = make_order(mode, n, seed=8)
    got: dict[int, np.ndarray] = {}

    def work(k0: int) -> None:
        for k in range(k0, 64, 4):
            got[k] = o.range(k * b, b) if k % 3 else o.indices(np.arange(k * b, k * b + b))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert np.array_equal(np.concatenate([got[k] for k in range(64)]), expected)


def test_arithmetic_and_table_round_functions_agree(monkeypatch):
    import headrace._order.shuffle as order_mod

    o = make_order("shuffle", 10_007, seed=4)
    pos = np.arange(20_014, dtype=np.uint64)
    expected = o.indices(pos)
    monkeypatch.setattr(order_mod, "_TABLE_MAX_BITS", 0)  # force the per-element arithmetic
    assert np.array_equal(make_order("shuffle", 10_007, seed=4).indices(pos), expected)


# ---------------------------------------------------------------------------- SHUFFLE permutation

SMALL_N = sorted({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 31, 97, 101, 127, 997, 1009}
                 | {2**k + d for k in range(1, 17) for d in (-1, 0, 1)})


@pytest.mark.parametrize("seed", [0, 42, 2**64 - 1])
def test_shuffle_is_a_permutation(seed):
    for n in SMALL_N:
        o = make_order("shuffle", n, seed=seed)
        for epoch in (0, 1, 12345):
            got = o.range(epoch * n, n)
            assert np.array_equal(np.sort(got), np.arange(n)), (n, epoch)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 20_000), seed=st.integers(0, 2**64 - 1), epoch=st.integers(0, 2**40),
       cut=st.integers(0, 20_000))
def test_shuffle_permutation_property(n, seed, epoch, cut):
    o = make_order("shuffle", n, seed=seed)
    cut = cut % (n + 1)
    perm = np.concatenate([o.range(epoch * n, cut), o.range(epoch * n + cut, n - cut)])
    assert np.array_equal(np.sort(perm), np.arange(n))
    assert np.array_equal(o.indices(np.arange(epoch * n, epoch * n + n, dtype=np.uint64)), perm)


def test_shuffle_is_a_permutation_for_a_large_table_free_n():
    n = 2**31 + 12345  # above the memoized-table size: the per-element arithmetic path
    o = make_order("shuffle", n, seed=2)
    # a bijection maps distinct inputs to distinct outputs; check on a big sample + a window
    rng = np.random.default_rng(0)
    pos = np.unique(rng.integers(0, n, size=200_000))
    out = o.indices(pos)
    assert np.unique(out).size == pos.size and out.min() >= 0 and out.max() < n
    win = o.range(n - 5000, 10_000)  # across the epoch boundary
    assert np.unique(win[:5000]).size == 5000 and np.unique(win[5000:]).size == 5000


@pytest.mark.parametrize("n", [2**63 - 25, 2**63, 2**62 + 1, 10**18])
def test_shuffle_huge_n_spot_checks(n):
    o = make_order("shuffle", n, seed=7)
    rng = np.random.default_rng(1)
    pos = np.unique(np.concatenate([
        rng.integers(0, 2**62, size=20_000, dtype=np.int64).astype(np.uint64) * np.uint64(2)
        % np.uint64(n),
        np.arange(1000, dtype=np.uint64), np.uint64(n) - np.arange(1, 1001, dtype=np.uint64)]))
    out = o.indices(pos)
    assert np.unique(out).size == pos.size
    assert out.min() >= 0 and (out.view(np.uint64) < np.uint64(n)).all()
    nxt = o.indices(pos + np.uint64(n))  # epoch 1 at the same offsets
    assert np.unique(nxt).size == pos.size and not np.array_equal(nxt, out)


def _per_element(o, positions):
    """Reference ids: the Feistel network with per-element round keys and array cycle-walks."""
    from headrace._order.shuffle import _round_keys

    pos = np.asarray(positions, dtype=np.uint64)
    epochs = pos // np.uint64(o.length)
    keys = _round_keys(o._key, epochs)
    return o._walk_keys(pos - epochs * np.uint64(o.length), keys, same=False)


# N just above SMALL_MAX (a = 128: 127 strays an epoch), a*b - 2 (2 strays), a*b (none),
# 2**20 + 1 (a = 2048: 2047 strays), 2**27 + 1 and 2**29 + 1 (a = 2**14, 2**15: a memoized
# block of 2**14 offsets is one row, half a row)
FAST_PATH_N = [4097, 4222, 4224, 10007, 65537, 2**20 - 1, 2**20 + 1, 2**27 + 1, 2**29 + 1]


@pytest.mark.parametrize("c_network", [True, False], ids=["c", "numpy"])
@pytest.mark.parametrize("n", FAST_PATH_N)
def test_shuffle_fast_paths_equal_the_per_element_network(n, c_network, monkeypatch):
    # the memoized blocks (epoch-aligned rows, stray offsets known per epoch), the table pass with
    # the walk table, and the per-element round keys must give the same id at every position,
    # with the C network (the default build) and with the NumPy passes that stand in without it
    if not c_network:
        monkeypatch.setattr(_shuffle, "_CNetwork", None)
    for seed in (0, 5, 2**64 - 1):
        o = make_order("shuffle", n, seed=seed)
        block = 1 << _BLOCK_BITS
        starts = [0, n - 4000, 7 * n - 9000, 2**33 * n + 8192 - 300, 5 * n + block - 300]
        if n < 70_000:
            starts.append(n)  # a whole epoch in consecutive batches
        for p0 in starts:
            total = n if p0 == n else 12_000  # straddles blocks and, for some, epochs
            want = _per_element(o, np.arange(p0, p0 + total, dtype=np.uint64))
            batches = [o.range(p0 + k, min(256, total - k)) for k in range(0, total, 256)]
            assert np.array_equal(np.concatenate(batches), want), (n, seed, p0)
            odd = [o.range(p0 + k, min(1000, total - k)) for k in range(0, total, 1000)]
            assert np.array_equal(np.concatenate(odd), want), (n, seed, p0)
            assert np.array_equal(o.range(p0, total), want), (n, seed, p0)  # one table pass
        pos = np.random.default_rng(seed % 97).integers(0, 3 * n, size=3000, dtype=np.uint64)
        assert np.array_equal(o.indices(pos), _per_element(o, pos)), (n, seed)


def test_the_c_network_is_built_and_equals_the_numpy_tables():
    # setup.py builds it wherever a C compiler exists (CI's machines have one): a silently failed
    # build would make the loader's shuffle ~3x dearer per batch. Without any compiler the NumPy
    # passes stand in (test_shuffle_fast_paths_equal_the_per_element_network covers them).
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    assert _shuffle.accelerated() or compiler is None, f"C compiler {compiler} but no C build"
    if not _shuffle.accelerated():  # the fallback is wired: no network, the NumPy blocks
        o = make_order("shuffle", 200_000, seed=3)
        assert o._epoch_net(0) is None and o.range(0, 5).tolist() == o.indices(range(5)).tolist()
        return
    for n, seed, epoch in ((200_000, 3, 0), (4097, 0, 10), (2**20 + 1, 5, 2**40), (65536, 1, 3)):
        o = make_order("shuffle", n, seed=seed)
        t, net = o._epoch_tables(epoch), o._epoch_net(epoch)
        src, dst = (np.frombuffer(x, dtype=np.int64) for x in net.strays())
        assert np.array_equal(src, t.src) and np.array_equal(dst, t.dst), (n, epoch)
        for start, count in ((0, n), (n - 1000, 1000), (int(t.src[0]) if len(t.src) else 0, 1)):
            want = o._fix_strays(o._feistel_tables(np.arange(start, start + count), t.rounds,
                                                   t.merge), t, start)
            assert np.array_equal(_run(net, start, count), want), (n, start)
        assert np.array_equal(np.sort(_run(net, 0, n)), np.arange(n))  # a permutation
    o = make_order("shuffle", 200_000, seed=3)
    with pytest.raises(ValueError, match=r"outside 0\.\.199999"):
        _run(o._epoch_net(0), 199_990, 20)
    build = _shuffle._CNetwork.build
    with pytest.raises(ValueError, match="does not fit"):
        build(9, 391, 1000, [1] * 6)
    with pytest.raises(ValueError, match="6 round keys, got 5"):
        build(9, 391, 200_000, [1] * 5)
    with pytest.raises(ValueError, match="need 1 <= ka <= 16"):
        build(0, 391, 200_000, [1] * 6)
    with pytest.raises(OverflowError):
        build(9, 391, 200_000, [2**64, 1, 1, 1, 1, 1])
    with pytest.raises(TypeError, match="contiguous int64"):
        o._epoch_net(0).run(np.empty(10, dtype=np.int32), 0)


def _run(net, start, count):
    out = np.empty(count, dtype=np.int64)
    net.run(out, start)
    return out


def test_one_epochs_round_keys_equal_the_array_form():
    from headrace._order.shuffle import _epoch_round_keys, _round_keys

    for key in (0, 12345, 2**64 - 1):
        for epoch in (0, 1, 7, 2**40 + 3, 2**64 - 1):
            want = _round_keys(key, np.array([epoch], dtype=np.uint64))[:, 0]
            assert np.array_equal(_epoch_round_keys(key, epoch), want), (key, epoch)


@pytest.mark.parametrize("mode", ["sequential", "iid", "shuffle"])
def test_shared_range_is_range_read_only(mode):
    # the loader's no-copy path: the same ids as range(), never writable (they may be a block's)
    o = make_order(mode, 100_000, seed=11)
    for start in (0, 256, 16_384 - 100, 99_900, 3 * 100_000 + 7):
        got = o.shared_range(start, 256)
        assert np.array_equal(got, o.range(start, 256))
        assert not got.flags.writeable
        with pytest.raises(ValueError):
            got[0] = 1


def test_shuffle_walk_table_with_a_cycle_of_strays_only():
    # N = 4097, seed 0: epoch 10 has a stray v >= N with F(v) == v (221: a 2-cycle of strays).
    # No offset maps onto it, its walk never ends: the walk table must stop there, not loop.
    n = 4097
    o = make_order("shuffle", n, seed=0)
    for epoch in (10, 221):
        tables = o._epoch_tables(epoch)
        assert (tables.walk >= n).any()
        got = np.concatenate([o.range(epoch * n + k, 256) for k in range(0, n, 256)])[:n]
        want = _per_element(o, np.arange(epoch * n, epoch * n + n, dtype=np.uint64))
        assert np.array_equal(got, want)
        assert np.array_equal(np.sort(got), np.arange(n))


@pytest.mark.parametrize("n", [4097, 10007, 2**20 + 1])
def test_shuffle_inverse_network_and_stray_sources(n):
    o = make_order("shuffle", n, seed=3)
    tables = o._epoch_tables(2)
    ab = o._a * o._b
    y = np.arange(ab, dtype=np.int64) if ab < 100_000 else \
        np.random.default_rng(0).integers(0, ab, size=100_000)
    x = o._inverse(y, tables.rounds, tables.fa0)
    assert np.array_equal(o._feistel_tables(x.copy(), tables.rounds, tables.merge), y)
    # the stray sources: exactly the offsets < N whose image is >= N, with their walked ids
    if ab < 100_000:
        img = o._feistel_tables(np.arange(n, dtype=np.int64), tables.rounds, tables.merge)
        assert np.array_equal(tables.src, np.flatnonzero(img >= n))
    want = _per_element(o, tables.src.astype(np.uint64) + np.uint64(2 * n))
    assert np.array_equal(tables.dst, want)


def test_short_range_fast_path_keeps_validation_and_fresh_arrays():
    for mode in MODES:
        o = make_order(mode, 20_000, seed=1)
        a = o.range(300, 256)  # memoizes the block holding 300
        b = o.range(300, 256)
        assert np.array_equal(a, b) and not np.shares_memory(a, b)
        a[:] = -1
        assert (o.range(300, 256) >= 0).all()
        with pytest.raises(ConfigError, match="positions"):
            o.range(300, -1)
        with pytest.raises(ConfigError, match="positions"):
            o.range(-1, 3)
        out = np.empty(256, dtype=np.int64)
        assert o.range(300, 256, out=out) is out and np.array_equal(out, b)
        assert o.range(300, 0).shape == (0,)


# ---------------------------------------------------------------------------- statistics

def test_shuffle_positions_not_correlated_across_epochs():
    n = 100_000
    o = make_order("shuffle", n, seed=123)
    perms = [o.range(e * n, n).astype(np.float64) for e in range(4)]
    ident = np.arange(n, dtype=np.float64)
    bound = 4 / np.sqrt(n)  # |r| of two independent permutations ~ N(0, 1/n): 4 sigma
    for a, b in itertools.pairwise(perms):
        assert abs(np.corrcoef(a, b)[0, 1]) < bound  # values are ranks: Pearson == Spearman
    for p in perms:
        assert abs(np.corrcoef(p, ident)[0, 1]) < bound  # and not correlated with the position
        # neighbouring positions land far apart (no runs): mean |p[i+1]-p[i]| ~ n/3
        gap = np.abs(np.diff(p)).mean()
        assert abs(gap - n / 3) < 0.02 * n


@pytest.mark.parametrize("n", [50, 5000])  # sorted-keys path and Feistel path
def test_shuffle_where_index_zero_lands_is_uniform(n):
    # For many seeds, the slot where record 0 lands (in 50 equal bins of slots) is uniform.
    seeds, bins = 3000, 50
    slots = np.empty(seeds, dtype=np.int64)
    for s in range(seeds):
        slots[s] = int(np.flatnonzero(make_order("shuffle", n, seed=s).range(0, n) == 0)[0])
    counts = np.bincount(slots * bins // n, minlength=bins)
    expected = seeds / bins
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 100  # 49 degrees of freedom: the 99.999th percentile is ~ 100


def _chi2_over_orders(rows: np.ndarray, n: int) -> tuple[int, float]:
    codes = rows @ (n ** np.arange(n))  # one integer per order
    counts = np.unique(codes, return_counts=True)[1]
    k = math.factorial(n)
    expected = rows.shape[0] / k
    return counts.size, float(((counts - expected) ** 2 / expected).sum() + (k - counts.size)
                              * expected)


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 7])
def test_small_shuffle_is_uniform_over_all_orders(n):
    # tiny N: every one of the N! orders, equally often over epochs and over seeds
    k = math.factorial(n)
    rows = make_order("shuffle", n, seed=5).range(0, n * 100 * k).reshape(-1, n)
    seen, chi2 = _chi2_over_orders(rows, n)
    assert seen == k and chi2 < (k - 1) + 6 * math.sqrt(2 * (k - 1))
    if n <= 4:
        rows = np.array([make_order("shuffle", n, seed=s).range(n, n) for s in range(50 * k)])
        seen, chi2 = _chi2_over_orders(rows, n)
        assert seen == k and chi2 < (k - 1) + 6 * math.sqrt(2 * (k - 1))


def test_feistel_adjacent_ids_keep_no_trace():
    # Ids x and x^1 share the high half; a 4-round network keeps their xor difference in the low
    # half twice as often as chance (seed-dependent, up to 5x). Six rounds must not.
    n, a = 2**16, 256  # a = b = 256: no cycle-walking
    x = np.arange(n)
    ratios = []
    for seed in range(12):
        y = make_order("shuffle", n, seed=seed).range(0, n)
        ratios.append(np.mean(((y ^ y[x ^ 1]) & (a - 1)) == 1) * a)
    assert 0.85 < np.mean(ratios) < 1.15 and max(ratios) < 1.5


def test_shuffle_epoch_pairs_are_uniform():
    # Over epochs of one seed, the pair (slot of record 0, slot of record 1) is uniform-ish.
    n, epochs = 20, 4000
    o = make_order("shuffle", n, seed=99)
    first = o.range(0, n * epochs).reshape(epochs, n)
    slot0 = np.argmax(first == 0, axis=1)
    counts = np.bincount(slot0, minlength=n)
    chi2 = ((counts - epochs / n) ** 2 / (epochs / n)).sum()
    assert chi2 < 60  # 19 degrees of freedom


@pytest.mark.parametrize("n", [10, 1000, 2**20, 2**20 + 1, 3 * 2**40 + 1])
def test_iid_is_uniform(n):
    o = make_order("iid", n, seed=2024)
    draws = o.range(12345, 400_000)
    assert draws.min() >= 0 and draws.max() < n
    bins = 100 if n >= 100 else n
    counts = np.bincount((draws * bins // n) if n < 2**40 else
                         (draws // -(-n // bins)), minlength=bins)
    expected = draws.size / bins
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < bins + 6 * np.sqrt(2 * bins)  # mean bins-1, sd sqrt(2(bins-1))
    # consecutive draws are not correlated
    assert abs(np.corrcoef(draws[:-1].astype(float), draws[1:].astype(float))[0, 1]) < 0.01


def test_iid_low_bits_are_uniform():
    # both 32-bit halves of each hash are used for small N: check parity and each half separately
    draws = make_order("iid", 1024, seed=1).range(0, 200_000)
    for half in (draws[0::2], draws[1::2]):
        assert abs((half & 1).mean() - 0.5) < 0.01
        counts = np.bincount(half, minlength=1024)
        chi2 = ((counts - half.size / 1024) ** 2 / (half.size / 1024)).sum()
        assert chi2 < 1024 + 6 * np.sqrt(2048)


# ---------------------------------------------------------------------------- rank sharding

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_ranks_partition_the_single_rank_stream(mode, world):
    n, b, steps = 101, 7, 30
    single = take(Sampler(n, b, mode, seed=4), steps * world)
    per_rank = [take(Sampler(n, b, mode, seed=4, rank=r, world_size=world), steps)
                for r in range(world)]
    for k in range(steps):
        for r in range(world):
            assert per_rank[r][k] == single[k * world + r]
    if mode == Mode.SHUFFLE:  # within one epoch, the ranks' batches are disjoint
        o = make_order(mode, n, seed=4)
        flat = [i for k in range(steps) for r in range(world) for i in per_rank[r][k]]
        assert flat == o.range(0, steps * world * b).tolist()
        first_epoch = flat[:n]
        assert sorted(first_epoch) == list(range(n))


def test_small_batch_blocks_do_not_change_the_stream():
    # next() computes small batches in blocks; seeks and block borders must not show
    for mode in MODES:
        o = make_order(mode, 5000, seed=6)
        s = Sampler(5000, 100, mode, seed=6)
        for step in (0, 1, 81, 82, 163, 5, 500):
            s.seek(step)
            assert s.next().tolist() == o.range(step * 100, 100).tolist()


# ---------------------------------------------------------------------------- validation

def test_validation_errors():
    with pytest.raises(ConfigError, match=r"Sampler length must be >= 1, got 0: the dataset is empty"):
        Sampler(0, 4, Sampler.Mode.SEQUENTIAL)
    with pytest.raises(ConfigError, match="batch_size must be >= 1, got 0"):
        Sampler(10, 0, Sampler.Mode.IID)
    with pytest.raises(ConfigError, match=r"length must be in 1\.\."):
        Sampler(-1, 4, 1)
    with pytest.raises(ConfigError, match="batch_size"):
        Sampler(10, -4, 1)
    with pytest.raises(ConfigError, match="unknown sampler mode 7"):
        Sampler(10, 4, 7)
    with pytest.raises(ConfigError, match="unknown sampler mode 'random'"):
        Sampler(10, 4, "random")
    with pytest.raises(ConfigError, match=r"seed must be in 0\.\.18446744073709551615, got -1"):
        Sampler(10, 4, 1, seed=-1)
    with pytest.raises(ConfigError, match="seed"):
        Sampler(10, 4, 1, seed=2**64)
    with pytest.raises(ConfigError, match=r"2\*\*63"):
        Sampler(2**63 + 1, 4, Sampler.Mode.SHUFFLE)
    with pytest.raises(ConfigError, match="rank"):
        Sampler(10, 4, 1, rank=2, world_size=2)
    with pytest.raises(ConfigError, match="world_size"):
        Sampler(10, 4, 1, world_size=0)
    with pytest.raises(ConfigError, match="step"):
        Sampler(10, 4, 1).seek(-1)
    with pytest.raises(ConfigError, match="positions must be >= 0"):
        make_order("iid", 10).indices(np.array([3, -1]))
    with pytest.raises(ConfigError, match="positions"):
        make_order("iid", 10).range(-1, 3)
    for bad in (True, 10.0, "10", None):
        with pytest.raises(TypeError):
            Sampler(bad, 4, 1)
        with pytest.raises(TypeError):
            Sampler(10, bad, 1)
    with pytest.raises(TypeError):
        Sampler(10, 4, 1, seed=1.5)
    with pytest.raises(TypeError):
        Sampler(10, 4, True)
    with pytest.raises(TypeError):
        Sampler(10, 4, 1.0)
    with pytest.raises(TypeError):
        make_order("iid", 10).indices(np.array([1.0]))
    assert issubclass(ConfigError, ValueError)


def test_repr_and_properties():
    s = Sampler(10, 4, "shuffle", 3, rank=1, world_size=2)
    assert (s.length, s.batch_size, s.seed, s.rank, s.world_size, s.step) == (10, 4, 3, 1, 2, 0)
    assert "SHUFFLE" in repr(s) and "seed=3" in repr(s)
    assert s.order.mode is Mode.SHUFFLE and s.position_of(2) == (2 * 2 + 1) * 4
