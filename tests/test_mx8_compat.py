"""``headrace.mx8`` against the real mx8 1.0.7 wheel on the same pack: PyBatch attributes,
dtypes and shapes, schedules with byte-aware batching, stats keys, print_stats, launcher errors."""

from __future__ import annotations

import os
import random

import mx8 as real
import pytest

import headrace.mx8 as mx8
from headrace import CheckpointError, ConfigError


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    root = tmp_path_factory.mktemp("mx8c_in")
    rng = random.Random(3)
    for i in range(40):
        d = root / ("cat" if i % 2 else "dog")
        d.mkdir(exist_ok=True)
        (d / f"{i}.jpg").write_bytes(os.urandom(rng.randint(2000, 6000)))
    out = tmp_path_factory.mktemp("mx8c_pk") / "pk"
    real.pack_dir(str(root), out=str(out), shard_mb=1)
    return out


@pytest.mark.parametrize("kw", [dict(batch=8), dict(batch=64, target_bytes=9000),
                                dict(batch=16, batch_bytes=15000), dict(batch=7, start=3, end=30)])
def test_pybatches_equal_mx8s(pack, tmp_path, kw):
    want = list(real.load(str(pack), store=str(tmp_path / "ms"), **kw))
    got = list(mx8.load(str(pack), **kw))
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert type(g).__name__ == "PyBatch"
        assert g.sample_ids == w.sample_ids and g.offsets == w.offsets
        assert g.payload == w.payload and g.label_ids == w.label_ids
        gt, wt = g.to_torch(), w.to_torch()
        assert [(t.dtype, tuple(t.shape)) for t in gt] == [(t.dtype, tuple(t.shape)) for t in wt]
        assert all(bool((a == b).all()) for a, b in zip(gt, wt, strict=True))
        assert [t.tolist() for t in g.to_torch_with_labels()[1:]] == [
            t.tolist() for t in w.to_torch_with_labels()[1:]]


def test_stats_keys_print_stats_and_summary(pack, tmp_path, capsys):
    ref = real.load(str(pack), store=str(tmp_path / "ms"), batch=8)
    next(ref)
    ld = mx8.load(str(pack), batch=8)
    next(ld)
    measured = set(ref.stats()) - {k for k in ref.stats() if k.startswith("autotune_")
                                   and k != "autotune_enabled"} - {
        "batch_jitter_slo_breaches_total", "batch_jitter_band_adjustments_total"}
    assert measured <= set(ld.stats())
    assert ld.stats()["delivered_batches_total"] == 1
    assert ld.manifest_hash == ref.manifest_hash
    ld.print_stats()
    line = capsys.readouterr().err.strip()
    assert line.startswith("[mx8] batches=1 samples=8 inflight=") and line.endswith("MB")
    assert "Progress: 8 samples | 1 batches" in mx8.stats(ld)
    assert mx8.stats(ld, raw=True)["delivered_samples_total"] == 8
    with pytest.raises(ValueError, match=r"expects a loader object with a \.stats\(\)"):
        mx8.stats(object())


def test_coord_without_a_launcher_says_how_to_launch(pack, monkeypatch):
    for var in ("WORLD_SIZE", "RANK", "SLURM_PROCID", "MX8_JOB_ID", "MX8_COORD_URL"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ConfigError, match="distributed mode requires job"):
        mx8.load(str(pack), coord="http://127.0.0.1:50051")
    with pytest.raises(ConfigError, match="torchrun --nproc_per_node"):
        mx8.load(str(pack), coord="http://127.0.0.1:50051", job="j")
    assert len(list(mx8.load(str(pack), job="j", batch=8))) == 5  # job alone stays local
    with pytest.raises(ConfigError, match="torchrun"):
        mx8.DistributedDataLoader(coord_url="x", job_id="j", node_id="n")


def test_coord_under_a_launcher_reads_this_ranks_share(pack, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    ld = mx8.load(str(pack), batch=8, coord="http://c", job="j")
    assert (ld.assigned_rank, ld.world_size) == (1, 2)
    with mx8.coordinator(world_size=2, data=str(pack)) as c:
        dd = mx8.DistributedDataLoader(coord_url=c.url, job_id="j", node_id="n",
                                       batch_size_samples=8)
        assert [b.sample_ids for b in dd] == [b.sample_ids for b in ld]


def test_resume_continues_exactly(pack):
    ld = mx8.load(str(pack), batch=8)
    next(ld)
    token = ld.checkpoint()
    rest = [b.sample_ids for b in ld]
    assert [b.sample_ids for b in mx8.load(str(pack), batch=8, resume=token)] == rest


def test_tune_true_autotunes_and_reads_what_an_untuned_loader_reads(pack):
    tuned = mx8.load(str(pack), batch=8, tune=True)  # no warning: pytest makes one an error
    assert [b.sample_ids for b in tuned] == [b.sample_ids for b in mx8.load(str(pack), batch=8)]
    s = tuned.stats()
    assert s["autotune_enabled"] is True and s["threads"] == s["autotune_threads"]
    assert mx8.load(str(pack), batch=8).stats()["autotune_enabled"] is False


def test_an_mx8_token_says_how_to_continue(pack, tmp_path):
    ref = real.load(str(pack), store=str(tmp_path / "ms"), batch=8, start=3, end=30)
    next(ref)
    with pytest.raises(CheckpointError, match=r"an mx8 'data_loader' checkpoint token.*"
                                              r"continue with start=11, end=30 and no resume="):
        mx8.load(str(pack), batch=8, start=3, end=30, resume=ref.checkpoint())
    want = [b.sample_ids for b in ref]
    assert [b.sample_ids for b in mx8.load(str(pack), batch=8, start=11, end=30)] == want
