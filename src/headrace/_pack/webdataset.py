"""``pack_webdataset``: WebDataset tar shards (local or ``s3://``) -> a store, one field per extension.

Grouping is WebDataset's: a member ``dir/abc.seg.png`` has key ``dir/abc`` and extension
``seg.png`` (everything after the first dot of the base name, lower-cased); consecutive members
with one key are one sample. Top-level ``__*__`` members and non-files are skipped, as
``webdataset`` skips them; an extension repeated within a sample is an error.

Fields, for each extension (``.`` becomes ``_`` in the field name: ``seg.png`` -> ``seg_png``):
``cls``/``cls2``/``index``/``id`` -> int64 (the member's ASCII integer), anything else -> ragged
bytes (``jpg``/``png``/... stay encoded for ``image()``, ``json`` its bytes, ``txt`` its UTF-8
text), plus ``key`` (the sample key). Shards are read front to back as tar streams (S3: ranged
GETs behind a buffer), samples appended in batches of ``batch_mb``: memory holds one batch.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import re
import tarfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from headrace._base.errors import ConfigError, SchemaError
from headrace._pack.inputs import InputFile, list_inputs
from headrace._pack.units import codecs_for, dir_bytes, pack_units

__all__ = ["pack_webdataset", "split_name"]

INT_EXTENSIONS = frozenset({"cls", "cls2", "index", "id"})
IMAGE_EXTENSIONS = frozenset({"jpg", "jpeg", "png", "webp", "gif", "bmp", "tif", "tiff", "ppm",
                              "pgm", "pbm", "pnm"})
AUDIO_EXTENSIONS = frozenset({"wav", "flac", "mp3", "ogg", "opus", "m4a"})
VIDEO_EXTENSIONS = frozenset({"mp4", "webm", "mkv", "avi", "mov"})
MISSING_POLICIES = ("error", "skip", "fill")
_NAME = re.compile(r"^((?:.*/|)[^./]+)[.]([^/]*)$")  # webdataset's base_plus_ext
KEY_FIELD = "key"


def split_name(name: str) -> tuple[str, str] | None:
    """``(key, extension)`` of a tar member, or ``None`` when it has no extension."""
    m = _NAME.match(name)
    if m is None:
        return None
    return m.group(1), m.group(2).lower()


def _field_of(ext: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", ext)[:100] or "_"


def _samples(f: InputFile) -> Iterator[tuple[str, dict[str, bytes]]]:
    """``(key, {extension: bytes})`` of every sample of one shard, in tar order."""
    key: str | None = None
    sample: dict[str, bytes] = {}
    with f.open() as fh:
        try:
            tar = tarfile.open(fileobj=fh, mode="r|*")  # noqa: SIM115 - the with below closes it
        except tarfile.TarError as e:
            raise ConfigError(f"{f.name} is not a readable tar file ({e})") from None
        with tar:
            try:
                for member in tar:
                    if not member.isfile():
                        continue
                    name = member.name
                    if "/" not in name and name.startswith("__") and name.endswith("__"):
                        continue
                    parts = split_name(name)
                    if parts is None:
                        continue
                    k, ext = parts
                    if key is not None and k != key:
                        yield key, sample
                        sample = {}
                    if ext in sample:
                        raise ConfigError(f"{f.name}: sample {k!r} holds extension {ext!r} "
                                          f"twice (member {name!r}); each sample needs one "
                                          "file per extension")
                    key = k
                    data = tar.extractfile(member)
                    sample[ext] = data.read() if data is not None else b""
            except tarfile.TarError as e:
                raise ConfigError(f"{f.name}: the tar stream is damaged ({e}); re-create the "
                                  "shard") from None
    if key is not None:
        yield key, sample


@dataclass(frozen=True)
class _ShardReader:
    """The samples of ``shards`` as append batches (picklable: runs in a worker too)."""

    shards: tuple[InputFile, ...]
    exts: tuple[tuple[str, str], ...]  # (extension, field)
    missing: str
    strict: bool  # an extension outside ``exts`` is an error (fields were inferred)
    batch_bytes: int

    def __call__(self) -> Iterator[Mapping[str, Any]]:
        wanted = dict(self.exts)
        cols: dict[str, list[Any]] = {KEY_FIELD: [], **{f: [] for f in wanted.values()}}
        size = 0
        for shard in self.shards:
            for key, sample in _samples(shard):
                extra = sorted(set(sample) - set(wanted))
                if extra and self.strict:
                    raise ConfigError(
                        f"{shard.name}: sample {key!r} has extensions {extra} that the first "
                        f"sample lacks (fields: {sorted(wanted)}); pass fields=[...] naming the "
                        "extensions to keep")
                lacking = [e for e in wanted if e not in sample]
                if lacking:
                    if self.missing == "error":
                        raise SchemaError(
                            f"{shard.name}: sample {key!r} has no {lacking} file; pass "
                            "missing='skip' to drop such samples or missing='fill' to store "
                            "empty records (-1 for integer fields)")
                    if self.missing == "skip":
                        continue
                cols[KEY_FIELD].append(key.encode("utf-8", "surrogateescape"))
                for ext, field in wanted.items():
                    blob = sample.get(ext)
                    if ext in INT_EXTENSIONS:
                        cols[field].append(-1 if blob is None else _int(blob, shard, key, ext))
                    else:
                        cols[field].append(b"" if blob is None else blob)
                        size += len(blob or b"")
                if size >= self.batch_bytes or len(cols[KEY_FIELD]) >= 4096:
                    yield _batch(cols, wanted)
                    cols = {k: [] for k in cols}
                    size = 0
        if cols[KEY_FIELD]:
            yield _batch(cols, wanted)


def _int(blob: bytes, shard: InputFile, key: str, ext: str) -> int:
    try:
        return int(blob.strip())
    except ValueError:
        raise SchemaError(f"{shard.name}: sample {key!r}: .{ext} holds {blob[:40]!r}, not an "
                          "integer (class indices are ASCII digits)") from None


def _batch(cols: dict[str, list[Any]], wanted: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    ints = {wanted[e] for e in wanted if e in INT_EXTENSIONS}
    for field, values in cols.items():
        out[field] = np.asarray(values, np.int64) if field in ints else values
    return out


def _first_sample(f: InputFile) -> dict[str, bytes]:
    for _key, sample in _samples(f):
        return sample
    raise ConfigError(f"{f.name} holds no samples (no member has a key.extension name)")


def pack_webdataset(shards: Any, out: str | os.PathLike[str], *,
                    fields: Sequence[str] | Mapping[str, str] | None = None,
                    codec: str | Mapping[str, str] = "raw", missing: str = "error",
                    chunk_mb: float = 256, batch_mb: float = 64, workers: int | None = None,
                    executor: cf.Executor | None = None, progress: bool | None = None,
                    overwrite: bool = False, **options: Any) -> dict[str, Any]:
    """Packs WebDataset tar shards into a new store at ``out``: one record per sample.

    Example::

        headrace.pack_webdataset("s3://bucket/train/shard-{000000..000099}.tar", "train.hr")
        loader = headrace.image("train.hr", batch=64, resize=(224, 224))   # jpg + cls

    Args:
        shards: a tar file, a folder of them, a glob or brace pattern
            (``shard-{000000..000099}.tar``), or a list of those; local or ``s3://``.
            Shards are packed in the order named (patterns and folders: sorted).
        out: the new store's directory.
        fields: the extensions to keep (default: those of the first sample, and then every
            sample must have exactly those), or ``{extension: field}`` to name the fields.
        codec: one codec for every field, or ``{field: codec}``.
        missing: a sample lacking a kept extension: ``"error"`` (default, naming the shard and
            key), ``"skip"`` the sample, or ``"fill"`` (empty bytes, ``-1`` for ``cls``).
        chunk_mb, batch_mb: chunk file size bound, bytes appended per step (the memory bound).
        workers, executor: parallel packing, one or more whole shards per task, as in
            ``pack_arrays``; same records and content hash as one process.
        progress: a progress bar on stderr (``None``: only on a terminal).
        overwrite: replace a store at ``out`` (only a store).
        **options: S3 settings for ``s3://`` shards (``endpoint``, ``region``, ...).

    Returns:
        ``{"path", "samples", "fields", "shards", "chunks", "bytes_written", "seconds"}``.

    Raises:
        ConfigError: no shards, a shard that is not a tar, a duplicate extension in a sample,
            an extension outside the inferred ``fields``.
        SchemaError: a sample lacking a kept extension (``missing="error"``), a ``cls`` that
            is not an integer.
        StoreExistsError: ``out`` is not empty (and not a store to overwrite).
        PackWorkerError: a parallel task failed (nothing is left at ``out``).
    """
    from headrace._remote.objstore import S3Options

    t0 = time.perf_counter()
    if missing not in MISSING_POLICIES:
        raise ConfigError(f"missing={missing!r} must be one of {list(MISSING_POLICIES)}")
    if not isinstance(batch_mb, int | float) or not batch_mb > 0:
        raise ConfigError(f"batch_mb={batch_mb!r} must be a positive number of MiB")
    s3 = S3Options.from_kwargs(options)
    if options:
        raise ConfigError(f"unknown options {sorted(options)} for pack_webdataset()")
    files = list_inputs(shards, suffixes=(".tar", ".tar.gz", ".tgz"), what="WebDataset tar",
                        options={"s3": s3})
    strict = fields is None
    if fields is None:
        chosen = {ext: _field_of(ext) for ext in _first_sample(files[0])}
    elif isinstance(fields, Mapping):
        chosen = {str(k).lower(): str(v) for k, v in fields.items()}
    elif isinstance(fields, str):
        raise ConfigError(f"fields={fields!r} must be a list of extensions, e.g. "
                          f"fields=[{fields!r}]")
    else:
        chosen = {str(e).lower().lstrip("."): _field_of(str(e).lower().lstrip("."))
                  for e in fields}
    if not chosen:
        raise ConfigError("fields= keeps no extension; name at least one")
    names = list(chosen.values())
    if KEY_FIELD in names or len(set(names)) != len(names):
        raise ConfigError(f"the fields {names} repeat or use the reserved name {KEY_FIELD!r}; "
                          "name them with fields={extension: field}")
    codecs = codecs_for(codec, [KEY_FIELD, *names])
    specs: dict[str, Any] = {KEY_FIELD: {"dtype": "bytes", "shape": None,
                                         "codec": codecs[KEY_FIELD]}}
    for ext, field in chosen.items():
        if ext in INT_EXTENSIONS:
            specs[field] = {"dtype": "<i8", "shape": [], "codec": codecs[field]}
        else:
            specs[field] = {"dtype": "bytes", "shape": None, "codec": codecs[field]}
    attrs: dict[str, Any] = {"kind": "webdataset", "source": files[0].name,
                             "extensions": dict(chosen)}
    for role, group in (("image", IMAGE_EXTENSIONS), ("audio", AUDIO_EXTENSIONS),
                        ("video", VIDEO_EXTENSIONS)):
        hit = next((f for e, f in chosen.items() if e in group), None)
        if hit is not None:
            attrs[f"{role}_field"] = hit
    label = next((chosen[e] for e in ("cls", "cls2") if e in chosen), None)
    if label is not None:
        attrs["label_field"] = label
    exts = tuple(chosen.items())
    batch_bytes = int(batch_mb * (1 << 20))
    ftuple = tuple(files)

    def make_reader(a: int, b: int) -> _ShardReader:
        return _ShardReader(ftuple[a:b], exts, missing, strict, batch_bytes)

    res = pack_units(out, fields=specs, attrs=attrs,
                     unit_bytes=np.asarray([max(1, f.size) for f in files], np.int64),
                     make_reader=make_reader,
                     describe=lambda a, b: f"shards {files[a].name} .. {files[b - 1].name}",
                     chunk_mb=chunk_mb, workers=workers, executor=executor, progress=progress,
                     desc=f"pack {os.path.basename(os.fspath(out))}", overwrite=overwrite,
                     who="pack_webdataset")
    return {"path": res["path"], "samples": res["samples"], "fields": specs,
            "shards": len(files), "chunks": res["chunks"],
            "bytes_written": dir_bytes(res["path"]), "seconds": time.perf_counter() - t0}
