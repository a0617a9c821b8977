"""``headrace.audio``: fixed-size float32 audio batches decoded in the loader's threads.

Built on :class:`headrace.Loader` like the image loader: the source hands out labels (the files
stay where they are: a folder, or zero-copy views of a store's ``mmap``), and a transform running
in the worker threads decodes each record (``_audio``), fits its channels, resamples it to
``rate_hz`` and writes the first ``samples`` frames (zero-padded) straight into the batch array,
which is counted in the loader's byte budget (``transform_nbytes = batch x channels x samples x
4``). Order, epochs, rank sharding, checkpoint/resume and memory caps are the loader's.

``on_decode_error="skip"`` drops the undecodable file only: that batch comes back shorter (a batch
where every file failed is not delivered at all). The checkpoint still counts the skipped records
as consumed, so a resumed run skips them the same way.
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
    BorrowedRecords,
    SingleLoaderWrapper,
    ThenTransform,
    refuse_empty,
)
from headrace._engine.loader import Loader, resolve_order
from headrace._engine.timeline import timeline_period
from headrace._modal.audio_decode import decode_audio, fit_channels, fit_length, resample
from headrace._sources.media import MediaFiles, open_media

__all__ = ["AudioLoader", "audio"]

_ERROR_POLICIES = ("error", "skip")


class _LabelSource(BorrowedRecords):
    """``MediaFiles`` as a loader source: a batch's labels (decoding is the transform's job)."""

    records: MediaFiles

    def gather(self, ids: np.ndarray) -> dict[str, Any]:
        return {"label": self.records.labels(ids)}


class _Job:
    """What the decoding transform needs, and its counters. The worker threads hold this, never
    the ``AudioLoader``, so a loader dropped without ``close()`` is collected and its threads
    stopped."""

    def __init__(self, *, files: MediaFiles, channels: int, sample_count: int,
                 rate_hz: int | None, on_decode_error: str) -> None:
        self.files = files
        self.channels = channels
        self.sample_count = sample_count
        self.rate_hz = rate_hz
        self.on_decode_error = on_decode_error
        self.lock = threading.Lock()
        self.decoded = self.failed = self.frames = 0

    def _count(self, *, decoded: int, failed: int, frames: int) -> None:
        with self.lock:
            self.decoded += decoded
            self.failed += failed
            self.frames += frames


class _Decoder:
    """The transform: record ids -> ``{"samples", "labels", "sample_rates_hz", "ids"}``."""

    def __init__(self, job: _Job) -> None:
        self.ld = job

    def __call__(self, batch: dict[str, Any], ids: np.ndarray) -> dict[str, Any]:
        ld = self.ld
        n = len(ids)
        out = np.empty((n, ld.channels, ld.sample_count), np.float32)
        rates = np.empty(n, np.int64)
        keep = np.empty(n, np.int64)
        k = frames = 0
        for j, rid in enumerate(ids.tolist()):
            try:
                x, rate, got = decode_audio(ld.files.open(rid), samples=ld.sample_count,
                                            target_hz=ld.rate_hz)
                frames += got
                x = fit_channels(x, ld.channels)
                if ld.rate_hz is not None:
                    x = resample(x, rate, ld.rate_hz)
                    rate = ld.rate_hz
                fit_length(x, ld.sample_count, out[k])
            except DecodeError as e:
                if ld.on_decode_error == "error":
                    path = ld.files.path(rid)
                    raise DecodeError(f"audio record {rid} ({path}): {e}", record_id=rid,
                                      path=path) from e
                continue
            rates[k] = rate
            keep[k] = j
            k += 1
        ld._count(decoded=k, failed=n - k, frames=frames)
        labels = np.asarray(batch["label"], np.int64)
        if k < n:
            sel = keep[:k]
            out, rates, labels, ids = out[:k], rates[:k], labels[sel], ids[sel]
        return {"samples": out, "labels": labels, "sample_rates_hz": rates, "ids": ids}


def _finish(to_torch: bool, as_dict: bool, b: dict[str, Any]) -> Any:
    """A decoded batch as the loader yields it."""
    if to_torch:
        import torch

        b = {k: torch.from_numpy(v) for k, v in b.items()}
    return b if as_dict else (b["samples"], b["labels"])


class AudioLoader(SingleLoaderWrapper):
    """Iterates ``(samples, labels)`` batches; built by :func:`audio` (see it for the arguments).

    ``samples`` is ``float32[B, channels, sample_count]``, ``labels`` ``int64[B]`` (``-1`` for
    unlabeled records). With ``as_dict=True`` each batch is ``{"samples", "labels",
    "sample_rates_hz", "ids"}``.
    """

    _timeline_kind = "audio"
    _stats_summary = ("audio decoded {audio_decode_samples_total}, decode failures "
                      "{audio_decode_failures_total}")

    def __init__(self, data: Any, *, batch: int, samples: int, channels: int,
                 rate_hz: int | None, on_decode_error: str, order: str, seed: int, epoch: int,
                 epochs: int | None, drop_last: bool, as_dict: bool, to_torch: bool,
                 labels: bool | None, loader_kw: dict[str, Any], resume: bytes | None,
                 timeline: bool | float = False, transform: Any = None,
                 recursive: bool = True) -> None:
        timeline_s = timeline_period(timeline)
        if on_decode_error not in _ERROR_POLICIES:
            raise ConfigError(f"invalid decode_error_policy={on_decode_error!r} (expected: "
                              "error|skip)")
        for name, value in (("samples", samples), ("channels", channels)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be an int >= 1, got {value!r}")
        if rate_hz is not None and (isinstance(rate_hz, bool) or not isinstance(rate_hz, int)
                                    or rate_hz < 1):
            raise ConfigError(f"rate_hz must be None (keep each file's rate) or an int >= 1, "
                              f"got {rate_hz!r}")
        self.sample_count = samples
        self.channels = channels
        self.rate_hz = rate_hz
        self.on_decode_error = on_decode_error
        self.as_dict = bool(as_dict)
        self.to_torch = bool(to_torch)
        self.files = open_media(data, kind="audio", labels=labels, recursive=recursive)
        try:
            refuse_empty(len(self.files), "audio files", data)
        except BaseException:
            self.files.close()
            raise
        self._job = _Job(files=self.files, channels=channels, sample_count=samples,
                         rate_hz=rate_hz, on_decode_error=on_decode_error)
        self._closed = False
        self.last_ids = np.empty(0, np.int64)
        per_item = channels * samples * 4 + 24
        decoder: Any = _Decoder(self._job)
        if transform is not None:
            decoder = ThenTransform(decoder, partial(_finish, self.to_torch, self.as_dict),
                                    transform, "ids", seed=seed)
        try:
            self._inner = Loader(_LabelSource(self.files), batch=batch, order=order, seed=seed,
                                 epoch=epoch, epochs=epochs, drop_last=drop_last,
                                 transform=decoder, transform_nbytes=lambda k: k * per_item,
                                 resume=resume, close_source=False, **loader_kw)
        except BaseException:
            self.files.close()
            raise
        self._started(timeline_s, f"on_decode_error={on_decode_error!r}")

    # -- iteration -------------------------------------------------------------------------------

    @tracked
    def __next__(self) -> Any:
        b = self._next_delivered("ids")
        if YIELD_KEY in b:
            return b[YIELD_KEY]
        return _finish(self.to_torch, self.as_dict, b)

    # -- state -----------------------------------------------------------------------------------

    @property
    def sample_rate_hz(self) -> int | None:
        """``rate_hz``; when it is ``None`` the first record's own rate (``None`` if empty)."""
        if self.rate_hz is not None or len(self.files) == 0:
            return self.rate_hz
        try:
            return decode_audio(self.files.open(0), samples=1)[1]
        except DecodeError:
            return None

    def stats(self) -> dict[str, Any]:
        """The loader's stats plus mx8's audio keys: ``audio_sample_count``,
        ``audio_channels``, ``audio_expected_sample_rate_hz`` (0 = keep each file's rate),
        ``audio_decode_samples_total`` (files decoded), ``audio_decode_failures_total`` (files
        dropped by ``on_decode_error="skip"``), ``audio_decoded_frames_total`` (source frames
        read)."""
        s = self._inner.stats()
        job = self._job
        with job.lock:
            s.update({
                "audio_sample_count": self.sample_count,
                "audio_channels": self.channels,
                "audio_expected_sample_rate_hz": self.rate_hz or 0,
                "audio_decode_samples_total": job.decoded,
                "audio_decode_failures_total": job.failed,
                "audio_decoded_frames_total": job.frames,
            })
        return s

    def __repr__(self) -> str:
        return (f"AudioLoader({self.files!r}, batch={self.batch_size}, "
                f"channels={self.channels}, samples={self.sample_count}, rate_hz={self.rate_hz})")


