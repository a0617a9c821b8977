"""``headrace.mx8`` text / audio / video / mix / pack / _internal against the real mx8 1.0.7 wheel
on the same data: TextBatch and AudioBatch tensors, mix schedules (with exhaustion), stats keys,
``__all__`` and signatures. mx8's video needs an ffmpeg binary (absent here), so VideoBatch is
checked against mx8's documented fields and headrace's own decoded clips."""

from __future__ import annotations

import inspect
import os
import random

import mx8 as real
import numpy as np
import pytest
from tests._media import frame_index, write_audio, write_video
from tokenizers import Tokenizer, models, pre_tokenizers

import headrace
import headrace.mx8 as mx8
from headrace import ConfigError, LoaderError

DOCS = ["the cat", "a dog sat on the mat the cat sat", "on the mat", "dog", "the the the the the",
        "mat a dog on the cat"]


@pytest.fixture(scope="module")
def tok_path(tmp_path_factory):
    vocab = {"[UNK]": 0, "<|endoftext|>": 1, "<s>": 2, "[PAD]": 3}
    for i, w in enumerate(["the", "cat", "sat", "on", "mat", "a", "dog"]):
        vocab[w] = 4 + i
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<|endoftext|>", "<s>", "[PAD]"])
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return str(path)


@pytest.fixture(scope="module")
def text_pack(tmp_path_factory):
    root = tmp_path_factory.mktemp("txt")
    for i, t in enumerate(DOCS):
        (root / "raw").mkdir(exist_ok=True)
        (root / "raw" / f"{i}.txt").write_text(t)
    real.pack_dir(str(root / "raw"), out=str(root / "pk"))
    return root


@pytest.fixture(scope="module")
def audio_pack(tmp_path_factory):
    root = tmp_path_factory.mktemp("aud")
    rng = np.random.default_rng(0)
    for i, n in enumerate([100, 300, 200, 50, 400, 256, 10]):
        x = rng.uniform(-0.9, 0.9, n).astype(np.float32)
        write_audio(str(root / "raw" / f"{i}.wav"), x, 8000)
    real.pack_dir(str(root / "raw"), out=str(root / "pk"))
    return root


