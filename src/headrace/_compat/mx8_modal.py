"""``headrace.mx8.text`` / ``audio`` / ``video``: mx8 1.0.7's media loaders over headrace's.

Each takes mx8's keywords and builds headrace's own loader of that kind (text: documents
tokenized in the loader's threads and cut into padded rows, mx8's way; audio: decoded and cut or
padded to ``samples``; video: clips decoded by PyAV), then yields mx8's batch classes
(``TextBatch``, ``AudioBatch``, ``VideoBatch``). mx8's record-range and byte-aware keywords
(``start``/``end``, ``batch_bytes``/``target_bytes``) reach the engine as they do for ``load``:
they count documents or files.
"""

from __future__ import annotations

import math
import os
from typing import Any

from headrace._base.errors import CheckpointError, ConfigError
from headrace._compat import mx8_token as mx8_tokens
from headrace._compat.mx8 import (
    _common,
    _distributed,
    _drop_unused_store,
    _mx8_stats,
    _resume_mx8,
    _tune,
    _Wrapped,
)
from headrace._compat.mx8_batch import AudioBatch, TextBatch, VideoBatch

__all__ = ["AudioLoader", "TextLoader", "VideoDataLoader", "audio", "text", "video"]

_GPT2 = "gpt2"


def _engine_kw(where: str, *, store: Any, manifest: Any, recursive: bool, batch: int,
               inflight: Any, queue: Any, prefetch: Any, target_bytes: Any, batch_bytes: Any,
               start: Any, end: Any, resume: Any, job: Any, coord: Any, node: Any, ram_gb: Any,
               profile: Any, tune: Any, constraints: Any, runtime: Any) -> dict[str, Any]:
    """mx8's shared loader keywords as headrace ``Loader`` keywords (plus ``store``/``recursive``
    for the source opener)."""
    kw = _common(store, manifest, recursive, batch, inflight, queue, prefetch, start, end, resume,
                 ram_gb, profile, constraints, runtime)
    kw["tune"] = _tune(tune)
    kw.update(_distributed(job, coord, node, where))
    kw["batch_bytes"], kw["target_bytes"] = batch_bytes, target_bytes
    if (kw["start"] is None) != (kw["end"] is None):
        raise ConfigError("start and end must be set together")
    return kw


def _loader_kw(kw: dict[str, Any]) -> dict[str, Any]:
    """The keywords ``headrace.Loader`` takes, from :func:`_engine_kw`'s result."""
    names = ("inflight", "queue", "prefetch", "start", "end", "ram_gb", "profile", "constraints",
             "runtime", "rank", "world_size", "batch_bytes", "target_bytes", "order", "seed",
             "epoch", "tune")
    return {k: kw[k] for k in names if kw.get(k) is not None}


class TextLoader(_Wrapped):
    """Yields :class:`TextBatch`; built by :func:`text`."""

    def __init__(self, inner: Any, return_mask: bool) -> None:
        self._inner = inner
        self._return_mask = return_mask

    def _convert(self, batch: Any) -> TextBatch:
        return TextBatch(batch)

    @property
    def sequence_length(self) -> int:
        return int(self._inner.sequence_length)

    @property
    def stride(self) -> int:
        return int(self._inner.stride)

    def stats(self) -> dict[str, Any]:
        s = _mx8_stats(self._inner.stats())
        s.update(text_sequence_length=self.sequence_length, text_stride=self.stride,
                 text_return_attention_mask=self._return_mask)
        return s


