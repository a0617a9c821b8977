"""The on-disk format of a headrace store, version 1 (``docs/format.md`` describes it in prose).

Everything that fixes a byte layout lives here: the index/aux entry dtypes (explicit little-endian),
the ``meta.json`` schema and its parser, file names, the per-record size limit and ``FieldSpec``.
The reader (``_store``), the writer (``_writer``) and ``_verify`` all go through these helpers, so
there is exactly one definition of what a valid store looks like.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from headrace._base.errors import CorruptionError, FormatVersionError, NotAStoreError, SchemaError
from headrace._store.codecs import check_codec

__all__ = [
    "AUX_DTYPE",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "INDEX_DTYPE",
    "MAX_RECORD_BYTES",
    "META_NAME",
    "ChunkInfo",
    "FieldSpec",
    "Meta",
    "parse_field_spec",
    "read_meta",
    "write_meta",
]

FORMAT_NAME = "headrace-store"
FORMAT_VERSION = 1
META_NAME = "meta.json"
META_TMP_NAME = "meta.json.tmp"
LOCK_NAME = ".lock"
CHUNK_DIR = "chunks"

# One entry per record per field. Packed (no padding): 4 + 8 + 4 = 16 bytes, entry i at 16*i.
INDEX_DTYPE = np.dtype([("chunk", "<u4"), ("offset", "<u8"), ("length", "<u4")])
# Parallel array: crc32c of the stored bytes, decoded size in bytes.
AUX_DTYPE = np.dtype([("crc", "<u4"), ("nbytes", "<u4")])
assert INDEX_DTYPE.itemsize == 16 and AUX_DTYPE.itemsize == 8

# Stored and decoded lengths are u32. Read through the module (``_format.MAX_RECORD_BYTES``) so a
# test can lower it instead of allocating 4 GiB.
MAX_RECORD_BYTES = 2**32 - 1

_FIELD_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,99}$")
INDEX_FILE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,99}(\.g[0-9]+)?\.(index|aux)$")
CHUNK_FILE = re.compile(r"^[0-9]+\.zr$")


def chunk_name(chunk_id: int) -> str:
    """Path of a chunk file relative to the store directory."""
    return f"{CHUNK_DIR}/{chunk_id}.zr"


def index_names(field_name: str, generation: int) -> tuple[str, str]:
    """File names of a field's index and aux files written in ``generation``."""
    if generation == 0:
        return f"{field_name}.index", f"{field_name}.aux"
    return f"{field_name}.g{generation}.index", f"{field_name}.g{generation}.aux"


@dataclass(frozen=True)
class FieldSpec:
    """The schema of one field: every record is an array of ``dtype``.

    Attributes:
        name: field name; letters, digits, ``_`` and ``-`` (it becomes a file name).
        dtype: element dtype, stored little-endian (or byte-order free).
        shape: per-record shape for fixed-shape fields (``()`` is a scalar); ``None`` for ragged
            fields, whose records are 1-D arrays of any length.
        codec: per-record codec, one of ``raw``, ``zstd``, ``lz4``, ``deflate``.
    """

    name: str
    dtype: np.dtype
    shape: tuple[int, ...] | None = None
    codec: str = "raw"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _FIELD_NAME.match(self.name):
            raise SchemaError(
                f"field name {self.name!r} is not allowed: use 1-100 letters, digits, '_' or '-' "
                "(not starting with '-'), because it becomes a file name")
        try:
            dt = np.dtype(self.dtype)
        except TypeError as e:
            raise SchemaError(f"field {self.name!r}: dtype {self.dtype!r} is not a NumPy dtype") from e
        if dt.hasobject or dt.fields is not None or dt.subdtype is not None:
            raise SchemaError(
                f"field {self.name!r}: dtype {dt} cannot be stored; use a plain numeric, bool or "
                "fixed-width bytes/str dtype (put the shape in `shape`)")
        if dt.itemsize == 0:
            raise SchemaError(f"field {self.name!r}: dtype {dt} has 0-byte elements; give it a size")
        if dt.byteorder == ">":
            dt = dt.newbyteorder("<")
        object.__setattr__(self, "dtype", dt)
        if self.shape is not None:
            try:
                shape = tuple(int(s) for s in self.shape)
            except TypeError as e:
                raise SchemaError(
                    f"field {self.name!r}: shape {self.shape!r} must be a tuple of ints or None") from e
            if any(s < 0 for s in shape):
                raise SchemaError(f"field {self.name!r}: shape {shape} has a negative dimension")
            object.__setattr__(self, "shape", shape)
            if self.record_nbytes > MAX_RECORD_BYTES:
                from headrace._base.errors import RecordTooLargeError
                raise RecordTooLargeError(
                    f"field {self.name!r}: a record of shape {shape} and dtype {dt} is "
                    f"{self.record_nbytes} bytes, over the format's {MAX_RECORD_BYTES}-byte limit")
        object.__setattr__(self, "codec", check_codec(self.codec, field=self.name))

    @property
    def ragged(self) -> bool:
        """True when records have variable length (``shape is None``)."""
        return self.shape is None

    @property
    def record_nbytes(self) -> int:
        """Decoded bytes of one record of a fixed-shape field (raises for ragged fields)."""
        if self.shape is None:
            raise TypeError(f"field {self.name!r} is ragged: records have no fixed size")
        return int(self.dtype.itemsize * math.prod(self.shape))

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype.str,
                "shape": None if self.shape is None else list(self.shape), "codec": self.codec}


