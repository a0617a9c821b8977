"""``headrace.video``: uint8 clip batches decoded with PyAV (FFmpeg) in the loader's threads.

The clip space is a loader source (:class:`ClipSource`, one record per clip of the clip index,
``_video_index``), so order, shuffling, epochs, rank sharding, checkpoint/resume, stats and the
memory caps are :class:`headrace.Loader`'s. A transform running in the worker threads decodes a
batch's clips into one ``(B, clip, H, W, 3)`` array that is counted in the loader's byte budget
(``transform_nbytes = B x clip x H x W x 3``).

Decoding a batch: its clips are grouped by video; each video is opened once, its clips sorted by
first frame, and clips whose frames can be reached by decoding forward from where the previous
clip ended (no keyframe closer to the new clip's first frame) share one decoding pass; otherwise
the decoder seeks to the last keyframe at or before the clip's first frame and decodes forward.
Decoded frames are matched to the index by presentation timestamp, so a frame lands in every
clip slot that wants it (frames repeat when ``fps`` is above the source rate) and only frames
some clip wants are converted to RGB.

A clip that fails to decode (``corrupt_media``: FFmpeg errors; ``short_media``: the stream ended
before the clip's last frame) is dropped from its batch and counted per kind
(``on_error="count"``), or raises :class:`DecodeError` (``on_error="error"``). Videos that fail
the index probe never produce clips; their counts are in ``loader.index_info["failure_counts"]``
and ``stats()`` (``on_error="error"`` refuses to start instead, naming the first such video).
"""

from __future__ import annotations

import threading
from functools import partial
from typing import Any

import numpy as np

from headrace._base.errors import ConfigError, DecodeError
from headrace._engine.history import tracked
from headrace._engine.keywords import checked
from headrace._engine.lifecycle import (
    INNER_LOADER_KEYWORDS,
    YIELD_KEY,
    SingleLoaderWrapper,
    ThenTransform,
    refuse_empty,
)
from headrace._engine.loader import Loader, resolve_order
from headrace._engine.timeline import timeline_period
from headrace._modal.video_index import FAILURE_KINDS, ClipIndex, build_index, fps_fraction
from headrace._sources.media import MediaFiles, open_media

__all__ = ["ClipSource", "VideoLoader", "decode_clips", "video"]

_ERROR_POLICIES = ("count", "error")


class ClipSource:
    """The clips of a :class:`ClipIndex` as loader records (metadata only; decoding is the
    transform's). ``gather`` returns ``clip_ids``, ``video_ids``, ``start_s`` and ``labels``."""

    def __init__(self, index: ClipIndex, files: MediaFiles) -> None:
        self.index = index
        self.files = files
        ix = index
        self._fingerprint = f"video:{files.fingerprint}:{ix.clip}/{ix.stride}/{ix.fps}"

    def __len__(self) -> int:
        return len(self.index)

    @property
    def fingerprint(self) -> str:
        return self._fingerprint

    def nbytes(self, ids: np.ndarray) -> int:
        return 32 * len(ids)

    def gather(self, ids: np.ndarray) -> dict[str, Any]:
        ids = np.array(ids, np.int64)  # the batch keeps it: a writable copy of the shared ids
        videos = self.index.video[ids].astype(np.int64)
        return {"clip_ids": ids, "video_ids": videos, "start_s": self.index.start_seconds(ids),
                "labels": self.files.labels(videos)}

    def close(self) -> None:
        pass  # the VideoLoader owns the files


