"""``headrace.pack_text``: UTF-8 text (``.txt``/``.jsonl``, local or S3, or a store's bytes field)
-> a store of token ids, tokenized once so that training reads tokens, not text.

Documents, in this order: files sorted by path (S3: by key; hidden files skipped; other suffixes
ignored), and inside a file, in file order. A ``.txt`` file is one document (``txt_mode="file"``,
mx8's rule: one file = one sample) or one document per non-empty line (``txt_mode="line"``). A
``.jsonl`` file holds one JSON object per non-empty line; its ``text_key`` is the document. A store
holding a ragged ``bytes`` field named ``text_key`` gives one document per record, an mx8 pack
(``mx8.pack_dir`` of text files) one per sample.

Output: a store with one ragged int32 field (``field``, default ``"tokens"``), record ``i`` = the
``i``-th kept document's ids (no special tokens: BOS/EOS are the loader's choice), and
``attrs["text"]`` recording the tokenizer identity (name, sha256 of its config/vocabulary), its
special ids, and counts. Memory is bounded by one tokenization batch (``batch_mb`` of text) plus
one input file or object.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from headrace._base.errors import ConfigError, DecodeError, StoreExistsError
from headrace._base.fsutil import discard_dir, publish_dir
from headrace._base.progress import progress as progress_bar
from headrace._base.staging import make_staging
from headrace._pack.tokenizer import TextTokenizer, as_tokenizer
from headrace._store.format import looks_like_store

__all__ = ["TEXT_ATTR", "pack_text"]

TEXT_ATTR = "text"
SUFFIXES = (".txt", ".jsonl")
_TXT_MODES = ("file", "line")
_POLICIES = ("error", "skip")


@dataclass(frozen=True)
class _Input:
    """One input file/object: where it is, how big, how to read it."""

    name: str  # path or s3:// url, for messages
    size: int
    key: str | None = None  # S3 key (None: local path in name)
    client: Any = None  # the bucket's ObjectStore for S3 inputs


def _list_local(src: str, recursive: bool) -> list[_Input]:
    if os.path.isfile(src):
        return [_Input(src, os.path.getsize(src))]
    if not os.path.isdir(src):
        raise ConfigError(f"pack_text source {src!r} does not exist; pass a folder, a .txt/.jsonl "
                          "file, a list of files, an s3:// prefix or a store with a text field")
    found = []
    for root, dirs, files in os.walk(src):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".")) if recursive else []
        for f in files:
            if not f.startswith(".") and f.endswith(SUFFIXES):
                p = os.path.join(root, f)
                found.append(_Input(p, os.path.getsize(p)))
    return sorted(found, key=lambda i: i.name)


def _list_s3(url: str, options: dict[str, Any]) -> list[_Input]:
    from headrace._remote.objstore import ObjectStore, S3Options, split_s3_url

    bucket, prefix = split_s3_url(url)
    client = ObjectStore(bucket, options=S3Options.from_kwargs(options))
    items = [_Input(f"s3://{bucket}/{o.key}", o.size, key=o.key, client=client)
             for o in client.list(prefix)
             if not os.path.basename(o.key).startswith(".") and o.key.endswith(SUFFIXES)]
    return sorted(items, key=lambda i: i.key or "")


def _lines(data: bytes) -> Iterator[tuple[int, bytes]]:
    for n, line in enumerate(data.split(b"\n"), 1):
        if line.endswith(b"\r"):
            line = line[:-1]
        if line:
            yield n, line


def _local_lines(path: str) -> Iterator[tuple[int, bytes]]:
    with open(path, "rb") as f:  # streamed: a huge line-per-document file is never all in memory
        for n, line in enumerate(f, 1):
            line = line.rstrip(b"\n")
            if line.endswith(b"\r"):
                line = line[:-1]
            if line:
                yield n, line


class _Docs:
    """Yields ``(where, text | error)`` per document, in order, and counts input bytes."""

    def __init__(self, src: Any, *, text_key: str, txt_mode: str, recursive: bool,
                 options: dict[str, Any]) -> None:
        self.text_key = text_key
        self.txt_mode = txt_mode
        self.store: Any = None
        self.records: Any = None
        self.inputs: list[_Input] = []
        if is_mx8_pack(src):
            from headrace._sources.images import Mx8PackImages

            self.records = Mx8PackImages(os.fspath(src))
            self.total = len(self.records)
        elif is_store_like(src):
            from headrace._store.reader import Store
            from headrace._store.reader import open as open_store

            self.store = src if isinstance(src, Store) else open_store(os.fspath(src))
            self._owned = not isinstance(src, Store)
            spec = self.store.fields.get(text_key)
            if spec is None or spec.shape is not None or spec.dtype != np.uint8:
                raise ConfigError(f"store {self.store.path} has no ragged bytes field "
                                  f"{text_key!r} (fields: {list(self.store.fields)}); pass "
                                  "text_key= naming the field that holds UTF-8 text")
            self.total = len(self.store)
        else:
            srcs = [src] if isinstance(src, str | os.PathLike) else list(src)
            if options and not all(os.fspath(s).startswith("s3://") for s in srcs):
                raise ConfigError(f"options {sorted(options)} only apply to s3:// sources")
            for s in srcs:
                s = os.fspath(s)
                if s.startswith("s3://"):
                    found = _list_s3(s, dict(options))
                else:
                    found = _list_local(s, recursive)
                self.inputs.extend(found)
            if not self.inputs:
                raise ConfigError(f"pack_text found no .txt or .jsonl files in {src!r}")
            self.total = sum(i.size for i in self.inputs)
    def close(self) -> None:
        if self.store is not None and self._owned:
            self.store.close()
        if self.records is not None:
            self.records.close()

    def __iter__(self) -> Iterator[tuple[str, str | Exception | None, int]]:
        """``(where, text or the decode error, input units done)``; text ``None`` is progress
        only (the rest of a line-based file), not a document."""
        if self.records is not None:  # an mx8 pack: one document per sample
            n = len(self.records)
            for lo in range(0, n, 1024):
                ids = np.arange(lo, min(n, lo + 1024))
                for i, v in zip(ids.tolist(), self.records.payloads(ids), strict=True):
                    yield f"{self.records.root} sample {i}", _decode(bytes(v)), 1
            return
        if self.store is not None:
            n = len(self.store)
            for lo in range(0, n, 1024):
                ids = np.arange(lo, min(n, lo + 1024))
                for i, v in zip(ids.tolist(), self.store.views(ids, self.text_key), strict=True):
                    yield f"{self.store.path} record {i}", _decode(bytes(v)), 1
            return
        for inp in self.inputs:
            if inp.name.endswith(".txt") and self.txt_mode == "file":
                yield inp.name, _decode(self._read(inp)), inp.size
                continue
            if inp.key is not None:
                lines: Iterator[tuple[int, bytes]] = _lines(self._read(inp))
            else:
                lines = _local_lines(inp.name)
            done = 0
            for lineno, line in lines:
                step = len(line) + 1
                done += step
                text = _decode(line) if inp.name.endswith(".txt") else self._json(line)
                yield f"{inp.name} line {lineno}", text, step
            yield inp.name, None, max(0, inp.size - done)

    def _read(self, inp: _Input) -> bytes:
        if inp.key is not None:
            return bytes(inp.client.get(inp.key)[0])
        with open(inp.name, "rb") as f:
            return f.read()

    def _json(self, line: bytes) -> str | Exception:
        try:
            obj = json.loads(line)
        except UnicodeDecodeError as e:
            return e
        except ValueError as e:
            return ValueError(f"not a JSON object: {e}")
        if not isinstance(obj, dict) or self.text_key not in obj:
            keys = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
            return ValueError(f"no {self.text_key!r} key (has {keys}); pass text_key=")
        text = obj[self.text_key]
        if not isinstance(text, str):
            return ValueError(f"{self.text_key!r} is {type(text).__name__}, not a string")
        try:
            text.encode("utf-8")  # lone surrogates from \\ud800 escapes are not text
        except UnicodeEncodeError as e:
            return e
        return text


def _decode(raw: bytes) -> str | Exception:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return e


def is_mx8_pack(src: Any) -> bool:
    """A folder made by ``mx8.pack_dir`` (``_mx8/manifest.tsv``)."""
    return isinstance(src, str | os.PathLike) and os.path.isfile(
        os.path.join(os.fspath(src), "_mx8", "manifest.tsv"))


def is_store_like(src: Any) -> bool:
    if type(src).__name__ == "Store":
        return True
    # also a store damaged before its first commit: opened (and refused) as a store, never
    # tokenized as a folder of text files
    return isinstance(src, str | os.PathLike) and os.path.isdir(os.fspath(src)) and \
        looks_like_store(os.fspath(src))


def pack_text(src: Any, out: str | os.PathLike[str], *, tokenizer: Any = None,
              field: str = "tokens", text_key: str = "text", txt_mode: str = "file",
              recursive: bool = True, on_decode_error: str = "error",
              progress: bool | None = None, batch_mb: float = 8, chunk_mb: float = 256,
              **options: Any) -> dict[str, Any]:
    """Tokenizes UTF-8 text into a store of int32 token ids (one record per document).

    Example::

        info = headrace.pack_text("corpus/", "corpus.hr", tokenizer="tokenizer.json")
        loader = headrace.text("corpus.hr", seq_len=2048, batch=32, shuffle=True)

    Args:
        src: a folder (walked in sorted order), a ``.txt``/``.jsonl`` file, a list of those, an
            ``s3://bucket/prefix`` (objects under it, sorted by key), a store (path or
            ``Store``) with a ragged bytes field ``text_key``, or an ``mx8.pack_dir`` pack (one
            document per sample, in sample-id order).
        out: the new store's directory (must not exist or be empty).
        tokenizer: ``None`` (byte-level, offline), a ``tokenizer.json`` path, a
            ``tokenizers.Tokenizer``, or any callable ``str -> ids``. No special tokens are
            added here.
        field: name of the token field.
        text_key: the JSON key of ``.jsonl`` lines / the store field holding text.
        txt_mode: ``"file"`` (a ``.txt`` file is one document) or ``"line"`` (each non-empty
            line is one).
        recursive: walk sub-folders of a local folder.
        on_decode_error: ``"error"`` raises :class:`~headrace.DecodeError` naming the document
            number and where it is (file and line); ``"skip"`` drops the document and counts it
            in the result's ``skipped``. Invalid UTF-8, and for ``.jsonl`` a line that is not a
            JSON object with a string ``text_key``, are decode errors.
        progress: progress bar (``None``: only on a terminal).
        batch_mb: MiB of text tokenized per batch (bounds memory).
        chunk_mb: chunk file size of the store.
        **options: S3 options for an ``s3://`` source (``endpoint=``, ``region=``, ...).

    Returns:
        ``{"path", "documents", "tokens", "skipped", "tokenizer", "tokenizer_sha256", "bos_id",
        "eos_id", "pad_id", "vocab_size"}``.

    Raises:
        ConfigError: bad arguments or no input files. DecodeError: see ``on_decode_error``.
    """
    if on_decode_error not in _POLICIES:
        raise ConfigError(f'invalid decode_error_policy="{on_decode_error}" (expected: error|skip)')
    if txt_mode not in _TXT_MODES:
        raise ConfigError(f"txt_mode={txt_mode!r} must be 'file' or 'line'")
    if not (isinstance(batch_mb, int | float) and batch_mb > 0):
        raise ConfigError(f"batch_mb={batch_mb!r} must be a positive number of MiB")
    tok = as_tokenizer(tokenizer)
    from headrace._store.writer import create

    docs = _Docs(src, text_key=text_key, txt_mode=txt_mode, recursive=recursive, options=options)
    try:
        return _pack(docs, os.fspath(out), tok, field=field, on_decode_error=on_decode_error,
                     progress=progress, batch_bytes=int(batch_mb * (1 << 20)),
                     chunk_mb=chunk_mb, create=create, settings={
                         "text_key": text_key, "txt_mode": txt_mode})
    finally:
        docs.close()


def _pack(docs: _Docs, out: str, tok: TextTokenizer, *, field: str, on_decode_error: str,
          progress: bool | None, batch_bytes: int, chunk_mb: float, create: Any,
          settings: dict[str, Any]) -> dict[str, Any]:
    # Built in a private sibling folder and published with one rename, as every other packer: a
    # failure or a kill leaves nothing at ``out`` (a folder that was empty stays so), and a
    # pack running elsewhere to the same ``out`` is never touched.
    target = os.path.abspath(out)
    if os.path.exists(target) and (not os.path.isdir(target) or os.listdir(target)):
        raise StoreExistsError(f"pack_text: cannot create a store at {out}: it exists and is not "
                               "an empty directory; pick a new out")
    os.makedirs(os.path.dirname(target), exist_ok=True)
    staging = make_staging(target)
    try:
        writer = create(staging, fields={field: {"dtype": "int32", "shape": None}},
                        chunk_mb=chunk_mb)
        try:
            counts = _fill(writer, docs, tok, field=field, on_decode_error=on_decode_error,
                           progress=progress, batch_bytes=batch_bytes, settings=settings,
                           desc=f"pack_text {out}")
        finally:
            writer.close()
        publish_dir(staging, target, who="pack_text")
    except BaseException:
        discard_dir(staging)
        raise
    return {"path": out, **counts, **tok.identity()}


def _fill(w: Any, docs: _Docs, tok: TextTokenizer, *, field: str, on_decode_error: str,
          progress: bool | None, batch_bytes: int, settings: dict[str, Any],
          desc: str) -> dict[str, int]:
    unit = "B" if docs.inputs else "doc"
    counts = {"documents": 0, "tokens": 0, "skipped": 0}
    pending: list[str] = []
    pending_bytes = 0

    def flush() -> None:
        nonlocal pending, pending_bytes
        if pending:
            ids = tok.encode_batch(pending)
            w.append({field: ids})
            counts["documents"] += len(ids)
            counts["tokens"] += sum(len(a) for a in ids)
        pending, pending_bytes = [], 0

    with progress_bar(docs.total, desc=desc, unit=unit,
                      enabled=progress) as bar:
        ordinal = 0
        for where, text, done in docs:
            bar.update(done)
            if text is None:
                continue
            doc = ordinal
            ordinal += 1
            if isinstance(text, Exception):
                if on_decode_error == "error":
                    raise DecodeError(
                        f"document {doc} ({where}) cannot be decoded: {text}; pass "
                        "on_decode_error='skip' to drop such documents",
                        record_id=doc, path=where) from text
                counts["skipped"] += 1
                continue
            pending.append(text)
            pending_bytes += len(text)
            if pending_bytes >= batch_bytes or len(pending) >= 65536:
                flush()
        flush()
        w.attrs[TEXT_ATTR] = {"format": "headrace-text-v1", "field": field,
                              **tok.identity(), **counts, **settings}
        w.commit()
    return counts