@checked("audio()")
def audio(data: Any, *, batch: int = 32, samples: int = 16000, channels: int = 1,
          rate_hz: int | None = None, on_decode_error: str = "error", shuffle: bool = False,
          order: str | None = None, seed: int = 0, epoch: int = 0, epochs: int | None = 1,
          drop_last: bool = False, as_dict: bool = False, to_torch: bool = False,
          labels: bool | None = None, threads: int | None = None, inflight: int | None = None,
          ram_gb: float | None = None, queue: int | None = None, prefetch: int | None = None,
          profile: str | None = None, constraints: Any = None, runtime: Any = None,
          rank: int | None = None, world_size: int | None = None, tail: str | None = None,
          resume: bytes | None = None, timeline: bool | float = False,
          transform: Any = None, recursive: bool = True, tune: bool = False,
          batch_bytes: int | None = None, target_bytes: int | None = None) -> AudioLoader:
    """Fixed-size float32 audio batches from a store or a raw folder of audio files.

    Example (mx8's spelling)::

        loader = headrace.audio("/data/speech", batch=32, samples=16000, rate_hz=16000)
        for samples, labels in loader:     # float32 (32, 1, 16000), int64 (32,)
            ...

    Args:
        data: a folder of audio files (WAV, FLAC, OGG, MP3, ... ; labels by first-level folder
            when every file sits in one) or a store packed with
            ``headrace._sources.media.pack_media`` (path or ``Store``).
        batch: files per batch.
        samples: output length per channel: longer audio is truncated (its head is kept),
            shorter audio is zero-padded at the end.
        channels: ``1`` mixes down (channel mean); ``k > 1`` keeps files with ``k`` channels
            and duplicates mono files; other channel counts are decode errors.
        rate_hz: resample every file to this rate (polyphase FIR, scipy's resample_poly);
            ``None`` keeps each file's own rate (see ``sample_rates_hz`` in ``as_dict`` batches).
        on_decode_error: ``"error"`` raises :class:`~headrace.DecodeError` naming the record and
            path; ``"skip"`` drops the file (the batch is shorter) and counts it.
        shuffle, order, seed, epoch, epochs, drop_last: as in :class:`headrace.Loader`.
        as_dict: yield ``{"samples", "labels", "sample_rates_hz", "ids"}`` instead of a tuple.
        to_torch: torch tensors instead of NumPy arrays (torch is imported only then).
        labels: ``True``/``False``/``None`` (auto) labels by first-level folder (raw folders).
        recursive: raw folders: read subfolders too (mx8's default); ``False`` reads only the
            files directly in ``data``.
        threads, inflight, ram_gb, queue, prefetch, profile, constraints, runtime, rank,
            world_size, tail, resume, tune: as in :class:`headrace.Loader` (rank and world size
            from the launcher unless given).
        timeline: record a stats timeline (``True``: a snapshot every 0.5 s; a number: the
            period in seconds) for ``stats_timeline()`` and ``headrace.plot``.
        transform: ``fn(batch, ids) -> batch``, run in the loader's threads on each batch as it
            would be yielded (``ids``: its record ids); the loader yields what it returns.
        batch_bytes, target_bytes: byte-aware batches (as :class:`headrace.Loader`), counted
            over the encoded files as mx8 does; ``batch`` stays the most files per batch.
    """
    loader_kw = {k: v for k, v in locals().items() if k in INNER_LOADER_KEYWORDS}
    return AudioLoader(data, batch=batch, samples=samples, channels=channels, rate_hz=rate_hz,
                       on_decode_error=on_decode_error, order=resolve_order(order, shuffle),
                       seed=seed,
                       epoch=epoch, epochs=epochs, drop_last=drop_last, as_dict=as_dict,
                       to_torch=to_torch, labels=labels, loader_kw=loader_kw, resume=resume,
                       timeline=timeline, transform=transform,
                       recursive=recursive)
