"""Checkpoint tokens: exact round trips, refusals, size, and what counts as consumed."""

from __future__ import annotations

import json

import numpy as np
import pytest

import headrace
from _loader_util import run_checkpoint_roundtrip, take, wait_for
from headrace import CheckpointError

pytestmark = pytest.mark.timeout(120)

N = 50
COLS = {"x": np.arange(N * 3, dtype=np.int16).reshape(N, 3), "y": np.arange(N, dtype=np.int64)}
MODES = ["sequential", "shuffle", "iid"]


@pytest.mark.parametrize("threads", [1, 4])
@pytest.mark.parametrize("order", MODES)
def test_epoch_mode_roundtrip_at_many_midpoints(order, threads):
    # 50 records, batch 8: 7 batches an epoch (the last holds 2); 2 epochs = 14 batches.
    # Stops: before the first, after the first, mid-epoch, the epoch boundary (7), end.
    def make(resume):
        return headrace.Loader(COLS, batch=8, order=order, seed=11, epochs=2, threads=threads,
                               resume=resume)

    ref = run_checkpoint_roundtrip(make, [0, 1, 3, 6, 7, 8, 13, 14])
    assert len(ref) == 14
    assert [len(ids) for ids, _ in ref[:7]] == [8] * 6 + [2]


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("order", MODES)
def test_endless_roundtrip_across_epochs(order, threads):
    # Batches of 16 over 50 records run across epoch boundaries (positions 48..63 span two).
    def make(resume):
        return headrace.Loader(COLS, batch=16, order=order, seed=5, epochs=None,
                               threads=threads, resume=resume)

    ref = run_checkpoint_roundtrip(make, [0, 1, 3, 4, 9, 19], total=20)
    if order == "shuffle":
        ids = [i for batch_ids, _ in ref for i in batch_ids]
        for e in range(6):  # every epoch is a permutation, and epochs differ
            assert sorted(ids[e * N:(e + 1) * N]) == list(range(N))
        assert ids[:N] != ids[N:2 * N]


@pytest.mark.parametrize("tail", ["drop", "pad", "partial"])
def test_sharded_roundtrip(tail):
    def make(resume):
        return headrace.Loader(COLS, batch=4, order="shuffle", seed=2, epochs=2, rank=1,
                               world_size=3, tail=tail, threads=2, resume=resume)

    run_checkpoint_roundtrip(make, [0, 1, 4, 5, 7])


def test_resume_on_another_world_size_continues_the_global_stream():
    # Two ranks read 3 steps each of a sequential epoch; one rank resumes from rank 0's token
    # and must read exactly the positions nobody has read, in order.
    ranks = [headrace.Loader(COLS, batch=4, order="sequential", rank=r, world_size=2,
                             tail="partial", threads=1) for r in range(2)]
    seen = []
    for _ in range(3):
        for ld in ranks:
            next(ld)
            seen += ld.last_ids.tolist()
    tokens = [ld.checkpoint() for ld in ranks]
    for ld in ranks:
        ld.close()
    assert json.loads(tokens[0])["position"] == json.loads(tokens[1])["position"] == 24
    with headrace.Loader(COLS, batch=4, order="sequential", threads=1, resume=tokens[1]) as one:
        rest = [i for ids, _ in take(one, None) for i in ids]
    assert sorted(seen) == list(range(24))
    assert rest == list(range(24, N))
    # Four ranks from the same token split the rest of the epoch between them.
    got = []
    for r in range(4):
        with headrace.Loader(COLS, batch=4, order="sequential", rank=r, world_size=4,
                             tail="partial", threads=1, resume=tokens[0]) as ld:
            got += [i for ids, _ in take(ld, None) for i in ids]
    assert sorted(got) == list(range(24, N))


def test_token_is_small_and_independent_of_dataset_size():
    small = headrace.Loader(np.zeros((10, 1), np.uint8), batch=4, threads=1)
    big = headrace.Loader(np.zeros((1_000_000, 1), np.uint8), batch=4, threads=1)
    with small, big:
        next(small)
        next(big)
        a, b = small.checkpoint(), big.checkpoint()
    assert len(a) <= 1024 and len(b) <= 1024
    assert abs(len(a) - len(b)) <= 3 * 6  # only the digits of N (length, end, fingerprint)
    body = json.loads(a)
    assert body["format"] == "headrace-ckpt-1"
    assert body["position"] == 4 and body["batch"] == 4 and body["length"] == 10


def test_buffered_batches_are_not_consumed():
    with headrace.Loader(COLS, batch=5, threads=2, queue=8, prefetch=6) as ld:
        next(ld)
        assert wait_for(lambda: ld.stats()["queue_depth"] >= 3)
        token = ld.checkpoint()
    assert json.loads(token)["position"] == 5
    with headrace.Loader(COLS, batch=5, threads=2, resume=token) as ld:
        next(ld)
        assert ld.last_ids.tolist() == [5, 6, 7, 8, 9]


def _token(**overrides):
    with headrace.Loader(COLS, batch=8, order="shuffle", seed=3, threads=1) as ld:
        next(ld)
        body = json.loads(ld.checkpoint())
    body.update(overrides)
    return json.dumps(body).encode()


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"seed": 4}, "seed mismatch: token=3 current=4"),
    ({"batch": 16}, "batch mismatch: token=8 current=16"),
    ({"order": "iid"}, "order mismatch: token='shuffle' current='iid'"),
])
def test_resume_refused_on_changed_arguments(kwargs, needle):
    args = {"batch": 8, "order": "shuffle", "seed": 3, "threads": 1, **kwargs}
    with pytest.raises(CheckpointError, match=needle):
        headrace.Loader(COLS, resume=_token(), **args)


