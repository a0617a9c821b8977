"""mx8 1.0.7's batch classes (``PyBatch``, ``TextBatch``, ``AudioBatch``, ``VideoBatch``) built
from a headrace batch dict: same attribute names, dtypes and shapes, no second copy of the data
where mx8 itself hands out tensors (the arrays are wrapped, not copied)."""

from __future__ import annotations

from typing import Any

import numpy as np

from headrace._base.errors import ConfigError

__all__ = ["AudioBatch", "PyBatch", "TextBatch", "VideoBatch", "payload_field"]


def payload_field(batch: dict[str, Any]) -> str:
    """The field holding each record's raw bytes: ``image``/``bytes`` (mx8 packs, folders, raw
    links), else the first variable-size field."""
    for name in ("image", "bytes"):
        if name in batch and isinstance(batch[name], tuple):
            return name
    for name, value in batch.items():
        if isinstance(value, tuple):  # headrace.Ragged is a (values, offsets) tuple
            return name
    raise ConfigError(f"this data has no variable-size field to serve as mx8's payload (fields: "
                      f"{sorted(batch)}); use headrace.load() for fixed-shape records")


class PyBatch:
    """Raw records: ``payload`` (their bytes, concatenated), ``offsets`` (n+1), ``sample_ids``,
    ``label_ids`` (``None`` when the data has no labels)."""

    __slots__ = ("_ids", "_labels", "_offsets", "_values")

    def __init__(self, values: np.ndarray, offsets: np.ndarray, ids: np.ndarray,
                 labels: np.ndarray | None) -> None:
        self._values = values
        self._offsets = np.asarray(offsets, np.int64)
        self._ids = np.asarray(ids, np.int64)
        self._labels = labels

    @classmethod
    def from_batch(cls, batch: dict[str, Any], ids: np.ndarray) -> PyBatch:
        values, offsets = batch[payload_field(batch)]
        labels = batch.get("label")
        if labels is not None:
            labels = np.asarray(labels, np.int64)
            if labels.ndim != 1 or (len(labels) and labels.min() < 0):
                labels = None  # -1 marks a record without an ImageFolder label hint
        return cls(np.asarray(values, np.uint8).reshape(-1), offsets, np.array(ids), labels)

    @property
    def payload(self) -> bytes:
        return self._values.tobytes()

    @property
    def offsets(self) -> list[int]:
        return self._offsets.tolist()

    @property
    def sample_ids(self) -> list[int]:
        return self._ids.tolist()

    @property
    def label_ids(self) -> list[int] | None:
        return None if self._labels is None else self._labels.tolist()

    def to_torch(self) -> tuple[Any, Any, Any]:
        """``(payload uint8[total_bytes], offsets int64[n+1], sample_ids int64[n])``."""
        import torch

        return (torch.from_numpy(np.array(self._values, np.uint8)),
                torch.from_numpy(self._offsets.copy()), torch.from_numpy(self._ids.copy()))

    def to_torch_with_labels(self) -> tuple[Any, Any, Any, Any]:
        """``to_torch()`` plus ``labels int64[n]``."""
        import torch

        if self._labels is None:
            raise ConfigError("batch has no label_ids (expected mx8:vision:imagefolder label hints "
                              "in manifest, or a store/folder with labels)")
        return (*self.to_torch(), torch.from_numpy(self._labels.copy()))

    def __len__(self) -> int:
        return len(self._ids)

    def __repr__(self) -> str:
        return f"PyBatch(samples={len(self._ids)}, payload_bytes={len(self._values)})"


def _torch(a: Any, dtype: Any = None) -> Any:
    import torch

    t = a if isinstance(a, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(a))
    return t if dtype is None else t.to(dtype)


class TextBatch:
    """``token_ids`` int64 ``[rows, seq_len]``, ``attention_mask`` bool (or ``None``),
    ``sample_ids`` int64 ``[rows]`` (the document of each row): torch tensors."""

    def __init__(self, batch: dict[str, Any]) -> None:
        import torch

        self.token_ids = _torch(batch["tokens"], torch.int64)
        mask = batch.get("mask")
        self.attention_mask = None if mask is None else _torch(mask, torch.bool)
        self.sample_ids = _torch(batch["doc_ids"], torch.int64)

    def to_torch(self) -> tuple[Any, ...]:
        """``(token_ids, attention_mask, sample_ids)``; ``(token_ids, sample_ids)`` without a
        mask (``return_mask=False``), as mx8."""
        if self.attention_mask is None:
            return self.token_ids, self.sample_ids
        return self.token_ids, self.attention_mask, self.sample_ids


class AudioBatch:
    """``samples`` float32 ``[B, samples]``, ``sample_rates_hz`` and ``sample_ids`` int64
    ``[B]``: torch tensors."""

    def __init__(self, batch: dict[str, Any]) -> None:
        import torch

        samples = batch["samples"]
        if getattr(samples, "ndim", 2) == 3:  # (B, channels=1, samples) -> mx8's mono (B, samples)
            samples = samples[:, 0]
        self.samples = _torch(samples, torch.float32)
        self.sample_rates_hz = _torch(batch["sample_rates_hz"], torch.int64)
        self.sample_ids = _torch(batch["ids"], torch.int64)

    def to_torch(self) -> tuple[Any, Any, Any]:
        return self.samples, self.sample_rates_hz, self.sample_ids


class VideoBatch:
    """Decoded clips as mx8 describes them: one ``payload`` of ``uint8`` RGB frames in ``THWC``
    layout per clip, ``offsets`` into it, the geometry fields, and ``to_torch()`` ->
    ``uint8[B, T, H, W, C]``."""

    def __init__(self, batch: dict[str, Any], uris: list[str]) -> None:
        frames = np.ascontiguousarray(batch["frames"])
        b, t, h, w, c = frames.shape
        self._frames = frames
        self.sample_ids = np.asarray(batch["video_ids"], np.int64).tolist()
        self.clip_ids = np.asarray(batch["clip_ids"], np.int64).tolist()
        self.clip_starts = np.asarray(batch["start_s"], np.float64).tolist()
        self.media_uris = uris
        self.frames_per_clip, self.frame_height, self.frame_width, self.channels = t, h, w, c
        self.layout = "thwc"
        self.dtype = "u8"
        self.colorspace = "rgb24"
        self.strides = [s // frames.itemsize for s in frames.strides[1:]]
        clip_bytes = t * h * w * c
        self.offsets = [i * clip_bytes for i in range(b + 1)]

    @property
    def payload(self) -> bytes:
        return self._frames.tobytes()

    def to_torch(self) -> Any:
        return _torch(self._frames)
