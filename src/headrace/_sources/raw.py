"""Zero-manifest loading: every file of a folder, or object under an S3 prefix, is one record.

The records are the entries of a pinned snapshot (:mod:`headrace._remote.resolve`), in key order. A batch
is ``{"bytes": Ragged(uint8), "key": str array, "label": int64}`` (``label`` only when asked:
ImageFolder style, the index of the record's top folder in the sorted folder names). Batches go
through the loader's byte budget like any other source: ``nbytes`` is the snapshot's sizes.

A record whose file/object changed since the snapshot (size, mtime or ETag differ) raises
:class:`LinkError` naming the key, instead of returning other bytes under the same manifest hash.
S3 objects of one batch are fetched concurrently (``threads`` requests in flight), through the
optional byte cache.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import threading
from typing import Any, Literal

import numpy as np

from headrace._base.errors import ConfigError, LinkError
from headrace._remote.cache import ByteCache
from headrace._remote.objstore import ObjectStore
from headrace._remote.resolve import Snapshot
from headrace._store.reader import Ragged

__all__ = ["RawSource"]

LabelMode = Literal["none", "imagefolder", "auto"]


def _label_mode(labels: bool | None, label_mode: str | None) -> LabelMode:
    """``labels=True/False`` wins over an ``"auto"`` mode; an explicit mode must agree with it."""
    if label_mode is not None and label_mode not in ("none", "imagefolder", "auto"):
        raise ConfigError(f'invalid label mode "{label_mode}" (expected: auto|none|imagefolder)')
    if labels is None:
        return label_mode or "none"  # type: ignore[return-value]
    wanted: LabelMode = "imagefolder" if labels else "none"
    if label_mode not in (None, "auto", wanted):
        raise ConfigError(f"labels={labels} contradicts label_mode={label_mode!r}; pass one")
    return wanted


class RawSource:
    """The records of an ``objects`` snapshot, read from a local folder or an S3 prefix.

    Args:
        snap: the pinned snapshot (its base says where the bytes live).
        labels / label_mode: ``labels=True`` (= ``"imagefolder"``) adds ``label`` from each key's
            top folder; ``"auto"`` does so when every record sits in a folder.
        objstore: the client for an S3 base.
        cache: optional :class:`ByteCache` for S3 object bytes (keyed by key + ETag).
        threads: S3 requests in flight per batch.
    """

    def __init__(self, snap: Snapshot, *, labels: bool | None = None,
                 label_mode: str | None = None, objstore: ObjectStore | None = None,
                 cache: ByteCache | None = None, threads: int = 16) -> None:
        m = snap.manifest
        if m.kind != "objects":
            raise ConfigError(f"{snap.link.base} holds a packed store, not raw files")
        self.snapshot = snap
        self.manifest = m
        self._base = snap.link.base
        self._objstore = objstore
        self._cache = cache
        if snap.link.is_s3 and objstore is None:
            raise ConfigError("an s3:// base needs an ObjectStore")
        self._prefix = snap.link.prefix if snap.link.is_s3 else ""
        mode = _label_mode(labels, label_mode)
        in_folder = all(m.labels)
        if mode == "auto":
            mode = "imagefolder" if in_folder and m.class_names else "none"
        if mode == "imagefolder" and not in_folder:
            top = next(k for k, lb in zip(m.keys, m.labels, strict=True) if not lb)
            raise ConfigError(f"labels by folder were asked for, but {top!r} is not inside a class "
                              f"folder of {self._base}; move it or pass labels=False")
        self.classes: list[str] | None = m.class_names if mode == "imagefolder" else None
        if self.classes is not None:
            lookup = {c: i for i, c in enumerate(self.classes)}
            self._labels: np.ndarray | None = np.array([lookup[lb] for lb in m.labels], np.int64)
        else:
            self._labels = None
        self._keys = np.array(m.keys, dtype=str) if len(m.keys) else np.zeros(0, "<U1")
        self._threads = max(1, int(threads))
        self._pool: cf.ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.manifest)

    @property
    def fingerprint(self) -> str:
        return f"manifest:{self.snapshot.hash}"

    @property
    def fields(self) -> list[str]:
        return ["bytes", "key"] + (["label"] if self._labels is not None else [])

    def key(self, i: int) -> str:
        return self.manifest.keys[i]

    def nbytes(self, ids: np.ndarray) -> int:
        ids = np.asarray(ids, np.int64)
        n = len(ids)
        extra = 8 * (n + 1) + self._keys.itemsize * n + (8 * n if self._labels is not None else 0)
        return int(self.manifest.sizes[ids].sum(dtype=np.int64)) + extra

    def record_nbytes(self, ids: np.ndarray) -> np.ndarray:
        """Each object's size, what byte-aware batching counts."""
        return np.asarray(self.manifest.sizes[np.asarray(ids, np.int64)], np.int64)

    def gather(self, ids: np.ndarray) -> dict[str, Any]:
        ids = np.asarray(ids, np.int64)
        if len(ids) and (ids.min() < 0 or ids.max() >= len(self)):
            from headrace._base.errors import RecordIndexError

            raise RecordIndexError(f"record ids must be in [0, {len(self)}), got {ids.tolist()}")
        sizes = self.manifest.sizes[ids]
        offsets = np.zeros(len(ids) + 1, np.int64)
        np.cumsum(sizes, out=offsets[1:])
        values = np.empty(int(offsets[-1]), np.uint8)
        read = self._read_s3 if self._objstore is not None else self._read_local
        jobs = [(j, int(i)) for j, i in enumerate(ids.tolist())]
        if self._objstore is not None and len(jobs) > 1:
            for fut in [self._executor().submit(read, i, values, int(offsets[j]))
                        for j, i in jobs]:
                fut.result()
        else:
            for j, i in jobs:
                read(i, values, int(offsets[j]))
        out: dict[str, Any] = {"bytes": Ragged(values, offsets), "key": self._keys[ids]}
        if self._labels is not None:
            out["label"] = self._labels[ids]
        return out

    def _executor(self) -> cf.ThreadPoolExecutor:
        if self._pool is None:
            with self._pool_lock:
                if self._pool is None:
                    self._pool = cf.ThreadPoolExecutor(self._threads,
                                                       thread_name_prefix="headrace-get")
        return self._pool

    def _stale(self, i: int, what: str) -> LinkError:
        return LinkError(f"{self._join(self.manifest.keys[i])} changed after snapshot "
                         f"{self.snapshot.hash[:12]}… ({what}); re-list it with "
                         f"'{self._base}@refresh' to read the new data")

    def _join(self, key: str) -> str:
        return f"{self._base}/{key}"

    def _read_local(self, i: int, out: np.ndarray, at: int) -> None:
        m = self.manifest
        size = int(m.sizes[i])
        path = os.path.join(self._base, *m.keys[i].split("/"))
        try:
            with open(path, "rb", buffering=0) as f:
                st = os.fstat(f.fileno())
                if st.st_size != size or st.st_mtime_ns != int(m.mtimes_ns[i]):
                    raise self._stale(i, f"size {size} -> {st.st_size}, mtime changed"
                                      if st.st_size != size else "mtime changed")
                view = memoryview(out[at:at + size])  # type: ignore[arg-type]
                got = 0
                while got < size:
                    n = f.readinto(view[got:])
                    if not n:
                        raise self._stale(i, "file shrank while being read")
                    got += n
        except FileNotFoundError:
            raise self._stale(i, "file is gone") from None

    def _read_s3(self, i: int, out: np.ndarray, at: int) -> None:
        from headrace._remote.objstore import ObjectNotFoundError

        m = self.manifest
        assert self._objstore is not None
        key = self._prefix + m.keys[i]
        size, etag = int(m.sizes[i]), m.etags[i]
        cache_key = f"obj|{self._objstore.bucket}/{key}|{etag}|{size}"
        data = self._cache.get(cache_key) if self._cache is not None else None
        if data is None or len(data) != size:
            try:
                data, info = self._objstore.get(key)
            except ObjectNotFoundError:
                raise self._stale(i, "object is gone") from None
            if info.size != size or info.etag != etag:
                raise self._stale(i, f"size {size} -> {info.size}, etag {etag} -> {info.etag}")
            if self._cache is not None:
                self._cache.put(cache_key, data)
        out[at:at + size] = np.frombuffer(data, np.uint8)

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_pool"] = None
        del state["_pool_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._pool_lock = threading.Lock()

    def __repr__(self) -> str:
        return (f"RawSource({self._base!r}, records={len(self)}, "
                f"manifest={self.snapshot.hash[:12]}…, classes={self.classes})")
