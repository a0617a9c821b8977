"""``headrace.text``: fixed-shape token windows from a packed token store.

The *window space* is a :class:`~headrace._sources.base.Source` whose records are windows (rows), handed
to :class:`headrace.Loader`: shuffling (a keyed bijection over window ids), resume, epochs and rank
sharding are the loader's, and the window list is never materialized. Every window is a half-open
range ``[a, b)`` of the *block stream*: the documents in record order, each as a block
``[BOS] tokens [EOS]`` (BOS/EOS as asked). A cumulative-length array over the blocks (N + 1 int64)
maps stream offsets to (document, offset).

* ``packing="concat"``: window ``w`` is ``[w*stride, w*stride + seq_len)`` of the whole stream,
  across document boundaries.
* ``packing="pad"`` (mx8's text loader): each block is cut on its own into rows starting every
  ``stride`` tokens.

In both, windows start every ``stride`` tokens and stop with the first window that reaches the end
(of the stream, or of the block): a sequence of ``L`` tokens gives
``min(ceil(L / stride), 1 + ceil(max(L - seq_len, 0) / stride))`` windows (mx8's rule, observed).
``stride < seq_len`` overlaps windows, ``stride > seq_len`` skips the tokens between them. A
window shorter than ``seq_len`` is padded with ``pad_id`` (default: the EOS id, as mx8) and its
mask is False there; ``drop_last=True`` drops the concat stream's partial last window (and, as on
every loader, an incomplete last batch).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import threading
import weakref
from functools import partial
from typing import Any

import numpy as np

from headrace._base.errors import (
    CheckpointError,
    ConfigError,
    DecodeError,
    LoaderError,
    RecordIndexError,
)
from headrace._engine.history import delivered, token_at, tracked
from headrace._engine.keywords import keyword_names, refuse_unknown
from headrace._engine.lifecycle import (
    YIELD_KEY,
    EmptyStreak,
    InnerState,
    ThenTransform,
    refuse_empty,
)
from headrace._engine.loader import Loader, resolve_order
from headrace._engine.timeline import TimelineMixin, timeline_period
from headrace._pack.text import TEXT_ATTR, is_mx8_pack, is_store_like, pack_text
from headrace._pack.tokenizer import as_tokenizer
from headrace._sources.tokens import TokenWindows, is_token_array, open_tokens, out_dtype, rows_out
from headrace._store.fingerprint import store_fingerprint
from headrace._store.snapshot import fetch

__all__ = ["TextLoader", "text"]

_PACKINGS = ("concat", "pad")
_TRUNCATE = ("right", "error")
_POLICIES = ("error", "skip")


def window_counts(lengths: np.ndarray, seq_len: int, stride: int, *,
                  full_only: bool = False) -> np.ndarray:
    """Windows over sequences of ``lengths`` tokens (vectorized; see the module docstring)."""
    lengths = np.asarray(lengths, np.int64)
    if full_only:
        return np.where(lengths >= seq_len, (lengths - seq_len) // stride + 1, 0)
    cover = 1 + -(-np.maximum(lengths - seq_len, 0) // stride)
    return np.where(lengths > 0, np.minimum(-(-lengths // stride), cover), 0)


class WindowSource:
    """Windows of a token store as loader records: ``gather(window ids)`` ->
    ``{"tokens": int32 (n, seq_len), "mask": bool (n, seq_len) | None, "doc_ids": int64 (n)}``.

    ``doc_ids`` is the document of each row's first token. Thread-safe (read-only state).
    """

    def __init__(self, store: Any, *, field: str, packing: str, seq_len: int, stride: int,
                 add_bos: bool, add_eos: bool, bos_id: int, eos_id: int, pad_id: int,
                 drop_last: bool, return_mask: bool, truncate: str, targets: bool = False,
                 out_dtype: np.dtype[Any] = np.dtype(np.int32)) -> None:
        self.store = store
        self.targets = targets
        self.out_dtype = out_dtype
        self.field = field
        self.packing = packing
        self.seq_len = seq_len
        self.stride = stride
        self.bos = int(add_bos)
        self.eos = int(add_eos)
        self.bos_id, self.eos_id, self.pad_id = bos_id, eos_id, pad_id
        self.return_mask = return_mask
        spec = store.fields[field]
        self.dtype = np.dtype(spec.dtype)
        n = len(store)
        self._snap = store._st  # the snapshot this source reads (stores refresh only when asked)
        self._raw = spec.codec == "raw"
        self._seen = np.zeros(n, bool)
        self._chunks: dict[int, np.ndarray] = {}
        nbytes = self._snap.fields[field].aux["nbytes"][:n].astype(np.int64)
        self.ntokens = nbytes // self.dtype.itemsize  # tokens per document (N int64)
        blocks = self.ntokens + (self.bos + self.eos)
        self.cum = np.zeros(n + 1, np.int64)  # block stream offsets
        np.cumsum(blocks, out=self.cum[1:])
        if truncate == "error" and n:
            over = np.flatnonzero(blocks > seq_len)
            if len(over):
                d = int(over[0])
                raise ConfigError(f"token sequence too long for sample_id={d} "
                                  f"(tokens={int(blocks[d])} > sequence_length={seq_len}); "
                                  "pass truncate='right' to cut documents into several rows")
        self.total_tokens = int(self.cum[-1])
        self.row_cum: np.ndarray | None = None
        if packing == "concat":
            self.windows = int(window_counts(np.array([self.total_tokens]), seq_len, stride,
                                             full_only=drop_last)[0])
        else:
            self.row_cum = np.zeros(n + 1, np.int64)
            np.cumsum(window_counts(blocks, seq_len, stride), out=self.row_cum[1:])
            self.windows = int(self.row_cum[-1])
        params = json.dumps([packing, seq_len, stride, self.bos, self.eos, bos_id, eos_id,
                             pad_id, drop_last, field])
        self._fingerprint = (f"text:{store_fingerprint(store)}:"
                             f"{hashlib.sha256(params.encode()).hexdigest()[:12]}")

    def __len__(self) -> int:
        return self.windows

    @property
    def fingerprint(self) -> str:
        return self._fingerprint

    def nbytes(self, ids: np.ndarray) -> int:
        per_row = self.seq_len * (4 + (1 if self.return_mask else 0)) + 8
        if self.targets or self.out_dtype != np.int32:  # the shaped copies, beside the rows
            per_row += self.seq_len * self.out_dtype.itemsize * (2 if self.targets else 1)
        return len(ids) * per_row

    def spans(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(a, b, first document)`` of windows ``ids`` in block-stream offsets."""
        ids = np.asarray(ids, np.int64)
        if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= self.windows):
            bad = int(ids[(ids < 0) | (ids >= self.windows)][0])
            raise RecordIndexError(f"window id {bad} is out of range for {self.windows} windows "
                                   f"(valid ids are 0..{self.windows - 1})")
        if self.row_cum is None:
            a = ids * self.stride
            b = np.minimum(a + self.seq_len, self.total_tokens)
            d0 = np.searchsorted(self.cum, a, side="right") - 1
            return a, b, d0
        d = np.searchsorted(self.row_cum, ids, side="right") - 1
        a = self.cum[d] + (ids - self.row_cum[d]) * self.stride
        b = np.minimum(a + self.seq_len, self.cum[d + 1])
        return a, b, d

    def gather(self, ids: np.ndarray) -> dict[str, Any]:
        a, b, d0 = self.spans(ids)
        n, L = len(a), self.seq_len
        d1 = d0
        if self.row_cum is None:
            d1 = np.searchsorted(self.cum, np.maximum(b - 1, a), side="right") - 1
        # The documents each row touches, back to back (a few numpy calls for the whole batch;
        # the per-piece arithmetic below is on Python ints, cheaper than numpy on ~100 items).
        counts = d1 - d0 + 1
        doc = np.repeat(d0 - (np.cumsum(counts) - counts), counts) + np.arange(int(counts.sum()))
        chunk_of, first = self._locate(doc)
        c0 = self.cum[doc].tolist()
        c1 = self.cum[doc + 1].tolist()
        starts = first.tolist()
        bos, eos = self.bos, self.eos
        specials = bos + eos
        bos1 = np.full(1, self.bos_id, np.int32)
        eos1 = np.full(1, self.eos_id, np.int32)
        pads = np.full(L, self.pad_id, np.int32)
        pieces: list[np.ndarray] = []
        put = pieces.append
        i = 0
        for ar, br, cnt in zip(a.tolist(), b.tolist(), counts.tolist(), strict=True):
            for _ in range(cnt):
                s, e = c0[i], c1[i]
                lo = (ar if ar > s else s) - s  # this piece is block offsets [lo, hi)
                hi = (br if br < e else e) - s
                if hi > lo:
                    if bos and lo == 0:
                        put(bos1)
                    t_lo = lo - bos if lo > bos else 0
                    t_hi = hi - bos
                    ntok = e - s - specials
                    if t_hi > ntok:
                        t_hi = ntok
                    if t_hi > t_lo:
                        f = starts[i]
                        put(chunk_of[i][f + t_lo:f + t_hi])
                    if eos and hi == e - s:
                        put(eos1)
                i += 1
            if br - ar < L:
                put(pads[:L - (br - ar)])
        out = np.empty((n, L), np.int32)
        if pieces:
            np.concatenate(pieces, out=out.reshape(-1), casting="unsafe")
        mask = None
        if self.return_mask:
            mask = np.ones((n, L), bool)
            for r, used in zip(np.flatnonzero(b - a < L).tolist(),
                               (b - a)[b - a < L].tolist(), strict=True):
                mask[r, used:] = False  # only partial rows (rare) need a loop
        shaped = rows_out(out, mask, targets=self.targets, dtype=self.out_dtype)
        shaped["doc_ids"] = d0.astype(np.int64)
        return shaped

    def _locate(self, doc: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
        """For each entry of ``doc``: an array holding that document's tokens and the element
        offset where they start in it.

        Raw fields: the committed chunk itself (an mmap), so a piece is a slice, not a copy per
        document. The store checks a document's checksum and index entry the first time this
        source reads it (``Store.views``); later reads go straight to the chunk (committed bytes
        never change within a snapshot, see ``docs/internals.md``). Other codecs decode.
        """
        if not self._raw:
            uniq, inv = np.unique(doc, return_inverse=True)
            views = self.store.views(uniq, self.field)
            arrays = [np.frombuffer(v, self.dtype) for v in views]
            return [arrays[i] for i in inv.tolist()], np.zeros(len(doc), np.int64)
        unseen = ~self._seen[doc]
        if unseen.any():
            new = np.unique(doc[unseen])
            self.store.views(new, self.field)  # verifies bounds and checksums once
            self._seen[new] = True
        cid, off, _ln, _nb, _crc = fetch(self._snap.fields[self.field], doc)
        isz = self.dtype.itemsize
        chunks = self._chunks
        cid[self.ntokens[doc] == 0] = -1  # an empty (absent) record has no chunk
        for c in np.unique(cid).tolist():
            if c not in chunks:
                raw = self._snap.chunks[c] if c >= 0 else np.empty(0, np.uint8)
                chunks[c] = raw[:len(raw) // isz * isz].view(self.dtype)
        out = [chunks[c] for c in cid.tolist()]
        return out, off // isz

    def close(self) -> None:
        pass  # the TextLoader owns the store


class _StreamRows:
    """``stream=True``: the transform that tokenizes raw documents in the loader's threads and
    cuts each into rows, as mx8's text loader does (``packing="pad"`` rows).

    A batch of ``batch`` documents yields a varying number of rows; the checkpoint counts
    documents, so a resumed run skips bad documents the same way: exact resume.
    """

    def __init__(self, tok: Any, *, key: str, seq_len: int, stride: int, add_bos: bool,
                 add_eos: bool, bos_id: int, eos_id: int, pad_id: int, truncate: str,
                 on_decode_error: str, return_mask: bool) -> None:
        self.tok = tok
        self.key = key
        self.seq_len, self.stride = seq_len, stride
        self.head = np.full(int(add_bos), bos_id, np.int32)
        self.tail = np.full(int(add_eos), eos_id, np.int32)
        self.pad_id = pad_id
        self.truncate = truncate
        self.policy = on_decode_error
        self.return_mask = return_mask
        self.skipped = 0
        self._lock = threading.Lock()

    def __call__(self, batch: dict[str, Any], ids: np.ndarray) -> dict[str, Any]:
        texts: list[str] = []
        keep: list[int] = []
        for rid, rec in zip(ids.tolist(), batch[self.key].to_list(), strict=True):
            try:
                texts.append(rec.tobytes().decode("utf-8"))
            except UnicodeDecodeError as e:
                if self.policy == "error":
                    raise DecodeError(f"document {rid} is not valid UTF-8: {e}; pass "
                                      "on_decode_error='skip' to drop such documents",
                                      record_id=rid) from e
                with self._lock:
                    self.skipped += 1
                continue
            keep.append(rid)
        blocks = [np.concatenate([self.head, t, self.tail])
                  for t in (self.tok.encode_batch(texts) if texts else [])]
        lengths = np.array([len(b) for b in blocks], np.int64)
        if self.truncate == "error" and len(blocks) and int(lengths.max()) > self.seq_len:
            j = int(np.argmax(lengths > self.seq_len))
            raise ConfigError(f"token sequence too long for sample_id={keep[j]} "
                              f"(tokens={int(lengths[j])} > sequence_length={self.seq_len})")
        counts = window_counts(lengths, self.seq_len, self.stride)
        n, L = int(counts.sum()), self.seq_len
        out = np.full((n, L), self.pad_id, np.int32)
        mask = np.zeros((n, L), bool) if self.return_mask else None
        r = 0
        for blk, c in zip(blocks, counts.tolist(), strict=True):
            for k in range(c):
                seg = blk[k * self.stride:k * self.stride + L]
                out[r, :len(seg)] = seg
                if mask is not None:
                    mask[r, :len(seg)] = True
                r += 1
        return {"tokens": out, "mask": mask,
                "doc_ids": np.repeat(np.asarray(keep, np.int64), counts)}


class TextLoader(InnerState, TimelineMixin):
    """Iterates ``{"tokens", "mask", "doc_ids"}`` batches; built by :func:`text` (see it)."""

    _timeline_kind = "text"

    def __init__(self, source: Any, loader: Loader, *, closer: Any, temp_dir: str | None,
                 info: dict[str, Any], to_torch: bool, seq_len: int, stride: int,
                 documents: int, name: str, stream: _StreamRows | None = None,
                 timeline_s: float | None = None) -> None:
        self.source = source
        self._loader = loader
        self.info = info
        self.to_torch = to_torch
        self._seq_len = seq_len
        self._stride = stride
        self._stream = stream
        self._closed = False
        self._tokens = 0
        self._documents = documents
        self._path = name
        self._finalizer = weakref.finalize(self, _cleanup, loader, closer, temp_dir)
        self._streak = EmptyStreak(loader, "on_decode_error='skip'")
        self._start_timeline(timeline_s)

    @property
    def sequence_length(self) -> int:
        return self._seq_len

    @property
    def stride(self) -> int:
        return self._stride

    @property
    def batch_size(self) -> int:
        """Rows per batch (``stream=True``: documents per batch)."""
        return self._loader.batch_size

    @property
    def windows(self) -> int | None:
        """Windows (rows) in one epoch; ``None`` with ``stream=True`` (known only once read)."""
        return len(self.source) if isinstance(self.source, WindowSource | TokenWindows) \
            else None

    @property
    def documents(self) -> int:
        """Documents (records) in the token store, or raw documents with ``stream=True``."""
        return self._documents

    @property
    def last_ids(self) -> np.ndarray:
        """Window ids of the batch last delivered (``stream=True``: document ids)."""
        return self._loader.last_ids

    @property
    def epoch(self) -> int:
        return self._loader.epoch

    def _state_loader(self) -> Loader:
        return self._loader

    @tracked
    def __next__(self) -> dict[str, Any]:
        while True:
            try:
                batch = self._loader.__next__()
            except StopIteration:
                self._end_timeline()
                self._streak.end()
                raise
            except LoaderError as e:
                cause = e.__cause__
                if isinstance(cause, DecodeError | ConfigError):  # stream=True: the user's error
                    raise cause.with_traceback(None) from e
                raise
            if len(_rows(batch)):
                break
            # stream=True: a batch whose documents were all skipped is not delivered
            self._streak.empty(len(self._loader.last_ids))
        self._streak.full()
        self._tokens += int(_rows(batch).size)
        self._tick_timeline()
        if YIELD_KEY in batch:
            return batch[YIELD_KEY]
        return _finish(self.to_torch, batch)

    def __len__(self) -> int:
        return len(self._loader)

    def checkpoint(self, at: int | None = None) -> bytes:
        """A token for ``resume=``: continues right after the last delivered batch.

        ``at=i``: the token that resumes at delivered batch ``i`` (0-based, counted since this
        loader was built; ``delivered`` is how many it has delivered), for loops that fetch
        ahead: ``checkpoint(at=loader.delivered - 1)`` resumes at the batch fetched but not yet
        trained on. The last 256 batches' tokens are kept.
        """
        return self._loader.checkpoint() if at is None else token_at(self, at)

    @property
    def delivered(self) -> int:
        """Batches this loader has delivered (the index ``checkpoint(at=)`` counts)."""
        return delivered(self)

    def stats(self) -> dict[str, Any]:
        """The loader's stats plus ``tokens_delivered_total``, ``windows``, ``documents``,
        ``tokens_total`` (of the stream; both absent with ``stream=True``) and
        ``decode_errors_total`` (documents skipped when the text was packed or streamed)."""
        s = self._loader.stats()
        skipped = int(self.info.get("skipped", 0))
        if self._stream is not None:
            skipped += self._stream.skipped
        s.update({"tokens_delivered_total": self._tokens, "documents": self.documents,
                  "sequence_length": self.sequence_length, "stride": self.stride,
                  "decode_errors_total": skipped})
        if self.windows is not None:  # stream=True: counts known only once read, so absent
            s["windows"] = self.windows
            s["tokens_total"] = self.source.total_tokens
        return s

    def print_stats(self) -> None:
        self._loader.print_stats()

    def close(self) -> None:
        """Stops the threads, closes the store, removes a temporary token store (idempotent)."""
        self._closed = True
        self._finalizer()

    def __enter__(self) -> TextLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"TextLoader({self._path!r}, packing={self.source.packing!r}, "
                f"seq_len={self.sequence_length}, stride={self.stride}, "
                f"batch={self.batch_size}, windows={self.windows})")


def _rows(batch: dict[str, Any]) -> Any:
    """The rows of a batch (``inputs`` with ``targets=True``)."""
    return batch["tokens"] if "tokens" in batch else batch["inputs"]


def _finish(to_torch: bool, batch: dict[str, Any]) -> dict[str, Any]:
    """A batch of rows as the loader yields it."""
    if to_torch:
        import torch

        return {k: None if v is None else torch.from_numpy(v) for k, v in batch.items()}
    return batch


def _cleanup(loader: Loader, closer: Any, temp_dir: str | None) -> None:
    loader.close()
    closer.close()
    if temp_dir is not None:
        shutil.rmtree(temp_dir, ignore_errors=True)


def _check_options(options: dict[str, Any]) -> None:
    """``text()``'s ``**options`` are packing and S3 settings; anything else is a misspelling."""
    import dataclasses

    from headrace._remote.objstore import S3Options

    valid = ({"batch_mb", "chunk_mb", "autopack", "shard_mb", "s3", "store", "cache_bytes",
              "max_inflight", "verify"} | {f.name for f in dataclasses.fields(S3Options)})
    if not valid.issuperset(options):
        refuse_unknown(options, valid | keyword_names(text), "text()")


def _positive(name: str, value: Any, mx8_name: str | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ConfigError(f"{name} must be an int, got {value!r}")
    if value <= 0:
        raise ConfigError(f"{mx8_name or name} must be > 0, got {value}")
    return int(value)


def _token_field(store: Any, field: str) -> bool:
    spec = store.fields.get(field)
    return spec is not None and spec.shape is None and np.dtype(spec.dtype).kind in "iu" \
        and np.dtype(spec.dtype).itemsize > 1


def _special_ids(tok_given: Any, attrs: dict[str, Any], *, add_bos: bool, add_eos: bool,
                 bos_id: int | None, eos_id: int | None,
                 pad_id: int | None) -> tuple[int, int, int]:
    ids: dict[str, int | None] = {k: attrs.get(k) for k in ("bos_id", "eos_id", "pad_id")}
    if tok_given is not None:
        tok = as_tokenizer(tok_given)
        have, want = attrs.get("tokenizer_sha256"), tok.sha256
        # Without both hashes (a callable has none) the names decide.
        differ = have != want if have and want else (
            "tokenizer" in attrs and attrs["tokenizer"] != tok.name)
        if differ:
            raise ConfigError(
                f"the store's tokens were made by tokenizer {attrs.get('tokenizer')!r} "
                f"(sha256 {str(have)[:12]}), not by {tok.name!r} (sha256 {str(want)[:12]}); "
                "pass the tokenizer used by pack_text, or tokenizer=None to use the store's ids")
        ids = {"bos_id": tok.bos_id, "eos_id": tok.eos_id, "pad_id": tok.pad_id}
    for k, v in (("bos_id", bos_id), ("eos_id", eos_id), ("pad_id", pad_id)):
        if v is not None:
            ids[k] = int(v)
    if add_bos and ids["bos_id"] is None:
        raise ConfigError("add_bos=True but tokenizer has no known BOS token id; pass bos_id= "
                          "or add_bos=False")
    if add_eos and ids["eos_id"] is None:
        raise ConfigError("add_eos=True but tokenizer has no known EOS token id; pass eos_id= "
                          "or add_eos=False")
    pad = pad_id if pad_id is not None else ids["eos_id"] if ids["eos_id"] is not None else (
        ids["pad_id"] if ids["pad_id"] is not None else 0)
    return int(ids["bos_id"] or 0), int(ids["eos_id"] or 0), int(pad)


def _open_tokens(data: Any, *, field: str, tokenizer: Any, text_key: str, txt_mode: str,
                 recursive: bool, on_decode_error: str, cache_dir: str | None,
                 progress: bool | None,
                 options: dict[str, Any]) -> tuple[Any, str | None, dict[str, Any]]:
    """The token store for ``data``: itself if pre-tokenized, else packed into a temp folder."""
    from headrace._store.reader import Store
    from headrace._store.reader import open as open_store

    store = None
    if isinstance(data, Store):
        store = data
    elif is_store_like(data):  # damaged too: open_store says so
        store = open_store(os.fspath(data))
    if store is not None and _token_field(store, field):
        if options:
            raise ConfigError(f"options {sorted(options)} do not apply to a token store")
        if store is data:  # the loader closes what it reads: reopen the user's store
            store = open_store(store.path, verify=store.verify)
        return store, None, dict(store.attrs.get(TEXT_ATTR, {}))
    if store is not None:
        spec = store.fields.get(text_key)
        tok = store.fields.get(field)
        if store is not data:
            store.close()
        if tok is not None and spec is None:
            shape = "ragged" if tok.shape is None else f"shape {list(tok.shape)}"
            raise ConfigError(
                f"field {field!r} of {os.fspath(getattr(data, 'path', data))} is {tok.dtype} "
                f"({shape}); a token field is ragged, one 1-D array of integer ids per document, "
                "int32 (or another integer type of 2 bytes or more: uint16, int64, ...): "
                f"pack_arrays(out, {field}=[np.asarray(doc, np.int32) for doc in docs]), "
                f"create(path, fields={{{field!r}: {{'dtype': 'int32', 'shape': None}}}}) or "
                "headrace.pack_text; a flat token array is read as it is, unpacked: "
                "text(tokens_array) or text('train.bin', dtype='uint16')")
        if spec is None:
            raise ConfigError(f"store {os.fspath(getattr(data, 'path', data))} has neither a "
                              f"token field {field!r} nor a text field {text_key!r}; pass "
                              "field= or text_key=")
    temp = tempfile.mkdtemp(prefix="headrace-text-", dir=cache_dir)
    try:
        out = os.path.join(temp, "tokens.hr")
        info = pack_text(data, out, tokenizer=tokenizer, field=field, text_key=text_key,
                         txt_mode=txt_mode, recursive=recursive,
                         on_decode_error=on_decode_error, progress=progress, **options)
        return open_store(out), temp, info
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise


def _open_stream(data: Any, *, text_key: str, recursive: bool,
                 options: dict[str, Any]) -> tuple[Any, str]:
    """``stream=True``: a source of raw documents and the name of its bytes field."""
    from headrace._sources.base import StoreSource, open_source
    from headrace._store.reader import Store
    from headrace._store.reader import open as open_store

    if is_mx8_pack(data):
        from headrace._sources.images import Mx8PackImages

        return Mx8PackImages(os.fspath(data)), "image"  # a Source of Ragged sample bytes
    if isinstance(data, Store) or is_store_like(data):
        st = open_store(data.path if isinstance(data, Store) else os.fspath(data))
        spec = st.fields.get(text_key)
        if spec is None or spec.shape is not None or np.dtype(spec.dtype) != np.uint8:
            st.close()
            raise ConfigError(f"stream=True reads raw text, and store {st.path} has no ragged "
                              f"bytes field {text_key!r}; pass text_key=, or stream=False for a "
                              "token store")
        return StoreSource(st, fields=[text_key], owned=True), text_key
    src = open_source(data, recursive=recursive, **options)
    if "bytes" not in list(getattr(src, "fields", [])):
        src.close()
        raise ConfigError(f"stream=True needs raw documents (a folder or s3:// prefix where each "
                          f"file is one document, or a store with a bytes field); {data!r} "
                          "opened as something else")
    return src, "bytes"


def text(data: Any, *, batch: int = 32, tokenizer: Any = None, seq_len: int = 2048,
         stride: int | None = None, add_bos: bool = False, add_eos: bool = True,
         truncate: str = "right", return_mask: bool = True, on_decode_error: str = "error",
         packing: str = "concat", shuffle: bool = False, order: str | None = None,
         seed: int = 0, epoch: int = 0, epochs: int | None = 1, drop_last: bool = False,
         tail: str | None = None, bos_id: int | None = None, eos_id: int | None = None, pad_id: int | None = None,
         field: str = "tokens", text_key: str = "text", txt_mode: str = "file",
         recursive: bool = True, stream: bool = False, cache_dir: str | None = None, to_torch: bool = False, progress: bool | None = False,
         threads: int | None = None, inflight: int | None = None, ram_gb: float | None = None,
         queue: int | None = None, prefetch: int | None = None, profile: str | None = None,
         constraints: Any = None, runtime: Any = None, rank: int | None = None,
         world_size: int | None = None,
         resume: bytes | None = None, timeline: bool | float = False, transform: Any = None,
         dtype: Any = None, tokens_dtype: Any = "int32", targets: bool = False,
         windows: str = "strided", tune: bool = False, batch_bytes: int | None = None,
         target_bytes: int | None = None, **options: Any) -> TextLoader:
    """Token windows ``(batch, seq_len)`` for language-model training, deterministic and resumable.

    Example::

        headrace.pack_text("corpus/", "corpus.hr", tokenizer="tokenizer.json")
        with headrace.text("corpus.hr", batch=32, seq_len=2048, targets=True,
                           tokens_dtype="int64", shuffle=True, seed=1, epochs=None) as loader:
            for b in loader:
                x, y = b["inputs"], b["targets"]   # contiguous, shifted by one

        headrace.text("train.bin", dtype="uint16", seq_len=1024, windows="random",
                      targets=True, tokens_dtype="int64", epochs=None)   # nanoGPT's get_batch

    Args:
        data: a token store made by :func:`headrace.pack_text` (path or ``Store``), or a flat
            token array: a raw ``.bin`` file (with ``dtype=``), a ``.npy`` file, an ndarray or
            memmap (windows of the stream, ``offsets`` instead of ``doc_ids``). Raw text (a
            folder, ``.txt``/``.jsonl`` files, an ``s3://`` prefix, or a store with a bytes field
            ``text_key``) is packed first into a temporary store under ``cache_dir`` (removed
            at ``close()``), with ``tokenizer``, ``txt_mode`` and ``on_decode_error``.
        batch: rows (windows) per batch; every batch is ``(batch, seq_len)`` except a partial
            last one (mx8 counts documents instead and yields a varying number of rows).
        tokenizer: for raw text, the tokenizer (see :func:`headrace.pack_text`); for a token
            store, optional: it must be the one that made the tokens (checked by hash) and gives
            the special ids. ``None``: the ids recorded in the store.
        seq_len: tokens per row. For next-token training use ``seq_len = context + 1`` with
            ``stride = context``.
        stride: tokens between row starts (default ``seq_len``; mx8's default is 2048 whatever
            ``seq_len``). Smaller overlaps rows, larger skips tokens.
        add_bos, add_eos: put BOS before / EOS after every document (ids looked up as mx8 does,
            or ``bos_id=``/``eos_id=``).
        truncate: ``"right"`` cuts a long document into several rows (mx8); ``"error"`` raises
            ``ConfigError("token sequence too long for sample_id=...")`` at construction when a
            document (with BOS/EOS) is longer than ``seq_len``.
        return_mask: return ``mask`` (True on real tokens, False on padding) or ``None``.
        on_decode_error: for raw text: ``"error"`` raises :class:`~headrace.DecodeError` naming
            the document; ``"skip"`` drops it (counted in ``stats()["decode_errors_total"]``).
        packing: ``"concat"`` (documents concatenated, windows across boundaries; default) or
            ``"pad"`` (each document cut into its own rows and padded, as mx8).
        shuffle, order, seed, epoch, epochs: window order, as :class:`headrace.Loader`
            (``shuffle=True`` is ``order="shuffle"``: a keyed permutation of window ids per epoch).
        drop_last: every batch full: drop the concat stream's partial last window (so rows are
            all full) and an incomplete last batch of each epoch (``tail="drop"``, as every
            loader's ``drop_last``).
        tail: an incomplete last batch of an epoch: ``"partial"`` (default for one rank),
            ``"drop"`` or ``"pad"`` (default for several ranks), as :class:`headrace.Loader`.
        bos_id, eos_id, pad_id: override the special ids; padding uses ``pad_id``, default the
            EOS id (mx8).
        field: the token field; text_key, txt_mode, recursive: as for
            :func:`headrace.pack_text`.
        stream: tokenize raw text in the loader's threads instead of packing it first (mx8's
            way): every file/object (or store record) is one document, ``packing="pad"`` only,
            ``batch`` counts documents and a batch has a varying number of rows; bad UTF-8
            raises or is skipped per ``on_decode_error`` while loading.
        cache_dir: where raw text is packed (default: the system temp folder).
        to_torch: yield torch tensors.
        progress: progress bar while packing raw text.
        threads, inflight, ram_gb, queue, prefetch, profile, constraints, runtime, rank,
            world_size, resume, tune: as :class:`headrace.Loader`.
        timeline: record a stats timeline (``True``: a snapshot every 0.5 s; a number: the
            period in seconds) for ``stats_timeline()`` and ``headrace.plot``.
        transform: ``fn(batch, ids) -> batch``, run in the loader's threads on each batch as it
            would be yielded (``ids``: its ``doc_ids``; a token array: its window offsets); the
            loader yields what it returns. ``rng``/``seeds`` parameters: see Loader.
        dtype: the token dtype of a raw ``.bin`` token file (``"uint16"`` for nanoGPT's GPT-2
            tokens); ``.npy`` files and arrays carry their own.
        tokens_dtype: ``"int32"`` (default) or ``"int64"`` (what ``cross_entropy`` wants).
        targets: yield ``inputs`` and ``targets`` (the next tokens), ``(batch, seq_len)`` each
            and C-contiguous, instead of ``tokens``: every window then reads ``seq_len + 1``
            tokens, and ``stride`` defaults to ``seq_len`` (windows share their boundary token).
        windows: ``"strided"`` (a window every ``stride`` tokens) or ``"random"``: nanoGPT's
            ``get_batch``, windows at random offsets drawn with replacement (``stride=1`` and
            ``order="iid"``; ``order="shuffle"`` draws them without replacement).
        batch_bytes, target_bytes: with ``stream=True``, byte-aware batches of documents (as
            :class:`headrace.Loader`, mx8's rule), counted over each document's UTF-8 bytes;
            token windows are all ``seq_len`` tokens, so other text loaders refuse them.
        **options: S3 options for an ``s3://`` raw-text source. mx8's ``autopack`` and
            ``shard_mb`` are accepted and ignored (raw text is always packed).

    Returns:
        a :class:`TextLoader` yielding ``{"tokens": int32 (B, seq_len), "mask": bool (B,
        seq_len) | None, "doc_ids": int64 (B)}`` (``doc_ids``: document of each row's first
        token).
    """
    seq_len = _positive("seq_len", seq_len, "sequence_length")
    if windows not in ("strided", "random"):
        raise ConfigError(f"windows={windows!r} must be 'strided' or 'random'")
    if windows == "random":
        if stride not in (None, 1):
            raise ConfigError(f"windows='random' starts a window at every offset (stride=1); "
                              f"drop stride={stride}")
        stride = 1
        if order is None and not shuffle:
            order = "iid"
    stride = seq_len if stride is None else _positive("stride", stride)
    span = seq_len + 1 if targets else seq_len
    tok_dtype = out_dtype(tokens_dtype)
    timeline_s = timeline_period(timeline)
    if truncate not in _TRUNCATE:
        raise ConfigError(f'invalid truncate="{truncate}" (expected: right|error)')
    if on_decode_error not in _POLICIES:
        raise ConfigError(f'invalid decode_error_policy="{on_decode_error}" (expected: error|skip)')
    if packing not in _PACKINGS:
        raise ConfigError(f"packing={packing!r} must be 'concat' or 'pad'")
    order = resolve_order(order, shuffle)
    _check_options(options)
    for mx8_only in ("autopack", "shard_mb"):
        options.pop(mx8_only, None)
    loader_kw = {"order": order, "seed": seed, "epoch": epoch, "epochs": epochs, "tail": tail,
                 "drop_last": drop_last,
                 "rank": rank, "world_size": world_size, "threads": threads,
                 "inflight": inflight, "ram_gb": ram_gb, "queue": queue, "prefetch": prefetch,
                 "profile": profile, "constraints": constraints, "runtime": runtime,
                 "resume": resume, "close_source": False, "tune": tune}
    if batch_bytes is not None or target_bytes is not None:
        if not stream:
            raise ConfigError("batch_bytes/target_bytes cut batches of variable-size records; "
                              f"token windows are all seq_len={seq_len} tokens: use batch= "
                              "alone, or stream=True for batches of whole documents by bytes")
        loader_kw.update(batch_bytes=batch_bytes, target_bytes=target_bytes)
    if is_token_array(data):
        if stream:
            raise ConfigError("stream=True tokenizes raw text; a token array is already tokens: "
                              "drop stream=")
        return _array_loader(data, dtype=dtype, batch=batch, span=span, seq_len=seq_len,
                             stride=stride, targets=targets, tok_dtype=tok_dtype,
                             to_torch=to_torch, loader_kw=loader_kw, timeline_s=timeline_s,
                             transform=transform)
    if dtype is not None:
        raise ConfigError("dtype= is the token dtype of a raw .bin token file; a store or "
                          "raw text carries its own (tokens_dtype= sets the output's)")
    if stream and (targets or tok_dtype != np.int32):
        raise ConfigError("targets= and tokens_dtype= apply to packed tokens; with stream=True "
                          "pass stream=False (the text is packed first)")
    if stream:
        return _stream_loader(data, batch=batch, tokenizer=tokenizer, seq_len=seq_len,
                              stride=stride, add_bos=add_bos, add_eos=add_eos,
                              truncate=truncate, return_mask=return_mask,
                              on_decode_error=on_decode_error, packing=packing,
                              drop_last=drop_last, ids=(bos_id, eos_id, pad_id),
                              text_key=text_key, recursive=recursive, to_torch=to_torch,
                              loader_kw=loader_kw, options=options, timeline_s=timeline_s,
                              transform=transform)
    store, temp, info = _open_tokens(data, field=field, tokenizer=tokenizer, text_key=text_key,
                                     txt_mode=txt_mode, recursive=recursive,
                                     on_decode_error=on_decode_error,
                                     cache_dir=cache_dir, progress=progress, options=options)
    try:
        specials = _special_ids(tokenizer if temp is None else None, info, add_bos=add_bos,
                                add_eos=add_eos, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id)
        source = WindowSource(store, field=field, packing=packing, seq_len=span,
                              stride=stride, add_bos=add_bos, add_eos=add_eos,
                              bos_id=specials[0], eos_id=specials[1], pad_id=specials[2],
                              drop_last=drop_last, return_mask=return_mask, truncate=truncate,
                              targets=targets, out_dtype=tok_dtype)
        refuse_empty(len(source), f"token windows of {span} tokens", store.path)
        user = None if transform is None else ThenTransform(
            None, partial(_finish, to_torch), transform, "doc_ids", seed=loader_kw["seed"])
        try:
            loader = Loader(source, batch=batch, transform=user, **loader_kw)
        except CheckpointError as e:
            e.add_note("a text checkpoint also pins packing, seq_len, stride, BOS/EOS and the "
                       "special ids")
            raise
    except BaseException:
        store.close()
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)
        raise
    return TextLoader(source, loader, closer=store, temp_dir=temp, info=info, to_torch=to_torch,
                      seq_len=seq_len, stride=stride, documents=len(store), name=store.path,
                      timeline_s=timeline_s)


def _stream_loader(data: Any, *, batch: int, tokenizer: Any, seq_len: int, stride: int,
                   add_bos: bool, add_eos: bool, truncate: str, return_mask: bool,
                   on_decode_error: str, packing: str, drop_last: bool,
                   ids: tuple[int | None, int | None, int | None], text_key: str,
                   recursive: bool, to_torch: bool, loader_kw: dict[str, Any],
                   options: dict[str, Any], timeline_s: float | None,
                   transform: Any = None) -> TextLoader:
    if packing != "pad" or drop_last:
        raise ConfigError("stream=True cuts each document on its own (packing='pad', no "
                          "drop_last): concat windows need every document's token count up "
                          "front; use stream=False (the text is packed first)")
    tok = as_tokenizer(tokenizer)
    specials = _special_ids(None, tok.identity(), add_bos=add_bos, add_eos=add_eos,
                            bos_id=ids[0], eos_id=ids[1], pad_id=ids[2])
    source, key = _open_stream(data, text_key=text_key, recursive=recursive, options=options)
    try:
        refuse_empty(len(source), "documents", data)
        rows = _StreamRows(tok, key=key, seq_len=seq_len, stride=stride, add_bos=add_bos,
                           add_eos=add_eos, bos_id=specials[0], eos_id=specials[1],
                           pad_id=specials[2], truncate=truncate,
                           on_decode_error=on_decode_error, return_mask=return_mask)
        per_row = seq_len * (4 + int(return_mask)) + 8
        work: Any = rows if transform is None else ThenTransform(
            rows, partial(_finish, to_torch), transform, "doc_ids", seed=loader_kw["seed"])
        # An estimate (one row per document): rows are known only after tokenizing.
        loader = Loader(source, batch=batch, transform=work,
                        transform_nbytes=lambda k: k * per_row, **loader_kw)
    except BaseException:
        source.close()
        raise
    return TextLoader(source, loader, closer=source, temp_dir=None, info=tok.identity(),
                      to_torch=to_torch, seq_len=seq_len, stride=stride,
                      documents=len(source), name=str(data), stream=rows,
                      timeline_s=timeline_s)


def _array_loader(data: Any, *, dtype: Any, batch: int, span: int, seq_len: int, stride: int,
                  targets: bool, tok_dtype: np.dtype[Any], to_torch: bool,
                  loader_kw: dict[str, Any], timeline_s: float | None,
                  transform: Any) -> TextLoader:
    """A flat token array (``.bin``, ``.npy``, ndarray, memmap) as windows (``_sources.tokens``)."""
    name = f"array{getattr(data, 'shape', '')}" if isinstance(data, np.ndarray) \
        else os.fspath(data)
    tokens = open_tokens(data, dtype)
    source = TokenWindows(tokens, span=span, stride=stride, targets=targets, dtype=tok_dtype,
                          name=name)
    user = None if transform is None else ThenTransform(
        None, partial(_finish, to_torch), transform, "offsets", seed=loader_kw["seed"])
    loader = Loader(source, batch=batch, transform=user, **loader_kw)
    return TextLoader(source, loader, closer=source, temp_dir=None, info={}, to_torch=to_torch,
                      seq_len=seq_len, stride=stride, documents=1, name=name,
                      timeline_s=timeline_s)