def text(data: Any, *, store: Any = None, manifest: Any = None, recursive: bool = True,
         batch: int = 32, inflight: int | None = None, queue: int | None = None,
         prefetch: int | None = None, target_bytes: int | None = None,
         batch_bytes: int | None = None, start: int | None = None, end: int | None = None,
         resume: bytes | None = None, job: str | None = None, coord: str | None = None,
         node: str | None = None, ram_gb: float | None = None, profile: str | None = None,
         tune: bool | None = None, constraints: Any = None, runtime: Any = None,
         tokenizer: Any = _GPT2, seq_len: int = 2048, stride: int | None = None,
         add_bos: bool = False, add_eos: bool = True, truncate: str = "right",
         return_mask: bool = True, on_decode_error: str = "error", autopack: bool = False,
         shard_mb: int = 512) -> TextLoader:
    """mx8's ``text``: each record (a file of a folder or pack) is one UTF-8 document, tokenized
    in the loader's threads and cut into rows of ``seq_len`` tokens every ``stride`` (padded with
    the EOS id); ``batch`` counts documents, so a batch has a varying number of rows.

    ``tokenizer``: a ``tokenizer.json`` path, a ``tokenizers.Tokenizer`` or a callable (headrace
    never downloads one: mx8's default ``"gpt2"`` hub name is refused with that fix).
    ``stride`` defaults to ``seq_len`` (mx8's is 2048 whatever ``seq_len``, which skips tokens
    between rows once ``seq_len < 2048``).
    """
    from headrace._modal.text import _stream_loader

    del autopack, shard_mb
    if isinstance(tokenizer, str) and tokenizer == _GPT2 and not os.path.exists(tokenizer):
        raise ConfigError('tokenizer="gpt2" names a Hugging Face hub tokenizer, and headrace '
                          "never downloads one: pass the path of its tokenizer.json (e.g. "
                          "hf_hub_download('gpt2', 'tokenizer.json'), or "
                          "tokenizers.Tokenizer.from_pretrained('gpt2').save(path)) or a "
                          "tokenizers.Tokenizer")
    kw = _engine_kw("text()", store=store, manifest=manifest, recursive=recursive, batch=batch,
                    inflight=inflight, queue=queue, prefetch=prefetch, target_bytes=target_bytes,
                    batch_bytes=batch_bytes, start=start, end=end, resume=resume, job=job,
                    coord=coord, node=node, ram_gb=ram_gb, profile=profile, tune=tune,
                    constraints=constraints, runtime=runtime)
    if isinstance(seq_len, int) and not isinstance(seq_len, bool) and seq_len <= 0:
        raise ConfigError("sequence_length must be > 0")
    if truncate not in ("right", "error"):
        raise ConfigError(f'invalid truncate="{truncate}" (expected: right|error)')
    if on_decode_error not in ("error", "skip"):
        raise ConfigError(f'invalid decode_error_policy="{on_decode_error}" (expected: '
                          "error|skip)")
    loader_kw = {"order": "sequential", "seed": 0, "epoch": 0, "epochs": 1, "tail": None,
                 "drop_last": False, "threads": None, "close_source": False,
                 "resume": kw["resume"], **_loader_kw(kw)}
    _drop_unused_store(data, kw)
    options = {"store": kw["store"]} if "store" in kw else {}
    try:
        inner = _stream_loader(data, batch=kw["batch"], tokenizer=tokenizer, seq_len=seq_len,
                               stride=seq_len if stride is None else stride, add_bos=add_bos,
                               add_eos=add_eos, truncate=truncate, return_mask=return_mask,
                               on_decode_error=on_decode_error, packing="pad", drop_last=False,
                               ids=(None, None, None), text_key="text", recursive=recursive,
                               to_torch=False, loader_kw=loader_kw, options=options,
                               timeline_s=None)
    except ConfigError as e:
        special = next((w for w in ("BOS", "EOS") if f"no known {w} token id" in str(e)), None)
        if special is None:
            raise
        flag = "add_bos" if special == "BOS" else "add_eos"
        raise ConfigError(f"{flag}=True but tokenizer has no known {special} token id; pass "
                          f"{flag}=False, or a tokenizer with one of mx8's {special} tokens "
                          "(headrace.text takes bos_id=/eos_id= too)") from None
    return TextLoader(_resume_mx8(inner, kw["mx8_token"]), bool(return_mask))


class AudioLoader(_Wrapped):
    """Yields :class:`AudioBatch`; built by :func:`audio`."""

    def __init__(self, inner: Any, rate_hz: int | None) -> None:
        self._inner = inner
        self._rate_hz = rate_hz

    def _convert(self, batch: Any) -> AudioBatch:
        return AudioBatch(batch)

    @property
    def sample_count(self) -> int:
        return int(self._inner.sample_count)

    @property
    def channels(self) -> int:
        return int(self._inner.channels)

    @property
    def sample_rate_hz(self) -> int | None:
        """The ``rate_hz`` asked for (``None``: each file keeps its own, as in mx8)."""
        return self._rate_hz

    def stats(self) -> dict[str, Any]:
        s = _mx8_stats(self._inner.stats())
        s["audio_expected_sample_rate_hz"] = self._rate_hz
        return s


def audio(data: Any, *, store: Any = None, manifest: Any = None, recursive: bool = True,
          batch: int = 32, inflight: int | None = None, queue: int | None = None,
          prefetch: int | None = None, target_bytes: int | None = None,
          batch_bytes: int | None = None, start: int | None = None, end: int | None = None,
          resume: bytes | None = None, job: str | None = None, coord: str | None = None,
          node: str | None = None, ram_gb: float | None = None, profile: str | None = None,
          tune: bool | None = None, constraints: Any = None, runtime: Any = None,
          samples: int = 16000, channels: int = 1, rate_hz: int | None = None,
          on_decode_error: str = "error", autopack: bool = False,
          shard_mb: int = 512) -> AudioLoader:
    """mx8's ``audio``: ``AudioBatch(samples float32[B, samples], sample_rates_hz,
    sample_ids)``, each file cut or zero-padded to ``samples``. Unlike mx8, ``rate_hz`` resamples
    a file of another rate (mx8 raises), any format PyAV/soundfile reads is accepted (mx8: WAV
    and FLAC), and ``channels > 1`` keeps that many channels (``samples`` is then
    ``[B, channels, samples]``; mx8 is mono only)."""
    from headrace._modal.audio import AudioLoader as Inner

    del autopack, shard_mb
    kw = _engine_kw("audio()", store=store, manifest=manifest, recursive=recursive, batch=batch,
                    inflight=inflight, queue=queue, prefetch=prefetch, target_bytes=target_bytes,
                    batch_bytes=batch_bytes, start=start, end=end, resume=resume, job=job,
                    coord=coord, node=node, ram_gb=ram_gb, profile=profile, tune=tune,
                    constraints=constraints, runtime=runtime)
    if on_decode_error not in ("error", "skip"):
        raise ConfigError(f'invalid decode_error_policy="{on_decode_error}" (expected: '
                          "error|skip)")
    loader_kw = _loader_kw(kw)
    order: dict[str, Any] = {"order": "sequential", "seed": 0, "epoch": 0}
    order.update({k: loader_kw.pop(k) for k in list(order) if k in loader_kw})
    inner = Inner(data, batch=kw["batch"], samples=samples,
                  channels=channels, rate_hz=rate_hz, on_decode_error=on_decode_error,
                  **order, epochs=1, drop_last=False, as_dict=True,
                  to_torch=False, labels=None, loader_kw=loader_kw, resume=kw["resume"],
                  recursive=recursive)
    return AudioLoader(_resume_mx8(inner, kw["mx8_token"]), rate_hz)


