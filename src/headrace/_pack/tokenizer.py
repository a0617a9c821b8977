"""Tokenizer adapters: one interface over a byte-level default, Hugging Face ``tokenizers`` and
any callable ``str -> ids``.

Everything here works offline: headrace never downloads a tokenizer (mx8's default ``"gpt2"`` is
fetched from the hub at run time; here a hub name is refused with the fix: pass the path of the
``tokenizer.json``). ``tokenizers`` is imported only when a Hugging Face tokenizer is used.

Special ids (BOS/EOS/PAD) are looked up the way mx8 1.0.7 does: BOS among ``<|bos|> <bos> <s>
[BOS] <|startoftext|>``, EOS among ``<|endoftext|> <|eos|> <eos> [EOS]``; PAD among ``<pad> [PAD]
<|pad|>``. A callable may carry ``bos_id``/``eos_id``/``pad_id`` (or transformers'
``bos_token_id``...) attributes.

The identity of a tokenizer (``name`` plus ``sha256`` of its full config/vocabulary) is written into
a packed store's attrs, so a loader can refuse tokens made by another tokenizer.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from headrace._base.errors import ConfigError

__all__ = ["BOS_NAMES", "EOS_NAMES", "PAD_NAMES", "ByteTokenizer", "TextTokenizer",
           "as_tokenizer"]

BOS_NAMES = ("<|bos|>", "<bos>", "<s>", "[BOS]", "<|startoftext|>")
EOS_NAMES = ("<|endoftext|>", "<|eos|>", "<eos>", "[EOS]")
PAD_NAMES = ("<pad>", "[PAD]", "<|pad|>")


class TextTokenizer:
    """What headrace needs from a tokenizer: batch encoding, special ids and an identity.

    Attributes:
        name: a readable name (``"bytes"``, a tokenizer.json file name, a callable's qualname).
        sha256: hash of the full configuration/vocabulary, ``None`` when unknowable (callables).
        bos_id, eos_id, pad_id: special token ids, ``None`` when the tokenizer has none.
        vocab_size: number of ids, ``None`` when unknown.
    """

    name: str = "?"
    sha256: str | None = None
    bos_id: int | None = None
    eos_id: int | None = None
    pad_id: int | None = None
    vocab_size: int | None = None

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Token ids (int32 arrays), one per text, no special tokens added."""
        raise NotImplementedError

    def identity(self) -> dict[str, Any]:
        """JSON-able description stored in a packed store's attrs."""
        return {"tokenizer": self.name, "tokenizer_sha256": self.sha256,
                "bos_id": self.bos_id, "eos_id": self.eos_id, "pad_id": self.pad_id,
                "vocab_size": self.vocab_size}

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.name!r}, bos={self.bos_id}, eos={self.eos_id}, "
                f"pad={self.pad_id})")


class ByteTokenizer(TextTokenizer):
    """The offline default: UTF-8 bytes are ids 0..255; BOS=256, EOS=257, PAD=258."""

    name = "bytes"
    bos_id = 256
    eos_id = 257
    pad_id = 258
    vocab_size = 259
    sha256 = hashlib.sha256(b"headrace byte-level tokenizer v1: utf-8 bytes, bos 256, eos 257, "
                            b"pad 258").hexdigest()

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [np.frombuffer(t.encode("utf-8"), np.uint8).astype(np.int32) for t in texts]

    @staticmethod
    def decode(ids: Any) -> str:
        """Ids back to text (special ids dropped); invalid UTF-8 becomes U+FFFD."""
        a = np.asarray(ids)
        return a[a < 256].astype(np.uint8).tobytes().decode("utf-8", errors="replace")


