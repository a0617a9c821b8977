"""The stats timeline: bounded in count and memory, JSON-serializable, honest verdicts."""

import json

import numpy as np
import pytest

import headrace
from headrace._timeline import Recorder, advice, derive, load_timeline, summarize


def _data(n=2000):
    return {"x": np.arange(n * 16, dtype=np.uint8).reshape(n, 16), "y": np.arange(n)}


def test_timeline_off_by_default_and_the_error_says_how():
    with headrace.Loader(_data(), batch=64) as ld:
        next(ld)
        with pytest.raises(headrace.ConfigError, match="timeline=True"):
            ld.stats_timeline()


def test_snapshots_are_bounded_in_count_per_batch_and_in_length():
    # A period far shorter than a batch: at most one snapshot per delivered batch, and never more
    # than capacity kept (older ones thinned out, period doubled).
    with headrace.Loader(_data(), batch=10, epochs=None) as ld:
        ld.enable_timeline(period_s=1e-9, capacity=16)
        for _ in zip(range(300), ld, strict=False):
            pass
        tl = ld.stats_timeline()
    assert tl["records"] <= 300
    assert len(tl["samples"]) <= 16 + 1  # the kept ones + the current state at export
    assert tl["period_s"] > 1e-9  # doubled at least once
    ts = [s["t"] for s in tl["samples"]]
    assert ts == sorted(ts)
    assert tl["samples"][-1]["delivered_batches_total"] == 300


def test_a_long_period_records_only_the_end_of_the_run():
    with headrace.Loader(_data(), batch=64, timeline=3600.0) as ld:
        batches = sum(1 for _ in ld)
        tl = ld.stats_timeline()
    assert tl["records"] == 1  # StopIteration records the end; no batch passed the period
    assert tl["samples"][-1]["delivered_batches_total"] == batches == 32


def test_timeline_is_json_and_loads_back(tmp_path):
    with headrace.Loader(_data(), batch=64, timeline=True) as ld:
        list(ld)
        tl = ld.stats_timeline()
    path = tmp_path / "t.json"
    path.write_text(json.dumps(tl))
    back = load_timeline(path)
    assert back == json.loads(json.dumps(tl))
    assert back["format"] == "headrace-timeline" and back["version"] == 1
    for key in ("max_inflight_bytes", "max_process_rss_bytes", "threads",
                "effective_max_queue_batches"):
        assert isinstance(back[key], int), key
    s = back["samples"][-1]
    for key in ("t", "samples_per_second", "bytes_per_second", "queue_depth", "inflight_bytes",
                "process_rss_bytes", "page_cache_resident_bytes", "consumer_wait_fraction",
                "worker_busy_fraction", "budget_wait_fraction", "gather_busy_seconds",
                "transform_busy_seconds"):
        assert key in s, key
    assert s["delivered_samples_total"] == 2000


def test_worker_busy_time_is_counted_per_stage():
    def transform(batch, ids):
        return {"x": batch["x"].astype(np.float32) * 2}

    with headrace.Loader(_data(), batch=100, transform=transform) as ld:
        list(ld)
        s = ld.stats()
    assert s["gather_busy_seconds"] > 0 and s["transform_busy_seconds"] > 0


def test_load_timeline_rejects_what_is_not_a_timeline(tmp_path):
    with pytest.raises(headrace.ConfigError, match="headrace-timeline"):
        load_timeline({"format": "other"})
    with pytest.raises(headrace.ConfigError, match="version"):
        load_timeline({"format": "headrace-timeline", "version": 99})
    with pytest.raises(headrace.ConfigError, match="stats_timeline"):
        load_timeline(42)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(headrace.ConfigError, match="not a saved timeline"):
        load_timeline(bad)


@pytest.mark.parametrize("kwargs", [{"period_s": 0}, {"period_s": -1}, {"capacity": 2},
                                    {"period_s": True}])
def test_recorder_rejects_bad_settings(kwargs):
    with pytest.raises(headrace.ConfigError):
        Recorder(**kwargs)


def _timeline(*, wait, busy, budget=0.0, threads=2, seconds=10.0, n=10):
    samples = []
    for i in range(1, n + 1):
        f = i / n
        samples.append({"t": seconds * f, "delivered_batches_total": 100 * f,
                        "delivered_samples_total": 1000 * f, "delivered_bytes_total": 1e6 * f,
                        "consumer_wait_seconds": wait * seconds * f,
                        "budget_wait_seconds": budget * seconds * f, "ram_wait_seconds": 0.0,
                        "gather_busy_seconds": busy * seconds * threads * f,
                        "transform_busy_seconds": 0.0, "queue_depth": 1.0,
                        "batches_in_flight": 2.0, "inflight_bytes": 1e5,
                        "process_rss_bytes": 5e7, "page_cache_resident_bytes": 1e7,
                        "counted_rss_bytes": 4e7})
    return {"format": "headrace-timeline", "version": 1, "threads": threads,
            "max_inflight_bytes": 1 << 28, "max_process_rss_bytes": 1 << 33,
            "effective_max_queue_batches": 4, "samples": derive(samples, threads=threads)}


def test_verdict_and_advice():
    s = summarize(_timeline(wait=0.6, busy=0.95))
    assert s["loader_bound"] and s["verdict"].startswith("loader-bound: the model waited 60%")
    assert s["samples_per_second"] == pytest.approx(100.0)
    assert any("add --threads" in t for t in advice(s, cpus=8))
    assert any("CPU is the limit" in t for t in advice(s, cpus=2))
    s = summarize(_timeline(wait=0.6, busy=0.3, budget=0.5))
    assert any("raise --inflight" in t for t in advice(s, cpus=8))
    s = summarize(_timeline(wait=0.6, busy=0.3))
    assert any("larger --batch" in t for t in advice(s, cpus=8))
    s = summarize(_timeline(wait=0.02, busy=0.3))
    assert not s["loader_bound"] and s["verdict"].startswith("model-bound")
    assert any("not the bottleneck" in t for t in advice(s, cpus=8))


def test_counters_that_restart_count_from_zero():
    tl = _timeline(wait=0.5, busy=0.5)
    raw = tl["samples"]
    restarted = [*raw[:5], *({**s, "delivered_samples_total": s["delivered_samples_total"] - 500}
                             for s in raw[5:])]
    out = derive(restarted, threads=2)
    assert all(s["samples_per_second"] >= 0 for s in out)
    assert summarize({**tl, "samples": out})["samples"] == 1000
