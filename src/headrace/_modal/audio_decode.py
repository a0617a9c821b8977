"""Audio decoding for ``headrace.audio``: decode, mix down or keep channels, resample, fit length.

Decoders: ``soundfile`` (libsndfile: WAV, FLAC, OGG/Vorbis, Opus, MP3, AIFF, ...) first; PyAV
(FFmpeg: AAC/M4A, WMA, anything else FFmpeg reads) when libsndfile does not know the format and
PyAV is installed. Integer PCM is scaled to float32 in [-1, 1) (int16 by ``1/32768``, as mx8).

Resampling is polyphase FIR filtering, :func:`scipy.signal.resample_poly` (Kaiser-windowed sinc,
``up/down`` reduced by their gcd), applied before the length is fitted.

Channels (``channels=k``): ``k=1`` averages all channels (mix-down). ``k>1`` keeps a source with
exactly ``k`` channels as is and duplicates a mono source into ``k`` channels; any other channel
count is a :class:`DecodeError` (so ``on_decode_error="skip"`` drops it), because no up- or
down-mix between e.g. 5.1 and stereo is right for every use.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from math import gcd
from typing import Any

import numpy as np

from headrace._base.errors import DecodeError

__all__ = ["decode_audio", "fit_channels", "fit_length", "resample"]

# scipy's resample_poly filter reaches 10 * max(up, down) taps of the upsampled signal each side.
_HALF_TAPS = 10


def _decode_soundfile(src: Any, need: Callable[[int], int | None]
                      ) -> tuple[np.ndarray, int] | None:
    """``(frames x channels float32, rate)``, or None when libsndfile does not know the format."""
    import soundfile as sf

    try:
        with sf.SoundFile(src) as f:
            rate = int(f.samplerate)
            max_frames = need(rate)
            want = -1 if max_frames is None else max_frames
            data = f.read(frames=want, dtype="float32", always_2d=True)
    except sf.LibsndfileError as e:
        text = str(e).lower()
        if "format" in text or "unknown" in text or "recogni" in text:
            return None
        raise DecodeError(f"libsndfile: {e}") from e
    except RuntimeError as e:  # older soundfile raises RuntimeError for bad data
        raise DecodeError(f"libsndfile: {e}") from e
    return data, rate


def _decode_av(src: Any, need: Callable[[int], int | None]) -> tuple[np.ndarray, int]:
    try:
        import av
    except ModuleNotFoundError:
        raise DecodeError("unsupported audio format (libsndfile cannot read it; install PyAV, "
                          "the 'video' extra, for the formats FFmpeg reads)") from None
    if hasattr(src, "seek"):
        src.seek(0)
    try:
        with av.open(src) as c:
            if not c.streams.audio:
                raise DecodeError("unsupported audio format: the file has no audio stream")
            stream = c.streams.audio[0]
            rate = int(stream.codec_context.sample_rate or stream.rate or 0)
            # Resample to packed float32 in the stream's own layout: FFmpeg does the format
            # conversion, never the rate (resampling is ours, the same for every decoder).
            rs = av.AudioResampler(format="flt", layout=stream.codec_context.layout, rate=rate)
            max_frames = need(rate)
            parts = []
            have = 0
            for frame in itertools.chain(c.decode(stream), [None]):
                for out in rs.resample(frame):
                    parts.append(out.to_ndarray().reshape(-1, len(out.layout.channels)))
                    have += len(parts[-1])
                if max_frames is not None and have >= max_frames:
                    break
    except DecodeError:
        raise
    except Exception as e:  # av.error.* and decoder errors
        raise DecodeError(f"unsupported audio format or corrupt audio ({type(e).__name__}: {e})"
                          ) from e
    if not parts:
        return np.zeros((0, 1), np.float32), rate
    max_frames = need(rate)
    data = np.concatenate(parts)
    return (data if max_frames is None else data[:max_frames]).astype(np.float32, copy=False), rate


def decode_audio(src: Any, *, samples: int | None = None,
                 target_hz: int | None = None) -> tuple[np.ndarray, int, int]:
    """Decodes a file name or seekable file object to ``(channels x frames float32, rate_hz,
    frames decoded)``.

    With ``samples``, only the frames that the first ``samples`` output samples depend on are
    decoded (at ``target_hz``, that includes the resampling filter's reach past the end), so a
    long file costs what its used head costs.

    Raises:
        DecodeError: not audio, or corrupt.
    """
    def need(rate: int) -> int | None:
        if samples is None:
            return None
        if target_hz is None or target_hz == rate:
            return samples
        g = gcd(rate, target_hz)
        up, down = target_hz // g, rate // g
        return -(-samples * down // up) + _HALF_TAPS * max(up, down) // up + 2

    got = _decode_soundfile(src, need)
    data, rate = got if got is not None else _decode_av(src, need)
    if rate <= 0:
        raise DecodeError(f"audio sample rate {rate} is not > 0")
    return np.ascontiguousarray(data.T), rate, int(data.shape[0])


def fit_channels(x: np.ndarray, channels: int) -> np.ndarray:
    """``(c, n)`` -> ``(channels, n)``: mix down to mono, keep, or duplicate mono (module doc)."""
    c = x.shape[0]
    if channels == 1:
        return x if c == 1 else x.mean(axis=0, keepdims=True, dtype=np.float32)
    if c == channels:
        return x
    if c == 1:
        return np.repeat(x, channels, axis=0)
    raise DecodeError(f"audio has {c} channels; channels={channels} keeps exactly {channels} "
                      "channels (or duplicates a mono file); pass channels=1 to mix down or "
                      f"channels={c} to keep them")


def resample(x: np.ndarray, rate_hz: int, target_hz: int) -> np.ndarray:
    """Polyphase resampling of ``(c, n)`` float32 along the last axis (scipy's resample_poly)."""
    if rate_hz == target_hz or x.shape[-1] == 0:
        return x
    from scipy.signal import resample_poly

    g = gcd(int(rate_hz), int(target_hz))
    up, down = target_hz // g, rate_hz // g
    y = resample_poly(x, up, down, axis=-1, window=_lowpass(up, down))
    return y.astype(np.float32, copy=False)


@functools.lru_cache(maxsize=32)
def _lowpass(up: int, down: int) -> np.ndarray:
    """resample_poly's own filter (Kaiser beta 5, cutoff at the lower Nyquist), designed once per
    rate pair instead of once per file."""
    from scipy.signal import firwin

    max_rate = max(up, down)
    h = firwin(2 * _HALF_TAPS * max_rate + 1, 1.0 / max_rate, window=("kaiser", 5.0))
    h = h.astype(np.float32)
    h.flags.writeable = False
    return h


def fit_length(x: np.ndarray, samples: int, out: np.ndarray) -> None:
    """Copies the first ``samples`` frames of ``x`` into ``out`` (``(c, samples)``), zero-padded."""
    n = min(samples, x.shape[-1])
    out[:, :n] = x[:, :n]
    out[:, n:] = 0.0
