"""Byte-aware batching (``batch_bytes`` hard ceiling, ``target_bytes`` soft target, mx8's rule):
the splits match mx8 1.0.7's on the same pack, on records of tens of bytes to kilobytes, on
every source kind with per-record sizes, across ranks and resume."""

from __future__ import annotations

import random

import mx8
import numpy as np
import pytest
from tests._files import random_files

import headrace
from headrace import ConfigError
from headrace._order.byte_plan import BytePlan, byte_split


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return random_files(tmp_path_factory.mktemp("bytes_in"), 60, 1500, 9000, seed=7,
                        name="{i:03d}.jpg")


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


@pytest.fixture(scope="module")
def tiny_pack(tmp_path_factory):
    """120 records of 10-120 bytes: a record is a large share of a batch, so the rule's every
    clause (the ceiling, the target a ceiling implies, the band's rounding) decides splits."""
    root = random_files(tmp_path_factory.mktemp("tiny_in"), 120, 10, 120, seed=3)
    out = tmp_path_factory.mktemp("tiny_pk") / "pk"
    mx8.pack_dir(str(root), out=str(out), shard_mb=1)
    return out


@pytest.mark.parametrize("kw", [
    # a ceiling alone implies a target of 90% of it: batches end once they reach it
    dict(batch=64, batch_bytes=300), dict(batch=64, batch_bytes=400),
    dict(batch=64, batch_bytes=1000), dict(batch=5, batch_bytes=1000),
    # the band's 85% and 115% in whole bytes rounded up (236 fits 115% of 205, 235.75)
    dict(batch=8, batch_bytes=830, target_bytes=205), dict(batch=512, target_bytes=417),
    dict(batch=512, batch_bytes=900, target_bytes=212), dict(batch=64, target_bytes=1000),
    # a target above the ceiling is the ceiling
    dict(batch=64, batch_bytes=500, target_bytes=800),
])
def test_splits_match_mx8_on_records_of_tens_of_bytes(tiny_pack, tmp_path, kw):
    want = _mx8_splits(tiny_pack, tmp_path, **kw)
    assert [ids for ids in _ids(headrace.load(str(tiny_pack), **kw))] == want


@pytest.mark.parametrize("which", ["tiny", "kb"])
def test_splits_match_mx8_over_random_settings(which, tiny_pack, pack, tmp_path):
    """40 seeded draws of ceiling, target, both, and batch 2-512 on each pack."""
    where = tiny_pack if which == "tiny" else pack
    sizes = [int(line.split("\t")[3]) for line in
             (where / "_mx8" / "manifest.tsv").read_text().splitlines()[1:]]
    mean, rng = sum(sizes) / len(sizes), random.Random(11)
    for _ in range(40):
        kw: dict = {"batch": rng.choice([2, 3, 5, 8, 64, 512])}
        kind = rng.choice(["ceiling", "target", "both"])
        if kind != "target":
            kw["batch_bytes"] = max(max(sizes), int(mean * rng.uniform(2, 15)))
        if kind != "ceiling":
            kw["target_bytes"] = int(mean * rng.uniform(0.5, 15))
        want = _mx8_splits(where, tmp_path, **kw)
        assert [ids for ids in _ids(headrace.load(str(where), **kw))] == want, kw


def test_implied_target_and_rounded_band_by_hand():
    # ceiling 1000 -> target 900: 915 reached it, so the batch ends before a record that fits
    sizes = [85, 79, 57, 87, 90, 84, 87, 11, 70, 43, 39, 34, 70, 79, 80, 70]
    assert byte_split(sizes, batch=64, batch_bytes=1000, target_bytes=None)[0] == 14
    assert byte_split(sizes, batch=64, batch_bytes=None, target_bytes=None).tolist() == [16]
    # target 205: 187 holds 85% (174.25); 187 + 49 = 236 <= ceil(235.75), so 49 joins
    assert byte_split([34, 86, 67, 49, 112], batch=64, batch_bytes=None,
                      target_bytes=205).tolist() == [4, 5]


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