def test_resume_adopts_the_tokens_epoch():
    # a token of epoch 0 into a loader built for epoch 1: the token says where the stream is
    with headrace.Loader(COLS, batch=8, order="shuffle", seed=3, threads=1, epoch=1,
                         resume=_token()) as ld:
        assert ld.epoch == 0 and ld.position == 8
        rest = [i for _ in ld for i in ld.last_ids.tolist()]
    with headrace.Loader(COLS, batch=8, order="shuffle", seed=3, threads=1) as ref:
        whole = [i for _ in ref for i in ref.last_ids.tolist()]
    assert rest == whole[8:]


def test_resume_refused_on_other_data():
    other = {"x": COLS["x"][:40], "y": COLS["y"][:40]}
    with pytest.raises(CheckpointError, match="length mismatch: token=50 current=40"):
        headrace.Loader(other, batch=8, order="shuffle", seed=3, resume=_token())


@pytest.mark.parametrize(("token", "needle"), [
    (b"", "empty checkpoint token"),
    (b"mx8_checkpoint_v1\nkind=data_loader\n", "unsupported checkpoint token format"),
    (b'{"format": "other"}', "unsupported checkpoint token format 'other'"),
    (b"x" * 2000, "at most 1024"),
    ("a string", "must be the bytes"),
])
def test_malformed_tokens(token, needle):
    with pytest.raises(CheckpointError, match=needle):
        headrace.Loader(COLS, batch=8, resume=token)


def test_resume_refused_on_new_store_generation(tmp_path):
    path = tmp_path / "s"
    with headrace.create(path, fields={"v": "int64"}) as w:
        w.append({"v": np.arange(30)})
        w.commit()
    with headrace.load(path, batch=4, shuffle=True, seed=1) as ld:
        next(ld)
        token = ld.checkpoint()
    with headrace.load(path, batch=4, shuffle=True, seed=1, resume=token) as ld:  # unchanged: ok
        next(ld)
    with headrace.open(path, mode="a") as w:
        w.modify(3, {"v": 99})
        w.commit()
    with pytest.raises(CheckpointError, match="fingerprint mismatch: token='store:g0"):
        headrace.load(path, batch=4, shuffle=True, seed=1, resume=token)


def test_a_store_is_fingerprinted_only_when_a_token_is_asked_for(tmp_path, monkeypatch):
    # hashing every aux entry costs milliseconds a million records: a loader that never
    # checkpoints does not pay it, one that does gets the same token as before
    from headrace._sources import base

    path = tmp_path / "s"
    headrace.pack_arrays(path, v=np.arange(40), progress=False)
    calls = []
    real = base.store_fingerprint
    monkeypatch.setattr(base, "store_fingerprint", lambda *a, **k: calls.append(1) or real(*a, **k))
    with headrace.load(path, batch=4, shuffle=True, seed=1) as ld:
        first = [next(ld)["v"].tolist() for _ in range(3)]
        assert not calls
        token = ld.checkpoint()
        assert ld.checkpoint(at=1) and len(calls) == 1  # hashed once
        rest = [b["v"].tolist() for b in ld]
    with headrace.load(path, batch=4, shuffle=True, seed=1, resume=token) as ld:
        assert [b["v"].tolist() for b in ld] == rest
    assert sorted(v for b in first + rest for v in b) == list(range(40))


@pytest.mark.parametrize("kind", ["loader", "dataloader"])
def test_a_dropped_loader_is_freed_at_once_not_by_the_garbage_collector(kind):
    # each next() keeps a token mark in the loader's log; a mark holding the loader itself
    # would make a cycle, and an abandoned loader's threads would run until a collection
    import gc
    import weakref

    if kind == "loader":
        ld = headrace.Loader(COLS, batch=8, threads=2)
    else:
        ld = headrace.DataLoader(COLS["x"], COLS["y"], num_workers=2, batch_size=8)
    next(ld)
    next(ld)
    token = ld.checkpoint(at=1)
    ref = weakref.ref(ld)
    gc.disable()
    try:
        del ld
        assert ref() is None
    finally:
        gc.enable()
    assert token


def test_token_at_the_end_resumes_exhausted():
    with headrace.Loader(COLS, batch=8, threads=1) as ld:
        take(ld, None)
        token = ld.checkpoint()
    with headrace.Loader(COLS, batch=8, threads=1, resume=token) as ld:
        assert next(ld, None) is None


def test_cached_token_encoder_matches_encode_byte_for_byte():
    # checkpoint() serializes the constant part once; every token must still equal encode().
    from headrace._engine import checkpoint as _checkpoint

    long_fp = "x" * 500  # stored as its sha256
    for fp in ("arrays:50:abc", long_fp):
        state = _checkpoint.LoaderState(position=0, epoch=0, seed=2**64 - 1, order="shuffle",
                                        batch=8, length=N, start=0, end=N, fingerprint=fp,
                                        rank=1, world_size=3)
        enc = _checkpoint.encoder(state)
        for position in (0, 7, N, 10**18, 10**300):
            epoch = position // N
            want = _checkpoint.encode(_checkpoint.LoaderState(
                **{**state.__dict__, "position": position, "epoch": epoch}))
            assert enc(position, epoch) == want
            assert _checkpoint.decode(want).position == position
        with pytest.raises(CheckpointError, match="bytes"):  # refused, never truncated
            enc(10**600, 10**598)
    with headrace.Loader(COLS, batch=8, order="shuffle", seed=3, epochs=2) as ld:
        for _ in range(9):
            next(ld)
            assert ld.checkpoint() == _checkpoint.encode(ld._state(ld.position))
