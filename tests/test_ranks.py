"""Ranks, tails and the content fingerprint, in one process (tests/test_ranks_torchrun.py launches).

* ``tail="pad"`` pads samples as torch's ``DistributedSampler``: every rank ``ceil(N / W)``
  samples, the same records twice as the sampler, the same batch counts as its ``DataLoader``.
* Rank and world size come from the launcher's environment; explicit arguments win; a launcher
  world with nothing to compare through is an error that names the fix, never a silent guess.
* The fingerprint hashes every record's checksum: equal shape, other bytes -> other fingerprint,
  refused by resume; a copied store (or the same store on S3) keeps it.
"""

import collections
import os
import shutil

import numpy as np
import pytest
import torch.utils.data as tud

import headrace
from _images import imagefolder
from headrace import CheckpointError, ConfigError
from headrace._store.fingerprint import store_fingerprint


@pytest.fixture(autouse=True)
def _no_launcher(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS",
                "TORCHELASTIC_USE_AGENT_STORE"):
        monkeypatch.delenv(var, raising=False)


def _loader_ids(n, world, batch, tail, order="sequential"):
    per_rank = []
    for r in range(world):
        with headrace.Loader({"x": np.arange(n)}, batch=batch, rank=r, world_size=world,
                             tail=tail, order=order, seed=3, threads=1) as ld:
            count = len(ld)
            batches = [b["x"].tolist() for b in ld]
            assert count == len(batches)
        per_rank.append(batches)
    return per_rank


def _sampler(n, world, drop_last=False, shuffle=False):
    return [tud.DistributedSampler(range(n), num_replicas=world, rank=r, shuffle=shuffle,
                                   seed=3, drop_last=drop_last) for r in range(world)]


@pytest.mark.parametrize(("n", "world", "batch"), [(400, 2, 32), (400, 3, 32), (101, 4, 8),
                                                    (5, 8, 4), (64, 2, 32), (33, 3, 1)])