class HFTokenizer(TextTokenizer):
    """A Hugging Face ``tokenizers.Tokenizer``; encodes batches in Rust threads."""

    def __init__(self, tok: Any, *, name: str | None = None) -> None:
        self.tok = tok
        config = tok.to_str()
        self.sha256 = hashlib.sha256(config.encode()).hexdigest()
        self.name = name or f"tokenizers.{type(tok.model).__name__}"
        self.bos_id = _lookup(tok, BOS_NAMES)
        self.eos_id = _lookup(tok, EOS_NAMES)
        self.pad_id = _lookup(tok, PAD_NAMES)
        self.vocab_size = int(tok.get_vocab_size(with_added_tokens=True))

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        encs = self.tok.encode_batch(list(texts), add_special_tokens=False)
        return [np.asarray(e.ids, np.int32) for e in encs]


def _lookup(tok: Any, names: Sequence[str]) -> int | None:
    for n in names:
        i = tok.token_to_id(n)
        if i is not None:
            return int(i)
    return None


class CallableTokenizer(TextTokenizer):
    """Any ``fn(str) -> ids`` (a list, an array, or a mapping with ``input_ids``)."""

    def __init__(self, fn: Callable[[str], Any]) -> None:
        self.fn = fn
        self.name = "callable:" + (getattr(fn, "__module__", None) or "?") + "." + (
            getattr(fn, "__qualname__", None) or type(fn).__qualname__)
        self.sha256 = getattr(fn, "sha256", None)
        for ours, theirs in (("bos_id", "bos_token_id"), ("eos_id", "eos_token_id"),
                             ("pad_id", "pad_token_id")):
            v = getattr(fn, ours, None)
            if v is None:
                v = getattr(fn, theirs, None)
            setattr(self, ours, None if v is None else int(v))
        vs = getattr(fn, "vocab_size", None)
        self.vocab_size = vs if isinstance(vs, int) else None

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        out = []
        for t in texts:
            ids = self.fn(t)
            if isinstance(ids, Mapping):
                ids = ids["input_ids"]
            arr = np.asarray(ids)
            if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
                raise ConfigError(f"tokenizer {self.name} returned {type(ids).__name__} of shape "
                                  f"{arr.shape} and dtype {arr.dtype}; it must return a 1-D "
                                  "sequence of int ids")
            if arr.size and (int(arr.min()) < 0 or int(arr.max()) > np.iinfo(np.int32).max):
                raise ConfigError(f"tokenizer {self.name} returned ids outside int32 range")
            out.append(arr.astype(np.int32, copy=False))
        return out


def as_tokenizer(tokenizer: Any = None) -> TextTokenizer:
    """Turns what a user passed into a :class:`TextTokenizer`.

    Args:
        tokenizer: ``None`` or ``"bytes"`` (the byte-level default), a path to a
            ``tokenizer.json``, a ``tokenizers.Tokenizer``, a :class:`TextTokenizer`, or any
            callable ``str -> ids``.

    Raises:
        ConfigError: a string that is neither ``"bytes"`` nor an existing file (e.g. a hub name).
    """
    if tokenizer is None:
        return ByteTokenizer()
    if isinstance(tokenizer, TextTokenizer):
        return tokenizer
    if isinstance(tokenizer, str | os.PathLike):
        path = os.fspath(tokenizer)
        if path in ("bytes", "byte"):
            return ByteTokenizer()
        if not os.path.isfile(path):
            raise ConfigError(
                f"tokenizer={path!r} is not a file; headrace never downloads tokenizers: pass "
                "the path of a tokenizer.json (e.g. saved with tokenizers' Tokenizer.save), a "
                "tokenizers.Tokenizer, any callable str -> ids, or None for byte-level ids")
        from tokenizers import Tokenizer

        return HFTokenizer(Tokenizer.from_file(path), name=os.path.basename(path))
    if hasattr(tokenizer, "encode_batch") and hasattr(tokenizer, "to_str") and hasattr(
            tokenizer, "token_to_id"):
        return HFTokenizer(tokenizer)
    if callable(tokenizer):
        return CallableTokenizer(tokenizer)
    raise ConfigError(f"tokenizer={tokenizer!r} is not a tokenizer; pass None (bytes), a "
                      "tokenizer.json path, a tokenizers.Tokenizer or a callable str -> ids")
