"""Makers of small test media: sine WAV/FLAC files and H.264/MPEG-4 videos whose frames carry
their own index (so the tests can tell exactly which source frame landed where)."""

from __future__ import annotations

import os
from fractions import Fraction

import numpy as np

# -- audio -----------------------------------------------------------------------------------------


def sine(freq_hz: float, rate_hz: int, n: int, *, amp: float = 0.5) -> np.ndarray:
    t = np.arange(n) / rate_hz
    return (amp * np.sin(2 * np.pi * freq_hz * t)).astype(np.float32)


def write_audio(path: str, data: np.ndarray, rate_hz: int, *, subtype: str = "PCM_16") -> str:
    """Writes ``data`` (``(n,)`` or ``(n, channels)`` float) as WAV/FLAC/OGG by extension."""
    import soundfile as sf

    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    if path.endswith(".ogg"):
        subtype = "VORBIS"
    sf.write(path, data, rate_hz, subtype=subtype)
    return path


def dominant_hz(x: np.ndarray, rate_hz: int) -> float:
    """The frequency of the largest FFT bin of ``x`` (Hann-windowed)."""
    spec = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.argmax(spec) * rate_hz / len(x))


# -- video -----------------------------------------------------------------------------------------

#: frame i is a flat gray of intensity LEVEL0 + STEP * i (mod the range), so its index reads back
#: from the mean within +-STEP/2 even after lossy coding.
LEVEL0 = 16
STEP = 6
LEVELS = (235 - LEVEL0) // STEP + 1


def frame_value(i: int) -> int:
    return LEVEL0 + STEP * (i % LEVELS)


def frame_index(frame: np.ndarray) -> int:
    """Decodes the index (mod LEVELS) written by :func:`write_video` from an RGB frame."""
    return round((float(frame.mean()) - LEVEL0) / STEP) % LEVELS


def write_video(path: str, n_frames: int, *, fps: int | Fraction = 24, size: tuple[int, int] = (
        32, 48), codec: str = "libx264", gop: int = 12, audio: bool = False) -> str:
    """An H.264 (or MPEG-4 Part 2) video of ``n_frames`` gray frames ``frame_value(i)``.

    ``size`` is ``(H, W)``. ``gop`` sets the keyframe interval, so seeking is exercised.
    """
    import av

    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    h, w = size
    with av.open(path, "w") as c:
        s = c.add_stream(codec, rate=Fraction(fps))
        s.width, s.height = w, h
        s.pix_fmt = "yuv420p"
        s.codec_context.gop_size = gop
        if codec == "libx264":
            s.options = {"crf": "10", "preset": "ultrafast", "bf": "2",
                         "x264-params": f"keyint={gop}:min-keyint={gop}:scenecut=0"}
        else:
            s.codec_context.bit_rate = 2_000_000
        a = None
        if audio:
            a = c.add_stream("aac", rate=16000)
        for i in range(n_frames):
            img = np.full((h, w, 3), frame_value(i), np.uint8)
            frame = av.VideoFrame.from_ndarray(img, format="rgb24")
            for p in s.encode(frame):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
        if a is not None:
            _mux_tone(c, a, 0.5)
    return path


def _mux_tone(c: object, a: object, seconds: float) -> None:
    import av

    rate = 16000
    x = sine(440, rate, int(rate * seconds))[None, :]
    step = 1024
    for k in range(0, x.shape[1] - step + 1, step):
        f = av.AudioFrame.from_ndarray(np.ascontiguousarray(x[:, k:k + step]), format="fltp",
                                       layout="mono")
        f.sample_rate = rate
        f.pts = k
        for p in a.encode(f):  # type: ignore[attr-defined]
            c.mux(p)  # type: ignore[attr-defined]
    for p in a.encode():  # type: ignore[attr-defined]
        c.mux(p)  # type: ignore[attr-defined]


def write_audio_only(path: str, seconds: float = 0.5) -> str:
    """An .mp4 holding one AAC audio stream and no video (a ``missing_stream`` video)."""
    import av

    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with av.open(path, "w") as c:
        a = c.add_stream("aac", rate=16000)
        _mux_tone(c, a, seconds)
    return path


def write_garbage(path: str, n: int = 4096, seed: int = 0) -> str:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "wb") as f:
        f.write(np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes())
    return path


def truncate(path: str, keep: float = 0.5) -> str:
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(int(size * keep))
    return path


def write_unknown_codec(path: str, n_frames: int = 12) -> str:
    """A valid Matroska file whose video track names a codec no FFmpeg knows (``V_ZZZZZ``): an
    ``unsupported_codec`` video. Same-length CodecID swap, so the EBML sizes stay valid."""
    write_video(path, n_frames, codec="mpeg4")
    with open(path, "rb") as f:
        data = f.read()
    assert data.count(b"V_MPEG4/ISO/ASP") == 1
    with open(path, "wb") as f:
        f.write(data.replace(b"V_MPEG4/ISO/ASP", b"V_ZZZZZ/ISO/ASP"))
    return path
