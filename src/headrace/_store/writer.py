"""``Writer``: appends, modifies, deletes and compacts records; nothing is visible before ``commit``.

How a crash at any instant leaves the last commit intact (``docs/format.md`` has the full argument):

* Only bytes past the committed sizes are written in place: chunk bytes past ``chunks[].size`` and
  index/aux entries past ``length``. Readers never look there, and a writer opening the store first
  truncates them away ("recovery").
* A commit that changes existing records (modify, delete, compact) writes the whole index/aux of
  every field to new files ``<field>.g<G+1>.index/.aux`` (copy-on-write) and puts compacted records in
  new chunk files. Until ``meta.json`` names them, they are unreferenced leftovers that recovery
  deletes.
* ``commit`` fsyncs every written file (and the directories when files were created), then replaces
  ``meta.json`` atomically (temp file, fsync, rename, fsync of the directory). Only then are files
  of the previous commit that the new one no longer names unlinked; readers that still map them keep
  reading (Linux keeps unlinked mapped files alive).

One writer at a time: ``flock(LOCK_EX|LOCK_NB)`` on ``<store>/.lock``. A failed write (disk full, any
OS error) rolls the writer back to the last commit and closes it.
"""

from __future__ import annotations

import functools
import json
import math
import os
import stat
import weakref
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any

import google_crc32c
import numpy as np

from headrace._base.errors import (
    ConfigError,
    CorruptionError,
    RecordIndexError,
    SchemaError,
    StoreExistsError,
    WriterClosedError,
)
from headrace._base.fsutil import (
    acquire_lock,
    copy_prefix,
    file_kind,
    is_disk_full,
    pwrite_all,
    store_full,
    undo_dir,
)
from headrace._base.progress import progress as progress_bar
from headrace._store import format as _format
from headrace._store.codecs import Codec, get_codec
from headrace._store.compact import ChunkMaps, rewrite_field
from headrace._store.encode import encode_batch
from headrace._store.folio_writes import FOLIO_BYTES, FolioWrites
from headrace._store.format import (
    AUX_DTYPE,
    CHUNK_DIR,
    INDEX_DTYPE,
    ChunkInfo,
    FieldEntry,
    FieldSpec,
    Meta,
)
from headrace._store.recover import recover

__all__ = ["Writer", "chunk_bytes_of", "create", "raw_chunk_bytes"]


def chunk_bytes_of(chunk_mb: float) -> int:
    """The chunk size bound in bytes that ``create(chunk_mb=...)`` stores."""
    return max(1, int(chunk_mb * (1 << 20)))


