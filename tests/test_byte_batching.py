"""Byte-aware batching (``batch_bytes`` hard ceiling, ``target_bytes`` soft target with mx8's
85%/115% band): the splits match mx8 1.0.7's on the same pack, on every source kind with
per-record sizes, across ranks and resume."""

from __future__ import annotations

import os
import random

import mx8
import numpy as np
import pytest

import headrace
from headrace import ConfigError
from headrace._order.byte_plan import BytePlan, byte_split


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("bytes_in")
    rng = random.Random(7)
    for i in range(60):
        d = root / ("a" if i % 3 else "b")
        d.mkdir(exist_ok=True)
        (d / f"{i:03d}.jpg").write_bytes(os.urandom(rng.randint(1500, 9000)))
    return root


@pytest.fixture(scope="module")
def pack(tree, tmp_path_factory):
    out = tmp_path_factory.mktemp("bytes_pk") / "pk"
    mx8.pack_dir(str(tree), out=str(out), shard_mb=1)
    return out


def _mx8_splits(pack, tmp_path, **kw):
    ld = mx8.load(str(pack), store=str(tmp_path / "ms"), **kw)
    return [list(b.sample_ids) for b in ld]





def _ids(ld):
    for _ in ld:
        yield ld.last_ids.tolist()


def test_reference_example_splits():
    # the reference's observed sizes: target 10000 -> 3, 2, 2; 20000 -> one batch of all six
    sizes = [3704, 3897, 4375, 4453, 4460, 4463]
    assert np.diff([0, *byte_split(sizes, batch=64, batch_bytes=None,
                                   target_bytes=10000)]).tolist() == [3, 2, 1]
    assert byte_split(sizes, batch=64, batch_bytes=None, target_bytes=20000).tolist() == [5, 6]
    assert byte_split(sizes, batch=4, batch_bytes=None, target_bytes=10**9).tolist() == [4, 6]
    assert byte_split(sizes, batch=64, batch_bytes=8000, target_bytes=None).tolist() == [
        2, 3, 4, 5, 6]


@pytest.mark.parametrize("kw", [
    dict(batch=64, target_bytes=5000), dict(batch=64, target_bytes=9000),
    dict(batch=64, target_bytes=10000), dict(batch=64, target_bytes=20000),
    dict(batch=3, target_bytes=20000), dict(batch=64, batch_bytes=12000),
    dict(batch=5, batch_bytes=30000), dict(batch=64, target_bytes=20000, batch_bytes=21000),
])
def test_splits_match_mx8_on_the_same_pack(pack, tmp_path, kw):
    want = _mx8_splits(pack, tmp_path, **kw)
    got = [ids for ids in _ids(headrace.load(str(pack), **kw))]
    assert got == want
    assert sum(map(len, got)) == 60


def test_a_record_past_batch_bytes_is_a_clear_error(pack, tmp_path):
    with pytest.raises(RuntimeError, match="max_batch_bytes 2000"):
        _mx8_splits(pack, tmp_path, batch=8, batch_bytes=2000)
    with pytest.raises(ConfigError, match=r"record \d+ has \d+ bytes > batch_bytes 2000; raise "
                                          r"batch_bytes to at least \d+"):
        headrace.load(str(pack), batch=8, batch_bytes=2000)


def test_raw_folder_and_store_cut_as_the_pack(tree, pack, tmp_path):
    want = [ids for ids in _ids(headrace.load(str(pack), batch=64, target_bytes=12000))]
    store = tmp_path / "st.hr"
    headrace.pack_dir(str(tree), out=str(store))
    got_store = [ids for ids in _ids(headrace.load(str(store), batch=64, target_bytes=12000))]
    got_raw = [ids for ids in _ids(headrace.load(str(tree), batch=64, target_bytes=12000))]
    assert got_store == want and got_raw == want


def test_ceiling_holds_and_batches_fill_the_band(pack):
    def payloads(**kw):
        return [int(b["image"].offsets[-1]) for b in headrace.load(str(pack), batch=64, **kw)]

    tight = payloads(target_bytes=15000, batch_bytes=17000)
    assert max(tight) <= 17000 and sum(tight) == sum(payloads())
    loose = payloads(target_bytes=15000)
    assert all(s >= 0.85 * 15000 for s in loose[:-1])


def test_ranks_take_rounds_and_resume_continues_exactly(pack):
    whole = [ids for ids in _ids(headrace.load(str(pack), batch=64, target_bytes=9000))]
    r0 = [ids for ids in _ids(headrace.load(str(pack), batch=64, target_bytes=9000, rank=0,
                                            world_size=2))]
    r1 = [ids for ids in _ids(headrace.load(str(pack), batch=64, target_bytes=9000, rank=1,
                                            world_size=2))]
    rounds = len(whole) // 2
    assert r0 == whole[0:2 * rounds:2] and r1 == whole[1:2 * rounds:2]  # tail: drop
    ld = headrace.load(str(pack), batch=64, target_bytes=9000, order="shuffle", seed=3)
    first = [next(ld) and ld.last_ids.tolist() for _ in range(4)]
    token = ld.checkpoint()
    rest = [ids for ids in _ids(ld)]
    again = headrace.load(str(pack), batch=64, target_bytes=9000, order="shuffle", seed=3,
                          resume=token)
    assert [ids for ids in _ids(again)] == rest
    assert sorted(i for ids in first + rest for i in ids) == list(range(60))


def test_plan_counts_and_epochs():
    sizes = np.array([5, 5, 5, 20, 1, 1, 1, 1], np.int64)
    plan = BytePlan(length=8, batch=4, rank=0, world_size=1, tail="partial", start_position=0,
                    end_position=16, sizes=lambda e: sizes, batch_bytes=15, target_bytes=None)
    steps = list(plan.steps())
    assert [(s.start, s.count) for s in steps] == [(0, 3), (3, 1), (4, 4), (8, 3), (11, 1),
                                                    (12, 4)]
    assert plan.count() == 6 and steps[-1].after == 16


def test_bad_values_and_fixed_records():
    with pytest.raises(ConfigError, match="batch_bytes must be >= 1"):
        headrace.load(np.zeros((10, 4), np.uint8), batch_bytes=0)
    with pytest.raises(ConfigError, match='tail="pad" does not apply'):
        headrace.load(np.zeros((10, 4), np.uint8), batch_bytes=8, tail="pad")
    with pytest.raises(ConfigError, match="per-record sizes"):
        headrace.load({"x": np.zeros((10, 4), np.uint8)}, batch=8, batch_bytes=12)
