"""``headrace.mx8`` against the real mx8 1.0.7 wheel on the same pack: PyBatch attributes,
dtypes and shapes, schedules with byte-aware batching, stats keys, print_stats, launcher errors."""

from __future__ import annotations

import os

import mx8 as real
import pytest
from tests._files import random_files

import headrace.mx8 as mx8
from headrace import CheckpointError, ConfigError
from headrace._compat.mx8 import batch_ceiling


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    root = random_files(tmp_path_factory.mktemp("mx8c_in"), 40, 2000, 6000, seed=3,
                        classes=("dog", "cat"), name="{i}.jpg")
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
        s = dd.stats()
        assert (s["assigned_rank"], s["world_size"], s["effective_want"]) == (1, 2, 1)


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


@pytest.mark.parametrize("kw", [dict(batch=8), dict(batch=7, start=3, end=30),
                                dict(batch=64, target_bytes=9000), dict(batch=5, batch_bytes=9000)])
@pytest.mark.parametrize("taken", [1, 3])
def test_an_mx8_token_resumes_where_mx8_resumes(pack, tmp_path, kw, taken):
    """A token the wheel wrote, given to headrace.mx8: the rest is what the wheel yields from the
    same token, and headrace's own token from there resumes the same call again."""
    store = str(tmp_path / "ms")
    ref = real.load(str(pack), store=store, **kw)
    for _ in range(taken):
        next(ref)
    token = ref.checkpoint()
    want = [b.sample_ids for b in real.load(str(pack), store=store, resume=token, **kw)]
    assert want and want[0][0] > 0
    ld = mx8.load(str(pack), resume=token, **kw)
    first = next(ld)
    again = mx8.load(str(pack), resume=ld.checkpoint(), **kw)
    assert [first.sample_ids, *[b.sample_ids for b in ld]] == want
    assert [b.sample_ids for b in again] == want[1:]
    long = mx8.DataLoader(str(pack), batch_size_samples=kw["batch"], resume_from=token,
                          start_id=kw.get("start"), end_id=kw.get("end"),
                          target_batch_bytes=kw.get("target_bytes"),
                          max_batch_bytes=kw.get("batch_bytes"))
    assert [b.sample_ids for b in long] == want


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    """An image pack (two classes) and an audio pack, made by the wheel."""
    from tests._images import imagefolder
    from tests._media import sine, write_audio

    root = tmp_path_factory.mktemp("mx8tok")
    imagefolder(root / "img", {"cat": 9, "dog": 8}, h=12, w=16)
    real.pack_dir(str(root / "img"), out=str(root / "img_pk"))
    for i in range(9):
        write_audio(str(root / "aud" / f"{i}.wav"), sine(200 + 50 * i, 8000, 100 * (i + 1)),
                    8000)
    real.pack_dir(str(root / "aud"), out=str(root / "aud_pk"))
    return root


def _token(data, store, taken, **kw):
    ref = real.load(str(data), store=store, **kw)
    for _ in range(taken):
        next(ref)
    return ref.checkpoint()


def test_an_mx8_token_resumes_image_and_audio_loaders(media, tmp_path):
    store = str(tmp_path / "ms")
    pk = media / "img_pk"
    token = _token(pk, store, 2, batch=4)  # next_sample_id=8
    want = [y.tolist() for _x, y in real.image(str(pk), batch=5, resize=(8, 8), store=store,
                                                resume=token)]
    assert [y.tolist() for _x, y in mx8.image(str(pk), batch=5, resize=(8, 8),
                                              resume=token)] == want
    long = mx8.ImageLoader(str(pk), batch_size_samples=5, resize_hw=(8, 8), resume_from=token)
    assert [y.tolist() for _x, y in long] == want
    assert sum(len(b) for b in want) == 17 - 8
    # mx8's image tokens say epoch=0 whatever the augmentation epoch: any epoch resumes them
    kw = dict(batch=5, resize=(8, 8), epoch=2, flip_p=0.5, resume=token)
    want = [y.tolist() for _x, y in real.image(str(pk), store=store, **kw)]
    assert [y.tolist() for _x, y in mx8.image(str(pk), **kw)] == want
    apk = media / "aud_pk"
    token = _token(apk, store, 1, batch=4, target_bytes=1500)
    want = [b.sample_ids.tolist() for b in real.audio(str(apk), samples=64, batch=4, store=store,
                                                       target_bytes=1500, resume=token)]
    got = mx8.audio(str(apk), samples=64, batch=4, target_bytes=1500, resume=token)
    assert [b.sample_ids.tolist() for b in got] == want and want[0][0] > 0


