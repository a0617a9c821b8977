"""mx8 1.0.7 packs on S3: ``headrace.load("s3://bucket/pack/")`` and ``headrace.image(...)``.

A pack is ``_mx8/manifest.tsv`` (one row per image: shard, byte offset, length, label hint), the
tar shards and ``_mx8/labels.tsv``. ``mx8.pack`` writes shard locations as ``s3://`` URLs; a pack
built locally (``pack_dir``) and uploaded has local paths, which are looked up as
``<pack>/shards/<file name>``, as a relocated local pack is. The manifest is read once; a gather
fetches the images' byte ranges, neighbours in a shard merged into one request, concurrently
and through the optional local byte cache. Fingerprint: mx8's manifest hash, as for the local pack,
so a checkpoint taken on a local copy resumes on the S3 one.

Registered under ``"mx8-pack-s3"``; it claims an ``s3://`` URL (``@refresh`` allowed,
``@sha256:<h>`` pinned to the manifest hash) whose ``_mx8/manifest.tsv`` exists.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import os
import threading
from typing import Any

import numpy as np

from headrace._base.errors import ConfigError, CorruptionError, LinkError
from headrace._remote.cache import ByteCache
from headrace._remote.objstore import ObjectNotFoundError, ObjectStore, S3Options, split_s3_url
from headrace._sources import links as _links  # noqa: F401 (registers "link" before this kind)
from headrace._sources.base import register_source
from headrace._sources.images import ImageRecords, _hint_label, _parse_manifest, parse_labels_tsv

__all__ = ["S3Mx8Pack", "is_s3_mx8_pack", "open_s3_mx8_pack"]

MANIFEST = "_mx8/manifest.tsv"
LABELS = "_mx8/labels.tsv"
_GAP = 64 << 10  # neighbouring images closer than this come in one request
_MAX_RANGE = 16 << 20
_DEFAULT_CACHE_BYTES = 10 << 30


def _split(url: str) -> tuple[str, str | None]:
    head, at, suffix = url.rpartition("@")
    if at and "/" not in suffix and (suffix == "refresh" or suffix.startswith("sha256:")):
        return head, suffix
    return url, None


def _prefix(url: str) -> tuple[str, str]:
    bucket, key = split_s3_url(url)
    return bucket, key.rstrip("/") + "/" if key else ""


def is_s3_mx8_pack(data: Any, **s3: Any) -> bool:
    """An ``s3://`` URL whose ``_mx8/manifest.tsv`` exists (one HEAD request; never raises)."""
    if not isinstance(data, str) or not data.startswith("s3://"):
        return False
    try:
        bucket, prefix = _prefix(_split(data)[0])
        ObjectStore(bucket, options=S3Options.from_kwargs(dict(s3))).head(prefix + MANIFEST)
        return True
    except Exception:
        return False


