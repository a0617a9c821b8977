"""``headrace.open``: a local store (read or append) or a store on S3 (read-only, cached).

A local path goes to :func:`headrace._store.reader.open`. ``s3://bucket/prefix/`` opens the store
under that prefix as a :class:`~headrace._remote.store.RemoteStore` at its current commit:
``meta.json`` and every index/aux file once, then byte ranges of chunks per gather, kept in a
local byte cache (LRU, bounded) so a second epoch, or another process on the machine, reads them
from disk instead of S3. The result reads like a local ``Store`` (``len``, ``fields``, ``attrs``,
``gather``, ``nbytes``, ``generation``) and is a loader source (``headrace.load(store)``).
"""

from __future__ import annotations

import os
from typing import Any

from headrace._base.errors import ConfigError
from headrace._remote.cache import ByteCache
from headrace._remote.objstore import ObjectStore, S3Options, split_s3_url
from headrace._store.reader import open as open_local

__all__ = ["default_cache_dir", "open"]

DEFAULT_CACHE_BYTES = 10 << 30


def default_cache_dir() -> str:
    """``$HEADRACE_CACHE_DIR``, else ``<user cache>/headrace/s3-bytes``."""
    env = os.environ.get("HEADRACE_CACHE_DIR")
    if env:
        return env
    import platformdirs

    return os.path.join(platformdirs.user_cache_dir("headrace"), "s3-bytes")


def open(path: str | os.PathLike[str], *, mode: str = "r", verify: str = "first",
         cache_dir: str | os.PathLike[str] | bool | None = None, cache_bytes: int | None = None,
         max_inflight: int = 32, **s3: Any) -> Any:
    """Opens a store: ``mode="r"`` (default) gives a read-only ``Store``, ``mode="a"`` a ``Writer``.

    Args:
        path: the store directory, or ``s3://bucket/prefix/`` of a store on S3 (read-only).
        mode: ``"r"`` to read, ``"a"`` to append/modify/delete/compact (takes the writer lock;
            local stores only).
        verify: for readers, when to check checksums: ``"first"`` read of each record in this
            process (default), ``"always"``, or ``"never"``.
        cache_dir: S3 only: where fetched chunk bytes are kept (default: ``$HEADRACE_CACHE_DIR``
            or the user cache dir); ``False`` keeps none.
        cache_bytes: S3 only: the cache's size limit (default 10 GiB; least recently used
            entries go first).
        max_inflight: S3 only: concurrent range requests.
        **s3: S3 settings (``endpoint``, ``region``, ``profile``, ``allow_http``, ``timeout_s``,
            ``max_attempts``, ... or ``s3=S3Options(...)``); default from the environment.

    Raises:
        NotAStoreError, FormatVersionError, CorruptionError (meta.json damaged), WriterBusyError;
        ConfigError for ``mode="a"`` on S3 or S3 settings given for a local path.
    """
    text = os.fspath(path)
    if not (isinstance(text, str) and text.startswith("s3://")):
        if cache_dir is not None or cache_bytes is not None or s3:
            raise ConfigError(f"cache_dir, cache_bytes and S3 settings apply to s3:// stores; "
                              f"{text!r} is a local path")
        return open_local(path, mode=mode, verify=verify)  # type: ignore[arg-type]
    if mode != "r":
        raise ConfigError(f"mode={mode!r}: a store on S3 opens read-only (mode='r'); to change "
                          "it, write a local store and upload it (headrace.pack(..., out='s3://')"
                          " writes one)")
    options = S3Options.from_kwargs(s3)
    if s3:
        raise ConfigError(f"unknown options {sorted(s3)} for an s3:// store")
    bucket, _key = split_s3_url(text)
    cache = None
    if cache_dir is not False:
        if cache_dir is True or cache_dir is None:
            cache_dir = default_cache_dir()
        cache = ByteCache(cache_dir, max_bytes=cache_bytes or DEFAULT_CACHE_BYTES)
    elif cache_bytes is not None:
        raise ConfigError("cache_bytes needs a cache; drop cache_dir=False")
    from headrace._remote.store import RemoteStore

    return RemoteStore(text, objstore=ObjectStore(bucket, options=options), cache=cache,
                       verify=verify, max_inflight=max_inflight)
