"""Resolving a link to a pinned snapshot: list the base when needed, store and pin the manifest.

* plain link: the hash pinned for the base is reused without looking at the data (a snapshot is
  stable); the first time, the base is listed and pinned.
* ``@refresh``: the base is listed again and the new manifest is pinned.
* ``@sha256:<h>``: exactly that snapshot; :class:`LinkError` if the manifest store does not have it.

A base that holds a packed headrace store (a ``meta.json``) is pinned by its committed state
``(length, generation, commit)``; any other folder or prefix by the list of its files/objects
(hidden names, starting with ``.``, are skipped; so are S3 "folder" marker objects).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from headrace._base.errors import ConfigError, LinkError
from headrace._remote.links import Link, parse_link
from headrace._remote.manifest import Manifest, ManifestStore
from headrace._store.format import read_meta, store_leftovers

__all__ = ["Snapshot", "list_base", "resolve", "resolve_manifest_hash", "snapshot"]


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """A link resolved to one manifest."""

    link: Link
    hash: str
    manifest: Manifest
    recursive: bool


def _hidden(rel: str) -> bool:
    return any(part.startswith(".") for part in rel.split("/"))


def _store_state(meta_bytes: bytes, where: str) -> dict[str, int] | None:
    try:
        meta = json.loads(meta_bytes)
    except (ValueError, RecursionError):
        return None
    if not isinstance(meta, dict) or meta.get("format") != "headrace-store":
        return None
    try:
        return {k: int(meta[k]) for k in ("length", "generation", "commit")}
    except (KeyError, TypeError, ValueError) as e:
        raise LinkError(f"{where} has a malformed meta.json ({e})") from e


def _list_local(base: str, *, recursive: bool) -> Manifest:
    if not os.path.exists(base):
        raise LinkError(f"dataset link base does not exist: {base}")
    if not os.path.isdir(base):
        raise LinkError(f"dataset link base is not a directory: {base} (point at its folder)")
    meta = os.path.join(base, "meta.json")
    if os.path.isfile(meta):
        with open(meta, "rb") as f:
            state = _store_state(f.read(), base)
        if state is not None:
            return Manifest.for_store(**state)
    elif os.path.lexists(meta) or store_leftovers(base):
        read_meta(base)  # a damaged store (meta.json not a file, or lost): never raw files
    entries: list[tuple[str, int, str, int]] = []
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".")) if recursive else []
        rel_dir = os.path.relpath(dirpath, base).replace(os.sep, "/")
        for name in filenames:
            if name.startswith("."):
                continue
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            st = os.stat(os.path.join(dirpath, name))
            entries.append((rel, st.st_size, "", st.st_mtime_ns))
    if not entries:
        raise LinkError(f"dataset link base {base} holds no files (hidden files are skipped)")
    return Manifest.from_objects(entries)


def _list_s3(link: Link, *, recursive: bool, options: dict[str, Any]) -> Manifest:
    from headrace._remote.objstore import ObjectNotFoundError, ObjectStore, S3Options

    os_ = ObjectStore(link.bucket, options=S3Options.from_kwargs(dict(options)))
    prefix = link.prefix
    try:
        meta, _ = os_.get(prefix + "meta.json")
    except ObjectNotFoundError:
        meta = None
    if meta is not None:
        state = _store_state(meta, link.base)
        if state is not None:
            return Manifest.for_store(**state)
    entries = []
    for info in os_.list(prefix):
        rel = info.key[len(prefix):]
        if not rel or rel.endswith("/") or _hidden(rel) or (not recursive and "/" in rel):
            continue
        entries.append((rel, info.size, info.etag, info.mtime_ns))
    if not entries:
        raise LinkError(f"input prefix produced zero objects: {link.base}/ (check the bucket and"
                        " prefix, and the endpoint/credentials)")
    return Manifest.from_objects(entries)


def list_base(link: Link, *, recursive: bool = True, options: dict[str, Any] | None = None,
              ) -> Manifest:
    """Lists what ``link.base`` holds now (no manifest store involved)."""
    if link.is_s3:
        return _list_s3(link, recursive=recursive, options=options or {})
    return _list_local(link.base, recursive=recursive)


def snapshot(link: str | os.PathLike[str] | Link, *, store: str | os.PathLike[str] | None = None,
             recursive: bool = True, **options: Any) -> Snapshot:
    """Resolves ``link`` to a pinned snapshot (listing and pinning the base when needed).

    Args:
        link: a dataset link (see :mod:`headrace._remote.links`).
        store: manifest store root (default: ``$HEADRACE_MANIFEST_STORE`` or the user cache).
        recursive: list subfolders too; a non-recursive listing is pinned separately.
        **options: S3 options (:class:`headrace._remote.objstore.S3Options` fields).
    """
    from headrace._remote.objstore import S3Options

    s3 = S3Options.from_kwargs(options)  # validates the knobs even when nothing is listed
    if options:
        raise ConfigError(f"unknown options {sorted(options)}; S3 settings are the fields of "
                          "S3Options (endpoint, region, profile, allow_http, timeout_s, ...)")
    parsed = link if isinstance(link, Link) else parse_link(link)
    ms = ManifestStore(store)
    if parsed.pinned_hash is not None:
        h = parsed.pinned_hash
        return Snapshot(parsed, h, ms.get(h), recursive)
    intent = parsed.intent_key(variant="" if recursive else "?recursive=0")
    if parsed.mode == "plain":
        cur = ms.current(intent)
        if cur is not None and ms.has(cur):
            return Snapshot(parsed, cur, ms.get(cur), recursive)
    with ms.lock(intent):
        if parsed.mode == "plain":
            # Another process may have listed and pinned while this one waited for the lock.
            cur = ms.current(intent)
            if cur is not None and ms.has(cur):
                return Snapshot(parsed, cur, ms.get(cur), recursive)
        manifest = list_base(parsed, recursive=recursive, options={"s3": s3})
        h = ms.put(manifest)
        ms.publish(intent, h, base=parsed.base)
    return Snapshot(parsed, h, manifest, recursive)


def resolve_manifest_hash(link: str | os.PathLike[str], *, store: str | os.PathLike[str] | None
                          = None, recursive: bool = True, **options: Any) -> str:
    """The 64-hex manifest hash a link resolves to (listing and pinning the base if needed).

    ``base`` reuses the pinned snapshot, ``base@refresh`` lists again and repins,
    ``base@sha256:<h>`` checks that snapshot ``h`` exists (:class:`LinkError` otherwise).

    Args:
        link: a local path, ``file://`` URL or ``s3://bucket/prefix/``, with an optional suffix.
        store: manifest store root (default ``$HEADRACE_MANIFEST_STORE``, then
            ``$MX8_MANIFEST_STORE_ROOT``, then the user cache dir).
        recursive: include subfolders (a non-recursive listing is pinned separately).
        **options: S3 settings: ``endpoint``, ``region``, ``profile``, ``allow_http``, ...
    """
    return snapshot(link, store=store, recursive=recursive, **options).hash


def resolve(link: str | os.PathLike[str], *, store: str | os.PathLike[str] | None = None,
            recursive: bool = True, **options: Any) -> str:
    """Alias of :func:`resolve_manifest_hash` (mx8's short spelling)."""
    return resolve_manifest_hash(link, store=store, recursive=recursive, **options)
