"""headrace.audio: decoding, mix-down, channels, resampling, pad/truncate, errors, resume, ranks."""

from __future__ import annotations

import os

import numpy as np
import pytest
import soundfile as sf
from scipy.signal import resample_poly

import headrace
from _media import dominant_hz, sine, write_audio, write_garbage
from headrace._sources.media import pack_media

RATE = 16000


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> str:
    """cat/: 4 mono WAVs of different lengths and tones; dog/: 2 FLACs (one stereo)."""
    root = str(tmp_path_factory.mktemp("audio"))
    for i, (freq, n) in enumerate([(200, 8000), (400, 16000), (800, 20000), (1600, 4000)]):
        write_audio(f"{root}/cat/{i}.wav", sine(freq, RATE, n), RATE)
    write_audio(f"{root}/dog/a.flac", sine(300, RATE, 12000), RATE)
    stereo = np.stack([sine(500, RATE, 10000), sine(700, RATE, 10000, amp=0.25)], 1)
    write_audio(f"{root}/dog/b.flac", stereo, RATE)
    with open(f"{root}/dog/notes.txt", "w") as f:
        f.write("not audio")
    return root


def _reference(path: str, samples: int) -> np.ndarray:
    x, _ = sf.read(path, dtype="float32", always_2d=True)
    x = x.mean(axis=1, dtype=np.float32)
    out = np.zeros(samples, np.float32)
    out[:min(samples, len(x))] = x[:samples]
    return out


def _all(loader: headrace.AudioLoader) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    xs, ys, ids = [], [], []
    for x, y in loader:
        xs.append(x)
        ys.append(y)
        ids.append(loader.last_ids)
    return np.concatenate(xs), np.concatenate(ys), np.concatenate(ids)


def test_shapes_labels_pad_truncate_and_mixdown(folder: str) -> None:
    with headrace.audio(folder, batch=4, samples=12000) as ld:
        assert (ld.sample_count, ld.channels, ld.sample_rate_hz) == (12000, 1, RATE)
        assert ld.classes == ["cat", "dog"]
        assert len(ld) == 2
        x, y, ids = _all(ld)
    assert x.dtype == np.float32 and x.shape == (6, 1, 12000)
    assert y.dtype == np.int64 and y.tolist() == [0, 0, 0, 0, 1, 1]
    assert ids.tolist() == list(range(6))
    paths = [f"cat/{i}.wav" for i in range(4)] + ["dog/a.flac", "dog/b.flac"]
    for k, p in enumerate(paths):  # exact: int16 / 32768, channel mean, zeros past the end
        np.testing.assert_array_equal(x[k, 0], _reference(os.path.join(folder, p), 12000))
    assert not x[0, 0, 8000:].any() and x[0, 0, :8000].any()  # 8000 frames, zero-padded
    assert x[3, 0, 4000:].max() == 0
    # the stereo file is the mean of a 500 Hz and a quieter 700 Hz tone
    assert abs(dominant_hz(x[5, 0, :10000], RATE) - 500) < 2


def test_channels_keep_duplicate_and_refuse(folder: str, tmp_path: str) -> None:
    with headrace.audio(folder, batch=6, samples=8000, channels=2, as_dict=True) as ld:
        b = next(ld)
    assert b["samples"].shape == (6, 2, 8000)
    mono = b["samples"][0]
    np.testing.assert_array_equal(mono[0], mono[1])  # mono duplicated
    stereo, _ = sf.read(os.path.join(folder, "dog/b.flac"), dtype="float32")
    np.testing.assert_array_equal(b["samples"][5], stereo[:8000].T)  # kept per channel
    three = os.path.join(str(tmp_path), "three")
    write_audio(f"{three}/x.wav", np.zeros((100, 3), np.float32), RATE)
    write_audio(f"{three}/y.wav", np.zeros((100, 2), np.float32), RATE)
    with pytest.raises(headrace.DecodeError, match=r"x\.wav.*3 channels; channels=2"):
        next(headrace.audio(three, channels=2))
    with headrace.audio(three, channels=2, on_decode_error="skip") as ld:
        x, _ = next(ld)
        assert x.shape == (1, 2, 16000) and ld.last_ids.tolist() == [1]
        assert ld.stats()["audio_decode_failures_total"] == 1


@pytest.mark.parametrize(("src_hz", "dst_hz", "freq"), [(44100, 16000, 1000), (8000, 16000, 700),
                                                        (22050, 8000, 3000)])
