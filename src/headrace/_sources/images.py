"""Image sources: a raw local image folder, an mx8 1.0.7 pack, a store made by ``pack_dir``.

All three give the image loader the same thing (:class:`ImageRecords`): the encoded bytes of
records ``0..N-1`` (zero-copy ``mmap`` views where the bytes sit in a file at a known offset), an
int64 label per record (``-1`` = unlabeled), the class names, and a path per record for error
messages. The folder and mx8 sources are also registered with ``headrace._sources.base`` so that a plain
``headrace.Loader(folder)`` reads them (fields ``image`` as ``Ragged`` bytes and ``label``).

Also here: the folder scan that ``pack_dir`` shares (sorted byte-wise by relative path, hidden and
non-image files skipped and counted, ImageFolder labels), the ImageFolder labelling rule and the
folder-records scaffolding that the audio/video folder source (``_media_sources``) shares too, and
``labels.tsv`` reading/writing with mx8's percent-encoding (``%`` ``%25``, space ``%20``, TAB
``%09``, non-ASCII bytes ``%C3%BC``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import itertools
import mmap
import os
import sys
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from headrace._base.errors import ConfigError, CorruptionError, RecordIndexError
from headrace._sources.walk import list_files
from headrace._store.format import looks_like_store

__all__ = ["IMAGE_EXTENSIONS", "LABELS_FILE", "FolderImages", "ImageRecords", "Mx8PackImages",
           "RawImages", "Scan", "ScannedFolder", "StoreImages", "check_record_ids", "decode_label",
           "drop_mapped_pages", "encode_label", "folder_class_labels", "is_image_folder",
           "is_mx8_pack", "label_paths", "open_image_records", "parse_labels_tsv",
           "read_labels_tsv", "scan_tree", "utf8_ragged", "write_labels_tsv"]

IMAGE_EXTENSIONS = frozenset({
    ".jpg", ".jpeg", ".jpe", ".jfif", ".png", ".webp", ".gif", ".bmp", ".tif", ".tiff",
    ".ppm", ".pgm", ".pbm", ".pnm",
})
LABEL_MODES = ("auto", "imagefolder", "none")

# -- labels.tsv ------------------------------------------------------------------------------------


def encode_label(name: str) -> str:
    """mx8's percent-encoding of a class name: ``%``, space, controls and non-ASCII bytes."""
    out = []
    for b in os.fsencode(name):
        if b == 0x25 or b <= 0x20 or b >= 0x7F:
            out.append(f"%{b:02X}")
        else:
            out.append(chr(b))
    return "".join(out)


def decode_label(text: str) -> str:
    """Inverse of :func:`encode_label` (undecodable UTF-8 keeps its bytes as surrogates)."""
    raw = bytearray()
    src = text.encode("utf-8", "surrogateescape")
    i = 0
    while i < len(src):
        c = src[i]
        if c == 0x25 and i + 3 <= len(src) and _is_hex(src[i + 1:i + 3]):
            raw.append(int(src[i + 1:i + 3], 16))
            i += 3
        else:
            raw.append(c)
            i += 1
    return os.fsdecode(bytes(raw))


def _is_hex(b: bytes) -> bool:
    return len(b) == 2 and all(chr(x) in "0123456789abcdefABCDEF" for x in b)


LABELS_FILE = "_labels.tsv"  # class names of a labelled store, one per line


