"""The on-disk format of a headrace store, versions 1 to 3 (``docs/format.md`` describes it in prose).

Version 2 ends ``meta.json`` with a crc32c of its bytes. Version 3 adds one thing to it: a field
with codec ``zstd_dict`` names its dictionary file (``"dict"``, ``"dict_crc"`` in its entry). A
store is written as version 3 only while it has such a field, so every other store stays readable
by version-2 readers.

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

import google_crc32c
import numpy as np

from headrace._base.errors import CorruptionError, FormatVersionError, NotAStoreError, SchemaError
from headrace._base.fsutil import open_regular
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
    "read_dict",
    "read_meta",
    "write_meta",
]

FORMAT_NAME = "headrace-store"
# 2: meta.json ends with a crc32c of every byte before it. Version 1 stores (no checksum) still read.
# 3: version 2 plus zstd_dict fields (their dictionary file named in the field's entry); written
# only by stores that have such a field.
FORMAT_VERSION = 3  # the newest version this code reads and writes
BASE_VERSION = 2  # what a store without a zstd_dict field is written as
_DICT_VERSION = 3
READ_VERSIONS = (1, 2, 3)
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
DICT_FILE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,99}\.dict$")


def dict_name(field_name: str) -> str:
    """File name of a ``zstd_dict`` field's dictionary (written once, never changed)."""
    return f"{field_name}.dict"


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
        codec: per-record codec, one of ``raw``, ``zstd``, ``lz4``, ``deflate``, ``zstd_dict``
            (zstd with a dictionary the writer trains on the field's first appended batch).
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
    """A field in ``meta.json``: its spec, the index/aux files of the current generation and, for
    a ``zstd_dict`` field once trained, its dictionary file and that file's crc32c."""

    spec: FieldSpec
    index: str
    aux: str
    dict_file: str | None = None
    dict_crc: int | None = None

    def to_json(self) -> dict[str, Any]:
        out = {**self.spec.to_json(), "index": self.index, "aux": self.aux}
        if self.dict_file is not None:
            out["dict"] = self.dict_file
            out["dict_crc"] = self.dict_crc
        return out


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
        version = _DICT_VERSION if any(f.spec.codec == "zstd_dict" for f in self.fields) \
            else BASE_VERSION
        return {
            "format": FORMAT_NAME, "version": version, "length": self.length,
            "generation": self.generation, "commit": self.commit, "chunk_bytes": self.chunk_bytes,
            "fields": [f.to_json() for f in self.fields],
            "chunks": [{"id": c.id, "field": c.field, "size": c.size} for c in self.chunks],
            "attrs": self.attrs,
        }

    def field_names(self) -> list[str]:
        return [f.spec.name for f in self.fields]


def _nonneg_int(obj: dict[str, Any], key: str, where: str, limit: int = 2**63 - 1) -> int:
    v = obj.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= limit:
        raise ValueError(f"{where}: {key!r} must be an integer in [0, {limit}], got {v!r:.40}")
    return v


def _obj(v: Any, where: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise ValueError(f"{where} must be a JSON object, got {type(v).__name__}")
    return v


def _list(v: Any, where: str) -> list[Any]:
    if not isinstance(v, list):
        raise ValueError(f"{where} must be a JSON list, got {type(v).__name__}")
    return v


def _shape(v: Any, where: str) -> tuple[int, ...] | None:
    if v is None:
        return None
    dims = _list(v, where)
    if len(dims) > 32 or not all(isinstance(d, int) and not isinstance(d, bool)
                                 and 0 <= d < 2**32 for d in dims):
        raise ValueError(f"{where} must be null or a list of at most 32 integers in [0, 2**32)")
    return tuple(dims)


def _dtype(text: str) -> np.dtype[Any]:
    if len(text) > 64:
        raise ValueError(f"dtype {text[:64]!r}... is not a dtype this format writes")
    try:
        return np.dtype(text)
    except Exception as e:  # NumPy parses dtype strings with several error types
        raise ValueError(f"dtype {text!r} is not a NumPy dtype ({type(e).__name__})") from None


def meta_from_json(doc: Any, *, path: str) -> Meta:
    """Validates a parsed ``meta.json``; raises NotAStore/FormatVersion/CorruptionError."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT_NAME:
        raise NotAStoreError(
            f"{path} is not a headrace store: its meta.json has no \"format\": {FORMAT_NAME!r}")
    version = doc.get("version")
    if isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION:
        raise FormatVersionError(
            f"{path} uses store format version {version}, but this headrace reads versions up to "
            f"{FORMAT_VERSION}; upgrade headrace (pip install -U headrace) to read it")
    try:
        if version not in READ_VERSIONS or isinstance(version, bool):
            raise ValueError(f"unknown format version {version!r:.40}")
        fields = []
        names: set[str] = set()
        for k, f in enumerate(_list(doc.get("fields"), "fields")):
            f = _obj(f, f"fields[{k}]")
            if not isinstance(f.get("dtype"), str) or not isinstance(f.get("codec"), str):
                raise ValueError(f"fields[{k}]: dtype and codec must be strings")
            spec = FieldSpec(f.get("name"), _dtype(f["dtype"]),  # type: ignore[arg-type]
                             _shape(f.get("shape", 0), f"fields[{k}].shape"), f["codec"])
            if spec.name in names:
                raise ValueError(f"field {spec.name!r} listed twice")
            names.add(spec.name)
            for key in ("index", "aux"):
                if not isinstance(f.get(key), str) or not INDEX_FILE.match(f[key]):
                    raise ValueError(f"field {spec.name!r}: bad {key} file name {f.get(key)!r:.120}")
            if spec.codec == "zstd_dict" and version < _DICT_VERSION:
                raise ValueError(f"field {spec.name!r}: codec zstd_dict in a version-{version} store")
            dname, dcrc = f.get("dict"), f.get("dict_crc")
            if dname is not None and (spec.codec != "zstd_dict" or not isinstance(dname, str)
                                      or not DICT_FILE.match(dname) or not isinstance(dcrc, int)
                                      or isinstance(dcrc, bool)):
                raise ValueError(f"field {spec.name!r}: bad dictionary entry {dname!r:.120}/"
                                 f"{dcrc!r:.40}")
            fields.append(FieldEntry(spec, f["index"], f["aux"], dname, dcrc))
        chunks = []
        seen: set[int] = set()
        for k, c in enumerate(_list(doc.get("chunks"), "chunks")):
            c = _obj(c, f"chunks[{k}]")
            cid = _nonneg_int(c, "id", f"chunks[{k}]", 2**32 - 1)
            if cid in seen:
                raise ValueError(f"chunk id {cid} repeated")
            seen.add(cid)
            if not isinstance(c.get("field"), str) or c["field"] not in names:
                raise ValueError(f"chunk {cid} belongs to unknown field {c.get('field')!r:.120}")
            chunks.append(ChunkInfo(cid, c["field"], _nonneg_int(c, "size", f"chunk {cid}")))
        attrs = _obj(doc.get("attrs", {}), "attrs")
        return Meta(
            length=_nonneg_int(doc, "length", "meta"),
            generation=_nonneg_int(doc, "generation", "meta"),
            commit=_nonneg_int(doc, "commit", "meta"),
            chunk_bytes=max(1, _nonneg_int(doc, "chunk_bytes", "meta")),
            fields=tuple(fields), chunks=tuple(chunks), attrs=attrs)
    except (KeyError, TypeError, ValueError, SchemaError) as e:
        raise CorruptionError(
            f"{os.path.join(path, META_NAME)} is damaged ({type(e).__name__}: {e}); restore it "
            "from a backup, or run `headrace verify` to see what else is affected") from e


# A meta.json of a million chunks is ~50 MB; anything past this is damage, not a store.
MAX_META_BYTES = 1 << 30
# Version 2: the document's last key, covering every byte before the comma that precedes it.
_CHECKSUM_KEY = b',\n "checksum": "crc32c:'
_CHECKSUM_TAIL = re.compile(rb',\n "checksum": "crc32c:([0-9a-f]{8})"\n\}\n?\Z')


def meta_bytes(doc: dict[str, Any]) -> bytes:
    """The bytes of ``meta.json`` for ``doc``: its JSON, then a crc32c of those bytes as the
    last key, so that any changed byte (an edited number, a duplicated key) is detected."""
    body = json.dumps({k: v for k, v in doc.items() if k != "checksum"}, indent=1).encode()
    assert body.endswith(b"\n}")
    head = body[:-2]
    return head + _CHECKSUM_KEY + b"%08x" % google_crc32c.value(head) + b'"\n}\n'


def parse_meta_bytes(raw: bytes, *, path: str) -> Meta:
    """Checks and parses the bytes of a ``meta.json`` (local or fetched from S3).

    Raises:
        NotAStoreError: not a headrace store's meta.json.
        FormatVersionError: written by a newer headrace.
        CorruptionError: damaged (not JSON, checksum mismatch, bad values).
    """
    where = os.path.join(path, META_NAME)
    fix = "restore it from a backup, or run `headrace verify` to see what else is affected"
    if len(raw) > MAX_META_BYTES:
        raise CorruptionError(f"{where} is {len(raw)} bytes, far more than any store's; it is "
                              f"damaged: {fix}")
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        # ValueError also covers an integer too long to convert (sys.int_info limits), and
        # RecursionError arrays or objects nested too deep: neither is a meta.json we wrote.
        what = "nested too deep" if isinstance(e, RecursionError) else str(e)[:200]
        raise CorruptionError(f"{where} is not valid JSON ({what}); {fix}") from None
    if isinstance(doc, dict) and doc.get("format") == FORMAT_NAME and doc.get("version") in (2, 3):
        m = _CHECKSUM_TAIL.search(raw, max(0, len(raw) - 64))
        if m is None or doc.get("checksum") != "crc32c:" + m.group(1).decode():
            raise CorruptionError(f"{where} has lost its checksum (the last key, \"checksum\"); "
                                  f"it was cut short or edited: {fix}")
        got = google_crc32c.value(raw[:m.start()])
        if got != int(m.group(1), 16):
            raise CorruptionError(f"{where} does not match its checksum (crc32c {got:08x}, "
                                  f"stored {m.group(1).decode()}); its bytes changed: {fix}")
    return meta_from_json(doc, path=path)


def store_leftovers(path: str) -> list[str]:
    """Names in ``path`` that only a store holds, when ``path`` has no ``meta.json``.

    A create or pack killed before its first commit leaves a ``chunks/`` folder (only ``<id>.zr``
    files in it) next to the writer's ``.lock``, ``<field>.index``/``.aux`` files or a
    ``meta.json.tmp``. Such a folder is a damaged store, never a folder of data files to read.
    Empty when the folder does not look like one.
    """
    try:
        names = os.listdir(path)
    except OSError:
        return []
    found = []
    cdir = os.path.join(path, CHUNK_DIR)
    if CHUNK_DIR in names and os.path.isdir(cdir) and not os.path.islink(cdir):
        try:
            inside = os.listdir(cdir)
        except OSError:
            inside = []
        if all(CHUNK_FILE.match(n) for n in inside):
            found.append(CHUNK_DIR + "/")
    stems = {n.rsplit(".", 1)[0] for n in names if n.endswith(".index") and INDEX_FILE.match(n)}
    found += sorted(n for n in names if INDEX_FILE.match(n) and n.rsplit(".", 1)[0] in stems
                    and n.endswith(".aux"))
    found += sorted(f"{s}.index" for s in stems if f"{s}.aux" in names)
    found += [n for n in (LOCK_NAME, META_TMP_NAME) if n in names]
    if META_TMP_NAME in found or (CHUNK_DIR + "/" in found and len(found) >= 2):
        return found
    return []


def looks_like_store(path: str) -> bool:
    """``path`` is a store folder (it has a ``meta.json`` of any kind), or one damaged before
    its first commit (``store_leftovers``): it is opened as a store, never read as raw files."""
    return os.path.lexists(os.path.join(path, META_NAME)) or bool(store_leftovers(path))


def read_meta(path: str) -> Meta:
    """Reads and validates ``<path>/meta.json``."""
    meta_path = os.path.join(path, META_NAME)
    if not os.path.isdir(path):
        raise NotAStoreError(f"{path} is not a headrace store: no such directory")
    try:
        fd = open_regular(meta_path)
    except FileNotFoundError:
        left = store_leftovers(path)
        if left:
            raise CorruptionError(
                f"{path} holds store files ({', '.join(left[:6])}) but no meta.json, so it is "
                "a damaged store (a create or pack killed before its first commit leaves this, as "
                "does a lost meta.json); delete the folder and pack again, or restore meta.json "
                "from a backup") from None
        raise NotAStoreError(
            f"{path} is not a headrace store: it has no meta.json; create one with "
            "headrace.create() or headrace.pack_arrays()") from None
    except IsADirectoryError:  # an O_RDONLY open of a folder only fails on odd platforms
        raise CorruptionError(f"{meta_path} is a directory, not a regular file; the store is "
                              "damaged") from None
    try:
        size = os.fstat(fd).st_size
        if size > MAX_META_BYTES:
            raise CorruptionError(f"{meta_path} is {size} bytes, far more than any store's; it "
                                  "is damaged: restore it from a backup")
        chunks = []
        while True:
            b = os.read(fd, 1 << 20)
            if not b:
                break
            chunks.append(b)
        raw = b"".join(chunks)
    finally:
        os.close(fd)
    return parse_meta_bytes(raw, path=path)


def read_dict(path: str, entry: FieldEntry) -> bytes | None:
    """The dictionary of a ``zstd_dict`` field (``None`` before the field has one), crc-checked.

    Raises:
        CorruptionError: the file is missing or its bytes do not match the crc in ``meta.json``.
    """
    if entry.dict_file is None:
        return None
    file = os.path.join(path, entry.dict_file)
    try:
        with open(file, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise CorruptionError(
            f"{file} is missing, but meta.json names it as the dictionary of field "
            f"{entry.spec.name!r}; restore it from a backup (the field cannot be decoded "
            "without it)", field=entry.spec.name) from None
    check_dict(data, entry, file)
    return data


def check_dict(data: bytes, entry: FieldEntry, where: str) -> None:
    """Raises ``CorruptionError`` unless ``data`` has the crc32c ``meta.json`` records."""
    import google_crc32c

    if int(google_crc32c.value(data)) != entry.dict_crc:
        raise CorruptionError(
            f"{where}: the dictionary of field {entry.spec.name!r} does not match its checksum "
            "in meta.json; restore it from a backup", field=entry.spec.name)


def fsync_dir(path: str) -> None:
    """Makes a directory's entries (created, renamed, removed files) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_meta(path: str, meta: Meta) -> None:
    """Atomically replaces ``meta.json``: temp file, fsync, rename, fsync of the directory."""
    data = meta_bytes(meta.to_json())
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
