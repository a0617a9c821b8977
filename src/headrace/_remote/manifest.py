"""Manifests (what a listing found) and the content-addressed manifest store that pins them.

A manifest is the list of records a base held when it was listed: for a folder or an object prefix,
one record per file/object ``(record id, key, size, etag, mtime_ns, label)`` with keys relative to the
base (so the same data gives the same hash wherever it lives, unlike mx8's absolute paths); for a
packed store, the store's committed state ``(length, generation, commit)``. Its canonical bytes are a
small TSV; the manifest hash is their sha256.

Store layout (mx8's, so an mx8 user finds the same things)::

    <root>/by-hash/<sha256>                           canonical manifest bytes
    <root>/intent/sha256_<sha256(base)>/current       the pinned hash (64 hex)
    <root>/intent/sha256_<sha256(base)>/base          the base, for humans
    <root>/locks/sha256_<sha256(base)>.lock           flock target while a base is listed

Root: ``store=`` > ``$HEADRACE_MANIFEST_STORE`` > ``$MX8_MANIFEST_STORE_ROOT`` > the platform user cache
dir (``platformdirs.user_cache_dir("headrace")/manifests``). Every file is published by writing a
temporary file, fsyncing it, renaming it over the target and fsyncing the directory (and the parent
of every directory made for it), so a reader never sees half a manifest and a power cut never loses
a pin that was published; listing a base holds an exclusive ``flock`` so two processes pin one snapshot, not two.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import os
import tempfile
from collections.abc import Iterator, Sequence
from typing import Literal

import numpy as np

from headrace._base.errors import LinkError

__all__ = ["Manifest", "ManifestStore", "manifest_store_root"]

_MAGIC = "headrace-manifest"
_VERSION = 1
_ESC = {"%": "%25", "\t": "%09", "\n": "%0A", "\r": "%0D"}
_UNESC = {v: k for k, v in _ESC.items()}


def _esc(s: str) -> str:
    return "".join(_ESC.get(c, c) for c in s)


def _unesc(s: str) -> str:
    if "%" not in s:
        return s
    out, i = [], 0
    while i < len(s):
        tok = s[i:i + 3]
        if s[i] == "%" and tok in _UNESC:
            out.append(_UNESC[tok])
            i += 3
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


@dataclasses.dataclass(frozen=True, eq=False)
class Manifest:
    """One snapshot of a base.

    Attributes:
        kind: ``"objects"`` (a folder / prefix: one record per file) or ``"store"`` (a packed store).
        keys: object keys relative to the base, ``/``-separated, sorted (``objects``).
        sizes: int64 byte size per record.
        etags: the ETag per record (S3) or ``""`` (local files).
        mtimes_ns: modification time per record in ns since the epoch.
        labels: the label name per record: the first folder of its key, ``""`` at the top level.
        store: ``{"length", "generation", "commit"}`` of a packed store (``store``).
    """

    kind: Literal["objects", "store"]
    keys: tuple[str, ...] = ()
    sizes: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))
    etags: tuple[str, ...] = ()
    mtimes_ns: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))
    labels: tuple[str, ...] = ()
    store: dict[str, int] | None = None

    def __post_init__(self) -> None:
        n = len(self.keys)
        if not (len(self.sizes) == len(self.etags) == len(self.mtimes_ns) == len(self.labels) == n):
            raise LinkError("manifest columns have different lengths")
        if self.kind == "store" and self.store is None:
            raise LinkError("a store manifest needs its store state")

    @classmethod
    def from_objects(cls, entries: Sequence[tuple[str, int, str, int]]) -> Manifest:
        """Builds an ``objects`` manifest from ``(relative key, size, etag, mtime_ns)``."""
        entries = sorted(entries)
        keys = tuple(e[0] for e in entries)
        return cls(kind="objects", keys=keys,
                   sizes=np.array([e[1] for e in entries], np.int64),
                   etags=tuple(e[2] for e in entries),
                   mtimes_ns=np.array([e[3] for e in entries], np.int64),
                   labels=tuple(k.split("/", 1)[0] if "/" in k else "" for k in keys))

    @classmethod
    def for_store(cls, *, length: int, generation: int, commit: int) -> Manifest:
        return cls(kind="store",
                   store={"length": int(length), "generation": int(generation),
                          "commit": int(commit)})

    def __len__(self) -> int:
        return self.store["length"] if self.store is not None else len(self.keys)

    @property
    def class_names(self) -> list[str]:
        """Sorted distinct non-empty label names (ImageFolder classes)."""
        return sorted({lb for lb in self.labels if lb})

    def canonical_bytes(self) -> bytes:
        """The bytes whose sha256 is the manifest hash (one TSV line per record)."""
        lines = [f"{_MAGIC}\tversion={_VERSION}\tkind={self.kind}\n"]
        if self.store is not None:
            s = self.store
            lines.append(f"length={s['length']}\tgeneration={s['generation']}\t"
                         f"commit={s['commit']}\n")
        for i, k in enumerate(self.keys):
            lines.append(f"{i}\t{_esc(k)}\t{int(self.sizes[i])}\t{_esc(self.etags[i])}\t"
                         f"{int(self.mtimes_ns[i])}\t{_esc(self.labels[i])}\n")
        return "".join(lines).encode()

    def sha256(self) -> str:
        return hashlib.sha256(self.canonical_bytes()).hexdigest()

    @classmethod
    def parse(cls, data: bytes) -> Manifest:
        """Reads canonical bytes back; raises :class:`LinkError` on anything malformed."""
        try:
            text = data.decode()
        except UnicodeDecodeError as e:
            raise LinkError(f"manifest is not UTF-8: {e}") from e
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        head = lines[0].split("\t") if lines else []
        if len(head) != 3 or head[0] != _MAGIC:
            raise LinkError("not a headrace manifest (bad header line)")
        if head[1] != f"version={_VERSION}":
            raise LinkError(f"unsupported manifest {head[1]}; this headrace reads "
                            f"version={_VERSION} (upgrade headrace)")
        kind = head[2].removeprefix("kind=")
        if kind == "store":
            try:
                vals = dict(kv.split("=", 1) for kv in lines[1].split("\t"))
                return cls.for_store(length=int(vals["length"]),
                                     generation=int(vals["generation"]),
                                     commit=int(vals["commit"]))
            except (IndexError, KeyError, ValueError) as e:
                raise LinkError(f"malformed store manifest: {e}") from e
        if kind != "objects":
            raise LinkError(f"unknown manifest kind {kind!r}")
        keys, sizes, etags, mtimes, labels = [], [], [], [], []
        for n, line in enumerate(lines[1:], start=2):
            cols = line.split("\t")
            if len(cols) != 6 or cols[0] != str(n - 2):
                raise LinkError(f"malformed manifest line {n}: expected 6 columns "
                                "(record_id, key, size, etag, mtime_ns, label) with ids from 0")
            keys.append(_unesc(cols[1]))
            sizes.append(int(cols[2]))
            etags.append(_unesc(cols[3]))
            mtimes.append(int(cols[4]))
            labels.append(_unesc(cols[5]))
        return cls(kind="objects", keys=tuple(keys), sizes=np.array(sizes, np.int64),
                   etags=tuple(etags), mtimes_ns=np.array(mtimes, np.int64),
                   labels=tuple(labels))


def manifest_store_root(store: str | os.PathLike[str] | None = None) -> str:
    """The manifest store root: ``store`` > env vars > the user cache dir."""
    if store is not None:
        return os.path.abspath(os.fspath(store))
    for var in ("HEADRACE_MANIFEST_STORE", "MX8_MANIFEST_STORE_ROOT"):
        if os.environ.get(var):
            return os.path.abspath(os.environ[var])
    import platformdirs

    return os.path.join(platformdirs.user_cache_dir("headrace"), "manifests")


def _fsync_dir(d: str) -> None:
    dfd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _makedirs_durable(d: str) -> None:
    """``os.makedirs`` whose new directories survive a power cut: each one's parent is synced."""
    if os.path.isdir(d):
        return
    parent = os.path.dirname(d)
    if parent != d:
        _makedirs_durable(parent)
    with contextlib.suppress(FileExistsError):  # another process made it: it synced it
        os.mkdir(d)
    _fsync_dir(parent)


