"""Behaviour exactly at the edges: block edges of the order, seeds, caps, format limits, the mix.

Each test sits on a boundary where an off-by-one or a dropped term changes what a user gets (a batch
one record short, one batch more in flight than ``queue=``, a valid record refused), so it checks
both sides of the edge, not just a value far from it.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace

import numpy as np
import pytest

import headrace
from headrace import ConfigError, MemoryCapError
from headrace._multi.mix_schedule import SmoothRoundRobin
from headrace._order.make import make_order
from headrace._order.order import BLOCK
from headrace._store import format as _format

pytestmark = pytest.mark.timeout(120)


# -- the order: memoized block edges and seeds ------------------------------------------------------

@pytest.mark.parametrize("mode", ["shuffle", "iid", "sequential"])
def test_ranges_around_memoized_block_edges_equal_the_pure_function(mode):
    n = 3 * BLOCK + 77
    order = make_order(mode, n, seed=11)
    for edge in (BLOCK, 2 * BLOCK, 3 * BLOCK):
        for d in range(-4, 5):
            for count in (1, 2, 3, 4, 5, BLOCK // 4):
                start = edge + d
                if start < 0:
                    continue
                want = order.indices(np.arange(start, start + count, dtype=np.int64))
                order.range(edge - 100, 3)  # the hot block now ends at ``edge``
                got = order.shared_range(start, count)
                assert got.shape == (count,), (edge, d, count)
                np.testing.assert_array_equal(got, want, err_msg=f"shared {edge}{d:+} x{count}")
                order.range(edge - 100, 3)
                np.testing.assert_array_equal(order.range(start, count), want,
                                              err_msg=f"range {edge}{d:+} x{count}")


@pytest.mark.parametrize("mode", ["shuffle", "iid"])
def test_seeds_differing_only_in_high_bits_give_different_streams(mode):
    n = 5000
    base = make_order(mode, n, seed=7).range(0, 256)
    for bit in (32, 40, 63):
        other = make_order(mode, n, seed=7 | (1 << bit)).range(0, 256)
        assert not np.array_equal(base, other), bit
    big = make_order(mode, 2**21 + 5, seed=3).range(0, 64)  # the one-word-per-position IID path
    assert not np.array_equal(big, make_order(mode, 2**21 + 5, seed=3 + (1 << 33)).range(0, 64))


def test_iid_word_sharing_switches_exactly_past_two_to_the_20():
    """N <= 2**20 takes two 32-bit draws per 64-bit word, larger N a word each (the pinned stream
    of every checkpoint in the wild depends on where that switch is)."""
    from headrace._order.order import _TAG_IID, PCGStream, mix64, mulhi

    seed = 9
    words = PCGStream(mix64(seed ^ _TAG_IID)).words(0, 8)
    for n in (2**20, 2**20 - 1):
        halves = words.view(np.uint32)[:16].astype(np.uint64)  # low half first
        want = (halves * np.uint64(n)) >> np.uint64(32)
        np.testing.assert_array_equal(make_order("iid", n, seed=seed).range(0, 16), want)
    n = 2**20 + 1
    want = np.floor((words >> np.uint64(11)).astype(np.float64) * (n * 2.0**-53))
    np.testing.assert_array_equal(make_order("iid", n, seed=seed).range(0, 8), want)
    big = 2**32 + 3  # past 2**32: the exact 128-bit multiply-high
    np.testing.assert_array_equal(make_order("iid", big, seed=seed).range(0, 8),
                                  mulhi(words.copy(), big))


# -- the loader: queue window, inflight bytes, RAM cap ----------------------------------------------

def _wait_for(pred, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while not pred() and time.monotonic() < deadline:
        time.sleep(0.01)
    return pred()


@pytest.mark.parametrize("queue", [1, 2, 3])
@pytest.mark.parametrize("threads", [3, 4])
def test_more_workers_than_the_window_deliver_every_batch(queue, threads):
    """Workers past the window wait for room, one of them holding the dispatch lock: every
    delivery must wake that one (a wake given to another left it asleep and the loader hung)."""
    data = np.arange(2000)
    with headrace.Loader({"x": data}, batch=2, queue=queue, threads=threads, prefetch=8) as ld:
        got = np.concatenate([b["x"] for b in ld])
    np.testing.assert_array_equal(got, data)


@pytest.mark.parametrize("queue", [1, 2, 3])
def test_batches_in_flight_never_pass_queue_and_reach_it(queue):
    with headrace.Loader({"x": np.arange(400)}, batch=2, queue=queue, threads=4,
                         prefetch=8) as ld:
        assert ld.stats()["effective_max_queue_batches"] == queue
        next(ld)
        assert _wait_for(lambda: ld.stats()["queue_depth"] == queue)
        time.sleep(0.2)  # workers had every chance to dispatch one more
        s = ld.stats()
        assert s["queue_depth"] == queue and s["queue_high_water"] == queue
        assert s["batches_in_flight"] <= queue
        for _ in range(20):
            next(ld)
            assert ld.stats()["queue_high_water"] <= queue
        # the workers, parked on the full window, wake as the consumer frees slots
        assert _wait_for(lambda: ld.stats()["queue_depth"] == queue)


def test_a_budget_release_of_more_than_is_held_is_refused():
    from headrace._engine.budget import ByteBudget

    b = ByteBudget(100)
    assert b.acquire(60)
    with pytest.raises(RuntimeError, match="releasing 61 bytes but only 60"):
        b.release(61)
    b.release(60)
    assert b.used_bytes == 0 and b.high_water_bytes == 60
    assert b.acquire(61)  # one byte past the old mark moves it
    assert b.high_water_bytes == 61
    b.release(61)
    assert b.acquire(100, timeout_s=0.0)  # an exact fit, no wait
    assert b.high_water_bytes == 100


def test_shares_of_a_mix_together_fill_exactly_the_shared_cap():
    from headrace._engine.shared_budget import SharedBudget

    sb = SharedBudget(100)
    a, b = sb.share(20), sb.share(20)  # the pool is the other 60
    for _ in range(4):  # a's reserve, then the whole pool (one request is at most a reserve)
        assert a.acquire(20, timeout_s=0.0)
    assert b.acquire(20, timeout_s=0.0)  # b's reserve is still there
    assert sb.used_bytes == 100
    assert not a.acquire(1, timeout_s=0.0) and not b.acquire(1, timeout_s=0.0)
    assert sb.high_water_bytes == 100
    a.release(1)
    assert b.acquire(1, timeout_s=0.0)  # the byte a gave back is the pool's again
    assert sb.used_bytes == 100


def test_a_failed_dispatch_is_raised_at_its_batch_and_nothing_comes_after(tmp_path):
    """Workers racing past a batch whose reservation failed must not deliver later batches in
    its place: the error is batch 2, and the loader stops there."""
    path = tmp_path / "s"
    with headrace.create(path, fields={"blob": "bytes"}) as w:
        w.append({"blob": [b"a"] * 8 + [b"b" * 5000] + [b"c"] * 31})
    with headrace.load(path, batch=4, inflight=1000, threads=4, queue=8, prefetch=8) as ld:
        got = [next(ld)["blob"].to_list() for _ in range(2)]
        assert [bytes(r) for b in got for r in b] == [b"a"] * 8
        time.sleep(0.3)  # every worker has had its chance at the batches after the failed one
        with pytest.raises(ConfigError, match="at least 5043"):
            next(ld)
        assert next(ld, None) is None


def test_inflight_cap_of_exactly_one_batch_is_accepted_and_one_byte_less_is_not():
    x = np.ones((40, 100), np.uint8)  # a batch of 10 is 1000 bytes
    with headrace.Loader({"x": x}, batch=10, inflight=1000, threads=3, queue=4) as ld:
        assert len(list(ld)) == 4
        assert ld.stats()["inflight_high_water_bytes"] == 1000
    with pytest.raises(ConfigError, match="at least 1000 bytes"):
        headrace.Loader({"x": x}, batch=10, inflight=999)
    # two batches fit in 2000 bytes, not in 1999: the high water shows which
    for cap, most in ((2000, 2000), (1999, 1000)):
        with headrace.Loader({"x": x}, batch=10, inflight=cap, threads=3, queue=4) as ld:
            next(ld)
            time.sleep(0.2)
            assert ld.stats()["inflight_high_water_bytes"] == most


def _counted_rss() -> int:
    from headrace._engine.stats import sample_memory

    return sample_memory().counted_bytes


def test_ram_cap_counts_the_batch_about_to_be_built():
    """The process sits just under the cap; a batch that would carry it over must wait."""
    rows = 64
    x = np.ones((rows, 1 << 20), np.uint8)  # a batch of 32 rows is 32 MiB
    batch_bytes = 32 << 20
    headroom = 8 << 20  # far above the RSS jitter of a sleeping test process
    cap = headrace.Constraints(max_ram_bytes=_counted_rss() + batch_bytes - headroom,
                               max_inflight_bytes=4 * batch_bytes)
    with headrace.Loader({"x": x}, batch=32, constraints=cap, threads=1, queue=1) as ld:
        ld._ram_wait_s = 0.3
        assert ld.stats()["counted_rss_bytes"] < cap.max_ram_bytes  # under the cap itself
        with pytest.raises(MemoryCapError, match="exceeds max_process_rss_bytes"):
            next(ld)
    cap = headrace.Constraints(max_ram_bytes=_counted_rss() + batch_bytes + headroom,
                               max_inflight_bytes=4 * batch_bytes)
    with headrace.Loader({"x": x}, batch=32, constraints=cap, threads=1, queue=1) as ld:
        assert next(ld)["x"].shape == (32, 1 << 20)  # the batch fits under the cap: no wait


# -- the format: versions, duplicate chunks, record-size limits -------------------------------------

def _two_chunk_store(path):
    with headrace.create(path, fields={"b": "bytes"}, chunk_mb=1 / 1024) as w:
        w.append({"b": [bytes([i]) * 700 for i in range(4)]})
    meta = json.loads((path / "meta.json").read_text())
    assert len(meta["chunks"]) >= 2
    return meta


def test_the_next_format_version_asks_for_an_upgrade_not_a_restore(tmp_path):
    meta = _two_chunk_store(tmp_path / "s")
    meta["version"] = _format.FORMAT_VERSION + 1
    (tmp_path / "s" / "meta.json").write_bytes(_format.meta_bytes(meta))
    with pytest.raises(headrace.FormatVersionError, match="upgrade headrace") as e:
        headrace.open(tmp_path / "s")
    assert not isinstance(e.value, headrace.CorruptionError)
    meta["version"] = 0  # older than any release: damaged, not newer
    (tmp_path / "s" / "meta.json").write_bytes(_format.meta_bytes(meta))
    with pytest.raises(headrace.CorruptionError, match="restore it from a backup"):
        headrace.open(tmp_path / "s")


def test_a_chunk_listed_twice_is_damage(tmp_path):
    meta = _two_chunk_store(tmp_path / "s")
    good = _format.meta_bytes(meta)
    meta["chunks"][1]["id"] = meta["chunks"][0]["id"]
    (tmp_path / "s" / "meta.json").write_bytes(_format.meta_bytes(meta))  # a valid checksum
    with pytest.raises(headrace.CorruptionError, match="repeated"):
        headrace.open(tmp_path / "s")
    (tmp_path / "s" / "meta.json").write_bytes(good)
    assert len(headrace.open(tmp_path / "s")) == 4


def test_a_field_listed_twice_is_damage(tmp_path):
    meta = _two_chunk_store(tmp_path / "s")
    meta["fields"].append(dict(meta["fields"][0]))
    (tmp_path / "s" / "meta.json").write_bytes(_format.meta_bytes(meta))
    with pytest.raises(headrace.CorruptionError, match="listed twice"):
        headrace.open(tmp_path / "s")


def test_a_commit_cuts_index_and_aux_files_to_exactly_its_length(tmp_path):
    """Step 1 of the commit protocol (docs/format.md): the working index/aux files are truncated
    to the pending N entries, so nothing stale survives past the length after a delete."""
    path = tmp_path / "s"
    with headrace.create(path, fields={"b": "bytes"}) as w:
        w.append({"b": [b"x%d" % i for i in range(5)]})
    for step in ("delete committed", "delete pending"):
        with headrace.open(path, mode="a") as w:
            if step == "delete pending":  # no copy-on-write: the same files stay in use
                w.append({"b": [b"new", b"newer"]})
                w.delete(len(w) - 1)
            else:
                w.delete(0)
        meta = json.loads((path / "meta.json").read_text())
        (field,) = meta["fields"]
        assert (path / field["index"]).stat().st_size == 16 * meta["length"], step
        assert (path / field["aux"]).stat().st_size == 8 * meta["length"], step


def test_fixed_shape_raw_chunks_fill_to_exactly_their_capacity(tmp_path):
    rec = 64 << 10  # 32 records make one 2 MiB chunk
    with headrace.create(tmp_path / "s", fields={"a": {"dtype": "uint8", "shape": [rec]}},
                         chunk_mb=2) as w:
        for k in (31, 1, 30, 2):  # the 1 fills the last slot of a chunk, the 2 straddles none
            w.append({"a": np.zeros((k, rec), np.uint8)})
    sizes = [c["size"] for c in json.loads((tmp_path / "s" / "meta.json").read_text())["chunks"]]
    assert sizes == [2 << 20, 2 << 20]


def test_a_fixed_shape_record_of_exactly_the_limit_is_stored(tmp_path, monkeypatch):
    monkeypatch.setattr(_format, "MAX_RECORD_BYTES", 12)
    with headrace.create(tmp_path / "s", fields={"a": {"dtype": "uint32", "shape": [3]},
                                                 "r": "bytes"}) as w:
        w.append({"a": np.arange(6, dtype=np.uint32).reshape(2, 3), "r": [b"x" * 12, b""]})
    st = headrace.open(tmp_path / "s")
    np.testing.assert_array_equal(st.record(1, "a"), [3, 4, 5])
    assert st.record(0, "r").tobytes() == b"x" * 12
    with pytest.raises(headrace.RecordTooLargeError, match="13 bytes"):
        headrace.create(tmp_path / "t", fields={"a": {"dtype": "uint8", "shape": [13]}})
    with headrace.open(tmp_path / "s", mode="a") as w, \
            pytest.raises(headrace.RecordTooLargeError, match="13 bytes"):
        w.append({"a": np.zeros((1, 3), np.uint32), "r": [b"y" * 13]})


# -- the mix: proportions after a source is dropped -------------------------------------------------

def test_swrr_after_a_drop_splits_by_the_remaining_weights_only():
    s = SmoothRoundRobin([3, 1, 4])
    s.sequence(5)
    s.deactivate(2)
    assert s.current[2] == 0  # its credit is forgotten (the mix's token carries it)
    credit = s.current[0] + s.current[1]
    picks = s.sequence(400)
    assert picks.count(0) == 300 and picks.count(1) == 100
    for k in range(0, 400, 4):  # smooth: every 4 ticks are 3 + 1, not runs
        assert sorted(picks[k:k + 4]) == [0, 0, 0, 1]
    assert s.current[0] + s.current[1] == credit  # each tick charges what it handed out


def test_mixed_loader_after_a_drop_keeps_the_remaining_proportions():
    a = headrace.Loader({"x": np.zeros(3000, np.int64)}, batch=1)
    b = headrace.Loader({"x": np.ones(1000, np.int64)}, batch=1)
    c = headrace.Loader({"x": np.full(5, 2, np.int64)}, batch=1)  # runs out early
    with headrace.mix([a, b, c], weights=[3, 1, 4], on_source_exhausted="drop") as m:
        got = [int(batch["x"][0]) for batch in m]
    last = len(got) - 1 - got[::-1].index(2)
    assert got.count(2) == 5
    after = got[last + 1:]
    head = after[:800]
    assert head.count(0) == 600 and head.count(1) == 200


# -- checkpoint tokens: the size limit, integer fields, long fingerprints --------------------------

def _loader_token(**overrides):
    with headrace.Loader({"x": np.arange(50)}, batch=8, order="shuffle", seed=3, threads=1) as ld:
        next(ld)
        body = json.loads(ld.checkpoint())
    body.update(overrides)
    return json.dumps(body).encode()


def test_a_token_of_exactly_the_size_limit_resumes_and_one_byte_more_is_refused():
    from headrace._engine.checkpoint import MAX_TOKEN_BYTES

    token = _loader_token()
    exact = token + b" " * (MAX_TOKEN_BYTES - len(token))  # JSON allows trailing blanks
    with headrace.Loader({"x": np.arange(50)}, batch=8, order="shuffle", seed=3,
                         resume=exact) as ld:
        assert ld.position == 8
    with pytest.raises(headrace.CheckpointError, match=f"at most {MAX_TOKEN_BYTES}"):
        headrace.Loader({"x": np.arange(50)}, batch=8, order="shuffle", seed=3,
                        resume=exact + b" ")


@pytest.mark.parametrize(("overrides", "needle"), [
    ({"seed": True}, "bad 'seed'"),
    ({"position": -1}, "impossible values"),
    ({"position": 8.0}, "bad 'position'"),
    ({"batch": 0}, "impossible values"),
])
def test_token_integers_are_integers_in_range(overrides, needle):
    with pytest.raises(headrace.CheckpointError, match=needle):
        headrace.Loader({"x": np.arange(50)}, batch=8, order="shuffle", seed=3,
                        resume=_loader_token(**overrides))


def test_token_encoder_never_emits_more_than_the_limit():
    from headrace._engine import checkpoint as _checkpoint

    state = _checkpoint.LoaderState(position=0, epoch=0, seed=1, order="shuffle", batch=8,
                                    length=10, start=0, end=10, fingerprint="arrays:10:x",
                                    rank=0, world_size=1)
    enc = _checkpoint.encoder(state)
    for digits in range(300, 600, 2):  # across the point where two integers stop fitting
        position = 10**digits
        try:
            want = _checkpoint.encode(replace(state, position=position, epoch=position // 10))
        except headrace.CheckpointError:
            with pytest.raises(headrace.CheckpointError):
                enc(position, position // 10)
            continue
        assert enc(position, position // 10) == want
        assert len(want) <= _checkpoint.MAX_TOKEN_BYTES


def test_a_fingerprint_of_exactly_160_chars_is_kept_and_a_longer_one_hashed():
    from headrace._engine.checkpoint import fingerprint_key

    assert fingerprint_key("f" * 160) == "f" * 160
    assert fingerprint_key("f" * 161).startswith("sha256:")
    assert fingerprint_key("f" * 161) != fingerprint_key("f" * 162)
