"""The clip index of ``headrace.video``: which source frames make up each clip, built once.

Two stages:

1. **Probe** (expensive, done once per data version and cached): each video is opened with PyAV,
   its first video stream demuxed (no decoding past the first frame) to list every frame's
   presentation timestamp and keyframe flag; the first frame is decoded to prove the stream
   decodes. A video that cannot be read is classified with mx8's failure kinds:
   ``corrupt_media`` (not a media file, truncated, undecodable), ``missing_stream`` (no video
   stream), ``unsupported_codec`` (FFmpeg has no decoder for it), ``short_media`` (fewer
   resampled frames than one clip; decided in stage 2). The probe is stored as an ``.npz``
   under the cache directory, named by a hash of the data fingerprint (store generation and
   chunks, or a folder's paths, sizes and mtimes), and reused by every later loader.

2. **Layout** (cheap, in memory, a pure function of the probe and ``clip, stride, fps``): each
   video's timeline is resampled to ``fps``: target time ``j / fps`` after the first frame (for
   every ``j`` with ``j / fps`` <= the last frame's time) takes the last source frame whose
   timestamp is <= that time (exact integer arithmetic on timestamps, no float rounding; with a
   tolerance of half a time-base tick, because containers round timestamps to their tick). Clips
   start at resampled frames ``0, stride, 2*stride, ...`` and hold ``clip`` resampled frames; a
   start whose clip would run past the end is dropped (``tail_clips_dropped_total``). Clip ids
   number the clips of video 0, then video 1, ... (videos in byte-wise path order).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from headrace._base.errors import ConfigError
from headrace._base.progress import progress as progress_bar
from headrace._sources.media import MediaFiles

__all__ = ["FAILURE_KINDS", "ClipIndex", "VideoProbe", "build_index", "fps_fraction",
           "index_dir", "probe_videos"]

SCHEMA_VERSION = 1
FAILURE_KINDS = ("corrupt_media", "short_media", "unsupported_codec", "missing_stream")
_OK = 0
_STATUS = {"ok": _OK, "corrupt_media": 1, "unsupported_codec": 2, "missing_stream": 3}
_STATUS_NAME = {v: k for k, v in _STATUS.items()}
_PROBE_THREADS = 4


def fps_fraction(fps: Any) -> Fraction:
    """``fps`` (int, float, Fraction or str) as an exact positive fraction."""
    try:
        f = Fraction(str(fps)) if isinstance(fps, float) else Fraction(fps)
    except (TypeError, ValueError, ZeroDivisionError):
        raise ConfigError(f"video fps must be a number > 0, got {fps!r}") from None
    if f <= 0:
        raise ConfigError(f"video fps must be > 0, got {fps!r}")
    return f.limit_denominator(1_001_000)


def index_dir(explicit: str | os.PathLike[str] | None = None) -> str:
    """Where probes are cached: ``explicit`` > ``$HEADRACE_VIDEO_INDEX_DIR`` > the user cache."""
    if explicit is not None:
        return os.fspath(explicit)
    env = os.environ.get("HEADRACE_VIDEO_INDEX_DIR")
    if env:
        return env
    import platformdirs

    return os.path.join(platformdirs.user_cache_dir("headrace"), "video-index")


# -- stage 1: probing -------------------------------------------------------------------------------


def _probe_one(src: Any) -> tuple[int, int, int, int, int, np.ndarray, np.ndarray]:
    """``(status, height, width, tb_num, tb_den, pts sorted, keyframe flags)`` for one video."""
    import av

    empty = np.zeros(0, np.int64), np.zeros(0, bool)
    try:
        container = av.open(src)
    except Exception:
        return (_STATUS["corrupt_media"], 0, 0, 1, 1, *empty)
    with container:
        if not container.streams.video:
            return (_STATUS["missing_stream"], 0, 0, 1, 1, *empty)
        stream = container.streams.video[0]
        try:
            codec = stream.codec_context.codec
            if codec is None or not codec.is_decoder:
                raise LookupError
        except Exception:
            return (_STATUS["unsupported_codec"], 0, 0, 1, 1, *empty)
        tb = stream.time_base or Fraction(1, 1)
        pts: list[int] = []
        keys: list[bool] = []
        first = None
        try:
            for packet in container.demux(stream):
                t = packet.pts if packet.pts is not None else packet.dts
                if t is None or packet.size == 0:
                    continue
                pts.append(int(t))
                keys.append(bool(packet.is_keyframe))
                if first is None:  # prove the stream decodes: its first frame
                    for frame in stream.codec_context.decode(packet):
                        first = frame
                        break
            if first is None:
                for frame in stream.codec_context.decode(None):
                    first = frame
                    break
        except Exception:
            return (_STATUS["corrupt_media"], 0, 0, 1, 1, *empty)
        if first is None:
            return (_STATUS["corrupt_media"], 0, 0, 1, 1, *empty)
        order = np.argsort(np.asarray(pts, np.int64), kind="stable")
        p = np.asarray(pts, np.int64)[order]
        k = np.asarray(keys, bool)[order]
        if len(p) > 1 and (np.diff(p) == 0).any():  # duplicate timestamps: keep the first
            keep = np.concatenate([[True], np.diff(p) != 0])
            p, k = p[keep], k[keep]
        return (_OK, int(first.height), int(first.width), tb.numerator, tb.denominator, p, k)


@dataclass
class VideoProbe:
    """Stage 1 for every video (arrays indexed by video id; frames concatenated by ``offsets``)."""

    status: np.ndarray  # int8, _STATUS codes
    height: np.ndarray  # int32
    width: np.ndarray  # int32
    tb: np.ndarray  # int64 (n, 2): time base numerator, denominator
    offsets: np.ndarray  # int64 (n + 1)
    pts: np.ndarray  # int64, sorted per video
    keyframe: np.ndarray  # bool
    path: str = ""
    reused: bool = False

    def frames(self, v: int) -> tuple[np.ndarray, np.ndarray]:
        a, b = int(self.offsets[v]), int(self.offsets[v + 1])
        return self.pts[a:b], self.keyframe[a:b]

    def save(self, path: str) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, schema=np.array([SCHEMA_VERSION]), status=self.status,
                         height=self.height, width=self.width, tb=self.tb,
                         offsets=self.offsets, pts=self.pts, keyframe=self.keyframe)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    @classmethod
    def load(cls, path: str) -> VideoProbe | None:
        try:
            with np.load(path) as z:
                if int(z["schema"][0]) != SCHEMA_VERSION:
                    return None
                return cls(z["status"], z["height"], z["width"], z["tb"], z["offsets"],
                           z["pts"], z["keyframe"], path=path, reused=True)
        except (OSError, KeyError, ValueError):
            return None  # a damaged cache file is rebuilt


def probe_videos(files: MediaFiles, *, cache_dir: str | os.PathLike[str] | None = None,
                 threads: int = _PROBE_THREADS, progress: bool | None = None) -> VideoProbe:
    """Stage 1 for ``files``, from the cache when this data version was probed before.

    ``progress``: a bar on stderr while probing (``None``: only on a terminal).
    """
    key = hashlib.sha256(f"v{SCHEMA_VERSION}\0{files.fingerprint}".encode()).hexdigest()[:32]
    path = os.path.join(index_dir(cache_dir), f"{key}.npz")
    if os.path.isfile(path):
        got = VideoProbe.load(path)
        if got is not None and len(got.status) == len(files):
            return got
    n = len(files)
    results = []
    with ThreadPoolExecutor(max(1, min(threads, n or 1)),
                            thread_name_prefix="headrace-video-probe") as pool, \
            progress_bar(n, desc="video index", unit="video", enabled=progress) as bar:
        for r in pool.map(lambda i: _probe_one(files.open(i)), range(n)):
            results.append(r)
            bar.update(1)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum([len(r[5]) for r in results], out=offsets[1:])
    probe = VideoProbe(
        status=np.array([r[0] for r in results], np.int8),
        height=np.array([r[1] for r in results], np.int32),
        width=np.array([r[2] for r in results], np.int32),
        tb=np.array([[r[3], r[4]] for r in results], np.int64).reshape(n, 2),
        offsets=offsets,
        pts=np.concatenate([r[5] for r in results]) if n else np.zeros(0, np.int64),
        keyframe=np.concatenate([r[6] for r in results]) if n else np.zeros(0, bool),
        path=path)
    probe.save(path)
    return probe


# -- stage 2: the clip layout -----------------------------------------------------------------------


class ClipIndex:
    """The clips of a probe for ``(clip, stride, fps)``; see the module docstring for the rules.

    Attributes:
        video: int32 video id per clip. start: int64 first resampled frame of each clip.
        first: int64 first clip id of each video (n + 1 entries).
        failures: per-video failure kind (``None`` for a usable video).
    """

    def __init__(self, probe: VideoProbe, *, clip: int, stride: int, fps: Fraction) -> None:
        self.probe = probe
        self.clip, self.stride, self.fps = clip, stride, fps
        n = len(probe.status)
        self._scaled: list[np.ndarray | None] = [None] * n
        self.failures: list[str | None] = []
        counts = np.zeros(n, np.int64)
        self.resampled_frames = np.zeros(n, np.int64)
        tail = 0
        for v in range(n):
            code = int(probe.status[v])
            if code != _OK:
                self.failures.append(_STATUS_NAME[code])
                continue
            scaled, unit, half = self._timeline(v)
            m = int((scaled[-1] + half) // unit) + 1
            self.resampled_frames[v] = m
            if m < clip:
                self.failures.append("short_media")
                continue
            self.failures.append(None)
            counts[v] = (m - clip) // stride + 1
            tail += len(range(0, m, stride)) - int(counts[v])
        self.tail_clips_dropped = tail
        self.first = np.zeros(n + 1, np.int64)
        np.cumsum(counts, out=self.first[1:])
        total = int(self.first[-1])
        self.video = np.repeat(np.arange(n, dtype=np.int32), counts)
        self.start = (np.arange(total, dtype=np.int64) - self.first[self.video]) * stride

    def _timeline(self, v: int) -> tuple[np.ndarray, int, int]:
        """``(scaled, unit, half)``: frame ``k`` is at or before target ``j`` iff
        ``scaled[k] - half <= j * unit`` (exact integers; ``half`` is half a time-base tick)."""
        pts, _ = self.probe.frames(v)
        num, den = (int(x) for x in self.probe.tb[v])
        # (pts - pts0) * num/den <= j * fps.den/fps.num + tick/2, times 2*den*fps.num. Containers
        # round timestamps to their tick (1 ms in Matroska), so a frame exactly on a target time
        # may be stored up to half a tick late; the half tick keeps it on that target.
        scaled = 2 * (pts - pts[0]) * (num * self.fps.numerator)
        return scaled, 2 * den * self.fps.denominator, num * self.fps.numerator

    def __len__(self) -> int:
        return len(self.video)

    def frames(self, clip_id: int) -> np.ndarray:
        """Source frame indices (into the video's sorted timestamps) of one clip's frames."""
        v = int(self.video[clip_id])
        unit = 2 * int(self.probe.tb[v][1]) * self.fps.denominator
        shifted = self._scaled[v]
        if shifted is None:
            scaled, unit, half = self._timeline(v)
            shifted = self._scaled[v] = scaled - half
        targets = (int(self.start[clip_id]) + np.arange(self.clip, dtype=np.int64)) * unit
        return np.maximum(np.searchsorted(shifted, targets, side="right") - 1, 0)

    def start_seconds(self, clip_ids: np.ndarray) -> np.ndarray:
        """Clip start times in seconds after the first frame of their video."""
        return self.start[clip_ids] * (self.fps.denominator / self.fps.numerator)

    def failure_counts(self) -> dict[str, int]:
        return {k: sum(1 for f in self.failures if f == k) for k in FAILURE_KINDS}

    def index_hash(self) -> str:
        h = hashlib.sha256(json.dumps([SCHEMA_VERSION, self.clip, self.stride,
                                       str(self.fps)]).encode())
        h.update(self.video.astype("<i4").tobytes())
        h.update(self.start.astype("<i8").tobytes())
        return h.hexdigest()


def build_index(files: MediaFiles, *, clip: int, stride: int, fps: Fraction,
                cache_dir: str | os.PathLike[str] | None = None,
                progress: bool | None = None) -> tuple[ClipIndex, dict[str, Any]]:
    """The clip index and mx8's ``video_index_build`` result dict for ``files``."""
    probe = probe_videos(files, cache_dir=cache_dir, progress=progress)
    idx = ClipIndex(probe, clip=clip, stride=stride, fps=fps)
    head = [f"{files.path(int(idx.video[c]))}@{int(idx.start[c])}"
            for c in range(min(8, len(idx)))]
    info = {
        "manifest_hash": files.fingerprint,
        "video_schema_version": SCHEMA_VERSION,
        "clip_count": len(idx),
        "tail_clips_dropped_total": idx.tail_clips_dropped,
        "clip_index_hash": idx.index_hash(),
        "clip_ids_head": head,
        "failure_counts": idx.failure_counts(),
        "videos": len(files),
        "index_path": probe.path,
        "reused": probe.reused,
    }
    return idx, info
