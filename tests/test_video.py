"""headrace.video: the clip index (exact frame counts, clip boundaries, fps resampling), decoded
frame identity, failure kinds and policies, index caching, resume, rank sharding, memory caps."""

from __future__ import annotations

import os
import shutil
from fractions import Fraction

import numpy as np
import pytest

import headrace
from _media import (
    LEVELS,
    frame_index,
    truncate,
    write_audio_only,
    write_garbage,
    write_unknown_codec,
    write_video,
)
from headrace._sources.media import pack_media

# name -> (frames, source fps, codec, keyframe interval); in byte-wise path order
VIDEOS = {
    "a/x.mp4": (30, 24, "libx264", 6),
    "a/y.mkv": (36, 30, "mpeg4", 10),
    "b/z.mp4": (20, 10, "libx264", 25),
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = str(tmp_path_factory.mktemp("videos"))
    for name, (n, fps, codec, gop) in VIDEOS.items():
        write_video(os.path.join(root, name), n, fps=fps, codec=codec, gop=gop)
    return root


def expected_clips(clip: int, stride: int, fps: Fraction | int) -> list[tuple[int, int, list[int]]]:
    """(video id, start frame on the resampled timeline, source frames) per clip, from first
    principles: target time j/fps takes the last source frame k with k/src <= j/fps."""
    out = []
    for v, (n, src, _codec, _gop) in enumerate(VIDEOS.values()):
        m = (n - 1) * Fraction(fps) // src + 1  # resampled frames up to the last source frame
        for s in range(0, m - clip + 1, stride):
            out.append((v, s, [int((s + t) * Fraction(src) // Fraction(fps))
                               for t in range(clip)]))
    return out


def run(loader: headrace.VideoLoader) -> dict[int, dict[str, object]]:
    """Every delivered clip by clip id: its decoded frame indices, start, video, label."""
    got: dict[int, dict[str, object]] = {}
    for b in loader:
        assert b["frames"].dtype == np.uint8 and b["frames"].ndim == 5
        for k, cid in enumerate(b["clip_ids"].tolist()):
            assert cid not in got
            got[cid] = {"frames": [frame_index(f) for f in b["frames"][k]],
                        "start_s": float(b["start_s"][k]), "video": int(b["video_ids"][k]),
                        "label": int(b["labels"][k])}
    return got


@pytest.mark.parametrize(("clip", "stride", "fps"), [(4, 3, 8), (3, 2, 20), (5, 5, Fraction(15, 2))])
def test_clip_layout_and_frames_exact(folder: str, tmp_path: str, clip: int, stride: int,
                                      fps: object) -> None:
    want = expected_clips(clip, stride, fps)  # type: ignore[arg-type]
    with headrace.video(folder, clip=clip, stride=stride, fps=fps, batch=4,
                        index_dir=str(tmp_path)) as ld:
        info = ld.index_info
        assert info["clip_count"] == len(want) == ld.clip_count
        assert info["failure_counts"] == {"corrupt_media": 0, "short_media": 0,
                                          "unsupported_codec": 0, "missing_stream": 0}
        assert ld.classes == ["a", "b"]
        got = run(ld)
        s = ld.stats()
    assert sorted(got) == list(range(len(want)))
    for cid, (v, start, frames) in enumerate(want):
        g = got[cid]
        assert g["video"] == v and g["label"] == (0 if v < 2 else 1)
        assert g["frames"] == [f % LEVELS for f in frames], f"clip {cid} of video {v}"
        assert g["start_s"] == pytest.approx(start / Fraction(fps))  # type: ignore[arg-type]
    assert s["video_clips_decoded_total"] == len(want)
    assert s["video_decode_failures_total"] == 0
    assert (s["video_frames_per_clip"], s["video_frame_height"], s["video_frame_width"]) == \
        (clip, 32, 48)


def test_upsampling_repeats_frames_and_tail_count(folder: str, tmp_path: str) -> None:
    # z.mp4 is 10 fps: at 20 fps each source frame fills two slots
    with headrace.video(folder, clip=6, stride=4, fps=20, batch=64,
                        index_dir=str(tmp_path)) as ld:
        b = next(ld)
        info = ld.index_info
    z = [k for k, v in enumerate(b["video_ids"].tolist()) if v == 2]
    assert [frame_index(f) for f in b["frames"][z[0]]] == [0, 0, 1, 1, 2, 2]
    # resampled lengths 50, 49, 39: starts 0,4,.. that do not fit a whole clip are the tail
    tails = sum(len(range(0, m, 4)) - len(range(0, m - 6 + 1, 4)) for m in (50, 49, 39))
    assert info["tail_clips_dropped_total"] == tails


def test_shuffled_clips_equal_sequential(folder: str, tmp_path: str) -> None:
    kw = {"clip": 4, "stride": 2, "fps": 12, "index_dir": str(tmp_path)}
    with headrace.video(folder, batch=5, **kw) as ld:
        seq = run(ld)
    with headrace.video(folder, batch=3, shuffle=True, seed=3, **kw) as ld:
        order = []
        shuf: dict[int, dict[str, object]] = {}
        for b in ld:
            order += b["clip_ids"].tolist()
            for k, cid in enumerate(b["clip_ids"].tolist()):
                shuf[cid] = {"frames": [frame_index(f) for f in b["frames"][k]],
                             "start_s": float(b["start_s"][k]), "video": int(b["video_ids"][k]),
                             "label": int(b["labels"][k])}
    assert order != sorted(order) and sorted(order) == list(range(len(seq)))
    assert shuf == seq


def test_failure_kinds_are_counted_not_fatal(tmp_path: str) -> None:
    root = os.path.join(str(tmp_path), "mixed")
    write_video(f"{root}/a_ok.mp4", 24, fps=24)
    write_garbage(f"{root}/b_garbage.mp4")
    truncate(write_video(f"{root}/c_truncated.mp4", 24, fps=24), 0.6)
    write_audio_only(f"{root}/d_audio_only.mp4")
    write_video(f"{root}/e_short.mp4", 3, fps=24)
    with open(f"{root}/f_empty.mkv", "wb"):
        pass
    write_unknown_codec(f"{root}/g_unknown_codec.mkv")
    idx = os.path.join(str(tmp_path), "idx")
    with headrace.video(root, clip=4, stride=4, fps=8, batch=8, index_dir=idx) as ld:
        info = ld.index_info
        got = run(ld)
        s = ld.stats()
    assert info["failure_counts"] == {"corrupt_media": 3, "short_media": 1,
                                      "unsupported_codec": 1, "missing_stream": 1}
    assert info["videos"] == 7 and info["clip_count"] == 2 == len(got)
    assert [g["frames"] for g in got.values()] == [[0, 3, 6, 9], [12, 15, 18, 21]]
    assert (s["video_index_corrupt_media"], s["video_index_missing_stream"],
            s["video_index_short_media"], s["video_index_unsupported_codec"]) == (3, 1, 1, 1)
    with pytest.raises(headrace.DecodeError, match=r"b_garbage\.mp4.*corrupt_media") as ei:
        headrace.video(root, clip=4, stride=4, fps=8, index_dir=idx, on_error="error")
    assert ei.value.record_id == 1
    # nothing usable at all: an error, not a silent empty loader (mx8's behaviour)
    with pytest.raises(headrace.ConfigError, match="no clips"):
        headrace.video(root, clip=400, index_dir=idx)


def test_index_is_cached_and_keyed_by_data(folder: str, tmp_path: str) -> None:
    data = os.path.join(str(tmp_path), "data")
    shutil.copytree(folder, data)
    idx = os.path.join(str(tmp_path), "idx")
    with headrace.video(data, clip=4, stride=3, fps=8, index_dir=idx) as a:
        first = a.index_info
    with headrace.video(data, clip=4, stride=3, fps=8, index_dir=idx) as b:
        again = b.index_info
    assert not first["reused"] and again["reused"]
    assert again["clip_index_hash"] == first["clip_index_hash"]
    assert again["index_path"] == first["index_path"] and os.path.isfile(first["index_path"])
    with headrace.video(data, clip=2, stride=1, fps=8, index_dir=idx) as c:
        assert c.index_info["reused"]  # the probe serves any clip layout
        assert c.index_info["clip_index_hash"] != first["clip_index_hash"]
    write_video(os.path.join(data, "b", "w.mp4"), 12, fps=12)
    with headrace.video(data, clip=4, stride=3, fps=8, index_dir=idx) as d:
        assert not d.index_info["reused"]
        assert d.index_info["clip_count"] == first["clip_count"] + 2
    os.environ["HEADRACE_VIDEO_INDEX_DIR"] = os.path.join(str(tmp_path), "env")
    try:
        with headrace.video(data, clip=4, index_dir=None) as e:
            assert e.index_info["index_path"].startswith(os.environ["HEADRACE_VIDEO_INDEX_DIR"])
    finally:
        del os.environ["HEADRACE_VIDEO_INDEX_DIR"]


def test_resume_is_exact(folder: str, tmp_path: str) -> None:
    kw = {"clip": 4, "stride": 3, "fps": 8, "batch": 3, "shuffle": True, "seed": 9,
          "epochs": 2, "index_dir": str(tmp_path)}
    with headrace.video(folder, **kw) as ld:
        full = [(b["clip_ids"].copy(), b["frames"].copy()) for b in ld]
    with headrace.video(folder, **kw) as ld:
        for _ in range(5):
            next(ld)
        token = ld.checkpoint()
    with headrace.video(folder, **kw, resume=token) as ld:
        rest = [(b["clip_ids"].copy(), b["frames"].copy()) for b in ld]
    assert len(rest) == len(full) - 5
    for (ia, fa), (ib, fb) in zip(full[5:], rest, strict=True):
        np.testing.assert_array_equal(ia, ib)
        np.testing.assert_array_equal(fa, fb)
    with pytest.raises(headrace.CheckpointError):  # another clip layout is other data
        headrace.video(folder, **{**kw, "stride": 2}, resume=token)


def test_rank_sharding_covers_every_clip_once(folder: str, tmp_path: str) -> None:
    n = len(expected_clips(2, 2, 8))
    assert n == 5 + 5 + 8  # 3 ranks x batch 2 divides it: no padding
    seen = []
    for rank in range(3):
        with headrace.video(folder, clip=2, stride=2, fps=8, batch=2, shuffle=True, seed=2,
                            rank=rank, world_size=3, index_dir=str(tmp_path)) as ld:
            seen.append([c for b in ld for c in b["clip_ids"].tolist()])
    assert [len(s) for s in seen] == [6, 6, 6]
    assert sorted(c for s in seen for c in s) == list(range(n))


def test_store_equals_folder(folder: str, tmp_path: str,
                             capsys: pytest.CaptureFixture[str]) -> None:
    out = os.path.join(str(tmp_path), "store")
    info = pack_media(folder, out=out, kind="video", progress=True)
    assert info["samples"] == 3 and info["classes"] == ["a", "b"]
    kw = {"clip": 4, "stride": 3, "fps": 8, "batch": 4, "index_dir": str(tmp_path)}
    with headrace.video(folder, **kw) as a, headrace.video(out, progress=True, **kw) as b:
        err = capsys.readouterr().err
        assert "pack_media" in err and "video index" in err
        fa = [x["frames"] for x in a]
        fb = [x["frames"] for x in b]
        assert b.index_info["clip_index_hash"] == a.index_info["clip_index_hash"]
    np.testing.assert_array_equal(np.concatenate(fa), np.concatenate(fb))


def test_resize_and_frame_size_mismatch(tmp_path: str) -> None:
    root = os.path.join(str(tmp_path), "sizes")
    write_video(f"{root}/a.mp4", 12, fps=8, size=(32, 48))
    write_video(f"{root}/b.mp4", 12, fps=8, size=(48, 64))
    idx = os.path.join(str(tmp_path), "idx")
    with pytest.raises(headrace.ConfigError, match=r"frame size.*resize"):
        headrace.video(root, clip=4, stride=4, fps=8, index_dir=idx)
    with headrace.video(root, clip=4, stride=4, fps=8, batch=6, resize=(16, 20),
                        index_dir=idx) as ld:
        b = next(ld)
    assert b["frames"].shape == (6, 4, 16, 20, 3)
    assert [frame_index(f) for f in b["frames"][4]] == [4, 5, 6, 7]


def test_memory_cap_endless_and_knobs(folder: str, tmp_path: str) -> None:
    idx = str(tmp_path)
    per_clip = 4 * 32 * 48 * 3
    with pytest.raises(headrace.ConfigError, match="inflight"):
        headrace.video(folder, clip=4, batch=8, index_dir=idx, inflight=per_clip * 4)
    with headrace.video(folder, clip=4, stride=3, fps=8, batch=2, epochs=None, index_dir=idx,
                        inflight=per_clip * 2 + 1024) as ld:
        with pytest.raises(TypeError):
            len(ld)
        ids = [c for _, b in zip(range(20), ld, strict=False) for c in b["clip_ids"].tolist()]
        s = ld.stats()
    assert len(ids) == 40 and set(ids) == set(range(ld.clip_count))
    assert s["inflight_high_water_bytes"] <= per_clip * 2 + 1024
    assert s["video_bytes_per_clip"] == per_clip
    with pytest.raises(headrace.ConfigError, match="fps must be > 0"):
        headrace.video(folder, fps=0, index_dir=idx)
    with pytest.raises(headrace.ConfigError, match="on_error"):
        headrace.video(folder, on_error="ignore", index_dir=idx)
    with pytest.raises(headrace.ConfigError, match="clip"):
        headrace.video(folder, clip=0, index_dir=idx)


def test_clip_failing_while_decoding_is_dropped_and_counted(tmp_path: str) -> None:
    # garbage over the middle of the sample data: the index (packet table) is intact, decoding
    # the clips that need those frames fails
    root = os.path.join(str(tmp_path), "bad")
    path = write_video(f"{root}/a.mp4", 36, fps=24, gop=6)
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.seek(size // 3)
        f.write(np.random.default_rng(1).integers(0, 256, size // 4, dtype=np.uint8).tobytes())
    idx = os.path.join(str(tmp_path), "idx")
    with headrace.video(root, clip=4, stride=4, fps=8, batch=2, index_dir=idx) as ld:
        assert ld.index_info["failure_counts"]["corrupt_media"] == 0
        delivered = 0
        try:
            for b in ld:
                delivered += len(b["clip_ids"])
        except headrace.DecodeError as e:  # every clip failed: nothing to yield is an error
            assert "nothing to yield" in str(e) and delivered == 0
        s = ld.stats()
    assert s["video_decode_failures_total"] >= 1
    assert s["video_corrupt_media_total"] + s["video_short_media_total"] == \
        s["video_decode_failures_total"]
    assert delivered == s["video_clips_decoded_total"] == 3 - s["video_decode_failures_total"]
    with pytest.raises(headrace.DecodeError, match=r"a\.mp4.*clip \d+: (corrupt|short)_media"):
        list(headrace.video(root, clip=4, stride=4, fps=8, batch=2, index_dir=idx,
                            on_error="error"))


@pytest.mark.parametrize(("ext", "codec"), [("avi", "mpeg4"), ("ts", "libx264"),
                                            ("mov", "libx264"), ("mkv", "libx264")])
def test_containers_seek_exactly(tmp_path: str, ext: str, codec: str) -> None:
    # MPEG-TS seeks by bytes/decode time and may land after the asked keyframe, or past the
    # end: the decoder retries one keyframe earlier, then from the start
    root = os.path.join(str(tmp_path), ext)
    write_video(f"{root}/v.{ext}", 48, fps=24, codec=codec, gop=8)
    idx = os.path.join(str(tmp_path), "idx")
    with headrace.video(root, clip=3, stride=1, fps=6, batch=2, shuffle=True, seed=4,
                        index_dir=idx) as ld:
        got = run(ld)
        s = ld.stats()
    assert len(got) == 10 and s["video_decode_failures_total"] == 0
    for cid, g in got.items():
        assert g["frames"] == [(4 * (cid + t)) % LEVELS for t in range(3)], (ext, cid)


def test_to_torch(folder: str, tmp_path: str) -> None:
    import torch

    with headrace.video(folder, clip=2, stride=2, fps=8, batch=3, to_torch=True,
                        index_dir=str(tmp_path)) as ld:
        b = next(ld)
    assert b["frames"].dtype == torch.uint8 and tuple(b["frames"].shape) == (3, 2, 32, 48, 3)
    assert b["clip_ids"].tolist() == [0, 1, 2] and b["start_s"].dtype == torch.float64