def parse_field_spec(name: str, spec: Any) -> FieldSpec:
    """Turns a user's field spec into a ``FieldSpec``.

    Accepted: ``"bytes"`` (ragged uint8), a dtype name such as ``"int64"`` (a scalar per record), a
    dict ``{"dtype": ..., "shape": [...] | None, "codec": ...}`` (a missing ``shape`` means a
    scalar, except for ``"bytes"`` which is ragged), or a ``FieldSpec`` (its name must match).
    """
    if isinstance(spec, FieldSpec):
        if spec.name != name:
            raise SchemaError(f"FieldSpec named {spec.name!r} given for field {name!r}; make them match")
        return spec
    if isinstance(spec, dict):
        unknown = set(spec) - {"dtype", "shape", "codec"}
        if unknown:
            raise SchemaError(
                f"field {name!r}: unknown spec keys {sorted(unknown)}; use dtype, shape, codec")
        dtype = spec.get("dtype", "bytes")
        codec = spec.get("codec", "raw")
        if isinstance(dtype, str) and dtype == "bytes":
            return FieldSpec(name, np.dtype(np.uint8), spec.get("shape"), codec)
        return FieldSpec(name, dtype, spec.get("shape", ()), codec)
    if isinstance(spec, str) and spec == "bytes":
        return FieldSpec(name, np.dtype(np.uint8), None, "raw")
    if isinstance(spec, str | np.dtype | type):
        return FieldSpec(name, spec, (), "raw")  # type: ignore[arg-type]
    raise SchemaError(
        f"field {name!r}: spec {spec!r} is not understood; use 'bytes', a dtype name, a dict "
        "{'dtype', 'shape', 'codec'} or a FieldSpec")


@dataclass(frozen=True)
class ChunkInfo:
    """A committed chunk: which field's records it holds and how many bytes are committed."""

    id: int
    field: str
    size: int


@dataclass(frozen=True)
class FieldEntry:
    """A field in ``meta.json``: its spec and the index/aux files of the current generation."""

    spec: FieldSpec
    index: str
    aux: str


@dataclass(frozen=True)
class Meta:
    """The committed state of a store, as held in ``meta.json``."""

    length: int
    generation: int
    commit: int
    chunk_bytes: int
    fields: tuple[FieldEntry, ...]
    chunks: tuple[ChunkInfo, ...]
    attrs: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT_NAME, "version": FORMAT_VERSION, "length": self.length,
            "generation": self.generation, "commit": self.commit, "chunk_bytes": self.chunk_bytes,
            "fields": [{**f.spec.to_json(), "index": f.index, "aux": f.aux} for f in self.fields],
            "chunks": [{"id": c.id, "field": c.field, "size": c.size} for c in self.chunks],
            "attrs": self.attrs,
        }

    def field_names(self) -> list[str]:
        return [f.spec.name for f in self.fields]