def _same_tensors(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        if w is None:
            assert g is None
            continue
        assert (g.dtype, tuple(g.shape)) == (w.dtype, tuple(w.shape))
        assert bool((g == w).all())


def test_all_names_and_signatures_are_mx8s():
    assert sorted(mx8.__all__) == sorted(real.__all__)
    for name in real.__all__:
        assert hasattr(mx8, name), name
        try:
            want = list(inspect.signature(getattr(real, name)).parameters)
        except (TypeError, ValueError):  # classes mx8 builds only from its functions
            continue
        got = [p for p in inspect.signature(getattr(mx8, name)).parameters
               if not p.startswith("_") and p != "kwargs"]
        if name not in ("image", "ImageLoader"):  # headrace.image's keywords, a superset
            assert got == want, name
    assert sorted(n for n in dir(real._internal) if not n.startswith("_")) == sorted(
        mx8._internal.__all__)


@pytest.mark.parametrize("kw", [
    dict(seq_len=4, stride=3, batch=2, add_bos=True),
    dict(seq_len=5, stride=5, batch=3, return_mask=False),
    dict(seq_len=3, stride=2, batch=1, add_eos=False),
    dict(seq_len=6, stride=6, batch=4, start=1, end=5),
    dict(seq_len=4, stride=4, batch=8, target_bytes=20),
])
@pytest.mark.parametrize("where", ["pk", "raw"])
def test_text_batches_equal_mx8s(text_pack, tok_path, tmp_path, kw, where):
    want = list(real.text(str(text_pack / "pk"), store=str(tmp_path / "ms"), tokenizer=tok_path,
                          **kw))
    with mx8.text(str(text_pack / where), tokenizer=tok_path, **kw) as ld:
        got = list(ld)
        assert list(ld) == []  # as mx8: an ended loader keeps ending
        assert (ld.sequence_length, ld.stride) == (kw["seq_len"], kw["stride"])
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert type(g).__name__ == "TextBatch"
        _same_tensors(g.to_torch(), w.to_torch())
        _same_tensors([g.token_ids, g.attention_mask, g.sample_ids],
                      [w.token_ids, w.attention_mask, w.sample_ids])


def test_text_stats_keys_resume_and_errors(text_pack, tok_path, tmp_path):
    kw = dict(tokenizer=tok_path, seq_len=4, stride=4, batch=2)
    ref = real.text(str(text_pack / "pk"), store=str(tmp_path / "ms"), **kw)
    next(ref)
    ld = mx8.text(str(text_pack / "pk"), **kw)
    first = next(ld)
    measured = {k for k in ref.stats() if (not k.startswith("autotune_")
                and not k.startswith("batch_jitter_")) or k in (
                    "autotune_enabled", "batch_jitter_band_lower_pct",
                    "batch_jitter_band_upper_pct")}
    assert measured <= set(ld.stats())
    s = ld.stats()
    assert (s["text_sequence_length"], s["text_stride"], s["text_return_attention_mask"]) == (
        4, 4, True)
    assert s["delivered_batches_total"] == 1 and s["delivered_samples_total"] == 2
    rest = [b.sample_ids.tolist() for b in ld]
    again = mx8.text(str(text_pack / "pk"), resume=ld.checkpoint(), **kw)
    assert [b.sample_ids.tolist() for b in again] == []
    token = mx8.text(str(text_pack / "pk"), **kw)
    next(token)
    assert [b.sample_ids.tolist() for b in mx8.text(str(text_pack / "pk"),
                                                    resume=token.checkpoint(), **kw)] == rest
    assert first.sample_ids.tolist() == [0, 1, 1, 1] and first.token_ids.dtype == torch_int64()
    with pytest.raises(ConfigError, match=r"headrace never downloads.*tokenizer\.json"):
        mx8.text(str(text_pack / "pk"))
    with pytest.raises(ConfigError, match=r'invalid truncate="left" \(expected: right\|error\)'):
        mx8.text(str(text_pack / "pk"), truncate="left", **kw)
    with pytest.raises(ConfigError, match="invalid decode_error_policy"):
        mx8.text(str(text_pack / "pk"), on_decode_error="ignore", **kw)
    with pytest.raises(ConfigError, match="sequence_length must be > 0"):
        mx8.text(str(text_pack / "pk"), tokenizer=tok_path, seq_len=0)
    with pytest.raises(ConfigError, match=r"add_eos=True but tokenizer has no known EOS "
                                          r"token id; pass add_eos=False"):
        mx8.text(str(text_pack / "pk"), tokenizer=lambda s: [len(w) for w in s.split()])
    too_long = mx8.text(str(text_pack / "pk"), tokenizer=tok_path, seq_len=3, truncate="error")
    with pytest.raises(ConfigError, match=r"token sequence too long for sample_id=1"):
        list(too_long)


def torch_int64():
    import torch

    return torch.int64


@pytest.mark.parametrize("kw", [dict(samples=256, batch=2), dict(samples=64, batch=3),
                                dict(samples=500, batch=4, rate_hz=8000),
                                dict(samples=128, batch=2, start=2, end=7)])
@pytest.mark.parametrize("where", ["pk", "raw"])
def test_audio_batches_equal_mx8s(audio_pack, tmp_path, kw, where):
    want = list(real.audio(str(audio_pack / "pk"), store=str(tmp_path / "ms"), **kw))
    with mx8.audio(str(audio_pack / where), **kw) as ld:
        got = list(ld)
        assert list(ld) == []
        assert (ld.sample_count, ld.channels, ld.sample_rate_hz) == (
            kw["samples"], 1, kw.get("rate_hz"))
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert type(g).__name__ == "AudioBatch"
        _same_tensors(g.to_torch(), w.to_torch())
        _same_tensors([g.samples, g.sample_rates_hz, g.sample_ids],
                      [w.samples, w.sample_rates_hz, w.sample_ids])


def test_audio_stats_keys(audio_pack, tmp_path):
    ref = real.audio(str(audio_pack / "pk"), store=str(tmp_path / "ms"), samples=64, batch=2)
    list(ref)
    ld = mx8.audio(str(audio_pack / "pk"), samples=64, batch=2)
    list(ld)
    audio_keys = {k for k in ref.stats() if k.startswith("audio_")}
    got, want = ld.stats(), ref.stats()
    assert audio_keys <= set(got)
    # mx8 decodes every file whole; headrace reads only the frames it keeps
    same = audio_keys - {"audio_decoded_frames_total"}
    assert {k: got[k] for k in same} == {k: want[k] for k in same}
    assert got["audio_decoded_frames_total"] == 5 * 64 + 50 + 10 < want[
        "audio_decoded_frames_total"]
    with pytest.raises(ConfigError, match="invalid decode_error_policy"):
        mx8.audio(str(audio_pack / "pk"), on_decode_error="ignore")


@pytest.fixture(scope="module")
def id_pack(tmp_path_factory):
    root = tmp_path_factory.mktemp("ids")
    rng = random.Random(5)
    for i in range(60):
        (root / "in").mkdir(exist_ok=True)
        (root / "in" / f"{i:03d}.bin").write_bytes(os.urandom(rng.randint(50, 150)))
    real.pack_dir(str(root / "in"), out=str(root / "pk"))
    return root / "pk"


def _picks(m, starts):
    out = []
    try:
        for b in m:
            sid = b.sample_ids[0]
            out.append(max(i for i, a in enumerate(starts) if a <= sid))
    except (RuntimeError, LoaderError) as e:
        out.append(str(e).split(";")[0])
    return out


@pytest.mark.parametrize(("weights", "seed", "epoch", "lens", "policy"), [
    ([7, 3], 0, 0, [20, 9], "allow"),
    ([7, 3], 1, 0, [20, 9], "error"),
    ([7, 3], 1, 0, [20, 20], "error"),
    ([1, 2, 3], 1, 0, [4, 3, 2], "allow"),
    ([1, 2, 3], 0, 1, [5, 2, 3], "allow"),
    ([0.7, 0.3], 0, 0, [9, 9], "allow"),
    ([2, 2, 1], 2, 0, [3, 1, 4], "allow"),
    ([1, 1, 1], 0, 2, [4, 4, 4], "error"),
])
def test_mix_schedules_equal_mx8s(id_pack, tmp_path, weights, seed, epoch, lens, policy):
    starts = [sum(lens[:i]) for i in range(len(lens))]

    def build(lib, **store):
        return lib.mix([lib.load(str(id_pack), batch=1, start=a, end=a + n, **store)
                        for a, n in zip(starts, lens, strict=True)],
                       weights=weights, seed=seed, epoch=epoch, on_source_exhausted=policy)

    want = _picks(build(real, store=str(tmp_path / "ms")), starts)
    got_mix = build(mx8)
    got = _picks(got_mix, starts)
    if policy == "error" and len(want) - 1 == sum(lens):
        # mx8 raises even when every source ended at the same tick; that is the mix's natural
        # end in headrace (the README's own mix example would raise otherwise)
        assert got == want[:-1]
    else:
        assert got == want
    ref_stats = build(real, store=str(tmp_path / "ms"))
    list(zip(range(3), ref_stats, strict=False))
    # mx8's keys, except autotune gauges and the resume-mismatch counter (headrace restores
    # every source, so that mismatch cannot happen)
    keys = {k for k in ref_stats.stats() if "autotune" not in k and k not in (
        "mix_profile", "mix_effective_prefetch_batches", "mix_effective_max_queue_batches",
        "mix_resume_source_checkpoint_mismatch_total")}
    assert keys <= set(got_mix.stats())


def test_mix_batches_resume_and_errors(id_pack, tmp_path):
    a, b = mx8.load(str(id_pack), batch=4), mx8.load(str(id_pack), batch=4)
    m = mx8.mix([a, b], weights=[1, 1], seed=0, epoch=0, on_source_exhausted="allow")
    first = next(m)
    assert type(first).__name__ == "PyBatch" and first.sample_ids == [0, 1, 2, 3]
    token = m.checkpoint()
    rest = [x.sample_ids for x in m]
    back = mx8.mix([mx8.load(str(id_pack), batch=4), mx8.load(str(id_pack), batch=4)],
                   weights=[1, 1], resume=token, on_source_exhausted="allow")
    assert [x.sample_ids for x in back] == rest  # the sources are put back too
    with pytest.raises(ConfigError, match=r"mix weights length \(1\) must match loader count"):
        mx8.mix([mx8.load(str(id_pack)), mx8.load(str(id_pack))], weights=[1])
    with pytest.raises(ConfigError, match=r"mix requires loaders created by mx8\.load"):
        mx8.mix([headrace.load(str(id_pack))], weights=[1])
    with pytest.raises(ConfigError, match="mix requires all loaders to have identical batch"):
        mx8.mix([mx8.load(str(id_pack), batch=2), mx8.load(str(id_pack), batch=3)],
                weights=[1, 1])
    with pytest.raises(ConfigError, match="mix weight at index 0 must be > 0"):
        mx8.mix([mx8.load(str(id_pack))], weights=[0])


def test_mix_of_text_and_raw_keeps_each_sources_batch_class(id_pack, text_pack, tok_path):
    t = mx8.text(str(text_pack / "pk"), tokenizer=tok_path, seq_len=4, batch=2)
    r = mx8.load(str(id_pack), batch=2)
    inner = mx8.mix([t, r], weights=[1, 1])
    outer = mx8.mix([inner], weights=[1], on_source_exhausted="allow")
    kinds = [type(x).__name__ for _, x in zip(range(6), outer, strict=False)]
    assert kinds == ["TextBatch", "PyBatch"] * 3


def test_video_batches(tmp_path):
    write_video(str(tmp_path / "v" / "a.mp4"), 40, fps=8)
    write_video(str(tmp_path / "v" / "b.mp4"), 24, fps=8)
    real.pack_dir(str(tmp_path / "v"), out=str(tmp_path / "vpk"))
    ref = headrace.video(str(tmp_path / "v"), clip=4, stride=8, fps=8, batch=3,
                         index_dir=str(tmp_path / "ix"))
    want = list(ref)
    for where in ("v", "vpk"):  # a folder of videos and mx8's pack of it
        ld = mx8.video(str(tmp_path / where), clip=4, stride=8, fps=8, batch=3)
        got = list(ld)
        assert list(ld) == []
        assert ld.frames_per_clip == 4 and ld.clip_count == 8
        assert len(got) == len(want) == 3
        for g, w in zip(got, want, strict=True):
            assert type(g).__name__ == "VideoBatch"
            t = g.to_torch()
            assert tuple(t.shape) == w["frames"].shape == (len(g.sample_ids), 4, 32, 48, 3)
            assert bool((t.numpy() == w["frames"]).all())
            assert g.clip_ids == w["clip_ids"].tolist()
            assert g.sample_ids == w["video_ids"].tolist()
            assert g.clip_starts == w["start_s"].tolist()
            assert (g.layout, g.dtype, g.colorspace, g.channels) == ("thwc", "u8", "rgb24", 3)
            assert (g.frames_per_clip, g.frame_height, g.frame_width) == (4, 32, 48)
            assert g.offsets[-1] == len(g.payload) == t.numel()
            assert len(g.media_uris) == len(g.sample_ids)
        assert [frame_index(f) for f in got[0].to_torch().numpy()[0]] == [0, 1, 2, 3]
    with pytest.raises(ConfigError, match="video fps must be > 0"):
        mx8.video(str(tmp_path / "v"), fps=0)
    info = mx8._internal.video_index_build(str(tmp_path / "vpk"), clip_len=4, stride=8,
                                           fps_policy=8)
    assert info["clip_count"] == 8 and info["video_schema_version"] == 1
    assert set(info["failure_counts"]) == {"corrupt_media", "short_media", "unsupported_codec",
                                           "missing_stream"}
    check = mx8._internal.video_index_replay_check(str(tmp_path / "v"), clip_len=4, stride=8,
                                                   fps_policy="8")
    assert check["deterministic"] is True and check["clip_index_hash"] == info["clip_index_hash"]


def test_pack_local_folder_has_mx8_keys(tmp_path):
    for i in range(6):
        d = tmp_path / "in" / ("cat" if i % 2 else "dog")
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{i}.jpg").write_bytes(os.urandom(100 + i))
    r = mx8.pack(str(tmp_path / "in"), out=str(tmp_path / "st"), label_mode="imagefolder")
    assert {"samples", "shards", "manifest_path", "manifest_hash", "labels_path",
            "labels_hash", "manifest_key", "labels_key"} <= set(r)
    assert r["samples"] == 6 and r["labels_hash"] is not None and r["shards"] >= 1
    assert r["manifest_hash"] == mx8.resolve(str(tmp_path / "st"))
    d = mx8.pack_dir(str(tmp_path / "in"), out=str(tmp_path / "pd"))
    assert d["manifest_hash"] == mx8.resolve(str(tmp_path / "pd"))
    assert [b.label_ids for b in mx8.load(str(tmp_path / "st"), batch=6)] == [
        [0, 0, 0, 1, 1, 1]]


def test_video_index_fps_policy_is_mx8s_string(tmp_path):
    """mx8 takes ``fps_policy`` as a string (an int is its TypeError), ``"fixed_fps:8"`` by
    default. On 24 fps videos indexed at ``fixed_fps:24`` the wheel's clip count (from the
    manifest's ``frames=`` hints; it needs no ffmpeg to index) is headrace's; the default policy
    is ``fixed_fps:8`` in both (mx8: the same clip ids as passing it)."""
    vids = tmp_path / "v"
    for i in range(2):
        write_video(str(vids / f"v{i}.mp4"), 24, fps=24, size=(16, 16), gop=6)
    man = tmp_path / "man"
    (man / "_mx8").mkdir(parents=True)
    (man / "_mx8" / "manifest.tsv").write_text("schema_version=0\n" + "".join(
        f"{i}\t{vids}/v{i}.mp4\t\t\tmx8:video;frames=24;stream_id=0\n" for i in range(2)))
    ms = str(tmp_path / "ms")

    def ref(**kw):
        return real._internal.video_index_build(str(man), manifest_store=ms, clip_len=16,
                                                 stride=8, **kw)

    assert ref()["clip_ids_head"] == ref(fps_policy="fixed_fps:8")["clip_ids_head"]
    with pytest.raises(TypeError):
        ref(fps_policy=8)
    with pytest.raises(RuntimeError, match="fps_policy must be non-empty"):
        ref(fps_policy="")
    got = mx8._internal.video_index_build(str(vids), clip_len=16, stride=8,
                                          fps_policy="fixed_fps:24")
    assert got["clip_count"] == ref(fps_policy="fixed_fps:24")["clip_count"] == 4
    assert mx8._internal.video_index_build(str(vids), clip_len=4, stride=4)["clip_count"] == (
        mx8._internal.video_index_build(str(vids), clip_len=4, stride=4,
                                        fps_policy="8")["clip_count"])
    with pytest.raises(ConfigError, match="fps_policy must be non-empty"):
        mx8._internal.video_index_build(str(vids), fps_policy=" ")
    with pytest.raises(ConfigError, match=r"fps_policy='fixed_fps:abc' names no frame rate"):
        mx8._internal.video_index_build(str(vids), fps_policy="fixed_fps:abc")


def test_video_stats_carry_mx8s_names_for_what_is_measured(tmp_path):
    from pathlib import Path

    write_video(str(tmp_path / "v" / "a.mp4"), 40, fps=8)
    ld = mx8.video(str(tmp_path / "v"), clip=4, stride=8, fps=8, batch=2)
    first = next(ld)
    s = ld.stats()
    wheel = (Path(real.__file__).parent / "mx8.abi3.so").read_bytes()
    mx8_names = [k for k in s if k.startswith(("video_", "clips_", "bytes_per"))
                 and k.encode() in wheel]
    assert len(mx8_names) >= 20  # the names are the wheel's own
    assert [s[f"video_stride_{c}"] for c in "thwc"] == first.strides
    assert (s["video_layout"], s["video_dtype"], s["video_channels"]) == ("thwc", "u8", 3)
    assert s["clips_total"] == ld.clip_count == 5 and s["bytes_per_clip"] == first.offsets[1]
    # decoding runs ahead of delivery (prefetch): counted when decoded, as mx8's counters
    assert s["video_delivered_samples_total"] == 2 <= s["video_decode_succeeded_clips_total"]
    assert s["video_decode_attempted_clips_total"] == s["video_decode_succeeded_clips_total"]
    assert s["video_decode_failed_total"] == 0


def test_an_mx8_text_token_resumes_where_mx8_resumes(text_pack, tok_path, tmp_path):
    kw = dict(tokenizer=tok_path, seq_len=4, stride=4, batch=2)
    ref = real.text(str(text_pack / "pk"), store=str(tmp_path / "ms"), **kw)
    next(ref)
    token = ref.checkpoint()
    assert b"kind=data_loader" in token and b"next_sample_id=2" in token
    want = list(real.text(str(text_pack / "pk"), store=str(tmp_path / "ms"), resume=token, **kw))
    got = list(mx8.text(str(text_pack / "pk"), resume=token, **kw))
    assert len(got) == len(want) > 0
    for g, w in zip(got, want, strict=True):
        _same_tensors(g.to_torch(), w.to_torch())