class S3Mx8Pack(ImageRecords):
    """An mx8 pack under ``s3://bucket/prefix/``.

    Args:
        url: the pack's ``s3://`` prefix.
        objstore: the client for its bucket.
        cache: optional local byte cache of fetched ranges.
        max_inflight: concurrent range requests.
        pinned: a manifest hash the pack must have (``@sha256:``), else ``LinkError``.
    """

    def __init__(self, url: str, *, objstore: ObjectStore, cache: ByteCache | None = None,
                 max_inflight: int = 32, pinned: str | None = None) -> None:
        if max_inflight < 1:
            raise ConfigError(f"max_inflight must be >= 1, got {max_inflight}")
        self.url = url.rstrip("/")
        self._bucket, self._prefix = _prefix(self.url)
        self._os = objstore
        self._cache = cache
        self._max_inflight = max_inflight
        where = f"{self.url}/{MANIFEST}"
        raw, _ = objstore.get(self._prefix + MANIFEST)
        self.manifest_hash = hashlib.sha256(raw).hexdigest()
        if pinned is not None and pinned != self.manifest_hash:
            raise LinkError(f"{self.url}@sha256:{pinned}: the mx8 manifest there hashes to "
                            f"{self.manifest_hash}; the pack changed since the link was pinned")
        rows = _parse_manifest(raw.decode("utf-8", "surrogateescape"), where)
        n = len(rows)
        keys: dict[str, int] = {}
        self._loc = np.empty(n, np.int32)
        self._off = np.empty(n, np.int64)
        self._len = np.empty(n, np.int64)
        self._labels = np.full(n, -1, np.int64)
        for i, (loc, off, ln, hint) in enumerate(rows):
            self._loc[i] = keys.setdefault(self._key(loc), len(keys))
            self._off[i] = -1 if off is None else off
            self._len[i] = -1 if ln is None else ln
            label = _hint_label(hint, i)
            if label is not None:
                self._labels[i] = label
        self.keys = list(keys)
        sizes = []
        for key in self.keys:
            try:
                sizes.append(objstore.head(key).size)
            except ObjectNotFoundError:
                raise CorruptionError(f"mx8 pack {self.url}: shard s3://{self._bucket}/{key} "
                                      "named by its manifest does not exist") from None
        self._sizes = np.array(sizes, np.int64)
        whole = self._len < 0
        if whole.any():
            self._len[whole] = self._sizes[self._loc[whole]]
            self._off[whole] = 0
        past = self._off + self._len > self._sizes[self._loc] if n else np.zeros(0, bool)
        if past.any():
            bad = np.flatnonzero(past)[:8].tolist()
            raise CorruptionError(f"mx8 pack {self.url}: byte ranges of records {bad} run past "
                                  "the end of their shard (truncated shard?)", record_ids=bad)
        try:
            text, _ = objstore.get(self._prefix + LABELS)
            self.classes = parse_labels_tsv(text.decode("utf-8", "surrogateescape"),
                                            f"{self.url}/{LABELS}")
        except ObjectNotFoundError:
            self.classes = None
        self._pool: cf.ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self.requests = 0

    def _key(self, loc: str) -> str:
        mine = f"s3://{self._bucket}/"
        if loc.startswith(mine):
            return loc[len(mine):]
        if loc.startswith("s3://"):
            raise ConfigError(f"mx8 pack {self.url}: shard {loc!r} is in another bucket; "
                              "read packs whose shards sit in their own bucket")
        # a local path (pack_dir's, absolute): the pack was uploaded with its shards/ folder
        return f"{self._prefix}shards/{os.path.basename(loc)}"

    def __len__(self) -> int:
        return len(self._loc)

    @property
    def fingerprint(self) -> str:
        return f"mx8:{self.manifest_hash}"

    def path(self, i: int) -> str:
        return (f"s3://{self._bucket}/{self.keys[self._loc[i]]}"
                f"[{int(self._off[i])}:+{int(self._len[i])}]")

    def labels(self, ids: np.ndarray) -> np.ndarray:
        return self._labels[self._check(ids)]

    def _plan(self, ids: np.ndarray) -> list[tuple[int, int, int, np.ndarray]]:
        """``(shard, start, end, positions)`` requests covering records ``ids``."""
        out = []
        loc, off, ln = self._loc[ids], self._off[ids], self._len[ids]
        for li in np.unique(loc).tolist():
            pos = np.flatnonzero(loc == li)
            pos = pos[np.argsort(off[pos], kind="stable")]
            start, end, group = -1, -1, list[int]()
            for p, o, n in zip(pos.tolist(), off[pos].tolist(), ln[pos].tolist(), strict=True):
                if group and o - end <= _GAP and max(end, o + n) - start <= _MAX_RANGE:
                    end = max(end, o + n)
                    group.append(p)
                    continue
                if group:
                    out.append((li, start, end, np.array(group)))
                start, end, group = o, o + n, [p]
            if group:
                out.append((li, start, end, np.array(group)))
        return out

    def raw_nbytes(self, ids: np.ndarray) -> int:
        return self.payload_nbytes(ids)

    def record_nbytes(self, ids: np.ndarray) -> np.ndarray:
        """Each record's manifest ``byte_length``, what mx8's byte-aware batching counts."""
        return self._len[self._check(ids)].copy()

    def payload_nbytes(self, ids: np.ndarray) -> int:
        ids = self._check(ids)
        fetched = sum(end - start for _li, start, end, _p in self._plan(ids))
        return int(fetched + self._len[ids].sum())

    def _fetch(self, li: int, start: int, end: int) -> bytes:
        key = self.keys[li]
        ckey = f"mx8|{self._bucket}/{key}|{self.manifest_hash}|{start}|{end}"
        if self._cache is not None:
            data = self._cache.get(ckey)
            if data is not None and len(data) == end - start:
                return data
        data = self._os.get_range(key, start, end)
        with self._lock:
            self.requests += 1
        if len(data) != end - start:
            raise CorruptionError(f"mx8 pack {self.url}: s3://{self._bucket}/{key} returned "
                                  f"{len(data)} bytes for [{start}, {end})")
        if self._cache is not None:
            self._cache.put(ckey, data)
        return data

    def payloads(self, ids: np.ndarray) -> list[Any]:
        ids = self._check(ids)
        plan = self._plan(ids)
        if self._pool is None:
            with self._lock:
                if self._pool is None:
                    self._pool = cf.ThreadPoolExecutor(self._max_inflight,
                                                       thread_name_prefix="headrace-mx8-s3")
        bufs = list(self._pool.map(lambda r: self._fetch(r[0], r[1], r[2]), plan)) if len(
            plan) > 1 else [self._fetch(*plan[0][:3])] if plan else []
        out: list[Any] = [b""] * len(ids)
        for (_li, start, _end, pos), buf in zip(plan, bufs, strict=True):
            mv = memoryview(buf)
            for p in pos.tolist():
                o = int(self._off[ids[p]]) - start
                out[p] = mv[o:o + int(self._len[ids[p]])]
        return out

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)

    def __reduce__(self) -> tuple[Any, ...]:  # reopened in another process
        return (_reopen, (self.url, self._os, self._cache, self._max_inflight,
                          self.manifest_hash))

    def __repr__(self) -> str:
        return f"S3Mx8Pack({self.url!r}, n={len(self)})"