def _nonneg_int(obj: dict[str, Any], key: str, where: str) -> int:
    v = obj.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise ValueError(f"{where}: {key!r} must be a non-negative integer, got {v!r}")
    return v


def meta_from_json(doc: Any, *, path: str) -> Meta:
    """Validates a parsed ``meta.json``; raises NotAStore/FormatVersion/CorruptionError."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT_NAME:
        raise NotAStoreError(
            f"{path} is not a headrace store: its meta.json has no \"format\": {FORMAT_NAME!r}")
    version = doc.get("version")
    if isinstance(version, int) and version > FORMAT_VERSION:
        raise FormatVersionError(
            f"{path} uses store format version {version}, but this headrace reads versions up to "
            f"{FORMAT_VERSION}; upgrade headrace (pip install -U headrace) to read it")
    try:
        if version != FORMAT_VERSION:
            raise ValueError(f"unknown format version {version!r}")
        fields = []
        names: set[str] = set()
        for f in doc["fields"]:
            spec = FieldSpec(f["name"], np.dtype(f["dtype"]),
                             None if f["shape"] is None else tuple(f["shape"]), f["codec"])
            if spec.name in names:
                raise ValueError(f"field {spec.name!r} listed twice")
            names.add(spec.name)
            for key in ("index", "aux"):
                if not isinstance(f[key], str) or not INDEX_FILE.match(f[key]):
                    raise ValueError(f"field {spec.name!r}: bad {key} file name {f[key]!r}")
            fields.append(FieldEntry(spec, f["index"], f["aux"]))
        chunks = []
        seen: set[int] = set()
        for c in doc["chunks"]:
            cid = _nonneg_int(c, "id", "chunk")
            if cid in seen or cid > 2**32 - 1:
                raise ValueError(f"chunk id {cid} repeated or out of range")
            seen.add(cid)
            if c.get("field") not in names:
                raise ValueError(f"chunk {cid} belongs to unknown field {c.get('field')!r}")
            chunks.append(ChunkInfo(cid, c["field"], _nonneg_int(c, "size", f"chunk {cid}")))
        attrs = doc.get("attrs", {})
        if not isinstance(attrs, dict):
            raise ValueError("attrs must be an object")
        return Meta(
            length=_nonneg_int(doc, "length", "meta"),
            generation=_nonneg_int(doc, "generation", "meta"),
            commit=_nonneg_int(doc, "commit", "meta"),
            chunk_bytes=max(1, _nonneg_int(doc, "chunk_bytes", "meta")),
            fields=tuple(fields), chunks=tuple(chunks), attrs=attrs)
    except (KeyError, TypeError, ValueError) as e:
        raise CorruptionError(
            f"{os.path.join(path, META_NAME)} is damaged ({type(e).__name__}: {e}); restore it "
            "from a backup, or run `headrace verify` to see what else is affected") from e


def read_meta(path: str) -> Meta:
    """Reads and validates ``<path>/meta.json``."""
    meta_path = os.path.join(path, META_NAME)
    if not os.path.isdir(path):
        raise NotAStoreError(f"{path} is not a headrace store: no such directory")
    try:
        with open(meta_path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise NotAStoreError(
            f"{path} is not a headrace store: it has no meta.json; create one with "
            "headrace.create() or headrace.pack_arrays()") from None
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorruptionError(
            f"{meta_path} is not valid JSON ({e}); restore it from a backup, or run "
            "`headrace verify` to see what else is affected") from e
    return meta_from_json(doc, path=path)


def fsync_dir(path: str) -> None:
    """Makes a directory's entries (created, renamed, removed files) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_meta(path: str, meta: Meta) -> None:
    """Atomically replaces ``meta.json``: temp file, fsync, rename, fsync of the directory."""
    data = json.dumps(meta.to_json(), indent=1).encode()
    tmp = os.path.join(path, META_TMP_NAME)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, os.path.join(path, META_NAME))
    fsync_dir(path)
