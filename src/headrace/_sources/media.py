"""Audio and video files as records: a raw local folder, a store made by :func:`pack_media`, or
an mx8 pack (``mx8.pack_dir`` of media files).

Both give the audio and video loaders the same thing (:class:`MediaFiles`): a file-like reader per
record (a real file for a folder, a seekable zero-copy view of the ``mmap`` for a raw store field),
an int64 label per record (``-1`` = unlabeled), class names, and a path per record for messages.

Folder rules are ``pack_dir``'s: files sorted byte-wise by their ``/``-separated relative path,
hidden files and folders skipped, files of other kinds (by extension) skipped and counted, labels
by first-level folder when every file sits in one (class ids = byte-wise sorted folder names).
"""

from __future__ import annotations

import hashlib
import io
import os
import struct
from typing import Any, BinaryIO

import numpy as np

from headrace._base.errors import ConfigError
from headrace._base.fsutil import replace_store
from headrace._sources.images import (
    LABELS_FILE,
    Mx8PackImages,
    Scan,
    ScannedFolder,
    check_record_ids,
    folder_class_labels,
    is_mx8_pack,
    read_labels_tsv,
    write_labels_tsv,
)
from headrace._sources.walk import list_files

__all__ = ["AUDIO_EXTENSIONS", "VIDEO_EXTENSIONS", "FolderMedia", "MediaFiles", "Mx8PackMedia",
           "StoreMedia", "ViewReader", "open_media", "pack_media", "scan_media"]

AUDIO_EXTENSIONS = frozenset({
    ".wav", ".wave", ".flac", ".ogg", ".oga", ".opus", ".mp3", ".aif", ".aiff", ".aifc", ".au",
    ".snd", ".caf", ".w64", ".rf64", ".m4a", ".aac", ".wma", ".webm",
})
VIDEO_EXTENSIONS = frozenset({
    ".mp4", ".m4v", ".mov", ".mkv", ".webm", ".avi", ".mpg", ".mpeg", ".ts", ".m2ts", ".flv",
    ".wmv", ".3gp", ".ogv", ".y4m",
})
_KINDS = {"audio": AUDIO_EXTENSIONS, "video": VIDEO_EXTENSIONS}
#: store fields that may hold the media bytes, in the order they are looked for
MEDIA_FIELDS = ("media", "audio", "video", "bytes")


def _extensions(kind: str) -> frozenset[str]:
    try:
        return _KINDS[kind]
    except KeyError:
        raise ConfigError(f"media kind {kind!r} must be 'audio' or 'video'") from None


# -- a seekable reader over bytes the source already holds ------------------------------------------


class ViewReader(io.RawIOBase):
    """A read-only, seekable file over a buffer (no copy of the whole buffer; reads copy slices).

    libsndfile and FFmpeg both accept it as a file object.
    """

    def __init__(self, buf: Any) -> None:
        super().__init__()
        self._view = memoryview(buf).cast("B")
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def read(self, size: int | None = -1) -> bytes:
        n = len(self._view)
        end = n if size is None or size < 0 else min(n, self._pos + size)
        out = bytes(self._view[self._pos:end]) if end > self._pos else b""
        self._pos = max(self._pos, end)
        return out

    def readinto(self, b: Any) -> int:
        data = self.read(len(memoryview(b)))
        memoryview(b).cast("B")[:len(data)] = data
        return len(data)

    def size(self) -> int:
        return len(self._view)


# -- scanning a folder ------------------------------------------------------------------------------


def scan_media(root: str, *, kind: str, labels: bool | None = None,
               exclude: str | None = None, recursive: bool = True, fresh: bool = False) -> Scan:
    """Lists the ``kind`` (``"audio"``/``"video"``) files under ``root`` with their labels.

    Args:
        recursive: list subfolders too (``False``: only the files directly in ``root``).
        fresh: walk the folder even when an unchanged listing of it is cached
            (see :mod:`headrace._sources.walk`).
        labels: ``True`` labels by first-level folder (every file must sit in one), ``False``
            never, ``None`` when every file sits in a folder.
    """
    exts = _extensions(kind)
    root = os.path.abspath(root)
    if not os.path.isdir(root):
        raise FileNotFoundError(f"no such folder {root!r}")
    listing = list_files(root, exts, exclude=exclude, recursive=recursive, fresh=fresh)
    paths, sizes = listing.paths, listing.sizes
    label_ids = np.full(len(paths), -1, np.int64)
    classes = None
    top = [p for p in paths if "/" not in p]
    if labels and top:
        raise ConfigError(f"labels=True needs every file under <label>/<file>, but {len(top)} "
                          f"files sit directly in {root} (e.g. {top[:3]}); move them into class "
                          "folders or pass labels=None/False")
    if labels is not False and paths and not top:
        label_ids, classes = folder_class_labels(paths)
    return Scan(root, paths, sizes, label_ids, classes,
                {"hidden": listing.hidden, f"non_{kind}": listing.other},
                mtimes=listing.mtimes_ns)


# -- records ----------------------------------------------------------------------------------------