def _reopen(url: str, objstore: ObjectStore, cache: ByteCache | None, max_inflight: int,
            manifest_hash: str) -> S3Mx8Pack:
    return S3Mx8Pack(url, objstore=objstore, cache=cache, max_inflight=max_inflight,
                     pinned=manifest_hash)


def open_s3_mx8_pack(data: str, *, cache_dir: str | os.PathLike[str] | None = None,
                     cache_bytes: int | None = None, max_inflight: int = 32,
                     recursive: bool = True, store: Any = None, verify: str = "first",
                     **s3: Any) -> S3Mx8Pack:
    """Opens the mx8 pack at ``data`` (``s3://...[@refresh|@sha256:<h>]``).

    ``recursive`` and ``store`` (mx8's listing and manifest-store keywords) change nothing: the
    pack's manifest lists its records. ``verify`` has no checksums to check (mx8 packs have none).
    """
    del recursive, store, verify
    options = S3Options.from_kwargs(s3)
    if s3:
        raise ConfigError(f"unknown options {sorted(s3)} for the mx8 pack {data!r}")
    base, suffix = _split(data)
    pinned = suffix[7:] if suffix is not None and suffix.startswith("sha256:") else None
    cache = None
    if cache_dir is not None:
        cache = ByteCache(cache_dir, max_bytes=cache_bytes or _DEFAULT_CACHE_BYTES)
    elif cache_bytes is not None:
        raise ConfigError("cache_bytes needs cache_dir= (where to keep the cached bytes)")
    bucket, _ = _prefix(base)
    return S3Mx8Pack(base, objstore=ObjectStore(bucket, options=options), cache=cache,
                     max_inflight=max_inflight, pinned=pinned)


register_source("mx8-pack-s3", is_s3_mx8_pack, open_s3_mx8_pack)