def decode_clips(src: Any, pts: np.ndarray, keyframe: np.ndarray,
                 requests: list[tuple[int, np.ndarray]], out: np.ndarray,
                 size_hw: tuple[int, int] | None, counters: dict[str, int]) -> dict[int, str]:
    """Decodes the clips ``requests`` (``(slot in out, source frame indices)``) of one video.

    Returns ``{slot: failure kind}`` for the clips that could not be filled.
    """
    import av

    failed: dict[int, str] = {}
    keys = np.flatnonzero(keyframe)
    reqs = sorted(requests, key=lambda r: int(r[1][0]))

    def key_before(i: int) -> int:
        k = int(np.searchsorted(keys, i, side="right")) - 1
        return int(keys[k]) if k >= 0 else 0

    # Runs of clips decoded in one forward pass (see the module docstring).
    runs: list[list[tuple[int, np.ndarray]]] = []
    hi = -1
    for r in reqs:
        lo = int(r[1][0])
        if runs and key_before(lo) <= hi:
            runs[-1].append(r)
        else:
            runs.append([r])
        hi = max(hi, int(r[1][-1]))
    try:
        container = av.open(src)
    except Exception as e:
        return {slot: _kind(e) for slot, _ in requests}
    with container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        for run in runs:
            want: dict[int, list[tuple[int, int]]] = {}
            for slot, frames in run:
                for j, i in enumerate(frames.tolist()):
                    want.setdefault(i, []).append((slot, j))
            kind = "short_media"  # frames still wanted after the stream ended
            try:
                _decode_run(container, stream, pts, key_before, want, out, size_hw, counters)
            except Exception as e:  # only the clips still missing frames fail
                kind = _kind(e)
            for pairs in want.values():
                for slot, _j in pairs:
                    failed[slot] = kind
    return failed


def _kind(e: BaseException) -> str:
    name = type(e).__name__
    if "DecoderNotFound" in name or "PatchWelcome" in name:
        return "unsupported_codec"
    return "corrupt_media"


def _decode_run(container: Any, stream: Any, pts: np.ndarray, key_before: Any,
                want: dict[int, list[tuple[int, int]]], out: np.ndarray,
                size_hw: tuple[int, int] | None, counters: dict[str, int]) -> None:
    lo, hi = min(want), max(want)
    seek_to: int | None = key_before(lo)  # None: the very start of the file
    while True:
        if seek_to is None:
            container.seek(0)
        else:
            container.seek(int(pts[seek_to]), stream=stream, backward=True, any_frame=False)
        counters["seeks"] += 1
        landed_late = False
        first = True
        for frame in container.decode(stream):
            if frame.pts is None:
                continue
            i = int(np.searchsorted(pts, frame.pts))
            if i >= len(pts) or pts[i] != frame.pts:
                continue
            if first:
                first = False
                # Demuxers that seek by decode time or by bytes (MPEG-TS) can land on a later
                # keyframe than asked for: go one keyframe earlier, at last to the start.
                if i > lo and seek_to is not None:
                    landed_late = True
                    break
            slots = want.pop(i, None)
            if slots is not None:
                kw: dict[str, Any] = {"format": "rgb24"}
                if size_hw is not None:
                    kw["height"], kw["width"] = size_hw
                img = frame.to_ndarray(**kw)
                counters["frames"] += 1
                for slot, j in slots:
                    out[slot, j] = img
            if i >= hi or not want:
                return
        if seek_to is None or not (landed_late or first):
            return  # the stream ended: what is left in ``want`` is short
        # landed late, or past the end (nothing decoded): retry earlier
        seek_to = key_before(seek_to - 1) if seek_to > 0 else None


class _Job:
    """What the decoding transform needs, and its counters. The worker threads hold this, never
    the ``VideoLoader``, so a loader dropped without ``close()`` is collected and its threads
    stopped."""

    def __init__(self, *, index: ClipIndex, files: MediaFiles, frame_hw: tuple[int, int],
                 resize: tuple[int, int] | None, on_error: str) -> None:
        self.index = index
        self.files = files
        self.frame_hw = frame_hw
        self.resize = resize
        self.on_error = on_error
        self.lock = threading.Lock()
        self.clips = self.frames = self.seeks = 0
        self.fail = dict.fromkeys(FAILURE_KINDS, 0)

    def _count(self, clips: int, counters: dict[str, int], kinds: list[str]) -> None:
        with self.lock:
            self.clips += clips
            self.frames += counters["frames"]
            self.seeks += counters["seeks"]
            for k in kinds:
                self.fail[k] += 1