def test_pad_is_distributed_sampler(n, world, batch):
    mine = _loader_ids(n, world, batch, "pad")
    theirs = _sampler(n, world)
    # per rank: as many samples as the sampler, in as many batches as its DataLoader gives
    assert [sum(map(len, b)) for b in mine] == [len(s) for s in theirs] == [-(-n // world)] * world
    assert [len(b) for b in mine] == [len(tud.DataLoader(range(n), batch_size=batch, sampler=s))
                                      for s in theirs]
    # the same records, the same ones twice: the sampler repeats its first positions, so do we
    ours = collections.Counter(i for b in mine for batch_ in b for i in batch_)
    assert ours == collections.Counter(i for s in theirs for i in s)


@pytest.mark.parametrize(("n", "world", "batch"), [(400, 2, 32), (400, 3, 32), (101, 4, 8)])
def test_shuffled_pad_and_drop_count_as_distributed_sampler(n, world, batch):
    mine = _loader_ids(n, world, batch, "pad", order="shuffle")
    theirs = _sampler(n, world, shuffle=True)
    assert [sum(map(len, b)) for b in mine] == [len(s) for s in theirs]
    flat = [i for b in mine for batch_ in b for i in batch_]
    assert set(flat) == set(range(n))
    assert len(flat) - n == sum(map(len, theirs)) - n  # as many duplicates
    # drop: full batches only, as DistributedSampler(drop_last=True) + DataLoader(drop_last=True)
    drop = _loader_ids(n, world, batch, "drop", order="shuffle")
    want = [len(tud.DataLoader(range(n), batch_size=batch, sampler=s, drop_last=True))
            for s in _sampler(n, world, drop_last=True, shuffle=True)]
    assert [len(b) for b in drop] == want
    assert all(len(b) == batch for r in drop for b in r)
    flat = [i for b in drop for batch_ in b for i in batch_]
    assert len(flat) == len(set(flat))


def test_image_pads_samples_on_three_ranks(tmp_path):
    imagefolder(tmp_path / "src", {"a": 200, "b": 200}, h=8, w=8)
    headrace.pack_dir(str(tmp_path / "src"), out=str(tmp_path / "st"))
    per_rank = []
    for r in range(3):
        with headrace.image(str(tmp_path / "st"), batch=32, resize=(8, 8), rank=r, world_size=3,
                            tail="pad", threads=1) as ld:
            assert len(ld) == 5
            per_rank.append([ld.last_ids.tolist() for _ in ld])
    assert [sum(map(len, b)) for b in per_rank] == [134] * 3  # not 160: samples, not batches
    flat = [i for b in per_rank for batch in b for i in batch]
    assert set(flat) == set(range(400)) and len(flat) == 402
    with headrace.image(str(tmp_path / "st"), batch=32, resize=(8, 8), rank=1, world_size=3,
                        tail="drop", threads=1) as ld:
        assert [len(ids) for ids in (ld.last_ids for _ in ld)] == [32] * 4


def test_ranks_come_from_the_launcher_and_explicit_values_win(monkeypatch):
    data = {"x": np.arange(10)}
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    # a launcher world and nothing to compare through: a clear error, not a silent guess
    with pytest.raises(ConfigError, match=r"rank 1 of 2 \(torchrun\) cannot check.*"
                                          r"init_process_group.*rank= and world_size="):
        headrace.Loader(data, batch=2)
    with pytest.raises(ConfigError, match="cannot check"):
        headrace.load(data, batch=2)
    with headrace.Loader(data, batch=2, check=False) as ld:  # the launcher's rank, unchecked
        assert (ld.rank, ld.world_size, ld.tail) == (1, 2, "pad")
        assert [b["x"].tolist() for b in ld] == [[2, 3], [6, 7], [9]]
    with headrace.Loader(data, batch=2, rank=0, world_size=1) as ld:  # explicit wins, no check
        assert (ld.rank, ld.world_size) == (0, 1) and len(ld) == 5
    with pytest.raises(ConfigError, match="cannot check"):  # check=True always checks
        headrace.Loader(data, batch=2, rank=0, world_size=2, check=True)


def test_explicit_ranks_in_one_process_need_no_engine():
    data = {"x": np.arange(10)}
    got = []
    for r in range(2):
        with headrace.Loader(data, batch=2, rank=r, world_size=2) as ld:
            got.append([b["x"].tolist() for b in ld])
    # pad on 10 records: 5 each, the last global step split 1 + 1
    assert got == [[[0, 1], [4, 5], [8]], [[2, 3], [6, 7], [9]]]


def _twins(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    headrace.pack_arrays(a, x=np.arange(50, dtype=np.int64), progress=False)
    headrace.pack_arrays(b, x=np.arange(50, dtype=np.int64)[::-1].copy(), progress=False)
    return str(a), str(b)


def test_fingerprint_covers_content_not_shape(tmp_path):
    a, b = _twins(tmp_path)
    with headrace.open(a) as sa, headrace.open(b) as sb:
        assert sa.meta.length == sb.meta.length
        assert [c.size for c in sa.meta.chunks] == [c.size for c in sb.meta.chunks]
        assert store_fingerprint(sa) != store_fingerprint(sb)
    copy = shutil.copytree(a, tmp_path / "copy")  # moved or copied: the same data version
    with headrace.open(a) as sa, headrace.open(copy) as sc:
        assert store_fingerprint(sa) == store_fingerprint(sc)


def test_resume_on_a_store_of_the_same_shape_is_refused(tmp_path):
    a, b = _twins(tmp_path)
    with headrace.Loader(a, batch=8) as ld:
        next(ld)
        token = ld.checkpoint()
    with pytest.raises(CheckpointError, match="fingerprint mismatch"):
        headrace.Loader(b, batch=8, resume=token)
    with headrace.Loader(a, batch=8, resume=token) as ld:  # the right store resumes
        assert next(ld)["x"].tolist() == list(range(8, 16))


def test_fingerprint_of_a_prefix_is_the_store_before_the_append(tmp_path):
    path = tmp_path / "grow"
    headrace.pack_arrays(path, x=np.arange(30, dtype=np.int64), progress=False)
    with headrace.open(path) as st:
        before = store_fingerprint(st)
    with headrace.open(path, mode="a") as w:
        w.append({"x": np.arange(30, 40, dtype=np.int64)})
    with headrace.open(path) as st:
        assert store_fingerprint(st) != before
        assert store_fingerprint(st, length=30) == before


def test_array_fingerprint_covers_content():
    from headrace._sources.base import ArraySource

    x = np.arange(100)
    assert ArraySource({"x": x}).fingerprint == ArraySource({"x": x.copy()}).fingerprint
    assert ArraySource({"x": x}).fingerprint != ArraySource({"x": x[::-1].copy()}).fingerprint
    big = np.zeros((20_000, 1024), np.uint8)  # over the whole-hash size: sampled rows
    other = big.copy()
    other[0, 0] = 1
    assert ArraySource({"x": big}).fingerprint != ArraySource({"x": other}).fingerprint


def test_remote_store_fingerprint_is_the_local_one(tmp_path):
    from _s3_server import new_bucket, s3_env, shared_server
    from headrace._remote.objstore import ObjectStore, S3Options
    from headrace._remote.store import RemoteStore

    server = shared_server()
    a, b = _twins(tmp_path)
    with s3_env(server.endpoint):
        bucket = new_bucket(server)
        client = ObjectStore(bucket, options=S3Options())
        for name, root in (("a", a), ("b", b)):
            for dirpath, _, files in os.walk(root):
                for f in files:
                    full = os.path.join(dirpath, f)
                    with open(full, "rb") as fh:
                        client.put(f"{name}/{os.path.relpath(full, root)}", fh.read())
        with headrace.open(a) as sa, RemoteStore(f"s3://{bucket}/a", objstore=client) as ra, \
                RemoteStore(f"s3://{bucket}/b", objstore=client) as rb:
            assert ra.fingerprint == store_fingerprint(sa)
            assert rb.fingerprint != ra.fingerprint