def _write_atomic(path: str, data: bytes) -> None:
    d = os.path.dirname(path)
    _makedirs_durable(d)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(d)


class ManifestStore:
    """The content-addressed manifest store under one root directory (safe across processes)."""

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        self.root = manifest_store_root(root)

    def _by_hash(self, h: str) -> str:
        return os.path.join(self.root, "by-hash", h)

    def has(self, h: str) -> bool:
        return os.path.isfile(self._by_hash(h))

    def put(self, manifest: Manifest) -> str:
        """Stores a manifest under its hash (idempotent) and returns the hash."""
        data = manifest.canonical_bytes()
        h = hashlib.sha256(data).hexdigest()
        path = self._by_hash(h)
        if not os.path.isfile(path):
            _write_atomic(path, data)
        return h

    def get(self, h: str) -> Manifest:
        """The manifest with hash ``h``; :class:`LinkError` if unknown or damaged."""
        try:
            with open(self._by_hash(h), "rb") as f:
                data = f.read()
        except FileNotFoundError:
            raise LinkError(f"manifest store error: manifest not found: {h} (in {self.root}); "
                            "list the base once without '@sha256:' to create a snapshot, or pass "
                            "the store= where it was made") from None
        if hashlib.sha256(data).hexdigest() != h:
            raise LinkError(f"manifest {h} in {self.root} is damaged (its bytes hash to something "
                            "else); delete it and list the base again with '@refresh'")
        return Manifest.parse(data)

    def current(self, intent: str) -> str | None:
        """The hash pinned for an intent key, or ``None``."""
        try:
            with open(os.path.join(self.root, "intent", intent, "current")) as f:
                h = f.read().strip()
        except FileNotFoundError:
            return None
        return h or None

    def publish(self, intent: str, h: str, *, base: str) -> None:
        """Pins ``h`` for an intent key (atomic replace)."""
        d = os.path.join(self.root, "intent", intent)
        _write_atomic(os.path.join(d, "base"), base.encode())
        _write_atomic(os.path.join(d, "current"), h.encode())

    @contextlib.contextmanager
    def lock(self, intent: str) -> Iterator[None]:
        """An exclusive cross-process lock (``flock``) for listing and pinning one base."""
        d = os.path.join(self.root, "locks")
        os.makedirs(d, exist_ok=True)
        fd = os.open(os.path.join(d, intent + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing drops the flock