def test_an_mx8_token_is_checked_as_mx8_checks_it(pack, tmp_path, monkeypatch):
    store = str(tmp_path / "ms")
    ref = real.load(str(pack), store=store, batch=8, start=3, end=30)
    next(ref)
    token = ref.checkpoint()
    for bad, message in [
            (token.replace(b"schema_version=0", b"schema_version=9"),
             "resume_from schema_version mismatch: token=9 current=0"),
            (token.replace(b"epoch=0", b"epoch=3"), "resume_from epoch mismatch: token=3"),
            (token.replace(b"end_id=30", b"end_id=40"),
             "resume_from end_id mismatch: token=40 current=30"),
            (token.replace(b"next_sample_id=11", b"next_sample_id=31"),
             r"invalid checkpoint token range \(next_sample_id > end_id\)")]:
        with pytest.raises(ValueError, match=message):  # real mx8: ValueError, same words
            list(real.load(str(pack), store=store, batch=8, start=3, end=30, resume=bad))
        with pytest.raises(CheckpointError, match=message):
            mx8.load(str(pack), batch=8, start=3, end=30, resume=bad)
    with pytest.raises(CheckpointError, match="resume_from end_id mismatch: token=30 current=40"):
        mx8.load(str(pack), batch=8, resume=token)
    fake = token.replace(b"manifest_hash=", b"manifest_hash=0")
    with pytest.raises(CheckpointError, match="resume_from manifest_hash mismatch"):
        mx8.load(str(pack), batch=8, start=3, end=30, resume=fake)
    assert mx8.resolve(str(pack)) == real.resolve(str(pack), store=store)
    mix = (b"mx8_checkpoint_v1\nkind=mix_loader\nseed=0\nepoch=0\nsource_count=1\n")
    with pytest.raises(ValueError, match="unsupported checkpoint kind mix"):
        real.load(str(pack), store=store, batch=8, resume=mix)
    with pytest.raises(CheckpointError, match=r"unsupported checkpoint kind mix_loader.*"
                                              r"resumes mx8\.mix"):
        mx8.load(str(pack), batch=8, resume=mix)
    dist = b"mx8_checkpoint_v1\nkind=distributed_loader\nepoch=0\nrange_count=1\nC 0 8\n"
    with pytest.raises(CheckpointError, match=r"'distributed_loader'.*no coordinator"):
        mx8.load(str(pack), batch=8, resume=dist)
    with pytest.raises(CheckpointError, match=r"unsupported checkpoint kind data_loader.*"
                                              r"resumes one source"):
        mx8.mix([mx8.load(str(pack), batch=8)], weights=[1], resume=token)


@pytest.mark.parametrize(("weights", "seed", "taken"), [([7, 3], 0, 5), ([0.7, 0.3], 1, 3),
                                                        ([1, 1, 2], 2, 7)])
def test_an_mx8_mix_token_resumes_schedule_and_sources(pack, tmp_path, weights, seed, taken):
    """The wheel's mix token: headrace resumes the schedule (as mx8 does) and every source at
    its own token, so the rest is the stream the uninterrupted mix yields (mx8 itself continues
    from wherever the sources are: from its fresh sources' starts here)."""
    store = str(tmp_path / "ms")
    ranges = [(0, 40), (0, 20), (20, 40)][:len(weights)]

    def sources(mod, **kw):
        return [mod.load(str(pack), batch=3, start=a, end=b, **kw) for a, b in ranges]

    ref = real.mix(sources(real, store=store), weights=weights, seed=seed,
                   on_source_exhausted="allow")
    for _ in range(taken):
        next(ref)
    token = ref.checkpoint()
    want = [b.sample_ids for b in ref]  # the uninterrupted run's rest
    got = mx8.mix(sources(mx8), weights=weights, seed=seed, on_source_exhausted="allow",
                  resume=token)
    assert [b.sample_ids for b in got] == want
    with pytest.raises(CheckpointError, match="resume_from seed mismatch: token="):
        mx8.mix(sources(mx8), weights=weights, seed=seed + 1, resume=token)
    with pytest.raises(CheckpointError, match="resume_from source_count mismatch: token="):
        mx8.mix(sources(mx8)[:1], weights=[1], seed=seed, resume=token)


def test_ram_gb_and_constraints_cap_are_one_setting_as_in_mx8(pack, tmp_path):
    both = dict(batch=8, ram_gb=1, constraints=real.Constraints(max_ram_bytes=10**9))
    with pytest.raises(ValueError, match=r"pass only one of ram_gb or constraints\.max_ram_bytes"):
        real.load(str(pack), store=str(tmp_path / "ms"), **both)
    with pytest.raises(ConfigError, match=r"pass only one of ram_gb or constraints\.max_ram_bytes"):
        mx8.load(str(pack), batch=8, ram_gb=1, constraints=mx8.Constraints(max_ram_bytes=10**9))
    ok = mx8.load(str(pack), batch=8, ram_gb=1,
                  constraints=mx8.Constraints(max_inflight_bytes=1 << 24))
    assert ok.stats()["max_process_rss_bytes"] == 1 << 30