def write_labels_tsv(path: str, classes: list[str], *, header: bool = False) -> None:
    """Writes ``label_id<TAB>encoded name`` lines (``header``: mx8's ``schema_version=1`` first)."""
    lines = (["schema_version=1"] if header else []) + [
        f"{i}\t{encode_label(c)}" for i, c in enumerate(classes)]
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        f.write("\n".join(lines) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_labels_tsv(path: str) -> list[str]:
    """Class names by label id from a headrace ``_labels.tsv`` or an mx8 ``labels.tsv``."""
    with open(path, encoding="utf-8", errors="surrogateescape", newline="") as f:
        return parse_labels_tsv(f.read(), path)


def parse_labels_tsv(text: str, path: str) -> list[str]:
    """:func:`read_labels_tsv` of the file's text (``path`` names it in errors)."""
    names: dict[int, str] = {}
    for n, line in enumerate(text.split("\n"), 1):
        line = line.rstrip("\r")
        if not line or line.startswith("#"):
            continue
        if line.startswith("schema_version="):
            if line != "schema_version=1":
                raise CorruptionError(f"{path}: unsupported labels {line} (expected "
                                      "schema_version=1)")
            continue
        key, sep, name = line.partition("\t")
        if not sep or not key.isdigit():
            raise CorruptionError(f"{path} line {n}: expected label_id<TAB>name, got {line!r}")
        names[int(key)] = decode_label(name)
    if sorted(names) != list(range(len(names))):
        raise CorruptionError(f"{path}: label ids must be 0..{len(names) - 1} without gaps")
    return [names[i] for i in range(len(names))]


# -- scanning a folder -----------------------------------------------------------------------------


@dataclass
class Scan:
    """The files under a root (images, or audio/video for ``_media_sources.scan_media``), in
    byte-wise order of their relative (``/``-separated) paths."""

    root: str
    paths: list[str]
    sizes: np.ndarray  # int64 file sizes
    labels: np.ndarray  # int64, -1 = unlabeled
    classes: list[str] | None
    skipped: dict[str, int] = field(default_factory=dict)
    note: str | None = None  # why records are unlabeled, when label_mode="auto" gave up
    mtimes: np.ndarray | None = None  # int64 st_mtime_ns


def _check_label_mode(label_mode: str | None, require_labels: bool) -> str:
    mode = "auto" if label_mode is None else label_mode
    if mode not in LABEL_MODES:
        raise ConfigError(f"invalid label mode {label_mode!r} (expected: auto|none|imagefolder)")
    if mode == "none" and require_labels:
        raise ConfigError("label_mode='none' contradicts require_labels=True; pass "
                          "label_mode='imagefolder' to label by first-level folder")
    return mode


def label_paths(paths: list[str], *, mode: str, require_labels: bool, root: str
                ) -> tuple[np.ndarray, list[str] | None, str | None]:
    """ImageFolder labels of sorted relative paths: ``(labels, classes, note)`` (see ``scan_tree``).

    Shared by the folder scan and the S3/link image sources, so a tree labels the same wherever
    it lives.
    """
    labels = np.full(len(paths), -1, np.int64)
    classes: list[str] | None = None
    note = None
    if mode != "none" and paths:
        top = [p for p in paths if "/" not in p]
        if top and (mode == "imagefolder" or require_labels):
            shown = ", ".join(top[:10]) + (f" ... ({len(top)} files)" if len(top) > 10 else "")
            raise ConfigError(
                f"require_labels/imagefolder mode requires files under <label>/<file>, but "
                f"{len(top)} image files sit directly in {root}: {shown}; move them into class "
                "folders or pass label_mode='auto'/'none'")
        if top:
            note = (f"label_mode='auto': {len(top)} image files sit directly in {root} (e.g. "
                    f"{', '.join(top[:3])}), so this is not an ImageFolder layout and the records "
                    "are unlabeled (label -1); move them into class folders, or pass "
                    "label_mode='none' to silence this")
        else:
            labels, classes = folder_class_labels(paths)
    return labels, classes, note


def folder_class_labels(paths: list[str]) -> tuple[np.ndarray, list[str]]:
    """The ImageFolder rule: ``(labels, classes)`` where a file's class is its first-level folder.

    Class ids follow the byte-wise sorted folder names, as mx8 1.0.7 assigns them; one rule for
    images and for audio/video folders, so a tree labels the same whatever it holds. Every path
    must sit in a folder (the callers check and say what to do when one does not).
    """
    first = [p.split("/", 1)[0] for p in paths]
    classes = sorted(set(first), key=os.fsencode)
    cid = {c: i for i, c in enumerate(classes)}
    return np.fromiter((cid[c] for c in first), np.int64, len(first)), classes


def scan_tree(root: str, *, label_mode: str | None = "auto", require_labels: bool = False,
              exclude: str | None = None, recursive: bool = True, fresh: bool = False) -> Scan:
    """Lists the image files under ``root`` with their labels (see ``pack_dir`` for the rules).

    ``recursive=False`` lists only the files directly in ``root`` (so none has a class folder).
    An unchanged tree listed before in this process is not walked again unless ``fresh``
    (see :mod:`headrace._sources.walk`).

    Raises:
        ConfigError: bad ``label_mode``; or labels are required (``imagefolder`` or
            ``require_labels``) and some files are not under a class folder (listed).
        FileNotFoundError: ``root`` is not a directory.
    """
    mode = _check_label_mode(label_mode, require_labels)
    root = os.path.abspath(root)
    if not os.path.isdir(root):
        raise FileNotFoundError(f"in_dir must be a directory: {root!r} is not one")
    listing = list_files(root, IMAGE_EXTENSIONS, exclude=exclude, recursive=recursive,
                         fresh=fresh)
    paths = listing.paths
    labels, classes, note = label_paths(paths, mode=mode, require_labels=require_labels,
                                        root=root)
    if not recursive:  # a flat listing asked for: no file has a class folder, by request
        note = None
    return Scan(root, paths, listing.sizes, labels, classes,
                {"hidden": listing.hidden, "non_image": listing.other}, note, listing.mtimes_ns)


# -- what the image loader reads ---------------------------------------------------------------------


def check_record_ids(ids: Any, n: int) -> np.ndarray:
    """``ids`` as int64, or :class:`RecordIndexError` naming (up to 8 of) those outside ``[0, n)``.

    Shared by the image and media records, so both refuse a bad id with the same message.
    """
    ids = np.asarray(ids, dtype=np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= n):
        bad = ids[(ids < 0) | (ids >= n)][:8].tolist()
        raise RecordIndexError(f"record ids {bad} are outside [0, {n})")
    return ids


class ImageRecords:
    """Encoded images ``0..N-1`` with labels; also a ``headrace._sources.base.Source``.

    Subclasses implement ``payloads`` (bytes or zero-copy views), ``_labels`` and ``path``.
    """

    classes: list[str] | None = None
    #: ``payloads(ids)`` returns views into memory the source already holds (no allocation).
    zero_copy: bool = False

    def __len__(self) -> int:
        raise NotImplementedError

    @property
    def fingerprint(self) -> str:
        raise NotImplementedError

    def payloads(self, ids: np.ndarray) -> list[Any]:
        raise NotImplementedError

    def labels(self, ids: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def path(self, i: int) -> str:
        raise NotImplementedError

    def payload_nbytes(self, ids: np.ndarray) -> int:
        """Bytes ``payloads(ids)`` allocates (0 for views of an existing mapping)."""
        raise NotImplementedError

    def record_nbytes(self, ids: np.ndarray) -> np.ndarray:
        """Each record's encoded bytes (the file as stored), what byte-aware batching
        (``batch_bytes``/``target_bytes``) counts, as mx8 counts a manifest's byte lengths."""
        raise NotImplementedError

    def release(self, payloads: list[Any]) -> None:
        """Done with ``payloads`` (decoded): views of a file mapping give their pages back
        to the kernel (see :func:`drop_mapped_pages`); copies are simply dropped."""
        if self.zero_copy:
            drop_mapped_pages(payloads)

    def _check(self, ids: np.ndarray) -> np.ndarray:
        return check_record_ids(ids, len(self))

    # -- the Source protocol (a generic Loader gets Ragged bytes and labels) ---------------------

    def nbytes(self, ids: np.ndarray) -> int:
        return self.raw_nbytes(ids) + 8 * (2 * len(ids) + 1)

    def raw_nbytes(self, ids: np.ndarray) -> int:
        raise NotImplementedError

    def gather(self, ids: np.ndarray) -> dict[str, Any]:
        from headrace._store.reader import Ragged

        ids = self._check(ids)
        parts = self.payloads(ids)
        lengths = np.fromiter((len(memoryview(p).cast("B")) for p in parts), np.int64, len(parts))
        offsets = np.zeros(len(parts) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        values = np.empty(int(offsets[-1]), np.uint8)
        for p, a, b in zip(parts, offsets[:-1].tolist(), offsets[1:].tolist(), strict=True):
            values[a:b] = np.frombuffer(p, np.uint8)
        return {"image": Ragged(values, offsets), "label": self.labels(ids)}

    def close(self) -> None:
        pass

    def __enter__(self) -> ImageRecords:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_libc_madvise: Any = None
_MADV_DONTNEED = 4  # Linux's value; the mmap module exports it only as a method's argument


def _madvise() -> Any:
    """libc's ``madvise`` through ctypes (Linux only), or ``False`` where it is not reachable."""
    global _libc_madvise
    if _libc_madvise is None:
        _libc_madvise = False
        if sys.platform.startswith("linux"):
            try:
                fn = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True).madvise
            except (OSError, AttributeError):
                return False
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            _libc_madvise = fn
    return _libc_madvise


def drop_mapped_pages(views: list[Any]) -> None:
    """Unmaps from this process the pages under ``views`` of read-only file mappings.

    An image decoded from a mapped store or mx8 shard leaves its file pages mapped in the process:
    after one pass over a 100 MB store the process's RSS is 100 MB higher than the loader's cap
    accounts for, though those pages are page cache (shared, reclaimable). ``MADV_DONTNEED``
    takes them out of this process's page tables only; the kernel keeps them cached, and a later
    read of the same bytes maps them again (a minor fault, no I/O). On a read-only mapping nothing
    can be lost: there are no private changes to discard. Contiguous views (a sequential batch)
    are one call.
    """
    fn = _madvise()
    if not fn:
        return
    page = mmap.PAGESIZE
    spans = []
    for v in views:
        n = len(v)
        if n:
            a = np.frombuffer(v, np.uint8).ctypes.data
            spans.append((a - a % page, a + n))
    spans.sort()
    start = end = -1
    for a, b in spans:
        if a > end:
            if end > start:
                fn(start, -(-(end - start) // page) * page, _MADV_DONTNEED)
            start = a
        end = max(end, b)
    if end > start:
        fn(start, -(-(end - start) // page) * page, _MADV_DONTNEED)


def utf8_ragged(texts: list[str]) -> Any:
    """Strings as a ``Ragged`` of their UTF-8 bytes (how stores hold paths and keys)."""
    from headrace._store.reader import Ragged

    blobs = [t.encode("utf-8", "surrogateescape") for t in texts]
    offsets = np.zeros(len(blobs) + 1, np.int64)
    np.cumsum([len(b) for b in blobs], out=offsets[1:])
    return Ragged(np.frombuffer(b"".join(blobs), np.uint8).copy(), offsets)


def _ragged_views(r: Any) -> list[Any]:
    """The records of a ``Ragged`` uint8 as views of its values (no copies)."""
    mv = memoryview(r.values)
    offs = r.offsets.tolist()
    return [mv[a:b] for a, b in itertools.pairwise(offs)]


class ScannedFolder:
    """Records that are the files of one folder :class:`Scan`, in its order: the length, the
    path per record and the fingerprint, shared by the image and the audio/video folder sources.

    The fingerprint hashes the relative paths, sizes and mtimes, so a checkpoint (or a cached
    video index) is not reused after files were added, removed or rewritten.
    """

    scan: Scan
    root: str
    classes: list[str] | None
    _fingerprint: str

    def _use_scan(self, scan: Scan, *, fingerprint_prefix: str, digest_chars: int) -> None:
        # prefix and digest length differ per source and stay as they were: fingerprints are
        # stored in checkpoints and video index caches
        self.scan = scan
        self.root = scan.root
        self.classes = scan.classes
        h = hashlib.sha256()
        assert scan.mtimes is not None
        for p, s, mt in zip(scan.paths, scan.sizes.tolist(), scan.mtimes.tolist(), strict=True):
            h.update(f"{p}\0{s}\0{mt}\n".encode("utf-8", "surrogateescape"))
        self._fingerprint = f"{fingerprint_prefix}:{len(scan.paths)}:{h.hexdigest()[:digest_chars]}"

    def __len__(self) -> int:
        return len(self.scan.paths)

    def record_nbytes(self, ids: np.ndarray) -> np.ndarray:
        """Each file's size, what byte-aware batching counts."""
        return self.scan.sizes[check_record_ids(ids, len(self))].astype(np.int64)

    @property
    def fingerprint(self) -> str:
        return self._fingerprint

    def path(self, i: int) -> str:
        return self.scan.paths[i]


class FolderImages(ScannedFolder, ImageRecords):
    """A raw local image tree, decoded on the fly (labels by first-level folder, see ``scan_tree``;
    fingerprint: see :class:`ScannedFolder`)."""

    def __init__(self, root: str | os.PathLike[str], *, label_mode: str | None = "auto",
                 require_labels: bool = False, recursive: bool = True,
                 fresh: bool = False) -> None:
        scan = scan_tree(os.fspath(root), label_mode=label_mode, require_labels=require_labels,
                         recursive=recursive, fresh=fresh)
        if scan.note is not None:
            warnings.warn(scan.note, UserWarning, stacklevel=3)
        self._use_scan(scan, fingerprint_prefix="folder", digest_chars=16)
        self._path_len = np.fromiter((len(p.encode("utf-8", "surrogateescape"))
                                      for p in scan.paths), np.int64, len(scan.paths))

    def payloads(self, ids: np.ndarray) -> list[Any]:
        out = []
        for i in self._check(ids).tolist():
            with open(os.path.join(self.root, self.scan.paths[i]), "rb") as f:
                out.append(f.read())
        return out

    def labels(self, ids: np.ndarray) -> np.ndarray:
        return self.scan.labels[self._check(ids)]

    def raw_nbytes(self, ids: np.ndarray) -> int:
        return int(self.scan.sizes[self._check(ids)].sum())

    payload_nbytes = raw_nbytes

    # A generic loader over a folder yields what it yields over ``pack_dir(folder)``: the
    # ``image`` bytes, ``label`` and ``path`` (UTF-8, relative, ``/``-separated).

    def nbytes(self, ids: np.ndarray) -> int:
        ids = self._check(ids)
        return super().nbytes(ids) + int(self._path_len[ids].sum()) + 8 * (len(ids) + 1)

    def gather(self, ids: np.ndarray) -> dict[str, Any]:
        out = super().gather(ids)
        out["path"] = utf8_ragged([self.scan.paths[i] for i in self._check(ids).tolist()])
        return out

    def __repr__(self) -> str:
        return f"FolderImages({self.root!r}, n={len(self)})"


class Mx8PackImages(ImageRecords):
    """An mx8 1.0.7 pack (``_mx8/manifest.tsv`` + ``shards/*.tar`` + ``_mx8/labels.tsv``).

    Manifest rows are read as mx8 does (schema_version=0, five TAB columns, ids contiguous from 0,
    byte ranges inside tar shards). Shard locations are absolute in mx8 packs; when one does not
    exist (the pack was copied or moved) ``<pack>/shards/<basename>`` is used, so relocated packs
    load too. Shards are ``mmap``-ed, so images are zero-copy views. The fingerprint is mx8's
    manifest hash, ``sha256(manifest.tsv)``.
    """

    zero_copy = True

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.path.abspath(os.fspath(root))
        mpath = os.path.join(self.root, "_mx8", "manifest.tsv")
        with open(mpath, "rb") as f:
            raw = f.read()
        self.manifest_hash = hashlib.sha256(raw).hexdigest()
        rows = _parse_manifest(raw.decode("utf-8", "surrogateescape"), mpath)
        locs: dict[str, int] = {}
        n = len(rows)
        self._loc = np.empty(n, np.int32)
        self._off = np.empty(n, np.int64)
        self._len = np.empty(n, np.int64)
        self._labels = np.full(n, -1, np.int64)
        for i, (loc, off, ln, hint) in enumerate(rows):
            self._loc[i] = locs.setdefault(loc, len(locs))
            self._off[i] = -1 if off is None else off
            self._len[i] = -1 if ln is None else ln
            label = _hint_label(hint, i)
            if label is not None:
                self._labels[i] = label
        self.locations = [self._resolve(loc) for loc in locs]
        self._sizes = np.array([os.path.getsize(p) for p in self.locations], np.int64)
        whole = self._len < 0
        if whole.any():
            self._len[whole] = self._sizes[self._loc[whole]]
            self._off[whole] = 0
        past = self._off + self._len > self._sizes[self._loc] if n else np.zeros(0, bool)
        if past.any():
            bad = np.flatnonzero(past)[:8].tolist()
            raise CorruptionError(f"mx8 pack {self.root}: byte ranges of records {bad} run past "
                                  "the end of their shard (truncated shard?)",
                                  record_ids=bad)
        lpath = os.path.join(self.root, "_mx8", "labels.tsv")
        self.classes = read_labels_tsv(lpath) if os.path.isfile(lpath) else None
        self._maps: dict[int, mmap.mmap | None] = {}
        self._lock = threading.Lock()

    def _resolve(self, loc: str) -> str:
        p = loc[7:] if loc.startswith("file://") else loc
        if not os.path.isabs(p):
            p = os.path.join(self.root, p)
        if os.path.isfile(p):
            return p
        moved = os.path.join(self.root, "shards", os.path.basename(p))
        if os.path.isfile(moved):
            return moved
        raise FileNotFoundError(f"mx8 pack {self.root}: shard {loc!r} does not exist, nor does "
                                f"{moved!r} (was the pack moved without its shards/ folder?)")

    def _map(self, li: int) -> mmap.mmap | None:
        with self._lock:
            if li not in self._maps:
                with open(self.locations[li], "rb") as f:
                    self._maps[li] = (mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                                      if self._sizes[li] else None)
            return self._maps[li]

    def __len__(self) -> int:
        return len(self._loc)

    @property
    def fingerprint(self) -> str:
        return f"mx8:{self.manifest_hash}"

    def path(self, i: int) -> str:
        return f"{self.locations[self._loc[i]]}[{int(self._off[i])}:+{int(self._len[i])}]"

    def payloads(self, ids: np.ndarray) -> list[Any]:
        ids = self._check(ids)
        out: list[Any] = []
        for li, off, ln in zip(self._loc[ids].tolist(), self._off[ids].tolist(),
                               self._len[ids].tolist(), strict=True):
            m = self._map(li)
            out.append(memoryview(m)[off:off + ln] if m is not None else b"")
        return out

    def labels(self, ids: np.ndarray) -> np.ndarray:
        return self._labels[self._check(ids)]

    def raw_nbytes(self, ids: np.ndarray) -> int:
        return int(self._len[self._check(ids)].sum())

    def record_nbytes(self, ids: np.ndarray) -> np.ndarray:
        """Each record's manifest ``byte_length``, what mx8's byte-aware batching counts."""
        return self._len[self._check(ids)].copy()

    def payload_nbytes(self, ids: np.ndarray) -> int:
        return 0

    def close(self) -> None:
        with self._lock:
            maps, self._maps = self._maps, {}
        for m in maps.values():
            if m is not None:
                try:
                    m.close()
                except BufferError:  # a view is still alive; the GC unmaps it later
                    pass

    def __repr__(self) -> str:
        return f"Mx8PackImages({self.root!r}, n={len(self)})"


def _parse_manifest(text: str, where: str) -> list[tuple[str, int | None, int | None, str]]:
    """mx8's canonical manifest TSV (A.5), validated with mx8's messages."""
    def bad(msg: str) -> CorruptionError:
        return CorruptionError(f"{where}: indexing parse error: {msg}")

    lines = text.split("\n")
    header = next((ln for ln in lines if ln.strip() and not ln.startswith("#")), None)
    if header is None or not header.startswith("schema_version="):
        raise bad("manifest header missing schema_version")
    if header.strip() != "schema_version=0":
        raise bad(f"unsupported {header.strip()}")
    rows: dict[int, tuple[str, int | None, int | None, str]] = {}
    seen_header = False
    for n, line in enumerate(lines, 1):
        if not line.strip() or line.startswith("#"):
            continue
        if not seen_header:
            seen_header = True
            continue
        cols = line.rstrip("\r").split("\t")
        if len(cols) != 5:
            raise bad(f"line {n}: expected 5 columns (sample_id<TAB>location<TAB>byte_offset"
                      "<TAB>byte_length<TAB>decode_hint)")
        sid, loc, off, ln, hint = cols
        if not loc:
            raise bad(f"line {n}: location must be non-empty")
        if bool(off) != bool(ln):
            raise bad(f"line {n}: byte_offset and byte_length must be set together (both Some "
                      "or both None)")
        try:
            i = int(sid)
            o = int(off) if off else None
            length = int(ln) if ln else None
        except ValueError:
            raise bad(f"line {n}: sample_id, byte_offset and byte_length must be integers"
                      ) from None
        if length is not None and length <= 0:
            raise bad(f"line {n}: byte_length must be > 0 when byte range is specified")
        rows[i] = (loc, o, length, hint)
    for want, got in enumerate(sorted(rows)):
        if want != got:
            raise bad(f"manifest invariant violated: expected sample_id {want} but found {got}")
    return [rows[i] for i in sorted(rows)]


def _hint_label(hint: str, i: int) -> int | None:
    if not hint.startswith("mx8:vision:imagefolder"):
        return None
    for part in hint.split(";")[1:]:
        key, _, value = part.partition("=")
        if key == "label_id":
            if not value.isdigit():
                raise CorruptionError(f"bad imagefolder label_id (sample_id={i}): {value!r}",
                                      record_ids=[i])
            return int(value)
    return None


class StoreImages(ImageRecords):
    """A headrace store of encoded images, local (``Store``) or on S3 (``RemoteStore``).

    Two layouts: ``pack_dir``'s (fields ``image``, ``label``, ``path``) and ``headrace.pack``'s
    (``bytes``, ``label``, ``key``). Class names come from ``attrs["classes"]`` (``pack``) or the
    ``_labels.tsv`` named in ``attrs["labels"]`` (``pack_dir``). A local store gives zero-copy views of
    its mapped chunks; a store on S3 is read by coalesced byte ranges per batch (``RemoteStore``),
    and its labels (8 bytes per record) are fetched once when it is opened, so a shuffled batch
    does not cost one small request per label.

    Args:
        store: an open ``Store`` or ``RemoteStore``.
        owned: close it with these records.
        length: serve only records ``[0, length)`` (a snapshot pinned before later appends).
    """

    zero_copy = True

    def __init__(self, store: Any, *, owned: bool = False, length: int | None = None) -> None:
        from headrace._store.fingerprint import store_fingerprint

        self.store = store
        self._owned = owned
        self._remote = hasattr(store, "url")  # a RemoteStore
        where = str(getattr(store, "url", None) or getattr(store, "path", "?"))
        fields = store.fields
        attrs = store.attrs
        # pack_arrow names fields after their columns and records which one holds the images.
        named = attrs.get("image_field")
        self._image = named if named in fields else next(
            (f for f in ("image", "bytes") if f in fields), None)
        if self._image is None:
            raise ConfigError(f"store {where!r} has no 'image' (pack_dir) or 'bytes' "
                              f"(headrace.pack) field (fields: {sorted(fields)}); pack images "
                              "with headrace.pack_dir")
        self._path_field = next((f for f in ("path", "key") if f in fields), None)
        self._raw = fields[self._image].codec == "raw" and not self._remote
        self.zero_copy = self._raw
        self._label = str(attrs.get("label_field") or "label")
        self._has_label = self._label in fields
        self._length = len(store) if length is None else int(length)
        if isinstance(attrs.get("classes"), list):
            self.classes = [str(c) for c in attrs["classes"]]
        elif attrs.get("labels"):
            self.classes = self._read_labels(str(attrs["labels"]), where)
        self._fingerprint = store_fingerprint(store, length=self._length)
        self._labels: np.ndarray | None = None
        if self._remote and self._has_label and self._length:
            self._labels = np.asarray(
                store.gather(np.arange(self._length), [self._label])[self._label],
                np.int64).reshape(-1)

    def _read_labels(self, name: str, where: str) -> list[str] | None:
        if self._remote:
            from headrace._remote.objstore import ObjectNotFoundError
            from headrace._remote.store import objstore_prefix

            try:
                raw, _ = self.store._os.get(objstore_prefix(self.store.url) + name)
            except ObjectNotFoundError:
                return None
            return parse_labels_tsv(raw.decode("utf-8", "surrogateescape"), f"{where}/{name}")
        lpath = os.path.join(self.store.path, name)
        return read_labels_tsv(lpath) if os.path.isfile(lpath) else None

    def __len__(self) -> int:
        return self._length

    @property
    def fingerprint(self) -> str:
        return self._fingerprint

    def path(self, i: int) -> str:
        if self._path_field is None:
            return f"{getattr(self.store, 'url', None) or self.store.path}#{i}"
        r = self.store.gather(np.array([int(i)], np.int64), [self._path_field])[self._path_field]
        return bytes(r[0]).decode("utf-8", "surrogateescape")

    def payloads(self, ids: np.ndarray) -> list[Any]:
        ids = self._check(ids)
        if self._remote:
            return _ragged_views(self.store.gather(ids, [self._image])[self._image])
        return list(self.store.views(ids, self._image))

    def labels(self, ids: np.ndarray) -> np.ndarray:
        ids = self._check(ids)
        if not self._has_label:
            return np.full(len(ids), -1, np.int64)
        if self._labels is not None:
            return self._labels[ids]
        return np.asarray(self.store.gather(ids, [self._label])[self._label],
                          np.int64).reshape(-1)

    def raw_nbytes(self, ids: np.ndarray) -> int:
        return int(self.store.nbytes(self._check(ids), [self._image]))

    def payload_nbytes(self, ids: np.ndarray) -> int:
        return 0 if self._raw else self.raw_nbytes(ids)

    def record_nbytes(self, ids: np.ndarray) -> np.ndarray:
        ids = self._check(ids)
        return np.asarray(self.store.aux_entries(self._image)["nbytes"], np.int64)[ids]

    def close(self) -> None:
        if self._owned:
            self.store.close()

    def __repr__(self) -> str:
        return f"StoreImages({self.store!r})"


class RawImages(ImageRecords):
    """The image files of a raw dataset link (an ``s3://`` prefix, a pinned local folder).

    Wraps the link's :class:`~headrace._sources.raw.RawSource` (its pinned snapshot, stale-object
    checks, concurrent GETs and byte cache) and applies the folder rules of ``scan_tree``: only
    files with an image extension are records (hidden ones are never listed), and labels follow
    ``label_mode`` (first-level folder), so an image tree gives the same records, labels and
    classes locally, packed, or on S3.
    """

    def __init__(self, raw: Any, *, label_mode: str | None = "auto",
                 require_labels: bool = False) -> None:
        mode = _check_label_mode(label_mode, require_labels)
        self.raw = raw
        self.base = raw.snapshot.link.base
        keys = raw.manifest.keys
        keep = [i for i, k in enumerate(keys)
                if os.path.splitext(k)[1].lower() in IMAGE_EXTENSIONS]
        if not keep:
            raise ConfigError(f"{self.base} holds no image files ({len(keys)} other objects; "
                              f"image extensions: {', '.join(sorted(IMAGE_EXTENSIONS))})")
        self._ids = np.array(keep, np.int64)
        self.paths = [keys[i] for i in keep]
        self._labels, self.classes, note = label_paths(self.paths, mode=mode,
                                                       require_labels=require_labels,
                                                       root=self.base)
        if note is not None:
            warnings.warn(note, UserWarning, stacklevel=4)

    def __len__(self) -> int:
        return len(self._ids)

    @property
    def fingerprint(self) -> str:
        return f"{self.raw.fingerprint}:images"

    def path(self, i: int) -> str:
        return f"{self.base}/{self.paths[i]}"

    def payloads(self, ids: np.ndarray) -> list[Any]:
        return _ragged_views(self.raw.gather(self._ids[self._check(ids)])["bytes"])

    def labels(self, ids: np.ndarray) -> np.ndarray:
        return self._labels[self._check(ids)]

    def raw_nbytes(self, ids: np.ndarray) -> int:
        return int(self.raw.nbytes(self._ids[self._check(ids)]))

    payload_nbytes = raw_nbytes

    def record_nbytes(self, ids: np.ndarray) -> np.ndarray:
        return np.asarray(self.raw.record_nbytes(self._ids[self._check(ids)]), np.int64)

    def close(self) -> None:
        self.raw.close()

    def __repr__(self) -> str:
        return f"RawImages({self.base!r}, n={len(getattr(self, '_ids', ()))})"


# -- opening ---------------------------------------------------------------------------------------


def is_mx8_pack(data: Any) -> bool:
    """A directory holding ``_mx8/manifest.tsv``."""
    return isinstance(data, str | os.PathLike) and os.path.isfile(
        os.path.join(os.fspath(data), "_mx8", "manifest.tsv"))


def _has_image(path: str, depth: int) -> bool:
    try:
        with os.scandir(path) as it:
            entries = [e for e in it if not e.name.startswith(".")]
    except OSError:
        return False
    if any(e.is_file() and os.path.splitext(e.name)[1].lower() in IMAGE_EXTENSIONS
           for e in entries):
        return True
    return depth > 0 and any(e.is_dir() and _has_image(e.path, depth - 1) for e in entries)


def is_image_folder(data: Any) -> bool:
    """A local directory, neither a headrace store nor an mx8 pack, with image files in it or in
    its first-level folders (so a generic loader does not claim unrelated directories)."""
    if not isinstance(data, str | os.PathLike):
        return False
    p = os.fspath(data)
    return (os.path.isdir(p) and not looks_like_store(p)
            and not is_mx8_pack(p) and _has_image(p, 1))


def _split_suffix(text: str) -> tuple[str, str | None]:
    """``base@refresh`` / ``base@sha256:<h>`` -> ``(base, suffix)``; anything else -> ``(text, None)``."""
    head, at, suffix = text.rpartition("@")
    if at and head and "/" not in suffix and not os.path.exists(text) and (
            suffix == "refresh" or suffix.startswith("sha256:")):
        return head, suffix
    return text, None


def open_image_records(data: Any, *, label_mode: str | None = "auto",
                       require_labels: bool = False, **link_options: Any) -> ImageRecords:
    """A store, an mx8 pack, an image folder or a dataset link as ``ImageRecords``.

    * ``s3://bucket/prefix/`` and ``file://`` links (with ``@refresh`` / ``@sha256:<h>``) resolve
      to a pinned snapshot (:mod:`headrace._sources.links`): a store there is read by byte ranges,
      a raw prefix of image files object by object.
    * a local path with ``@sha256:<h>``: an mx8 pack is checked against its manifest hash; a store
      or folder goes through the snapshot pinned as ``<h>`` (``LinkError`` if unknown or changed).
    * a local path, or one with ``@refresh``: read as it is now (store, mx8 pack or folder).

    Args:
        link_options: for links only: ``store`` (manifest store root), ``recursive``,
            ``cache_dir``/``cache_bytes``, ``max_inflight``, ``verify`` and S3 settings
            (``endpoint``, ``region``, ...); see :func:`headrace._sources.links.open_link`.
    """
    if isinstance(data, ImageRecords):
        return data
    if type(data).__name__ in ("Store", "RemoteStore") and type(data).__module__ in (
            "headrace._store.reader", "headrace._remote.store"):
        return StoreImages(data)
    if not isinstance(data, str | os.PathLike):
        raise ConfigError(f"cannot read images from {data!r}: pass a store path or Store, an mx8 "
                          "pack directory, an image folder or an s3:// link")
    text = os.fspath(data)
    if isinstance(text, str) and text.startswith(("s3://", "file://")):
        return _open_link(text, label_mode, require_labels, link_options)
    base, suffix = _split_suffix(text) if isinstance(text, str) else (text, None)
    if suffix is not None and suffix.startswith("sha256:"):
        if not is_mx8_pack(base):
            return _open_link(text, label_mode, require_labels, link_options)
        recs = Mx8PackImages(base)
        pinned = suffix[7:]
        if recs.manifest_hash != pinned:
            recs.close()
            from headrace._base.errors import LinkError

            raise LinkError(f"{text}: the mx8 manifest here hashes to {recs.manifest_hash}; the "
                            "pack changed since the link was pinned")
        return recs
    p = base  # a plain path, or @refresh: a local store/pack/folder is read as it is now
    if os.path.isdir(p) and looks_like_store(p):  # a damaged one too: open() says so
        from headrace._store.reader import open as open_store

        return StoreImages(open_store(p), owned=True)
    if is_mx8_pack(p):
        return Mx8PackImages(p)
    if os.path.isdir(p):
        return FolderImages(p, label_mode=label_mode, require_labels=require_labels,
                            recursive=link_options.get("recursive", True),
                            fresh=suffix == "refresh")
    raise FileNotFoundError(f"no such dataset {p!r}: expected a headrace store, an mx8 pack "
                            "directory, an image folder or an s3:// link")


def _open_link(text: str, label_mode: str | None, require_labels: bool,
               options: dict[str, Any]) -> ImageRecords:
    from headrace._sources.base import open_source
    from headrace._sources.raw import RawSource

    _check_label_mode(label_mode, require_labels)
    # an mx8 pack on S3 is claimed by its own kind; any other link resolves to a snapshot (raw
    # sources are unlabeled: RawImages labels them by scan_tree's rules)
    src = open_source(text, **options)
    if isinstance(src, ImageRecords):
        return src
    try:
        if isinstance(src, RawSource):
            return RawImages(src, label_mode=label_mode, require_labels=require_labels)
        store = getattr(src, "store", src)  # a pinned local store, or the RemoteStore itself
        return StoreImages(store, owned=True, length=len(src))
    except BaseException:
        src.close()
        raise


def _register() -> None:
    from headrace._sources.base import register_source

    register_source("image-folder", is_image_folder,
                    lambda d, **kw: FolderImages(d, **kw))
    register_source("mx8-pack", is_mx8_pack, _open_pack)


def _open_pack(data: Any, *, recursive: bool = True) -> Mx8PackImages:
    # ``recursive`` is mx8's listing keyword: a pack's manifest lists its records, so (as in mx8)
    # it changes nothing here
    del recursive
    return Mx8PackImages(data)


_register()