def raw_chunk_bytes(rec: int, chunk_bytes: int) -> int:
    """Bytes a chunk of a fixed-shape raw field with ``rec``-byte records holds when full.

    Whole records, so a chunk is a 2-D array. When it fits, a multiple of 2 MiB too: full chunks
    then map back to back (``_vmap``) with no gap, so record i is virtual row i and a steady-state
    gather is a single take with no index reads.
    """
    unit = math.lcm(rec, FOLIO_BYTES)
    if unit <= chunk_bytes:
        return chunk_bytes // unit * unit
    return max(rec, chunk_bytes // rec * rec)



class _FieldW:
    """Writer-side state of one field: its working index/aux files and its open chunk."""

    def __init__(self, spec: FieldSpec, index: str, aux: str, dict_file: str | None = None,
                 dictionary: bytes | None = None) -> None:
        self.spec = spec
        # zstd_dict: the dictionary (None until the first append trains it) and its file once
        # committed; the codec is built from it
        self.dictionary = dictionary
        self.dict_file = dict_file
        self.dict_crc: int | None = None
        self.codec: Codec = get_codec(spec.codec, dictionary)
        self.rec = -1 if spec.shape is None else spec.record_nbytes
        self.index_name = index
        self.aux_name = aux
        self.index_fd = -1
        self.aux_fd = -1
        self.open_chunk: int | None = None  # chunk that appends go to


def _release(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


class Writer:
    """The single writer of a store. Use ``headrace.create`` or ``headrace.open(path, mode="a")``.

    Changes become visible to readers only at ``commit()``. As a context manager it commits on a
    clean exit and rolls back (commits nothing) when the block raises. A writer is meant for one
    thread at a time; readers (``headrace.open(path)``) may run in any thread or process.
    """

    def __init__(self, path: str, lock_fd: int) -> None:
        """Takes ownership of ``lock_fd`` at once: if this raises, the fd is closed already, so
        the caller must not close it again (a second close would hit whatever file reused the
        number, in this or any other thread)."""
        self._fds: list[int] = [lock_fd]  # every fd we own, closed by close() or the finalizer
        self._finalizer = weakref.finalize(self, _release, self._fds)
        self.path = path
        self._lock_fd = lock_fd
        self._closed = False
        try:
            self._load(_format.read_meta(path))
        except BaseException:
            self._closed = True
            self._finalizer()  # now, not whenever a traceback holding this object is collected
            raise

    # -- opening, recovery -----------------------------------------------------------------------

    @classmethod
    def _open_existing(cls, path: str) -> Writer:
        _format.read_meta(path)  # NotAStoreError / FormatVersionError before touching anything
        lock_fd = acquire_lock(os.path.join(path, _format.LOCK_NAME), path)
        return cls(path, lock_fd)  # owns lock_fd, and closes it if it raises

    def _load(self, meta: Meta) -> None:
        """(Re)starts from commit ``meta``: recovery, then fresh working state."""
        self._close_data_fds()
        recover(self.path, meta)
        self._committed = meta
        self._n = meta.length
        self._cow = False
        self._dirty = False
        self._new_files = False
        self._dirty_fds: set[int] = set()
        self._chunks: dict[int, list[Any]] = {c.id: [c.field, c.size] for c in meta.chunks}
        self._chunk_fds: dict[int, int] = {}
        self._folios = FolioWrites()  # chunk tails held until a 2 MiB span is whole
        self._next_chunk = max((c.id for c in meta.chunks), default=-1) + 1
        self._attrs = json.loads(json.dumps(meta.attrs))
        self.chunk_bytes = meta.chunk_bytes
        self._fields: dict[str, _FieldW] = {}
        for fe in meta.fields:
            fw = _FieldW(fe.spec, fe.index, fe.aux, fe.dict_file, _format.read_dict(self.path, fe))
            fw.dict_crc = fe.dict_crc
            fw.index_fd = self._open_fd(fe.index)
            fw.aux_fd = self._open_fd(fe.aux)
            self._fields[fe.spec.name] = fw
        for c in meta.chunks:  # the last non-full chunk of a field takes the next appends
            fw = self._fields[c.field]
            if c.size < self._capacity(fw) and self._chunk_ok(c):
                fw.open_chunk = c.id

    def _chunk_ok(self, c: ChunkInfo) -> bool:
        try:
            return os.stat(os.path.join(self.path, _format.chunk_name(c.id))).st_size == c.size
        except FileNotFoundError:
            return False

    def _open_fd(self, name: str, *, create: bool = False) -> int:
        flags = os.O_RDWR | os.O_NONBLOCK | (os.O_CREAT | os.O_TRUNC if create else 0)
        try:
            fd = os.open(os.path.join(self.path, name), flags, 0o644)
        except IsADirectoryError:
            raise CorruptionError(
                f"{os.path.join(self.path, name)} is a directory, not a regular file, but "
                "meta.json names it; the store is damaged: restore that file from a backup") from None
        except FileNotFoundError:
            raise CorruptionError(
                f"{os.path.join(self.path, name)} is missing, but meta.json names it; the store "
                "is damaged: restore that file from a backup") from None
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):  # a FIFO or device in its place: writes would fail or block
            os.close(fd)
            raise CorruptionError(
                f"{os.path.join(self.path, name)} is a {file_kind(mode)}, not a regular file, but "
                "meta.json names it; the store is damaged: restore that file from a backup")
        self._fds.append(fd)
        return fd

    def _close_data_fds(self) -> None:
        keep = [fd for fd in self._fds if fd == self._lock_fd]
        _release([fd for fd in self._fds if fd != self._lock_fd])
        self._fds[:] = keep

    # -- properties ------------------------------------------------------------------------------

    def __len__(self) -> int:
        """Number of records including uncommitted changes."""
        return self._n

    @property
    def fields(self) -> dict[str, FieldSpec]:
        return {name: fw.spec for name, fw in self._fields.items()}

    @property
    def generation(self) -> int:
        """Generation of the last commit."""
        return self._committed.generation

    @property
    def commit_id(self) -> int:
        return self._committed.commit

    @property
    def attrs(self) -> dict[str, Any]:
        """Mutable attrs dict; changes are written by the next commit (must be JSON-able)."""
        self._dirty = True
        return self._attrs

    @property
    def closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"length={self._n}, fields={list(self._fields)}"
        return f"Writer({self.path!r}, {state})"

    # -- encoding --------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise WriterClosedError(
                f"the writer of {self.path} is closed (closed explicitly, or rolled back after a "
                "failed write); open a new one with headrace.open(path, mode='a')")

    def _capacity(self, fw: _FieldW) -> int:
        if fw.rec > 0 and fw.spec.codec == "raw":  # whole records, so a chunk is a 2-D array
            return raw_chunk_bytes(fw.rec, self.chunk_bytes)
        return self.chunk_bytes

    # -- low-level writes ------------------------------------------------------------------------

    def _chunk_fd(self, cid: int) -> int:
        fd = self._chunk_fds.get(cid)
        if fd is None:
            fd = self._open_fd(_format.chunk_name(cid), create=cid >= self._committed_top())
            self._chunk_fds[cid] = fd
        return fd

    def _committed_top(self) -> int:
        return max((c.id for c in self._committed.chunks), default=-1) + 1

    def _new_chunk(self, fw: _FieldW) -> int:
        if fw.open_chunk is not None:  # full: nothing more comes to it, write what it holds
            self._folios.flush(fw.open_chunk)
        cid = self._next_chunk
        self._next_chunk += 1
        self._chunks[cid] = [fw.spec.name, 0]
        self._chunk_fd(cid)
        self._new_files = True
        fw.open_chunk = cid
        return cid

    def _place(self, fw: _FieldW, data: list[Any] | np.ndarray, lengths: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
        """Appends records to the field's chunks; returns their (chunk ids, offsets)."""
        k = len(lengths)
        cids = np.zeros(k, np.int64)
        offs = np.zeros(k, np.int64)
        cap = self._capacity(fw)
        if isinstance(data, np.ndarray):  # fixed-shape raw: whole rows, sliced per chunk
            rec = fw.rec
            j = 0
            while j < k and rec > 0:
                cid = fw.open_chunk
                if cid is None or self._chunks[cid][1] + rec > cap:
                    cid = self._new_chunk(fw)
                size = self._chunks[cid][1]
                m = min(k - j, (cap - size) // rec)
                self._write(cid, data[j:j + m], size)
                cids[j:j + m] = cid
                offs[j:j + m] = size + rec * np.arange(m)
                j += m
            return cids, offs
        j = 0
        while j < k:
            if lengths[j] == 0:
                j += 1
                continue
            cid = fw.open_chunk
            if cid is None or (self._chunks[cid][1] > 0
                               and self._chunks[cid][1] + int(lengths[j]) > cap):
                cid = self._new_chunk(fw)
            start = self._chunks[cid][1]
            pos = start
            group = []
            while j < k and (pos == start or pos + int(lengths[j]) <= cap):
                if lengths[j]:
                    group.append(data[j])
                    cids[j] = cid
                    offs[j] = pos
                    pos += int(lengths[j])
                j += 1
            self._write(cid, b"".join(group) if len(group) > 1 else group[0], start)
        return cids, offs

    def _write(self, cid: int, data: Any, offset: int) -> None:
        fd = self._chunk_fd(cid)
        self._folios.write(cid, fd, data, offset)
        self._dirty_fds.add(fd)
        self._chunks[cid][1] = offset + memoryview(data).nbytes

    def _write_dict(self, fw: _FieldW) -> None:
        """Writes a newly trained dictionary; the commit's meta.json then names it."""
        assert fw.dictionary is not None
        name = _format.dict_name(fw.spec.name)
        fd = self._open_fd(name, create=True)
        pwrite_all(fd, np.frombuffer(fw.dictionary, np.uint8), 0)
        self._dirty_fds.add(fd)
        self._new_files = True
        fw.dict_file = name
        fw.dict_crc = int(google_crc32c.value(fw.dictionary))

    def _put_entries(self, fw: _FieldW, at: int, cids: np.ndarray, offs: np.ndarray,
                     lengths: np.ndarray, nbytes: np.ndarray, crcs: np.ndarray) -> None:
        ent = np.zeros(len(lengths), INDEX_DTYPE)
        ent["chunk"] = cids
        ent["offset"] = offs
        ent["length"] = lengths
        aux = np.zeros(len(lengths), AUX_DTYPE)
        aux["crc"] = crcs
        aux["nbytes"] = nbytes
        pwrite_all(fw.index_fd, ent, at * INDEX_DTYPE.itemsize)
        pwrite_all(fw.aux_fd, aux, at * AUX_DTYPE.itemsize)
        self._dirty_fds.update((fw.index_fd, fw.aux_fd))

    def _get_entries(self, fw: _FieldW, start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        ib = os.pread(fw.index_fd, count * INDEX_DTYPE.itemsize, start * INDEX_DTYPE.itemsize)
        ab = os.pread(fw.aux_fd, count * AUX_DTYPE.itemsize, start * AUX_DTYPE.itemsize)
        if len(ib) != count * INDEX_DTYPE.itemsize or len(ab) != count * AUX_DTYPE.itemsize:
            raise CorruptionError(
                f"field {fw.spec.name!r}: index/aux files of {self.path} are shorter than the "
                "store's length; the store is damaged", field=fw.spec.name)
        return (np.frombuffer(ib, INDEX_DTYPE).copy(), np.frombuffer(ab, AUX_DTYPE).copy())

    def _begin_cow(self) -> None:
        """Switches every field to fresh index/aux files for the next generation (copy-on-write)."""
        if self._cow:
            return
        gen = self._committed.generation + 1
        for fw in self._fields.values():
            index, aux = _format.index_names(fw.spec.name, gen)
            new_i = self._open_fd(index, create=True)
            new_a = self._open_fd(aux, create=True)
            copy_prefix(fw.index_fd, new_i, self._n * INDEX_DTYPE.itemsize)
            copy_prefix(fw.aux_fd, new_a, self._n * AUX_DTYPE.itemsize)
            fw.index_name, fw.aux_name, fw.index_fd, fw.aux_fd = index, aux, new_i, new_a
            self._dirty_fds.update((new_i, new_a))
        self._cow = True
        self._new_files = True

    def _guarded(self, fn: Any, *args: Any) -> Any:
        """Runs a write. If it fails half-way (disk full, I/O error, a damaged index found, even
        KeyboardInterrupt) the pending state is unknown: roll back to the last commit and close.
        Validation errors never get here: records are checked before anything is written."""
        self._check_open()
        try:
            return fn(*args)
        except BaseException as e:
            self._abort()
            if is_disk_full(e):
                raise store_full(self.path, e) from e  # type: ignore[arg-type]
            raise

    def _abort(self) -> None:
        try:
            on_disk = _format.read_meta(self.path).commit
        except Exception:
            on_disk = self._committed.commit
        try:
            if on_disk == self._committed.commit:
                self._load(self._committed)
            # else the failure came after meta.json was renamed (e.g. the directory fsync): the
            # new commit may or may not survive a crash, so delete nothing; the next writer
            # recovers against whichever meta.json it finds
        except OSError:
            pass  # the next writer's recovery finishes the job
        self._dirty = self._cow = False
        self._n = self._committed.length
        self.close()

    # -- public writes ---------------------------------------------------------------------------

    def append(self, records: Mapping[str, Any]) -> None:
        """Appends a batch of records.

        Args:
            records: ``{field: batch}``. A fixed-shape field's batch is an array of shape
                ``(n, *shape)``; a ragged field's batch is a list of ``n`` records (bytes or 1-D
                arrays). Fields left out get absent (length-0) entries.

        Raises:
            SchemaError: unknown field, wrong dtype/shape, or batches of different lengths.
            RecordTooLargeError: a record over 4 GiB. Nothing is written in either case.
            StoreFullError: the disk filled up; the writer is rolled back to the last commit.
        """
        self._check_open()
        if not isinstance(records, Mapping) or not records:
            raise SchemaError(f"append() takes a non-empty dict field -> batch, got {records!r:.80}")
        self._unknown(records)
        n: int | None = None
        encoded = {}
        for name, batch in records.items():
            enc = encode_batch(self._fields[name], batch, n)
            n = enc[0]
            encoded[name] = enc
        if not n:
            return  # zero records (checked like any batch): nothing to write or commit
        self._guarded(self._append_encoded, encoded, n)

    def _append_encoded(self, encoded: dict[str, Any], n: int) -> None:
        at = self._n
        for name, fw in self._fields.items():
            if name in encoded:
                _k, data, lengths, nbytes, crcs = encoded[name]
                cids, offs = self._place(fw, data, lengths)
                self._put_entries(fw, at, cids, offs, lengths, nbytes, crcs)
            else:
                z = np.zeros(n, np.int64)
                self._put_entries(fw, at, z, z, z, z, z.astype(np.uint32))
        self._n = at + n
        self._dirty = True

    def _unknown(self, records: Mapping[str, Any]) -> None:
        unknown = [k for k in records if k not in self._fields]
        if unknown:
            raise SchemaError(f"unknown fields {unknown}; this store has {list(self._fields)}")

    def _check_id(self, i: Any) -> int:
        if not isinstance(i, int | np.integer) or not 0 <= int(i) < self._n:
            raise RecordIndexError(
                f"record id {i!r} is out of range for a store of N={self._n} records")
        return int(i)

    def modify(self, i: int, record: Mapping[str, Any]) -> None:
        """Replaces fields of record ``i`` (fields left out keep their value): append + repoint.

        Changes the generation at the next commit when ``i`` was already committed.
        """
        self._check_open()
        i = self._check_id(i)
        self._unknown(record)
        encoded = {}
        for name, value in record.items():
            fw = self._fields[name]
            if fw.rec >= 0:
                batch = value[None] if isinstance(value, np.ndarray) else [value]
            else:
                batch = [value]
            encoded[name] = encode_batch(fw, batch, 1)
        self._guarded(self._modify_encoded, i, encoded)

    def _modify_encoded(self, i: int, encoded: dict[str, Any]) -> None:
        if i < self._committed.length:
            self._begin_cow()
        for name, (_k, data, lengths, nbytes, crcs) in encoded.items():
            fw = self._fields[name]
            cids, offs = self._place(fw, data, lengths)
            self._put_entries(fw, i, cids, offs, lengths, nbytes, crcs)
        self._dirty = True

    def delete(self, i: int) -> None:
        """Deletes record ``i`` by moving the last record into its place (N shrinks by one).

        Record ids are not stable across deletes; the generation changes at the next commit.
        """
        self._check_open()
        i = self._check_id(i)
        self._guarded(self._delete, i)

    def _delete(self, i: int) -> None:
        if i < self._committed.length:
            self._begin_cow()
        last = self._n - 1
        if i != last:
            for fw in self._fields.values():
                ent, aux = self._get_entries(fw, last, 1)
                pwrite_all(fw.index_fd, ent, i * INDEX_DTYPE.itemsize)
                pwrite_all(fw.aux_fd, aux, i * AUX_DTYPE.itemsize)
        self._n = last
        self._dirty = True

    def utilization(self) -> float:
        """Live record bytes / chunk bytes, over all fields, including uncommitted changes."""
        return self._guarded(self._utilization)

    def _utilization(self) -> float:
        live, total = self._live_bytes()
        return live / total if total else 1.0

    def _live_bytes(self) -> tuple[int, int]:
        """(bytes of live records, bytes in chunks), including uncommitted changes."""
        total = sum(size for _f, size in self._chunks.values())
        live = 0
        if total:
            for fw in self._fields.values():
                ent, _aux = self._get_entries(fw, 0, self._n)
                live += int(ent["length"].sum(dtype=np.int64))
        return live, total

    def compact(self, *, progress: bool | None = None) -> tuple[float, float]:
        """Rewrites live records into fresh chunks (the design's "rebalance").

        Takes effect at the next commit (which changes the generation); old chunks are deleted
        after that commit. A store with no dead bytes (utilization 100%) is left as it is: no
        rewrite, and no new generation that would invalidate checkpoints.

        Returns:
            ``(utilization_before, utilization_after)``, each live bytes / chunk bytes.
        """
        self._check_open()
        return self._guarded(self._compact, progress)

    def _compact(self, progress: bool | None) -> tuple[float, float]:
        # Old chunks stay on disk until the commit; the index is rewritten in the copy-on-write
        # files, so nothing is visible (or lost) before the commit.
        live, total = self._live_bytes()
        if live == total:  # nothing to reclaim: a rewrite would only change the generation
            return 1.0, 1.0
        before = live / total
        self._folios.flush_all()  # records appended since the commit are read back from the files
        self._begin_cow()
        plans = [(fw, self._get_entries(fw, 0, self._n)[0]) for fw in self._fields.values()]
        live = sum(int(ent["length"].sum(dtype=np.int64)) for _fw, ent in plans)
        maps = ChunkMaps(self.path, {cid: info[1] for cid, info in self._chunks.items()})
        for fw in self._fields.values():
            fw.open_chunk = None
        self._chunks.clear()
        with progress_bar(live, desc="compact", unit="B", enabled=progress) as bar:
            for fw, ent in plans:
                new = rewrite_field(fw.spec.name, ent, stacked=fw.rec > 0 and fw.spec.codec == "raw",
                                    maps=maps, place=functools.partial(self._place, fw),
                                    advance=bar.update)
                pwrite_all(fw.index_fd, new, 0)
        self._folios.flush_all()  # a full disk fails compact() itself, not the commit after it
        after = self._utilization()
        self._dirty = True
        return before, after

    # -- commit / rollback / close ---------------------------------------------------------------

    def commit(self) -> None:
        """Makes every change since the last commit durable and visible, atomically.

        A no-op when nothing changed.
        """
        self._check_open()
        if not self._dirty:
            return
        try:
            attrs = json.loads(json.dumps(self._attrs))
        except (TypeError, ValueError) as e:
            raise ConfigError(f"writer attrs must be JSON-serializable: {e}") from e
        self._guarded(self._commit, attrs)

    def _commit(self, attrs: dict[str, Any]) -> None:
        old = self._committed
        self._folios.flush_all()
        for fw in self._fields.values():
            os.ftruncate(fw.index_fd, self._n * INDEX_DTYPE.itemsize)
            os.ftruncate(fw.aux_fd, self._n * AUX_DTYPE.itemsize)
        for fw in self._fields.values():
            if fw.dictionary is not None and fw.dict_file is None:
                self._write_dict(fw)
        for fd in self._dirty_fds:
            os.fsync(fd)
        if self._new_files:
            _format.fsync_dir(os.path.join(self.path, CHUNK_DIR))
            _format.fsync_dir(self.path)
        meta = Meta(
            length=self._n,
            generation=old.generation + 1 if self._cow else old.generation,
            commit=old.commit + 1,
            chunk_bytes=self.chunk_bytes,
            fields=tuple(FieldEntry(fw.spec, fw.index_name, fw.aux_name, fw.dict_file, fw.dict_crc)
                         for fw in self._fields.values()),
            chunks=tuple(ChunkInfo(cid, f, size) for cid, (f, size) in sorted(self._chunks.items())),
            attrs=attrs)
        _format.write_meta(self.path, meta)
        # Committed. Files the new commit no longer names are unlinked (readers keep their maps).
        self._committed = meta
        self._dirty_fds.clear()
        self._dirty = False
        self._new_files = False
        if self._cow or len(meta.chunks) < len(old.chunks) or any(
                c.id not in self._chunks for c in old.chunks):
            self._load(meta)  # recovery deletes the old index/aux files and dropped chunks

    def rollback(self) -> None:
        """Discards every change since the last commit."""
        self._check_open()
        self._guarded(self._load, self._committed)

    def close(self) -> None:
        """Discards uncommitted changes and releases the lock (idempotent)."""
        if self._closed:
            return
        if self._dirty or self._cow or self._n != self._committed.length:
            try:
                self._load(self._committed)
            except OSError:
                pass
        self._closed = True
        self._finalizer()

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._closed:
            return
        if exc_type is None:
            try:
                self.commit()
            finally:
                self.close()
        else:
            self.close()


def create(path: str | os.PathLike[str], *, fields: Mapping[str, Any] | Iterable[FieldSpec],
           chunk_mb: float = 256, attrs: Mapping[str, Any] | None = None) -> Writer:
    """Creates a new, empty store and returns its writer.

    Args:
        path: a directory that does not exist yet (or is empty).
        fields: ``{name: spec}`` where spec is ``"bytes"``, a dtype name, a dict
            ``{"dtype", "shape", "codec"}`` or a ``FieldSpec``; or an iterable of ``FieldSpec``.
        chunk_mb: bound on a chunk file's size in MiB (a bigger single record gets its own chunk).
        attrs: JSON-able metadata stored in ``meta.json``.

    Raises:
        StoreExistsError: ``path`` exists and is not an empty directory.
        SchemaError: bad field specs (unknown codec, bad dtype, bad name).
    """
    path = os.fspath(path)
    if isinstance(fields, Mapping):
        specs = [_format.parse_field_spec(k, v) for k, v in fields.items()]
    else:
        specs = list(fields)
        if not all(isinstance(s, FieldSpec) for s in specs):
            raise SchemaError("fields must be a dict name -> spec or an iterable of FieldSpec")
    if not specs:
        raise SchemaError("a store needs at least one field, e.g. fields={'x': 'bytes'}")
    if len({s.name for s in specs}) != len(specs):
        raise SchemaError(f"field names repeat: {[s.name for s in specs]}")
    if not (isinstance(chunk_mb, int | float) and chunk_mb > 0 and math.isfinite(chunk_mb)):
        raise ConfigError(f"chunk_mb={chunk_mb!r} must be a positive number of MiB, e.g. 256")
    try:
        attrs_d = json.loads(json.dumps(dict(attrs or {})))
    except (TypeError, ValueError) as e:
        raise ConfigError(f"attrs must be JSON-serializable: {e}") from e
    if os.path.exists(path) and (not os.path.isdir(path) or os.listdir(path)):
        raise StoreExistsError(
            f"cannot create a store at {path}: it exists and is not an empty directory; pick "
            "a new path, or open the existing store with headrace.open(path, mode='a')")
    made_dir = not os.path.exists(path)
    try:
        os.makedirs(os.path.join(path, CHUNK_DIR), exist_ok=True)
    except OSError as e:
        if is_disk_full(e):
            raise store_full(path, e) from e
        raise
    lock_fd = acquire_lock(os.path.join(path, _format.LOCK_NAME), path)
    committed = False
    try:
        entries = []
        for s in specs:
            index, aux = _format.index_names(s.name, 0)
            for name in (index, aux):
                fd = os.open(os.path.join(path, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.fsync(fd)
                os.close(fd)
            entries.append(FieldEntry(s, index, aux))
        _format.fsync_dir(os.path.join(path, CHUNK_DIR))
        _format.write_meta(path, Meta(
            length=0, generation=0, commit=0, chunk_bytes=chunk_bytes_of(chunk_mb),
            fields=tuple(entries), chunks=(), attrs=attrs_d))
        committed = True
        if made_dir:  # the new directory's own entry
            _format.fsync_dir(os.path.dirname(os.path.abspath(path)))
    except BaseException as e:
        os.close(lock_fd)
        if not committed:  # leave no half-made store behind: create() can simply be retried
            undo_dir(path, made=made_dir)
        if is_disk_full(e):
            raise store_full(path, e) from e  # type: ignore[arg-type]
        raise
    return Writer(path, lock_fd)  # owns lock_fd from here, and closes it if it raises