class _Decoder:
    """The transform: clip metadata -> the batch dict with ``frames``."""

    def __init__(self, job: _Job) -> None:
        self.ld = job

    def __call__(self, batch: dict[str, Any], ids: np.ndarray) -> dict[str, Any]:
        ld = self.ld
        index = ld.index
        n = len(ids)
        out = np.empty((n, index.clip, *ld.frame_hw, 3), np.uint8)
        videos = batch["video_ids"]
        counters = {"seeks": 0, "frames": 0}
        failed: dict[int, tuple[str, int]] = {}
        for v in dict.fromkeys(videos.tolist()):
            slots = np.flatnonzero(videos == v).tolist()
            requests = [(s, index.frames(int(ids[s]))) for s in slots]
            pts, keyframe = index.probe.frames(v)
            got = decode_clips(ld.files.open(v), pts, keyframe, requests, out, ld.resize,
                               counters)
            for s, kind in got.items():
                failed[s] = (kind, v)
        ld._count(n - len(failed), counters, [k for k, _ in failed.values()])
        if failed and ld.on_error == "error":
            s, (kind, v) = min(failed.items())
            path = ld.files.path(v)
            raise DecodeError(f"video record {v} ({path}), clip {int(ids[s])}: {kind}",
                              record_id=v, path=path)
        if failed:
            keep = np.array([s for s in range(n) if s not in failed], np.int64)
            out = out[keep]
            batch = {k: np.asarray(a)[keep] for k, a in batch.items()}
        return {"frames": out, **batch}


def _finish(to_torch: bool, b: dict[str, Any]) -> Any:
    """A decoded batch as the loader yields it."""
    if to_torch:
        import torch

        return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in b.items()}
    return b


