"""The stats timeline: bounded in count and memory, JSON-serializable, honest verdicts."""

import json

import numpy as np
import pytest

import headrace
from headrace._engine.timeline import Recorder, advice, derive, load_timeline, summarize


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


# -- every loader kind records the same timeline (issue 10) ------------------------------------

SNAPSHOT_KEYS = ("t", "delivered_batches_total", "delivered_samples_total", "samples_per_second",
                 "bytes_per_second", "queue_depth", "batches_in_flight", "inflight_bytes",
                 "process_rss_bytes", "counted_rss_bytes", "consumer_wait_fraction",
                 "worker_busy_fraction", "gather_busy_seconds", "transform_busy_seconds")


def _drain_with_timeline(loader):
    """Iterates to the end with a snapshot due at every batch; checks what every kind shares."""
    loader.enable_timeline(period_s=1e-9, capacity=512)
    batches = sum(1 for _ in loader)
    with pytest.raises(StopIteration):  # next() past the end records nothing more
        next(loader)
    tl = loader.stats_timeline()
    assert json.loads(json.dumps(tl)) == tl
    assert tl["records"] == batches + 1  # one per batch (all due) + the end of the run
    assert batches >= 2
    for s in tl["samples"]:
        assert set(SNAPSHOT_KEYS) <= set(s)
    last = tl["samples"][-1]
    assert last["delivered_batches_total"] == batches
    assert [s["delivered_batches_total"] for s in tl["samples"]] == sorted(
        s["delivered_batches_total"] for s in tl["samples"])
    assert isinstance(tl["threads"], int) and tl["threads"] >= 1
    assert isinstance(tl["max_inflight_bytes"], int)
    return tl, batches


def _png_ok(path, size):
    from PIL import Image

    with Image.open(path) as im:
        assert im.format == "PNG" and im.size == size
        rgb = np.asarray(im.convert("RGB"))
    assert len(np.unique(rgb.reshape(-1, 3), axis=0)) > 20  # not a blank canvas
    assert (rgb.min(axis=2) < 200).mean() > 0.01


def _ints(s):
    return [int(x) for x in s.split()]


_ints.bos_id, _ints.eos_id = 2, 1  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def token_store(tmp_path_factory):
    root = tmp_path_factory.mktemp("text")
    src = root / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": " ".join(str(10 + (d * 7 + i) % 90)
                                                         for i in range(5 + d % 11))}) + "\n"
                           for d in range(60)))
    out = str(root / "tok.hr")
    headrace.pack_text(str(src), out, tokenizer=_ints)
    return out


def test_text_loader_timeline(token_store):
    with headrace.text(token_store, batch=4, seq_len=8, threads=1) as ld:
        tl, _ = _drain_with_timeline(ld)
    assert tl["kind"] == "text" and tl["batch_size_samples"] == 4
    assert tl["samples"][-1]["delivered_samples_total"] == ld.windows


def test_timeline_argument_on_every_factory(token_store, tmp_path):
    # A period longer than the run: only the end is recorded; a bad one fails before any work.
    with headrace.text(token_store, batch=4, seq_len=8, timeline=3600.0) as ld:
        n = sum(1 for _ in ld)
        tl = ld.stats_timeline()
    assert tl["records"] == 1 and tl["period_s"] == 3600.0
    assert tl["samples"][-1]["delivered_batches_total"] == n
    with headrace.text(token_store, batch=4, seq_len=8, timeline=True) as ld:
        assert ld.stats_timeline()["period_s"] == 0.5
    with (headrace.text(token_store, batch=4, seq_len=8) as ld,
          pytest.raises(headrace.ConfigError, match=r"TextLoader records no timeline.*=True")):
        ld.stats_timeline()
    for bad in (0, -1.0, "fast"):
        with pytest.raises(headrace.ConfigError, match="timeline="):
            headrace.text(token_store, batch=4, seq_len=8, timeline=bad)
        with pytest.raises(headrace.ConfigError, match="timeline="):
            headrace.mix([headrace.Loader(_data(40), batch=4)], timeline=bad)


def test_stream_text_loader_timeline(tmp_path):
    folder = tmp_path / "raw"
    folder.mkdir()
    for d in range(12):
        (folder / f"{d:02d}.txt").write_text(" ".join(str(10 + i) for i in range(3 + d)))
    with headrace.text(str(folder), batch=3, seq_len=6, tokenizer=_ints, stream=True,
                       packing="pad", threads=1) as ld:
        tl, batches = _drain_with_timeline(ld)
    assert tl["kind"] == "text" and batches == 4


def test_audio_loader_timeline(tmp_path):
    from _media import sine, write_audio

    for i in range(6):
        write_audio(str(tmp_path / "a" / f"{i}.wav"), sine(200 + 100 * i, 8000, 800), 8000)
    with headrace.audio(str(tmp_path / "a"), batch=2, samples=400, threads=1) as ld:
        tl, batches = _drain_with_timeline(ld)
    assert tl["kind"] == "audio" and batches == 3
    assert tl["samples"][-1]["delivered_samples_total"] == 6
    assert tl["samples"][-1]["transform_busy_seconds"] > 0  # decoding runs in the transform


