"""A flat token array as a loader source: windows of ``seq_len`` tokens, as nanoGPT reads them.

nanoGPT (and most GPT-style repos) keep a corpus as one flat array of token ids: ``train.bin``
written by ``arr.tofile()`` (``uint16`` for GPT-2's 50257 ids), a ``.npy`` file, or an array in
memory. :func:`open_tokens` maps it read-only (never read whole); :class:`TokenWindows` makes its
windows the loader's records. Window ``w`` is ``tokens[w * stride : w * stride + span]``, and
only full windows exist (a flat stream has no documents to pad). With ``stride=1`` every offset
is a window: under ``order="iid"`` that is nanoGPT's ``get_batch`` (random offsets drawn with
replacement), under ``order="shuffle"`` the same without replacement.

:func:`rows_out` shapes a gathered ``(n, span)`` block into what a training step wants: the
token dtype (``int64`` for ``torch.nn.functional.cross_entropy``) and, with ``targets=True``,
``inputs``/``targets`` shifted by one, each its own C-contiguous array (slices of one array are
views that ``.view(-1)`` refuses).
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import numpy as np

from headrace._base.errors import ConfigError, RecordIndexError

__all__ = ["TokenWindows", "is_token_array", "open_tokens", "out_dtype", "rows_out"]

_RAW_SUFFIXES = (".bin", ".u16", ".u32", ".tok", ".tokens")
_SAMPLE_BYTES = 1 << 16  # per sampled block of the content fingerprint
_SAMPLES = 16


def is_token_array(data: Any) -> bool:
    """A 1-D integer ndarray/memmap, a ``.npy`` file or a raw ``.bin`` token file."""
    if isinstance(data, np.ndarray):
        return True
    if isinstance(data, str | os.PathLike):
        p = os.fspath(data)
        return os.path.isfile(p) and p.lower().endswith((".npy", *_RAW_SUFFIXES))
    return False


def open_tokens(data: Any, dtype: Any = None) -> np.ndarray:
    """The 1-D token array of ``data``, mapped read-only for files."""
    if isinstance(data, np.ndarray):
        arr = data
        name = f"the array of shape {arr.shape}"
    else:
        p = os.fspath(data)
        name = p
        if p.lower().endswith(".npy"):
            arr = np.load(p, mmap_mode="r")
        else:
            if dtype is None:
                raise ConfigError(
                    f"{p} is a raw token file (no header says its dtype): pass dtype=, e.g. "
                    f"text({os.path.basename(p)!r}, dtype='uint16', seq_len=...) for nanoGPT's "
                    "GPT-2 tokens (uint32 for vocabularies over 65536)")
            dt = _int_dtype(dtype)
            size = os.path.getsize(p)
            if size % dt.itemsize:
                raise ConfigError(f"{p} holds {size} bytes, not a whole number of {dt.name} "
                                  f"tokens ({dt.itemsize} bytes each): check dtype=")
            if size == 0:
                raise ConfigError(f"{p} is empty: there are no tokens to load")
            arr = np.memmap(p, dtype=dt, mode="r")
    if dtype is not None and arr.dtype != _int_dtype(dtype) and isinstance(data, np.ndarray):
        raise ConfigError(f"dtype={np.dtype(dtype).name!r} but {name} is {arr.dtype.name}; drop "
                          "dtype= (an array carries its own)")
    if arr.ndim != 1:
        raise ConfigError(f"{name} has shape {arr.shape}: a token array is one flat 1-D stream "
                          "(documents separated by an EOS id); pass arr.reshape(-1)")
    if arr.dtype.kind not in "iu":
        raise ConfigError(f"{name} is {arr.dtype.name}: token ids must be integers "
                          "(uint16, int32, ...)")
    return arr


def _int_dtype(dtype: Any) -> np.dtype[Any]:
    try:
        dt = np.dtype(dtype)
    except TypeError as e:
        raise ConfigError(f"dtype={dtype!r} is not a NumPy dtype; use e.g. 'uint16'") from e
    if dt.kind not in "iu":
        raise ConfigError(f"dtype={dt.name!r}: token ids are integers (uint16, int32, ...)")
    return dt


def out_dtype(tokens_dtype: Any) -> np.dtype[Any]:
    dt = np.dtype(tokens_dtype)
    if dt not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise ConfigError(f"tokens_dtype={tokens_dtype!r} must be 'int32' or 'int64' (what "
                          "torch's cross_entropy wants for targets)")
    return dt


def rows_out(rows: np.ndarray, mask: np.ndarray | None, *, targets: bool,
             dtype: np.dtype[Any]) -> dict[str, Any]:
    """``{"tokens", "mask"}`` or, with ``targets``, ``{"inputs", "targets", "mask"}`` (``mask``
    of the targets), each C-contiguous in ``dtype``."""
    if not targets:
        tok = rows if rows.dtype == dtype else rows.astype(dtype)
        return {"tokens": tok, "mask": mask}
    inputs = np.ascontiguousarray(rows[:, :-1], dtype=dtype)
    tgt = np.ascontiguousarray(rows[:, 1:], dtype=dtype)
    return {"inputs": inputs, "targets": tgt,
            "mask": None if mask is None else np.ascontiguousarray(mask[:, 1:])}


class TokenWindows:
    """Windows of a flat token array as loader records (thread-safe: read-only state)."""

    packing = "flat"

    def __init__(self, tokens: np.ndarray, *, span: int, stride: int, targets: bool,
                 dtype: np.dtype[Any], name: str) -> None:
        self.tokens = tokens
        self.span = span
        self.stride = stride
        self.targets = targets
        self.dtype = dtype
        self.name = name
        n = len(tokens)
        if n < span:
            raise ConfigError(f"{name} holds {n} tokens, fewer than one window of {span} "
                              f"(seq_len{' + 1 with targets=True' if targets else ''}); use a "
                              "smaller seq_len")
        self.windows = (n - span) // stride + 1
        self.total_tokens = n
        self._offsets = np.arange(span, dtype=np.int64)
        self._fingerprint = _fingerprint(tokens, span, stride)

    def __len__(self) -> int:
        return self.windows

    @property
    def fingerprint(self) -> str:
        return self._fingerprint

    def nbytes(self, ids: np.ndarray) -> int:
        per = self.span * self.dtype.itemsize * (2 if self.targets else 1) + 8
        return len(ids) * per

    def gather(self, ids: np.ndarray) -> dict[str, Any]:
        ids = np.asarray(ids, np.int64)
        if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= self.windows):
            bad = int(ids[(ids < 0) | (ids >= self.windows)][0])
            raise RecordIndexError(f"window id {bad} is out of range for {self.windows} windows")
        starts = ids * self.stride
        if self.stride >= self.span or len(ids) < 2:
            rows = np.empty((len(ids), self.span), self.tokens.dtype)
            for r, s in enumerate(starts.tolist()):  # one memcpy per row beats fancy indexing
                rows[r] = self.tokens[s:s + self.span]
        else:
            rows = self.tokens[starts[:, None] + self._offsets[None, :]]
        out = rows_out(rows, None, targets=self.targets, dtype=self.dtype)
        out["offsets"] = starts
        return out

    def close(self) -> None:
        pass


def _fingerprint(tokens: np.ndarray, span: int, stride: int) -> str:
    """Length, dtype, window geometry and a hash of sampled blocks of the content (first, last
    and 14 spread between): cheap at open on a multi-GB file, and a different corpus of the same
    length is refused on resume."""
    h = hashlib.sha256(f"tokens:{tokens.dtype.str}:{len(tokens)}:{span}:{stride}".encode())
    raw = tokens.view(np.uint8) if tokens.flags.c_contiguous else None
    if raw is None:
        raw = np.ascontiguousarray(tokens).view(np.uint8)
    n = len(raw)
    step = max(1, (n - _SAMPLE_BYTES) // (_SAMPLES - 1)) if n > _SAMPLE_BYTES else n
    for i in range(_SAMPLES):
        a = min(i * step, max(0, n - _SAMPLE_BYTES))
        h.update(raw[a:a + _SAMPLE_BYTES].tobytes())
        if n <= _SAMPLE_BYTES:
            break
    return h.hexdigest()[:32]