class VideoLoader(SingleLoaderWrapper):
    """Iterates clip batches; built by :func:`video` (see it for the arguments).

    Each batch is a dict: ``frames`` uint8 ``(B, clip, H, W, 3)`` RGB, ``clip_ids`` int64,
    ``start_s`` float64 (clip start, seconds after the video's first frame), ``video_ids`` int64
    (record ids of the videos) and ``labels`` int64 (``-1`` unlabeled).
    """

    _timeline_kind = "video"
    _stats_summary = ("video clips decoded {video_clips_decoded_total}, failures "
                      "{video_decode_failures_total}")

    def __init__(self, data: Any, *, clip: int, stride: int, fps: Any, batch: int,
                 resize: tuple[int, int] | None, on_error: str, order: str, seed: int,
                 epoch: int, epochs: int | None, drop_last: bool, to_torch: bool,
                 labels: bool | None, index_dir: Any, progress: bool | None,
                 loader_kw: dict[str, Any], resume: bytes | None,
                 timeline: bool | float = False, transform: Any = None,
                 recursive: bool = True) -> None:
        timeline_s = timeline_period(timeline)
        if on_error not in _ERROR_POLICIES:
            raise ConfigError(f"on_error={on_error!r} must be 'count' or 'error'")
        for name, value in (("clip", clip), ("stride", stride)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"video {name} must be an int >= 1, got {value!r}")
        if resize is not None:
            if (len(resize) != 2 or any(isinstance(x, bool) or not isinstance(x, int) or x < 1
                                        for x in resize)):
                raise ConfigError(f"resize must be (height, width) ints >= 1, got {resize!r}")
            resize = (int(resize[0]), int(resize[1]))
        self.fps = fps_fraction(fps)
        self.resize = resize
        self.on_error = on_error
        self.to_torch = bool(to_torch)
        self.files = open_media(data, kind="video", labels=labels, recursive=recursive)
        self._closed = False
        self.last_ids = np.empty(0, np.int64)
        try:
            refuse_empty(len(self.files), "video files", data)
            self.index, self.index_info = build_index(self.files, clip=clip, stride=stride,
                                                      fps=self.fps, cache_dir=index_dir,
                                                      progress=progress)
            if on_error == "error":
                bad = next(((v, f) for v, f in enumerate(self.index.failures) if f), None)
                if bad is not None:
                    path = self.files.path(bad[0])
                    raise DecodeError(f"video record {bad[0]} ({path}): {bad[1]} (pass "
                                      "on_error='count' to skip such videos and count them)",
                                      record_id=bad[0], path=path)
            self.frame_hw = self._frame_hw()
            per_clip = clip * self.frame_hw[0] * self.frame_hw[1] * 3
            self.bytes_per_clip = per_clip
            self._job = _Job(index=self.index, files=self.files, frame_hw=self.frame_hw,
                             resize=resize, on_error=on_error)
            decoder: Any = _Decoder(self._job)
            if transform is not None:
                decoder = ThenTransform(decoder, partial(_finish, self.to_torch), transform,
                                        "clip_ids", seed=seed)
            self._inner = Loader(ClipSource(self.index, self.files), batch=batch, order=order,
                                 seed=seed, epoch=epoch, epochs=epochs, drop_last=drop_last,
                                 transform=decoder,
                                 transform_nbytes=lambda k: k * per_clip, resume=resume,
                                 close_source=False, **loader_kw)
        except BaseException:
            self.files.close()
            raise
        self._started(timeline_s, f"on_error={on_error!r}")

    def _frame_hw(self) -> tuple[int, int]:
        usable = [v for v, f in enumerate(self.index.failures) if f is None]
        if not usable:  # mx8 ends silently here; an empty training run is never what was meant
            raise ConfigError(f"{self.files!r} yields no clips of {self.index.clip} frames at "
                              f"fps={self.fps}: failure_counts="
                              f"{self.index_info['failure_counts']}; check the files, or lower "
                              "clip / raise fps")
        if self.resize is not None:
            return self.resize
        p = self.index.probe
        sizes = {(int(p.height[v]), int(p.width[v])) for v in usable}
        if len(sizes) > 1:
            v0 = usable[0]
            other = next(v for v in usable if (int(p.height[v]), int(p.width[v])) !=
                         (int(p.height[v0]), int(p.width[v0])))
            raise ConfigError(
                f"videos differ in frame size: {self.files.path(v0)} is "
                f"{p.height[v0]}x{p.width[v0]} but {self.files.path(other)} is "
                f"{p.height[other]}x{p.width[other]}; pass resize=(H, W)")
        return sizes.pop()

    # -- iteration -------------------------------------------------------------------------------

    @tracked
    def __next__(self) -> Any:
        b = self._next_delivered("clip_ids")
        if YIELD_KEY in b:
            return b[YIELD_KEY]
        return _finish(self.to_torch, b)

    # -- state -----------------------------------------------------------------------------------

    @property
    def clip_count(self) -> int:
        return len(self.index)

    @property
    def frames_per_clip(self) -> int:
        return self.index.clip

    def stats(self) -> dict[str, Any]:
        """The loader's stats plus ``video_*`` keys: geometry, index counts (videos, by failure
        kind: ``video_index_<kind>``) and decode counters (clips, frames converted, seeks, clips
        dropped by kind: ``video_<kind>_total``)."""
        s = self._inner.stats()
        fails = self.index_info["failure_counts"]
        s.update({
            "video_clip_count": len(self.index),
            "video_frames_per_clip": self.index.clip,
            "video_stride": self.index.stride,
            "video_fps": float(self.fps),
            "video_frame_height": self.frame_hw[0],
            "video_frame_width": self.frame_hw[1],
            "video_bytes_per_clip": self.bytes_per_clip,
            "video_tail_clips_dropped_total": self.index_info["tail_clips_dropped_total"],
            **{f"video_index_{k}": int(v) for k, v in fails.items()},
        })
        job = self._job
        with job.lock:
            s["video_clips_decoded_total"] = job.clips
            s["video_frames_decoded_total"] = job.frames
            s["video_seeks_total"] = job.seeks
            s["video_decode_failures_total"] = sum(job.fail.values())
            for k, v in job.fail.items():
                s[f"video_{k}_total"] = v
        return s

    def __repr__(self) -> str:
        return (f"VideoLoader({self.files!r}, clips={len(self.index)}, clip={self.index.clip}, "
                f"stride={self.index.stride}, fps={self.fps}, batch={self.batch_size})")