class VideoDataLoader(_Wrapped):
    """Yields :class:`VideoBatch`; built by :func:`video`."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def _convert(self, batch: Any) -> VideoBatch:
        files = self._inner.files
        return VideoBatch(batch, [files.path(int(v)) for v in batch["video_ids"].tolist()])

    @property
    def clip_count(self) -> int:
        return int(self._inner.clip_count)

    def stats(self) -> dict[str, Any]:
        """headrace's video stats plus mx8's ``video_*`` names for what is measured here (the
        layout facts, clip geometry and counts, delivered and decode counters; mx8's GPU,
        backend-fallback and S3-range keys have no counterpart: PyAV decodes on the CPU)."""
        s = _mx8_stats(self._inner.stats())
        h, w = int(s.get("video_frame_height", 0)), int(s.get("video_frame_width", 0))
        decoded = int(s.get("video_clips_decoded_total", 0))
        failed = int(s.get("video_decode_failures_total", 0))
        s.update(video_layout="thwc", video_dtype="u8", video_channels=3,
                 video_decode_backend="pyav", video_stride_t=h * w * 3, video_stride_h=w * 3,
                 video_stride_w=3, video_stride_c=1,
                 bytes_per_clip=s.get("video_bytes_per_clip"),
                 clips_total=s.get("video_clip_count"),
                 video_delivered_batches_total=s.get("delivered_batches_total", 0),
                 video_delivered_samples_total=s.get("delivered_samples_total", 0),
                 video_delivered_bytes_total=s.get("delivered_bytes_total", 0),
                 video_decode_attempted_clips_total=decoded + failed,
                 video_decode_succeeded_clips_total=decoded, video_decode_failed_total=failed)
        for kind in ("corrupt_media", "short_media", "unsupported_codec", "missing_stream"):
            if f"video_{kind}_total" in s:
                s[f"video_decode_failed_{kind}_total"] = s[f"video_{kind}_total"]
        return s

    @property
    def frames_per_clip(self) -> int:
        return int(self._inner.frames_per_clip)


def video(data: Any, *, store: Any = None, manifest: Any = None, recursive: bool = True,
          clip: int = 16, stride: int = 8, fps: Any = 8, batch: int = 32, seed: int = 0,
          epoch: int = 0, resume: bytes | None = None, job: str | None = None,
          coord: str | None = None, ram_gb: float | None = None, profile: str | None = None,
          tune: bool | None = None, constraints: Any = None, runtime: Any = None,
          node: str | None = None) -> VideoDataLoader:
    """mx8's ``video``: ``VideoBatch`` of ``clip`` RGB frames (``THWC`` uint8) every ``stride``
    frames of each video resampled to ``fps``, decoded by PyAV (no ffmpeg binary). A dataset with
    no usable clip raises ``ConfigError`` naming the failure counts (mx8 ends silently)."""
    import headrace

    if manifest is not None or os.environ.get("MX8_DEV_MANIFEST_PATH"):
        raise ConfigError("mx8 dev manifests (manifest=/MX8_DEV_MANIFEST_PATH) are not read by "
                          "headrace: point at the folder of videos itself")
    del store  # a folder of videos is read directly; no manifest snapshot is taken
    if mx8_tokens.parse(resume) is not None:  # other mx8 kinds raise there, saying why
        raise CheckpointError("unsupported checkpoint kind data_loader: an mx8 data_loader "
                              "token resumes load/image/text/audio, not a video loader")
    if isinstance(fps, int | float) and not isinstance(fps, bool) and (
            not math.isfinite(fps) or fps <= 0):
        raise ConfigError(f"video fps must be > 0, got {fps!r}")
    extra: dict[str, Any] = {"seed": seed, "epoch": epoch,
                             **_distributed(job, coord, node, "video()")}
    inner = headrace.video(data, clip=clip, stride=stride, fps=fps, batch=batch, resume=resume, ram_gb=ram_gb, profile=profile,
                           constraints=constraints, runtime=runtime, recursive=recursive,
                           tune=_tune(tune), **extra)
    return VideoDataLoader(inner)
