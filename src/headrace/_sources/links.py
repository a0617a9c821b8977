"""Dataset links as loader sources: what ``headrace.load(link)`` opens for a link.

Registered with :func:`headrace._sources.base.register_source` under ``"link"``. It claims ``s3://`` and
``file://`` URLs, any path with an ``@refresh`` / ``@sha256:`` suffix, and local folders that no other
registered kind claims (a store folder, an image folder or an mx8 pack without a suffix stays with
its own opener). The link is resolved to
a pinned snapshot, then:

* a packed store on S3 -> :class:`RemoteStore` (serving the snapshot's committed length);
* a packed local store (with a suffix) -> the local ``Store``, limited to the snapshot's length;
* anything else -> :class:`RawSource`: each file/object is a record (zero-manifest load).
"""

from __future__ import annotations

import os
from typing import Any

from headrace._base.errors import ConfigError, LinkError
from headrace._remote.cache import ByteCache
from headrace._remote.objstore import ObjectStore, S3Options
from headrace._remote.resolve import snapshot
from headrace._remote.store import RemoteStore
from headrace._sources.base import Source, StoreSource, register_source
from headrace._sources.raw import RawSource
from headrace._store.format import looks_like_store

__all__ = ["can_open_link", "open_link"]

_DEFAULT_CACHE_BYTES = 10 << 30


def can_open_link(data: Any) -> bool:
    """Cheap test: does ``data`` look like a link this module should open?"""
    if not isinstance(data, str | os.PathLike):
        return False
    try:
        text = os.fspath(data)
    except TypeError:
        return False
    if not isinstance(text, str) or not text:
        return False
    if text.startswith(("s3://", "file://")):
        return True
    suffix = text.rpartition("@")[2]
    if "@" in text and "/" not in suffix and (suffix == "refresh" or suffix.startswith("sha256:")):
        return True
    if not os.path.isdir(text) or looks_like_store(text):
        return False
    # A plain local folder is ours only when no other kind (image folder, mx8 pack) claims it,
    # whatever order the modules registered in.
    from headrace._sources import base as _sources

    with _sources._LOCK:
        others = [e for e in _sources._REGISTRY if e[0] != "link"]
    return not any(can_open(data) for _name, can_open, _opener in others)


class _PinnedStoreSource(StoreSource):
    """A local store served at the committed length of its snapshot (later appends hidden)."""

    def __init__(self, store: Any, *, length: int, fields: Any = None) -> None:
        super().__init__(store, fields=fields, owned=True)
        self._length = length

    def __len__(self) -> int:
        return self._length


def open_link(data: Any, *, store: str | os.PathLike[str] | None = None, recursive: bool = True,
              labels: bool | None = None, label_mode: str | None = None,
              fields: list[str] | str | None = None, verify: str = "first",
              cache_dir: str | os.PathLike[str] | None = None, cache_bytes: int | None = None,
              max_inflight: int = 32, **options: Any) -> Source:
    """Opens a dataset link as a source.

    Args:
        data: the link (``base``, ``base@refresh``, ``base@sha256:<h>``).
        store: manifest store root (see :mod:`headrace._remote.manifest`).
        recursive: list subfolders of a raw folder/prefix too.
        labels, label_mode: raw folders: label each record by its top folder (``True`` /
            ``"imagefolder"``), never (``"none"``), or when every record is in a folder (``"auto"``).
        fields: packed stores: the fields to read.
        verify: packed stores: crc32c checking, ``"first"``/``"always"``/``"never"``.
        cache_dir, cache_bytes: optional local cache of S3 bytes with a hard size limit.
        max_inflight: concurrent S3 requests.
        **options: S3 settings (``endpoint``, ``region``, ``profile``, ``allow_http``,
            ``timeout_s``, ``max_attempts``, ... or ``s3=S3Options(...)``).
    """
    s3 = S3Options.from_kwargs(options)
    if options:
        raise ConfigError(f"unknown options {sorted(options)} for dataset link {data!r}")
    snap = snapshot(data, store=store, recursive=recursive, s3=s3)
    cache = None
    if cache_dir is not None:
        cache = ByteCache(cache_dir, max_bytes=cache_bytes or _DEFAULT_CACHE_BYTES)
    elif cache_bytes is not None:
        raise ConfigError("cache_bytes needs cache_dir= (where to keep the cached bytes)")
    link, m = snap.link, snap.manifest
    objstore = ObjectStore(link.bucket, options=s3) if link.is_s3 else None
    if m.kind == "store":
        assert m.store is not None
        if objstore is not None:
            return RemoteStore(link.base, objstore=objstore, fields=fields, pinned=m.store,
                               cache=cache, verify=verify, max_inflight=max_inflight)
        from headrace._store.reader import Store

        st = Store(link.base, verify=verify)  # type: ignore[arg-type]
        if st.generation != m.store["generation"] or len(st) < m.store["length"]:
            got = (st.generation, len(st))
            st.close()
            raise LinkError(f"{link.base} was rewritten after snapshot {snap.hash[:12]}… "
                            f"(generation/length {m.store['generation']}/{m.store['length']} -> "
                            f"{got[0]}/{got[1]}); load '{link.base}@refresh' to read it now")
        return _PinnedStoreSource(st, length=m.store["length"], fields=fields)
    if fields is not None:
        raise ConfigError("fields= applies to packed stores; a raw folder has bytes/key/label")
    return RawSource(snap, labels=labels, label_mode=label_mode, objstore=objstore, cache=cache,
                     threads=max_inflight)


register_source("link", can_open_link, open_link)