class MediaFiles:
    """Media records ``0..N-1``: a reader, a label and a path each."""

    classes: list[str] | None = None

    def __len__(self) -> int:
        raise NotImplementedError

    @property
    def fingerprint(self) -> str:
        raise NotImplementedError

    def open(self, i: int) -> BinaryIO | str:
        """A file name or a seekable binary file object with record ``i``'s bytes."""
        raise NotImplementedError

    def path(self, i: int) -> str:
        raise NotImplementedError

    def labels(self, ids: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def payload_nbytes(self, ids: np.ndarray) -> int:
        """Bytes ``open`` copies into memory for these records (0 for files and mmap views)."""
        return 0

    def record_nbytes(self, ids: np.ndarray) -> np.ndarray:
        """Each record's encoded bytes (the file as stored), what byte-aware batching
        (``batch_bytes``/``target_bytes``) counts, as mx8 counts a manifest's byte lengths."""
        raise NotImplementedError

    def check(self, ids: Any) -> np.ndarray:
        return check_record_ids(ids, len(self))

    def close(self) -> None:
        pass


class FolderMedia(ScannedFolder, MediaFiles):
    """A raw local folder of audio or video files (see :func:`scan_media`; fingerprint: see
    :class:`~headrace._sources.images.ScannedFolder`)."""

    def __init__(self, root: str | os.PathLike[str], *, kind: str,
                 labels: bool | None = None, recursive: bool = True,
                 fresh: bool = False) -> None:
        self._use_scan(scan_media(os.fspath(root), kind=kind, labels=labels, recursive=recursive,
                                  fresh=fresh),
                       fingerprint_prefix=f"{kind}-folder", digest_chars=24)

    def open(self, i: int) -> str:
        return os.path.join(self.root, self.scan.paths[i])

    def labels(self, ids: np.ndarray) -> np.ndarray:
        return self.scan.labels[self.check(ids)]

    def __repr__(self) -> str:
        return f"FolderMedia({self.root!r}, n={len(self)})"


class StoreMedia(MediaFiles):
    """A headrace store with a ragged bytes field (``media``, ``audio``, ``video`` or ``bytes``),
    optional ``label`` (int64) and ``path`` fields: what :func:`pack_media` writes."""

    def __init__(self, store: Any, *, owned: bool = False, kind: str | None = None) -> None:
        from headrace._store.fingerprint import store_fingerprint

        self.store = store
        self._owned = owned
        attrs = store.attrs
        # pack_arrow / pack_webdataset name fields after their columns or extensions and record
        # which one holds each kind of media.
        named = (attrs.get(f"{kind}_field") if kind else None) or attrs.get(
            "audio_field") or attrs.get("video_field")
        name = named if named in store.fields else next(
            (f for f in MEDIA_FIELDS if f in store.fields), None)
        if name is None or store.fields[name].shape is not None:
            raise ConfigError(f"store {store.path!r} has no ragged bytes field named one of "
                              f"{list(MEDIA_FIELDS)} (fields: {sorted(store.fields)}); pack "
                              "media files with headrace._sources.media.pack_media")
        self.field = name
        self._raw = store.fields[name].codec == "raw"
        self._label = str(attrs.get("label_field") or "label")
        self._has_label = self._label in store.fields
        self._has_path = "path" in store.fields
        lname = attrs.get("labels")
        lpath = os.path.join(store.path, lname) if lname else None
        self.classes = read_labels_tsv(lpath) if lpath and os.path.isfile(lpath) else None
        if self.classes is None and isinstance(attrs.get("classes"), list):
            self.classes = [str(c) for c in attrs["classes"]]
        self._fingerprint = store_fingerprint(store)

    def __len__(self) -> int:
        return len(self.store)

    @property
    def fingerprint(self) -> str:
        return self._fingerprint

    def open(self, i: int) -> BinaryIO:
        i = int(self.check([i])[0])
        if self._raw:
            return ViewReader(self.store.views(np.array([i], np.int64), self.field)[0])  # type: ignore[return-value]
        return ViewReader(self.store.record(i, self.field))  # type: ignore[return-value]

    def path(self, i: int) -> str:
        if not self._has_path:
            return f"{self.store.path}#{i}"
        return bytes(self.store.record(int(i), "path")).decode("utf-8", "surrogateescape")

    def labels(self, ids: np.ndarray) -> np.ndarray:
        ids = self.check(ids)
        if not self._has_label or not len(ids):
            return np.full(len(ids), -1, np.int64)
        return np.asarray(self.store.gather(ids, [self._label])[self._label],
                          np.int64).reshape(-1)

    def payload_nbytes(self, ids: np.ndarray) -> int:
        return 0 if self._raw else int(self.store.nbytes(self.check(ids), [self.field]))

    def record_nbytes(self, ids: np.ndarray) -> np.ndarray:
        ids = self.check(ids)
        return np.asarray(self.store.aux_entries(self.field)["nbytes"], np.int64)[ids]

    def close(self) -> None:
        if self._owned:
            self.store.close()

    def __repr__(self) -> str:
        return f"StoreMedia({self.store!r})"


def open_media(data: Any, *, kind: str, labels: bool | None = None,
               recursive: bool = True) -> MediaFiles:
    """A store (path or ``Store``) or a raw folder of ``kind`` files as :class:`MediaFiles`.

    ``recursive`` (mx8's keyword) applies to folders: ``False`` reads only the files directly in
    it; a store lists its own records."""
    if isinstance(data, MediaFiles):
        return data
    if type(data).__name__ == "Store" and type(data).__module__ == "headrace._store.reader":
        return StoreMedia(data, kind=kind)
    if isinstance(data, str | os.PathLike):
        p = os.fspath(data)
        fresh = p.endswith("@refresh")  # a local store is always read at its latest commit,
        if fresh:  # a folder is listed again
            p = p[: -len("@refresh")]
        if os.path.isfile(os.path.join(p, "meta.json")):
            from headrace._store.reader import open as open_store

            return StoreMedia(open_store(p), owned=True, kind=kind)
        if is_mx8_pack(p):
            return Mx8PackMedia(p)
        if os.path.isdir(p):
            return FolderMedia(p, kind=kind, labels=labels, recursive=recursive, fresh=fresh)
        raise FileNotFoundError(f"no such dataset {p!r}: expected a headrace store or a folder "
                                f"of {kind} files")
    raise ConfigError(f"cannot read {kind} from {data!r}: pass a store path or Store, or a "
                      f"folder of {kind} files")


class Mx8PackMedia(MediaFiles):
    """An mx8 pack (``mx8.pack_dir`` of audio or video files) as media records: each record a
    zero-copy view of its tar member; labels and classes from the pack's ImageFolder hints."""

    def __init__(self, root: str) -> None:
        self.pack = Mx8PackImages(root)
        self.classes = self.pack.classes

    def __len__(self) -> int:
        return len(self.pack)

    @property
    def fingerprint(self) -> str:
        return self.pack.fingerprint

    def open(self, i: int) -> BinaryIO:
        return ViewReader(self.pack.payloads(np.array([i], np.int64))[0])  # type: ignore[return-value]

    def path(self, i: int) -> str:
        return self.pack.path(int(i))

    def labels(self, ids: np.ndarray) -> np.ndarray:
        return self.pack.labels(self.check(ids))

    def record_nbytes(self, ids: np.ndarray) -> np.ndarray:
        return self.pack.record_nbytes(ids)

    def close(self) -> None:
        self.pack.close()

    def __repr__(self) -> str:
        return f"Mx8PackMedia({self.pack.root!r}, n={len(self)})"


# -- packing ----------------------------------------------------------------------------------------


def pack_media(in_dir: str | os.PathLike[str], *, out: str | os.PathLike[str], kind: str,
               labels: bool | None = None, chunk_mb: float = 256,
               overwrite: bool = False, progress: bool | None = None) -> dict[str, Any]:
    """Packs the ``kind`` files under ``in_dir`` into a new store: fields ``media`` (the file's
    bytes, unchanged), ``label`` (int64, ``-1`` unlabeled), ``path`` (UTF-8 relative path).

    Files are read and appended one at a time (memory stays at one file); ``progress`` shows a
    bar on stderr (``None``: only on a terminal). Returns
    ``{"samples", "classes", "labels_path", "skipped", "dataset_hash", "path"}``.
    """
    from headrace._base.progress import progress as progress_bar
    from headrace._store.writer import create

    out = os.path.abspath(os.fspath(out))
    scan = scan_media(os.fspath(in_dir), kind=kind, labels=labels, exclude=out)
    if not scan.paths:
        raise ConfigError(f"{scan.root} holds no {kind} files (skipped: {scan.skipped})")
    replace_store(out, overwrite=overwrite, who="pack_media")
    attrs: dict[str, Any] = {"kind": kind}
    if scan.classes is not None:
        attrs["labels"] = LABELS_FILE
    digest = hashlib.sha256()
    with create(out, fields={"media": "bytes", "label": "int64", "path": "bytes"},
                chunk_mb=chunk_mb, attrs=attrs) as w, \
            progress_bar(int(scan.sizes.sum()), desc="pack_media", enabled=progress) as bar:
        if scan.classes is not None:
            write_labels_tsv(os.path.join(out, LABELS_FILE), scan.classes)
        for rel, label in zip(scan.paths, scan.labels.tolist(), strict=True):
            with open(os.path.join(scan.root, rel), "rb") as f:
                blob = f.read()
            path = rel.encode("utf-8", "surrogateescape")
            digest.update(struct.pack("<QqQ", len(blob), label, len(path)) + path)
            digest.update(blob)
            w.append({"media": [blob], "label": np.array([label], np.int64), "path": [path]})
            bar.update(len(blob))
        w.commit()
    return {"samples": len(scan.paths), "classes": scan.classes,
            "labels_path": os.path.join(out, LABELS_FILE) if scan.classes else None,
            "skipped": dict(scan.skipped), "dataset_hash": digest.hexdigest(), "path": out}
