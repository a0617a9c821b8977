"""A headrace store that lives on S3, read with byte-range GETs.

``meta.json`` and the committed part of every index/aux file are fetched once, when the store is
opened. A gather then plans its reads from the index alone: the stored bytes of the requested
records, per chunk, sorted by offset, with ranges closer than ``coalesce_gap_bytes`` merged (up to
``max_range_bytes`` per request, and only while at least ``min_fill`` of the merged bytes are wanted),
so a batch of neighbouring records costs one request, not one per record, and a shuffled batch does
not drag whole chunks in. The ranges are fetched concurrently (``max_inflight`` requests in flight for the whole store,
shared by every loader thread), checked against their crc32c, decoded with the store's codecs, and
assembled into the same arrays / :class:`Ragged` a local :class:`Store` returns.

Committed chunk bytes never change, so ranges can be cached locally (:class:`ByteCache`) under
``(store URL, generation, chunk, range)``. A store pinned by a snapshot serves the committed length of
that snapshot; a store rewritten since (a new generation) raises :class:`LinkError`.

``nbytes(ids)`` counts the decoded output plus the fetched range buffers, so the loader's byte budget
covers the whole transient footprint of a gather.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import google_crc32c
import numpy as np

from headrace._base.errors import ConfigError, CorruptionError, LinkError
from headrace._remote.cache import ByteCache
from headrace._remote.objstore import ObjectNotFoundError, ObjectStore
from headrace._store.codecs import get_codec
from headrace._store.format import (
    AUX_DTYPE,
    INDEX_DTYPE,
    META_NAME,
    FieldEntry,
    FieldSpec,
    Meta,
    check_dict,
    chunk_name,
    parse_meta_bytes,
)
from headrace._store.reader import Ragged, pick_fields, record_ids

__all__ = ["RemoteStore"]


class _Field:
    def __init__(self, spec: FieldSpec, index: np.ndarray, aux: np.ndarray,
                 dictionary: bytes | None = None) -> None:
        self.spec = spec
        self.index = index
        self.aux = aux
        self.dictionary = dictionary
        self.codec = get_codec(spec.codec, dictionary)
        self.rec = -1 if spec.shape is None else spec.record_nbytes

    def __reduce__(self) -> tuple[Any, ...]:  # codecs hold lambdas: look them up again
        return (_Field, (self.spec, self.index, self.aux, self.dictionary))


class RemoteStore:
    """A read-only store under ``s3://bucket/prefix/`` (the Source protocol plus ``gather``).

    Args:
        url: ``s3://bucket/prefix`` of the store (the folder holding ``meta.json``).
        objstore: the client for the bucket.
        fields: the fields a Source-style ``gather(ids)`` returns (default all).
        pinned: ``{"length", "generation"}`` of a snapshot to serve (else the current commit).
        cache: optional local byte cache for chunk ranges.
        verify: ``"first"`` or ``"always"`` (every fetched record's crc32c: each fetch is a fresh
            copy that crossed the network or sat in the local cache), or ``"never"``.
        max_inflight: concurrent range requests for this store.
        coalesce_gap_bytes: merge two ranges of a chunk when the gap between them is at most this.
        max_range_bytes: never merge a request past this size.
        min_fill: across gaps over ``small_gap_bytes``, merge only while at least this fraction of
            a request's bytes are records the gather asked for, so a shuffled batch over a large
            store is not read as whole chunks.
        small_gap_bytes: gaps up to this are always merged (reading them costs less than another
            request; this keeps tiny records such as labels to one request per chunk).
    """

    def __init__(self, url: str, *, objstore: ObjectStore, fields: Sequence[str] | str | None = None,
                 pinned: dict[str, int] | None = None, cache: ByteCache | None = None,
                 verify: str = "first", max_inflight: int = 32,
                 coalesce_gap_bytes: int = 1 << 20, max_range_bytes: int = 16 << 20,
                 min_fill: float = 0.5, small_gap_bytes: int = 64 << 10) -> None:
        if verify not in ("first", "always", "never"):
            raise ConfigError(f"verify must be 'first', 'always' or 'never', got {verify!r}")
        if max_inflight < 1 or coalesce_gap_bytes < 0 or max_range_bytes < 1:
            raise ConfigError("max_inflight and max_range_bytes must be >= 1, "
                              "coalesce_gap_bytes >= 0")
        if not 0.0 <= min_fill <= 1.0:
            raise ConfigError(f"min_fill must be in [0, 1], got {min_fill}")
        self._min_fill = min_fill
        self._small_gap = small_gap_bytes
        self.url = url.rstrip("/")
        self._prefix = objstore_prefix(self.url)
        self._os = objstore
        self._cache = cache
        self.verify = verify
        self._max_inflight = max_inflight
        self._gap = coalesce_gap_bytes
        self._max_range = max_range_bytes
        self._pool: cf.ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self.requests = 0
        self.bytes_fetched = 0
        self.refetches = 0  # rounds of ranges fetched again after a checksum mismatch
        meta = self._load_meta()
        if pinned is not None:
            if pinned["generation"] != meta.generation:
                raise LinkError(
                    f"{self.url} was rewritten after its snapshot (generation "
                    f"{pinned['generation']} -> {meta.generation}: records were modified, deleted "
                    f"or compacted); load '{self.url}@refresh' to read the current data")
            if pinned["length"] > meta.length:
                raise LinkError(f"{self.url} holds {meta.length} records but its snapshot had "
                                f"{pinned['length']}; load '{self.url}@refresh'")
            meta = Meta(length=pinned["length"], generation=meta.generation, commit=meta.commit,
                        chunk_bytes=meta.chunk_bytes, fields=meta.fields, chunks=meta.chunks,
                        attrs=meta.attrs)
        self.meta = meta
        self._chunk_size = {c.id: c.size for c in meta.chunks}
        self._chunk_field = {c.id: c.field for c in meta.chunks}
        self._fields = {fe.spec.name: self._load_field(fe)
                        for fe in meta.fields}
        names = list(self._fields)
        picked = [fields] if isinstance(fields, str) else list(fields or names)
        unknown = [f for f in picked if f not in self._fields]
        if unknown:
            raise ConfigError(f"unknown fields {unknown}; {self.url} has {names}")
        self.fields_selected = picked
        from headrace._store.fingerprint import store_fingerprint

        self._fingerprint = store_fingerprint(self)

    # -- opening -----------------------------------------------------------------------------------

    def _key(self, name: str) -> str:
        return f"{self._prefix}{name}"

    def _load_meta(self) -> Meta:
        attempts = self._os.options.max_attempts
        for attempt in range(1, attempts + 1):
            try:
                raw, _ = self._os.get(self._key(META_NAME))
            except ObjectNotFoundError:
                from headrace._base.errors import NotAStoreError

                raise NotAStoreError(
                    f"{self.url} is not a headrace store: it has no meta.json") from None
            try:
                return parse_meta_bytes(bytes(raw), path=self.url)
            except CorruptionError:
                # its checksum failed: flipped in transit, most likely; fetch it again
                if attempt == attempts:
                    raise
        raise AssertionError("unreachable")

    def _load_field(self, fe: FieldEntry) -> _Field:
        spec, index_name, aux_name = fe.spec, fe.index, fe.aux
        length = self.meta.length
        arrays = []
        for name, dtype in ((index_name, INDEX_DTYPE), (aux_name, AUX_DTYPE)):
            want = length * dtype.itemsize
            data = self._os.get_range(self._key(name), 0, want) if want else b""
            if len(data) != want:
                raise CorruptionError(f"{self.url}/{name} is shorter than {length} entries",
                                      field=spec.name)
            arrays.append(np.frombuffer(data, dtype))
        dictionary = None
        if fe.dict_file is not None:
            try:
                dictionary, _ = self._os.get(self._key(fe.dict_file))
            except ObjectNotFoundError:
                raise CorruptionError(f"{self.url}/{fe.dict_file} is missing, but meta.json names it "
                                      f"as the dictionary of field {spec.name!r}; restore it",
                                      field=spec.name) from None
            check_dict(dictionary, fe, f"{self.url}/{fe.dict_file}")
        return _Field(spec, arrays[0], arrays[1], dictionary)

    # -- Source protocol -------------------------------------------------------------------------

    def __len__(self) -> int:
        return self.meta.length

    @property
    def fingerprint(self) -> str:
        return self._fingerprint

    @property
    def generation(self) -> int:
        return self.meta.generation

    @property
    def commit_id(self) -> int:
        return self.meta.commit

    @property
    def fields(self) -> dict[str, FieldSpec]:
        return {n: f.spec for n, f in self._fields.items()}

    @property
    def attrs(self) -> dict[str, Any]:
        return dict(self.meta.attrs)

    def aux_entries(self, field: str) -> np.ndarray:
        """``field``'s aux entries (crc32c of each record's stored bytes, decoded size), fetched
        when the store was opened: as :meth:`headrace.Store.aux_entries`."""
        return self._fields[field].aux

    def nbytes(self, ids: Any, fields: str | Iterable[str] | None = None) -> int:
        """Decoded output bytes plus the range buffers fetched to produce them."""
        idx = record_ids(ids, len(self))
        total = 0
        for name in pick_fields(fields, self._fields, default=self.fields_selected, where=self.url):
            f = self._fields[name]
            total += f.rec * len(idx) if f.rec >= 0 else int(f.aux["nbytes"][idx].sum(dtype=np.int64))
            ranges = self._plan(f, idx)[0]
            total += sum(e - s for _, s, e in ranges)
        return total

    def gather(self, ids: Any, fields: str | Iterable[str] | None = None
               ) -> dict[str, np.ndarray | Ragged]:
        idx = record_ids(ids, len(self))
        names = pick_fields(fields, self._fields, default=self.fields_selected, where=self.url)
        plans = [self._plan(self._fields[name], idx) for name in names]
        # Every field's ranges go out together, so a batch waits for one round of requests.
        flat = [r for plan in plans for r in plan[0]]
        bufs = self._fetch_all(flat)
        out, at = {}, 0
        for name, plan in zip(names, plans, strict=True):
            k = len(plan[0])
            out[name] = self._assemble(self._fields[name], idx, plan, bufs[at:at + k])
            at += k
        return out

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def __enter__(self) -> RemoteStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_pool"] = None
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return (f"RemoteStore({self.url!r}, records={len(self)}, fields={list(self._fields)}, "
                f"generation={self.generation})")

    # -- reading ---------------------------------------------------------------------------------

    def _plan(self, f: _Field, idx: np.ndarray
              ) -> tuple[list[tuple[int, int, int]], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Coalesced ranges ``(chunk, start, end)`` plus per-record chunk/offset/length/range id."""
        ent = f.index[idx]
        cid = ent["chunk"].astype(np.int64)
        off = ent["offset"].astype(np.int64)
        ln = ent["length"].astype(np.int64)
        present = ln > 0
        csize = np.array([self._chunk_size.get(int(c), -1) for c in cid.tolist()], np.int64)
        bad = present & ((csize < 0) | (off + ln > csize))
        if bad.any():
            raise CorruptionError(
                f"{self.url}: field {f.spec.name!r}: index entries point outside their committed "
                f"chunk (records {idx[bad][:8].tolist()})", field=f.spec.name,
                record_ids=idx[bad].tolist())
        rid = np.full(len(idx), -1, np.int64)
        ranges: list[tuple[int, int, int]] = []
        order = np.lexsort((off, cid))
        order = order[present[order]]
        cur: list[int] | None = None
        for j, c, o, n in zip(order.tolist(), cid[order].tolist(), off[order].tolist(),
                              ln[order].tolist(), strict=True):
            if cur is not None and cur[0] == c and o - cur[2] <= self._gap:
                span = max(cur[2], o + n) - cur[1]
                useful = cur[3] + n
                if span <= self._max_range and (o - cur[2] <= self._small_gap
                                                or useful >= self._min_fill * span):
                    cur[2] = max(cur[2], o + n)
                    cur[3] = useful
                    rid[j] = len(ranges)
                    continue
            if cur is not None:
                ranges.append((cur[0], cur[1], cur[2]))
            cur = [c, o, o + n, n]
            rid[j] = len(ranges)
        if cur is not None:
            ranges.append((cur[0], cur[1], cur[2]))
        return ranges, cid, off, ln, rid

    def _executor(self) -> cf.ThreadPoolExecutor:
        if self._pool is None:
            with self._lock:
                if self._pool is None:
                    self._pool = cf.ThreadPoolExecutor(self._max_inflight,
                                                       thread_name_prefix="headrace-range")
        return self._pool

    def _fetch(self, chunk: int, start: int, end: int, *, use_cache: bool = True) -> bytes:
        ckey = f"range|{self.url}|g{self.meta.generation}|{chunk}|{start}|{end}"
        if use_cache and self._cache is not None:
            data = self._cache.get(ckey)
            if data is not None and len(data) == end - start:
                return data
        data = self._os.get_range(self._key(chunk_name(chunk)), start, end)
        with self._lock:
            self.requests += 1
            self.bytes_fetched += len(data)
        if self._cache is not None:
            self._cache.put(ckey, data)
        return data

    def _fetch_all(self, ranges: list[tuple[int, int, int]]) -> list[bytes]:
        if len(ranges) <= 1:
            return [self._fetch(*r) for r in ranges]
        pool = self._executor()
        return [fut.result() for fut in [pool.submit(self._fetch, *r) for r in ranges]]

    def _assemble(self, f: _Field, idx: np.ndarray, plan: Any, bufs: list[bytes]
                  ) -> np.ndarray | Ragged:
        ranges, _cid, off, ln, rid = plan
        nb = f.aux["nbytes"][idx].astype(np.int64)
        crc = f.aux["crc"][idx]

        def stored(j: int) -> memoryview:
            r = int(rid[j])
            s = int(off[j]) - ranges[r][1]
            return memoryview(bufs[r])[s:s + int(ln[j])]

        self._verify(f, idx, ranges, rid, bufs, stored, crc, ln)
        out: np.ndarray
        if f.rec >= 0:
            out = np.zeros((len(idx), f.rec), np.uint8)
            starts = np.arange(len(idx), dtype=np.int64) * f.rec
        else:
            starts = np.zeros(len(idx) + 1, np.int64)
            np.cumsum(nb, out=starts[1:])
            out = np.empty(int(starts[-1]), np.uint8)
        flat = out.reshape(-1)
        raw = f.spec.codec == "raw"
        for j in range(len(idx)):
            n = int(ln[j])
            if n == 0:
                continue
            src = stored(j)
            m, s = int(nb[j]), int(starts[j])
            if raw:
                if n != m:
                    raise CorruptionError(f"{self.url}: field {f.spec.name!r} record "
                                          f"{int(idx[j])}: stored {n} bytes, aux says {m}",
                                          field=f.spec.name, record_ids=[int(idx[j])])
                flat[s:s + n] = np.frombuffer(src, np.uint8)
                continue
            try:
                dec = f.codec.decode(src, m)
            except Exception as e:
                raise CorruptionError(
                    f"{self.url}: field {f.spec.name!r} record {int(idx[j])}: {f.spec.codec} data "
                    f"does not decode ({type(e).__name__}: {e})", field=f.spec.name,
                    record_ids=[int(idx[j])]) from e
            if len(dec) != m:
                raise CorruptionError(f"{self.url}: field {f.spec.name!r} record {int(idx[j])} "
                                      f"decodes to {len(dec)} bytes, expected {m}",
                                      field=f.spec.name, record_ids=[int(idx[j])])
            flat[s:s + m] = np.frombuffer(dec, np.uint8)
        if f.rec >= 0:
            shape = f.spec.shape or ()
            if f.rec == 0:
                return np.zeros((len(idx), *shape), f.spec.dtype)
            return out.view(f.spec.dtype).reshape((len(idx), *shape))
        isz = f.spec.dtype.itemsize
        return Ragged(out.view(f.spec.dtype), starts // max(isz, 1))

    def _verify(self, f: _Field, idx: np.ndarray, ranges: list[tuple[int, int, int]],
                rid: np.ndarray, bufs: list[bytes], stored: Any, crc: np.ndarray,
                ln: np.ndarray) -> None:
        # Every fetch is a fresh copy that crossed the network (or sat in the local cache), so
        # "first" checks it like "always": a record verified once can still arrive damaged.
        if self.verify == "never":
            return
        todo = np.flatnonzero(ln > 0)
        if not len(todo):
            return
        got = np.fromiter((google_crc32c.value(bytes(stored(j))) for j in todo.tolist()),
                          np.uint32, len(todo))
        still = todo[got != crc[todo]]
        # A mismatch is most often transient: bytes flipped in transit, or a cached range damaged
        # on local disk. Refetch those ranges from S3 (past the cache) within the retry budget;
        # bytes that stay wrong are damaged in the store itself.
        for _ in range(max(1, self._os.options.max_attempts - 1)):
            if not len(still):
                break
            with self._lock:
                self.refetches += 1
            for r in np.unique(rid[still]).tolist():
                bufs[r] = self._fetch(*ranges[r], use_cache=False)
            again = np.fromiter((google_crc32c.value(bytes(stored(j))) for j in still.tolist()),
                                np.uint32, len(still))
            still = still[again != crc[still]]
        if len(still):
            raise CorruptionError(
                f"{self.url}: field {f.spec.name!r}: stored bytes do not match their crc32c "
                f"(records {idx[still][:8].tolist()}), also when fetched again; the store on S3 "
                "is damaged: re-pack or restore it", field=f.spec.name,
                record_ids=idx[still].tolist())


def objstore_prefix(url: str) -> str:
    """``s3://bucket/a/b`` -> ``"a/b/"`` (``""`` for a bucket root)."""
    rest = url[5:].partition("/")[2].strip("/")
    return f"{rest}/" if rest else ""