def test_resampling_keeps_frequency(tmp_path: str, src_hz: int, dst_hz: int, freq: int) -> None:
    root = str(tmp_path)
    n = src_hz  # one second
    write_audio(f"{root}/x.wav", sine(freq, src_hz, n), src_hz, subtype="FLOAT")
    samples = dst_hz // 2
    with headrace.audio(root, batch=1, samples=samples, rate_hz=dst_hz, as_dict=True) as ld:
        assert ld.sample_rate_hz == dst_hz
        b = next(ld)
    y = b["samples"][0, 0]
    assert b["sample_rates_hz"].tolist() == [dst_hz]
    assert abs(dominant_hz(y, dst_hz) - freq) <= dst_hz / samples  # within one FFT bin
    # the head equals resampling the whole file (only the frames that matter are decoded)
    full = resample_poly(sine(freq, src_hz, n).astype(np.float64), dst_hz, src_hz)
    np.testing.assert_allclose(y, full[:samples], atol=2e-5)
    assert abs(float(np.abs(y[samples // 4:]).max()) - 0.5) < 0.02  # amplitude preserved


def test_rate_none_keeps_each_rate(tmp_path: str) -> None:
    root = str(tmp_path)
    write_audio(f"{root}/a.wav", sine(100, 8000, 800), 8000)
    write_audio(f"{root}/b.ogg", sine(1000, 22050, 22050), 22050)
    with headrace.audio(root, batch=2, samples=1000, as_dict=True) as ld:
        assert ld.sample_rate_hz == 8000
        b = next(ld)
        assert ld.stats()["audio_expected_sample_rate_hz"] == 0
    assert b["sample_rates_hz"].tolist() == [8000, 22050]
    assert b["labels"].tolist() == [-1, -1]
    assert abs(dominant_hz(b["samples"][1, 0], 22050) - 1000) < 25  # OGG/Vorbis decoded


def test_pyav_fallback_for_aac(tmp_path: str) -> None:
    import av

    root = str(tmp_path)
    with av.open(f"{root}/tone.m4a", "w") as c:
        s = c.add_stream("aac", rate=16000)
        x = sine(440, 16000, 16000)[None, :]
        for k in range(0, 16000 - 1024 + 1, 1024):
            f = av.AudioFrame.from_ndarray(np.ascontiguousarray(x[:, k:k + 1024]),
                                           format="fltp", layout="mono")
            f.sample_rate, f.pts = 16000, k
            for p in s.encode(f):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    with headrace.audio(root, batch=1, samples=8000) as ld:
        y, _ = next(ld)
    assert abs(dominant_hz(y[0, 0, 2000:], 16000) - 440) < 3
    assert ld.stats()["audio_decoded_frames_total"] >= 8000


def test_decode_errors(folder: str, tmp_path: str) -> None:
    root = str(tmp_path)
    write_audio(f"{root}/a.wav", sine(100, RATE, 100), RATE)
    write_garbage(f"{root}/b.wav")
    write_audio(f"{root}/c.wav", sine(100, RATE, 100), RATE)
    with pytest.raises(headrace.DecodeError, match=r"record 1 \(b\.wav\)") as ei:
        list(headrace.audio(root, batch=2))
    assert ei.value.record_id == 1
    with headrace.audio(root, batch=2, on_decode_error="skip") as ld:
        got = [(x.shape[0], ld.last_ids.tolist()) for x, _ in ld]
        s = ld.stats()
    assert got == [(1, [0]), (1, [2])]
    assert s["audio_decode_samples_total"] == 2 and s["audio_decode_failures_total"] == 1
    with pytest.raises(headrace.ConfigError, match="decode_error_policy"):
        headrace.audio(folder, on_decode_error="ignore")
    with pytest.raises(headrace.ConfigError, match="rate_hz"):
        headrace.audio(folder, rate_hz=0)


def test_store_equals_folder(folder: str, tmp_path: str) -> None:
    out = os.path.join(str(tmp_path), "store")
    info = pack_media(folder, out=out, kind="audio")
    assert info["samples"] == 6 and info["classes"] == ["cat", "dog"]
    assert info["skipped"]["non_audio"] == 1
    kw = {"batch": 4, "samples": 9000, "rate_hz": 8000}
    with headrace.audio(folder, **kw) as a, headrace.audio(out, **kw) as b:
        xa, ya, _ = _all(a)
        xb, yb, _ = _all(b)
        assert b.classes == ["cat", "dog"]
    np.testing.assert_array_equal(xa, xb)
    np.testing.assert_array_equal(ya, yb)


def test_pack_media_replaces_only_a_store_and_only_when_asked(folder: str, tmp_path: str) -> None:
    out = os.path.join(str(tmp_path), "store")
    pack_media(folder, out=out, kind="audio")
    with pytest.raises(headrace.StoreExistsError, match=r"pack_media: .*overwrite=True"):
        pack_media(folder, out=out, kind="audio")
    assert pack_media(folder, out=out, kind="audio", overwrite=True)["samples"] == 6
    other = os.path.join(str(tmp_path), "other")
    os.makedirs(other)
    with open(os.path.join(other, "keep.txt"), "w") as f:
        f.write("x")
    with pytest.raises(headrace.StoreExistsError, match="not a headrace store"):
        pack_media(folder, out=other, kind="audio", overwrite=True)
    assert os.listdir(other) == ["keep.txt"]


def test_resume_exact_and_epochs(folder: str) -> None:
    kw = {"batch": 2, "samples": 100, "shuffle": True, "seed": 5, "epochs": 3}
    with headrace.audio(folder, **kw) as ld:
        full = [(x.copy(), ld.last_ids.copy()) for x, _ in ld]
    assert len(full) == 9
    for e in range(3):  # each epoch is a permutation
        assert sorted(np.concatenate([i for _, i in full[3 * e:3 * e + 3]]).tolist()) == \
            list(range(6))
    with headrace.audio(folder, **kw) as ld:
        for _ in range(4):
            next(ld)
        token = ld.checkpoint()
    with headrace.audio(folder, **kw, resume=token) as ld:
        rest = [(x, ld.last_ids.copy()) for x, _ in ld]
    assert len(rest) == 5
    for (xa, ia), (xb, ib) in zip(full[4:], rest, strict=True):
        np.testing.assert_array_equal(ia, ib)
        np.testing.assert_array_equal(xa, xb)
    with pytest.raises(headrace.CheckpointError):
        headrace.audio(folder, **{**kw, "seed": 6}, resume=token)


def test_rank_sharding_covers_once(folder: str) -> None:
    seen = []
    for rank in range(2):
        with headrace.audio(folder, batch=1, samples=10, shuffle=True, seed=1, rank=rank,
                            world_size=2) as ld:
            seen.append(np.concatenate([ld.last_ids.copy() for _ in ld]))
    assert len(seen[0]) == len(seen[1]) == 3
    assert sorted(np.concatenate(seen).tolist()) == list(range(6))


def test_memory_cap_and_stats(folder: str) -> None:
    with pytest.raises(headrace.ConfigError, match="inflight"):
        headrace.audio(folder, batch=4, samples=16000, inflight=100_000)
    with headrace.audio(folder, batch=3, samples=16000, inflight=3 * 16000 * 4 + 200) as ld:
        for _ in ld:
            pass
        s = ld.stats()
    assert s["inflight_high_water_bytes"] <= 3 * 16000 * 4 + 200
    assert s["delivered_samples_total"] == 6
    assert (s["audio_sample_count"], s["audio_channels"]) == (16000, 1)
    assert s["audio_decode_samples_total"] == 6 and s["audio_decode_failures_total"] == 0
    assert s["audio_decoded_frames_total"] == 8000 + 16000 + 16000 + 4000 + 12000 + 10000
    assert headrace.stats(ld).startswith("Status:")


def test_to_torch(folder: str) -> None:
    import torch

    with headrace.audio(folder, batch=2, samples=50, to_torch=True) as ld:
        x, y = next(ld)
    assert isinstance(x, torch.Tensor) and x.dtype == torch.float32 and tuple(x.shape) == (2, 1, 50)
    assert y.dtype == torch.int64


def test_endless_and_open_store_object(folder: str, tmp_path: str) -> None:
    out = os.path.join(str(tmp_path), "store")
    pack_media(folder, out=out, kind="audio")
    with headrace.open(out) as st, headrace.audio(st, batch=4, samples=20, epochs=None,
                                                  shuffle=True) as ld:
        with pytest.raises(TypeError):
            len(ld)
        ids = [i for _, _ in zip(range(6), ld, strict=False) for i in ld.last_ids.tolist()]
        assert ld.epoch == 4
    assert len(ids) == 24 and sorted(ids) == sorted(list(range(6)) * 4)