def test_image_loader_stats_keys_and_print_stats_are_mx8s(media, tmp_path, capsys):
    pk = str(media / "img_pk")
    ref = real.image(pk, batch=4, resize=(8, 8), store=str(tmp_path / "ms"))
    next(ref)
    for ld in (mx8.image(pk, batch=4, resize=(8, 8)),
               mx8.ImageLoader(pk, batch_size_samples=4, resize_hw=(8, 8))):
        next(ld)
        measured = {k for k in ref.stats() if not k.startswith("autotune_")
                    and k not in ("batch_jitter_slo_breaches_total",
                                  "batch_jitter_band_adjustments_total")}
        assert measured | {"autotune_enabled"} <= set(ld.stats())
        assert type(ld).__name__ == "ImageLoader" and ld.classes == ref.classes
        ld.print_stats()
        line = capsys.readouterr().err.strip()
        assert line.startswith("[mx8] batches=1 samples=4 inflight=") and line.endswith("MB")
        ld.close()


def test_an_inflight_cap_alone_cuts_batches_to_fit_it_as_mx8(pack, tmp_path):
    """mx8's class API: without max_batch_bytes, a batch's bytes are capped by
    max_inflight_bytes (the splits are the wheel's); a record past it is mx8's error."""
    kw = dict(batch_size_samples=4, max_inflight_bytes=10000)
    ref = real.DataLoader(str(pack), manifest_store=str(tmp_path / "ms"), **kw)
    want = []
    for b in ref:
        want.append(b.sample_ids)
        del b  # mx8 blocks while a held batch keeps the cap used
    assert any(len(w) < 4 for w in want[:-1])
    assert [b.sample_ids for b in mx8.DataLoader(str(pack), **kw)] == want
    small = dict(batch_size_samples=4, max_inflight_bytes=2500)
    with pytest.raises(RuntimeError, match=r"sample \d+ has byte_length \d+ > max_batch_bytes 2500"):
        list(real.DataLoader(str(pack), manifest_store=str(tmp_path / "ms"), **small))
    with pytest.raises(ConfigError, match=r"record \d+ has \d+ bytes > max_inflight_bytes 2500: "
                                          r"with max_batch_bytes unset.*at least \d+"):
        mx8.DataLoader(str(pack), **small)


@pytest.fixture(scope="module")
def big_pack(tmp_path_factory):
    """380 records of 60-120 KB (about 33 MiB): past a quarter of mx8's default inflight cap."""
    root = random_files(tmp_path_factory.mktemp("mx8big_in"), 380, 60_000, 120_000, seed=9)
    out = tmp_path_factory.mktemp("mx8big_pk") / "pk"
    real.pack_dir(str(root), out=str(out), shard_mb=64)
    return out


@pytest.mark.parametrize("inflight", [None, 8 << 20, 64 << 20])
def test_the_class_apis_batch_ceiling_is_a_quarter_of_the_inflight_cap(big_pack, tmp_path,
                                                                         inflight):
    """mx8's DataLoader without max_batch_bytes cuts batches at a quarter of max_inflight_bytes
    (128 MiB unset) held between 4 and 64 MiB, ending each once it holds 90% of that."""
    kw = dict(batch_size_samples=512)
    if inflight is not None:
        kw["max_inflight_bytes"] = inflight
    want = []
    for b in real.DataLoader(str(big_pack), manifest_store=str(tmp_path / "ms"), **kw):
        want.append(b.sample_ids)
        del b
    assert len(want) > 1  # the ceiling, not batch_size_samples, cut them
    assert [b.sample_ids for b in mx8.DataLoader(str(big_pack), **kw)] == want
    assert batch_ceiling(inflight, None) == {None: 32 << 20, 8 << 20: 4 << 20,
                                                 64 << 20: 16 << 20}[inflight]


def test_a_record_past_the_derived_ceiling_names_max_batch_bytes_as_mx8(tmp_path):
    """With max_inflight_bytes 16 MiB the class API's ceiling is 4 MiB: a 5 MB record is mx8's
    error about max_batch_bytes 4194304, and headrace's ConfigError says what to pass."""
    root = random_files(tmp_path / "in", 3, 1000, 2000, seed=1)
    (root / "a" / "big.bin").write_bytes(os.urandom(5_000_000))
    real.pack_dir(str(root), out=str(tmp_path / "pk"), shard_mb=64)
    kw = dict(batch_size_samples=4, max_inflight_bytes=16 << 20)
    with pytest.raises(RuntimeError, match=r"byte_length 5000000 > max_batch_bytes 4194304"):
        list(real.DataLoader(str(tmp_path / "pk"), manifest_store=str(tmp_path / "ms"), **kw))
    with pytest.raises(ConfigError, match=r"record \d+ has 5000000 bytes > max_batch_bytes "
                                          r"4194304: .*quarter of max_inflight_bytes \(16777216\)"
                                          r".*pass max_batch_bytes of at least 5000000"):
        mx8.DataLoader(str(tmp_path / "pk"), **kw)