def test_video_loader_timeline(tmp_path):
    from _media import write_video

    for name in ("x.mp4", "y.mp4"):
        write_video(str(tmp_path / "v" / name), 12, fps=8, size=(16, 16))
    with headrace.video(str(tmp_path / "v"), clip=2, stride=2, fps=8, batch=4, threads=1,
                        index_dir=str(tmp_path / "idx"), timeline=1e-9) as ld:
        batches = sum(1 for _ in ld)
        tl = ld.stats_timeline()
    assert tl["kind"] == "video" and tl["records"] == batches + 1 and batches == 3
    assert set(SNAPSHOT_KEYS) <= set(tl["samples"][-1])
    assert tl["samples"][-1]["delivered_samples_total"] == 12


def test_distributed_loader_timeline():
    with headrace.DistributedDataLoader(_data(200), batch=16, rank=1, world_size=2,
                                        check=False, threads=1) as ld:
        tl, batches = _drain_with_timeline(ld)
    assert tl["kind"] == "distributed" and batches == 7  # 100 of 200 records, tail padded


def test_mix_timeline_sums_its_sources_and_plots(tmp_path):
    sources = [headrace.Loader(_data(120), batch=10, threads=1, inflight=1 << 20)
               for _ in range(2)]
    with headrace.mix(sources, weights=[1, 1], on_source_exhausted="drop") as m:
        tl, batches = _drain_with_timeline(m)
    assert tl["kind"] == "mix" and batches == 24
    assert tl["threads"] == 2 and tl["max_inflight_bytes"] == 2 << 20  # the shared cap
    assert tl["batch_size_samples"] == 10 and tl["effective_max_queue_batches"] >= 2
    assert tl["samples"][-1]["delivered_samples_total"] == 240
    assert tl["samples"][-1]["gather_busy_seconds"] > 0
    assert max(s["inflight_bytes"] for s in tl["samples"]) <= 2 << 20
    out = headrace.plot(m, tmp_path / "mix.png", dpi=40, width_in=10, height_in=9)
    _png_ok(out, (400, 360))


def test_mix_timeline_counters_survive_a_source_restart():
    def transform(batch, ids):
        return {"x": batch["x"].astype(np.float32)}

    sources = [headrace.Loader(_data(30), batch=10, threads=1, transform=transform)
               for _ in range(2)]
    with headrace.mix(sources, on_source_exhausted="restart", timeline=1e-9) as m:
        for _ in zip(range(20), m, strict=False):  # each source restarts 3 times
            pass
        assert m.stats()["mix_source_restarts_total"] == [3, 3]
        tl = m.stats_timeline()
    for key in ("gather_busy_seconds", "transform_busy_seconds"):
        series = [s[key] for s in tl["samples"]]
        assert series == sorted(series), key  # cumulative across rebuilt sources
    assert all(s["worker_busy_fraction"] >= 0 for s in tl["samples"])


def test_image_loader_timeline_spans_epochs_and_plots(tmp_path):
    from _images import imagefolder

    imagefolder(tmp_path / "imgs", {"a": 6, "b": 6}, h=24, w=32)
    with headrace.image(str(tmp_path / "imgs"), batch=4, epochs=2, resize=(16, 16),
                        threads=1) as ld:
        tl, batches = _drain_with_timeline(ld)  # one recorder across both epochs' loaders
        assert tl["kind"] == "image" and batches == 6
        assert tl["samples"][-1]["delivered_samples_total"] == 24
        assert max(s["transform_busy_seconds"] for s in tl["samples"]) > 0  # decoding
        out = headrace.plot(ld, tmp_path / "image.png", dpi=40, width_in=10, height_in=9)
    _png_ok(out, (400, 360))
    with headrace.image(str(tmp_path / "imgs"), batch=4, resize=(16, 16),
                        timeline=3600.0) as ld:
        n = sum(1 for _ in ld)
        assert ld.stats_timeline()["records"] == 1 and n == 3
    with pytest.raises(headrace.ConfigError, match="timeline="):
        headrace.image(str(tmp_path / "imgs"), batch=4, timeline=-1)


def test_a_mix_of_image_loaders_keeps_their_timelines_across_rebuilds(tmp_path):
    from _images import imagefolder

    imagefolder(tmp_path / "imgs", {"a": 4, "b": 4}, h=24, w=32)
    sources = [headrace.image(str(tmp_path / "imgs"), batch=4, resize=(16, 16), threads=1,
                              timeline=1e-9) for _ in range(2)]
    with headrace.mix(sources, inflight=8 << 20, on_source_exhausted="drop") as m:
        assert m.stats()["mix_shared_budget"]  # the sources were rebuilt on the shared budget
        assert sum(1 for _ in m) == 4
        tl = m.sources[0].stats_timeline()
    assert tl["kind"] == "image" and tl["samples"][-1]["delivered_batches_total"] == 2