@checked("video()")
def video(data: Any, *, clip: int = 16, stride: int = 8, fps: Any = 8, batch: int = 32,
          seed: int = 0, epoch: int = 0, epochs: int | None = 1, shuffle: bool = False,
          order: str | None = None, drop_last: bool = False,
          resize: tuple[int, int] | None = None, on_error: str = "count",
          to_torch: bool = False, labels: bool | None = None, index_dir: Any = None,
          progress: bool | None = None, threads: int | None = None, inflight: int | None = None, ram_gb: float | None = None,
          queue: int | None = None, prefetch: int | None = None, profile: str | None = None,
          constraints: Any = None, runtime: Any = None, rank: int | None = None,
          world_size: int | None = None,
          tail: str | None = None, resume: bytes | None = None,
          timeline: bool | float = False, transform: Any = None,
          recursive: bool = True, tune: bool = False) -> VideoLoader:
    """Clips of ``clip`` frames at ``fps``, every ``stride`` resampled frames, from a folder of
    videos or a store of video files.

    Example (mx8's spelling)::

        loader = headrace.video("/data/videos", clip=16, stride=8, fps=8, batch=32,
                                resize=(112, 112), shuffle=True, seed=0)
        for b in loader:
            b["frames"]        # uint8 (32, 16, 112, 112, 3)
            b["clip_ids"], b["start_s"]

    Args:
        data: a folder of video files (mp4, mkv, webm, avi, mov, ...; labels by first-level
            folder when every file sits in one) or a store packed with
            ``headrace._sources.media.pack_media(..., kind="video")`` (path or ``Store``).
        clip: frames per clip. stride: resampled frames between clip starts.
        fps: the rate the timeline is resampled to (int, float or Fraction; > 0).
        batch: clips per batch.
        seed, epoch, epochs, shuffle, order, drop_last: as in :class:`headrace.Loader` (the
            records are clips).
        resize: ``(H, W)`` output frames (FFmpeg's swscale); ``None`` keeps the source size,
            which must then be the same for every video.
        on_error: ``"count"`` drops clips that fail to decode and counts them per failure kind;
            ``"error"`` raises :class:`~headrace.DecodeError`.
        to_torch: torch tensors instead of NumPy arrays.
        labels: ``True``/``False``/``None`` (auto) labels by first-level folder (raw folders).
        recursive: raw folders: read subfolders too (mx8's default); ``False`` reads only the
            files directly in ``data``.
        index_dir: where the probe of the videos is cached (default
            ``$HEADRACE_VIDEO_INDEX_DIR``, else the user cache dir); keyed by the data version.
        progress: a progress bar on stderr while the videos are probed (``None``: only on a
            terminal; a cached probe shows none).
        threads, inflight, ram_gb, queue, prefetch, profile, constraints, runtime, rank,
            world_size, tail, resume, tune: as in :class:`headrace.Loader` (rank and world size
            from the launcher unless given).
        timeline: record a stats timeline (``True``: a snapshot every 0.5 s; a number: the
            period in seconds) for ``stats_timeline()`` and ``headrace.plot``.
        transform: ``fn(batch, ids) -> batch``, run in the loader's threads on each batch as it
            would be yielded (``ids``: its clip ids); the loader yields what it returns.

    Raises:
        ConfigError: bad knobs, no usable clip at all, or differing frame sizes without
            ``resize``.
    """
    loader_kw = {k: v for k, v in locals().items() if k in INNER_LOADER_KEYWORDS}
    return VideoLoader(data, clip=clip, stride=stride, fps=fps, batch=batch, resize=resize,
                       on_error=on_error, order=resolve_order(order, shuffle),
                       seed=seed, epoch=epoch, epochs=epochs, drop_last=drop_last,
                       to_torch=to_torch, labels=labels, index_dir=index_dir,
                       progress=progress, loader_kw=loader_kw, resume=resume,
                       timeline=timeline, transform=transform,
                       recursive=recursive)
