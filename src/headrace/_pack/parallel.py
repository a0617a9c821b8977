"""Parallel packing: split the input into contiguous ranges, pack each into a part store, merge.

``pack_dir``, ``pack_arrays`` and ``pack`` route here when they get ``workers > 1`` or an
``executor``. The plan:

1. The input (already sorted, so the order is deterministic) is cut into ``T`` contiguous record
   ranges of about equal bytes. Task ``t`` packs its range with the ordinary single writer into a
   part store ``<staging>/.parts/<t>-<random>/`` (a fresh directory per attempt, so a task that an
   executor retries never meets the leftovers of a killed attempt).
2. The tasks run on any ``concurrent.futures.Executor``: our own ``ProcessPoolExecutor``, a Dask
   ``Client.get_executor()``, a Ray pool. Task and result are small picklable values; the part stores
   live on the file system, so with a multi-machine executor ``out`` must be on shared storage.
3. The parent takes the results in task order. When every task has succeeded it merges: the part
   chunk files are renamed into ``<staging>/chunks/`` with ids renumbered (parts in task order, each
   part's chunks in id order), the index files are concatenated with their chunk ids rewritten, the aux
   files concatenated as they are, and ``meta.json`` is written once (atomically). Only then is the
   staging folder renamed to ``out``.

The merged store holds the same records, in the same order, with the same stored bytes as a
single-process pack; only chunk boundaries differ (each part ends with a partly filled chunk).

A task that raises, or whose worker dies (``BrokenProcessPool``, Dask's ``KilledWorker``), fails the
pack with ``PackWorkerError`` naming the task and its record range. The staging folder, and with it
every part, is removed; nothing is ever created at ``out``; re-running the pack starts afresh.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import hashlib
import itertools
import json
import mmap
import multiprocessing
import os
import re
import shutil
import struct
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from headrace._base.errors import ConfigError, PackWorkerError
from headrace._base.fsutil import discard_dir, publish_dir
from headrace._base.progress import progress as progress_bar
from headrace._base.staging import make_staging
from headrace._store import format as _format
from headrace._store.folio_writes import FOLIO_BYTES
from headrace._store.format import (
    AUX_DTYPE,
    CHUNK_DIR,
    INDEX_DTYPE,
    ChunkInfo,
    FieldEntry,
    FieldSpec,
    Meta,
)
from headrace._store.writer import chunk_bytes_of, raw_chunk_bytes

__all__ = ["content_hash", "pack_raw", "pack_scan", "pack_sources", "plan_tasks", "run_parts",
           "split_ranges"]

# With workers=None (all cores) small inputs stay in one process: a pool costs ~0.5 s to start.
_MIN_AUTO_TASK_BYTES = 64 << 20
# With an executor and workers=None: one task per this many input bytes.
_EXECUTOR_TASK_BYTES = 256 << 20
# Local pools: up to this many tasks per worker when the input is big (balances stragglers).
_TASKS_PER_WORKER = 4
_LOCAL_TASK_BYTES = 1 << 30
# After a failure, how long to wait for tasks still running elsewhere before removing their files.
_DRAIN_S = 30.0
PARTS_DIR = ".parts"


# -- planning ---------------------------------------------------------------------------------------


def check_workers(workers: int | None, executor: cf.Executor | None) -> None:
    """Validates ``workers=`` / ``executor=`` before anything is read."""
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)
                                or workers < 1):
        raise ConfigError(f"workers={workers!r} must be a positive int (1 = this process only) "
                          "or None (all cores)")
    if executor is not None and not isinstance(executor, cf.Executor):
        raise ConfigError(f"executor={executor!r} is not a concurrent.futures.Executor; pass e.g. "
                          "ProcessPoolExecutor(), dask's client.get_executor() or a Ray pool")


def plan_tasks(n_records: int, total_bytes: int, *, workers: int | None,
               executor: cf.Executor | None) -> int:
    """How many contiguous ranges (tasks) to pack; 1 with no executor means "this process".

    ``workers`` given: local pools get ``workers`` tasks (up to ``4 * workers`` for inputs over
    1 GiB per worker); with an ``executor`` it is the number of tasks. ``workers=None``: all cores,
    but inputs under 64 MiB per task stay in this process; with an executor, one task per 256 MiB.
    """
    check_workers(workers, executor)
    if n_records <= 1:
        return 1
    if workers is None:
        if executor is None:
            t = min(os.cpu_count() or 1, total_bytes // _MIN_AUTO_TASK_BYTES)
            t *= max(1, min(_TASKS_PER_WORKER, total_bytes // max(1, t * _LOCAL_TASK_BYTES)))
        else:
            t = -(-total_bytes // _EXECUTOR_TASK_BYTES)
    elif executor is None:
        t = workers * max(1, min(_TASKS_PER_WORKER,
                                 total_bytes // max(1, workers * _LOCAL_TASK_BYTES)))
    else:
        t = workers
    return int(max(1, min(n_records, t)))


def plan_array_tasks(sources: Sequence[Any], n: int, row_bytes: int, *, workers: int | None,
                     executor: cf.Executor | None) -> int:
    """``plan_tasks`` for ``pack_arrays``: in-memory arrays are copied to the workers, so they
    go parallel only when asked (``workers``/``executor``), in tasks of at most 256 MiB."""
    in_memory = any(s.npy_path is None for s in sources)
    if in_memory and workers is None and executor is None:
        check_workers(workers, executor)
        return 1
    t = plan_tasks(n, n * row_bytes, workers=workers, executor=executor)
    if in_memory and t > 1:
        t = min(n, max(t, -(-n * row_bytes // _EXECUTOR_TASK_BYTES)))
    return t


def whole_chunk_ranges(n: int, tasks: int, fields: Sequence[FieldSpec],
                       chunk_mb: float) -> list[tuple[int, int]]:
    """``tasks`` row ranges of about equal size that start on whole chunks of the widest
    fixed-shape raw field, when there are enough rows for that.

    Each part store ends in a partial chunk; parts that start on a chunk boundary of that field
    leave it only full chunks before the last, so its chunks map back to back and record i is
    row i, as after a single-writer pack (``raw_chunk_bytes``). Narrower fields (labels) get
    partial chunks and read through a short run table, which costs little at their size.
    """
    raw = [f.record_nbytes for f in fields
           if f.shape is not None and f.codec == "raw" and f.record_nbytes > 0]
    if raw:
        rec = max(raw)
        full = raw_chunk_bytes(rec, chunk_bytes_of(chunk_mb))
        unit = full // rec
        if full % FOLIO_BYTES == 0 and n // unit >= tasks:  # else chunks leave gaps anyway
            bounds = sorted({round(n * k / tasks / unit) * unit for k in range(1, tasks)} - {0})
            edges = [0, *[b for b in bounds if 0 < b < n], n]
            return list(itertools.pairwise(edges))
    return split_ranges(np.full(n, 1, np.int64), tasks)


def use_parallel(tasks: int, executor: cf.Executor | None) -> bool:
    return tasks > 1 or executor is not None


def split_ranges(sizes: np.ndarray, tasks: int) -> list[tuple[int, int]]:
    """``tasks`` contiguous non-empty ``[start, stop)`` ranges of about equal bytes."""
    n = len(sizes)
    tasks = max(1, min(n, tasks))
    cum = np.cumsum(np.maximum(np.asarray(sizes, np.int64), 1))  # empty records still weigh
    targets = cum[-1] * np.arange(1, tasks) / tasks
    edges = np.searchsorted(cum, targets, side="left") + 1
    bounds = [0]
    for k, e in enumerate(edges.tolist(), 1):  # strictly increasing, room left for the rest
        bounds.append(min(max(int(e), bounds[-1] + 1), n - (tasks - k)))
    bounds.append(n)
    return list(itertools.pairwise(bounds))


# -- tasks (run in workers: module-level, picklable) -----------------------------------------------


@dataclass(frozen=True)
class PartTask:
    """One range to pack into its own part store.

    Attributes:
        index: the task number ``t`` (parts are merged in this order).
        count: the number of tasks.
        start, stop: the global record range ``[start, stop)``.
        what: the range for error messages (e.g. first and last file).
        parts_dir: the folder the part store is made in (it must already exist).
        fields: the store's schema.
        chunk_mb: chunk size bound of the part store (the final store's).
        reader: a picklable callable that yields ``Writer.append`` batches of the range.
        units: ``start``/``stop`` count input units (files, row groups, tar shards) whose number
            of records is only known once read, so the part's length is not checked.
    """

    index: int
    count: int
    start: int
    stop: int
    what: str
    parts_dir: str
    fields: tuple[FieldSpec, ...]
    chunk_mb: float
    reader: Callable[[], Iterator[Mapping[str, Any]]]
    units: bool = False


@dataclass(frozen=True)
class PartResult:
    index: int
    path: str
    length: int


def run_part(task: PartTask) -> PartResult:
    """Packs one range into a fresh part store (runs in a worker process, thread or machine)."""
    from headrace._store.writer import create

    # mkdtemp (not makedirs): once the parent has given up and removed the staging folder, a
    # late attempt fails here instead of re-creating it.
    path = tempfile.mkdtemp(dir=task.parts_dir, prefix=f"{task.index:06d}-")
    n = 0
    with create(path, fields=task.fields, chunk_mb=task.chunk_mb) as w:
        for batch in task.reader():
            w.append(batch)
        n = len(w)
    if not task.units and n != task.stop - task.start:
        raise PackWorkerError(f"pack task {task.index} packed {n} records, expected "
                              f"{task.stop - task.start} (records {task.start}..{task.stop - 1})")
    return PartResult(task.index, path, n)


# -- running -----------------------------------------------------------------------------------------


def _describe(task: PartTask) -> str:
    what = "inputs" if task.units else "records"
    return (f"pack task {task.index} of {task.count} ({what} {task.start}..{task.stop - 1}"
            f"{': ' + task.what if task.what else ''})")


def _died(e: BaseException) -> bool:
    name = type(e).__name__
    return isinstance(e, cf.process.BrokenProcessPool | cf.CancelledError) or name in (
        "KilledWorker", "WorkerLostError", "RayActorError", "WorkerCrashedError")


_GUARD = re.compile(r"""__name__\s*==\s*['"]__main__['"]|['"]__main__['"]\s*==\s*__name__""")


def unguarded_main() -> str | None:
    """The running script's path when it has no ``if __name__ == "__main__":`` guard, else None.

    Workers started with forkserver or spawn run the script again; without the guard each of them
    starts the pack again, and multiprocessing kills it while it starts (its pool breaks).
    """
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    if not isinstance(path, str) or not os.path.isfile(path):
        return None  # interactive, `python -c`, a notebook: nothing is re-run
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(1 << 22)
    except OSError:
        return None
    return None if _GUARD.search(text) else path


def _guard_hint(method: str | None) -> str | None:
    if method not in ("forkserver", "spawn"):
        return None
    script = unguarded_main()
    if script is None:
        return None
    loaded = [m for m in _FORK_HOSTILE_MODULES if m in sys.modules]
    why = (f"{', '.join(loaded)} is imported" if loaded else "other threads are running")
    return (f"its worker died while starting. Workers start with {method!r} here (fork is "
            f"unsafe once {why}), which runs your script {script} again in each worker, and it "
            "has no `if __name__ == \"__main__\":` guard, so every worker began the pack anew. "
            "Put the code that packs under that guard (or pass workers=1)")


def _task_error(task: PartTask, e: BaseException, out: str,
                method: str | None = None) -> PackWorkerError:
    hint = _guard_hint(method) if _died(e) else None
    if hint is not None:
        why = hint
    elif _died(e):
        why = (f"its worker died ({type(e).__name__}: {e}): killed by a signal, out of memory, "
               "or the machine went away")
    else:
        why = f"it raised {type(e).__name__}: {e}"
    return PackWorkerError(
        f"{_describe(task)} failed: {why}. Nothing was committed at {out} and the partial parts "
        "were removed; fix the cause and re-run the pack",
        task=task.index, start=task.start, stop=task.stop)


# Libraries whose runtimes own native thread pools invisible to ``threading.enumerate()``; JAX
# also warns from an at-fork hook. With any of them loaded, never fork.
_FORK_HOSTILE_MODULES = ("jax", "jaxlib", "torch", "tensorflow")


def _fork_safe() -> bool:
    """No thread but ours could hold a lock at fork time (tqdm's monitor only sleeps)."""
    if any(name in sys.modules for name in _FORK_HOSTILE_MODULES):
        return False
    main = threading.main_thread()
    return threading.current_thread() is main and all(
        t is main or type(t).__name__ == "TMonitor" for t in threading.enumerate())


def _start_method() -> str:
    # fork is fastest and needs no `if __name__ == "__main__"` guard in the caller's script, but
    # forking a process that runs threads (a loader, a Dask client) can deadlock a child on a lock
    # some thread held: then forkserver (the script needs the guard, as with any spawn start).
    if sys.platform.startswith("linux"):
        return "fork" if _fork_safe() else "forkserver"
    return "spawn"


def _own_pool(workers: int, method: str) -> cf.ProcessPoolExecutor:
    ctx = multiprocessing.get_context(method)
    if method == "forkserver":  # the server imports these once; each worker forks from it
        ctx.set_forkserver_preload(["numpy", "headrace._pack.parallel", "headrace._store.writer",
                                    "headrace._store.reader", "headrace._sources.file_batches"])
    return cf.ProcessPoolExecutor(max_workers=workers, mp_context=ctx)


def run_parts(out: str, *, ranges: Sequence[tuple[int, int]],
              make_reader: Callable[[int, int], Callable[[], Iterator[Mapping[str, Any]]]],
              describe: Callable[[int, int], str], fields: Sequence[FieldSpec], chunk_mb: float,
              attrs: Mapping[str, Any], workers: int | None, executor: cf.Executor | None,
              range_bytes: Callable[[int, int], int], progress: bool | None, desc: str,
              on_part: Callable[[str], None] | None = None,
              extra_files: Callable[[str], None] | None = None, bar: Any = None,
              units: bool = False) -> int:
    """Packs ``ranges`` in parallel into a new store at ``out``; returns its number of chunks.

    Args:
        out: the absolute path of the store to create (must not exist, or be an empty folder).
        ranges: contiguous record ranges in order (``split_ranges``).
        make_reader: ``(start, stop) -> reader`` (a picklable callable yielding append batches);
            called in this process when the task is submitted.
        describe: ``(start, stop) -> str`` for error messages.
        fields, chunk_mb, attrs: the store's schema, chunk size and attrs.
        workers: local processes (``None``: all cores) when ``executor`` is ``None``.
        executor: run the tasks there instead (not shut down here).
        range_bytes: ``(start, stop) -> bytes`` of input, for the progress bar.
        on_part: called in this process with each part's path, in task order, as soon as the
            parts before it are done (e.g. to hash the records in order).
        extra_files: called with the staging folder before the commit (e.g. to write labels).
        bar: a progress bar to update instead of making one.
        units: ``ranges`` are of input units (files, row groups, shards), not records; each
            part holds whatever records its reader yields (see ``PartTask.units``).
    """
    if executor is None and getattr(multiprocessing.current_process(), "_inheriting", False):
        # This process is a pool worker importing an unguarded script while it starts: refuse
        # before making a staging folder or a pool (whose semaphores a dying worker would leak).
        # Its parent sees the worker die and explains the missing guard.
        raise PackWorkerError(f"a pack started while this worker process was starting (the "
                              f"script {unguarded_main() or sys.argv[0]} was re-run in it); put "
                              "the code that packs under `if __name__ == \"__main__\":`")
    parent = os.path.dirname(out) or "."
    os.makedirs(parent, exist_ok=True)
    staging = make_staging(out)
    parts_dir = os.path.join(staging, PARTS_DIR)
    os.mkdir(parts_dir)
    count = len(ranges)
    specs = tuple(fields)
    tasks = [PartTask(t, count, a, b, "", parts_dir, specs, chunk_mb, _Deferred(), units)
             for t, (a, b) in enumerate(ranges)]
    own = None
    method = None
    if executor is None:
        method = _start_method()
        own = _own_pool(max(1, min(count, workers or os.cpu_count() or 1)), method)
        window = 2 * max(1, min(count, workers or os.cpu_count() or 1))
    else:
        window = count
    pending: dict[int, cf.Future[PartResult]] = {}
    results: list[PartResult] = []
    try:
        pool = own if own is not None else executor
        assert pool is not None
        total = sum(range_bytes(a, b) for a, b in ranges)
        with contextlib.nullcontext(bar) if bar is not None else progress_bar(
                total, desc=desc, enabled=progress) as bar:
            nxt = 0
            done: dict[int, PartResult] = {}
            while len(results) < count:
                while nxt < count and nxt - len(results) < window:
                    a, b = ranges[nxt]
                    task = PartTask(nxt, count, a, b, describe(a, b), parts_dir, specs, chunk_mb,
                                    make_reader(a, b), units)
                    tasks[nxt] = task
                    with warnings.catch_warnings():  # Python 3.12+ on fork: see _fork_safe
                        warnings.filterwarnings("ignore", ".*multi-threaded.*fork",
                                                DeprecationWarning)
                        pending[nxt] = pool.submit(run_part, task)
                    nxt += 1
                finished, _ = cf.wait(pending.values(), return_when=cf.FIRST_COMPLETED)
                # Report the earliest failed task (a dead pool fails every outstanding future).
                for t in sorted(pending):
                    fut = pending[t]
                    if fut in finished:
                        exc = fut.exception()
                        if exc is not None:
                            raise _task_error(tasks[t], exc, out, method) from exc
                        done[t] = fut.result()
                        del pending[t]
                while len(results) in done:
                    res = done.pop(len(results))
                    if on_part is not None:
                        on_part(res.path)
                    results.append(res)
                    a, b = ranges[res.index]
                    bar.update(range_bytes(a, b))
        if extra_files is not None:
            extra_files(staging)
        chunks = _merge(staging, results, specs, chunk_mb, attrs)
        shutil.rmtree(parts_dir)
        publish_dir(staging, out, who=desc)
        return chunks
    except BaseException:
        for fut in pending.values():
            fut.cancel()
        if own is not None:
            own.shutdown(wait=True, cancel_futures=True)
            own = None
        else:  # tasks still running elsewhere write into parts_dir: let them end first
            cf.wait([f for f in pending.values() if not f.cancelled()], timeout=_DRAIN_S)
        # A cancelled Dask/Ray future can still be running its task, writing into parts_dir.
        discard_dir(staging)
        raise
    finally:
        if own is not None:
            own.shutdown(wait=True)


class _Deferred:
    """Placeholder reader of a task not yet submitted."""

    def __call__(self) -> Iterator[Mapping[str, Any]]:
        raise AssertionError("task not submitted")


# -- merging ----------------------------------------------------------------------------------------


def _merge(staging: str, results: Sequence[PartResult], specs: Sequence[FieldSpec],
           chunk_mb: float, attrs: Mapping[str, Any]) -> int:
    """Moves every part's chunks into ``staging`` and writes its index/aux and ``meta.json``."""
    cdir = os.path.join(staging, CHUNK_DIR)
    os.makedirs(cdir, exist_ok=True)
    entries = [FieldEntry(s, *_format.index_names(s.name, 0)) for s in specs]
    fds = {}
    for fe in entries:
        for name in (fe.index, fe.aux):
            fds[name] = os.open(os.path.join(staging, name),
                                os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    chunks: list[ChunkInfo] = []
    length = 0
    try:
        for res in results:
            meta = _format.read_meta(res.path)
            ids = sorted(c.id for c in meta.chunks)
            base = len(chunks)
            lut = np.zeros(max(ids, default=-1) + 1, np.int64)
            lut[ids] = base + np.arange(len(ids))
            by_id = {c.id: c for c in meta.chunks}
            for cid in ids:
                new = len(chunks)
                os.rename(os.path.join(res.path, _format.chunk_name(cid)),
                          os.path.join(staging, _format.chunk_name(new)))
                chunks.append(ChunkInfo(new, by_id[cid].field, by_id[cid].size))
            part_fields = {fe.spec.name: fe for fe in meta.fields}
            for fe in entries:
                pf = part_fields[fe.spec.name]
                ent = np.fromfile(os.path.join(res.path, pf.index), INDEX_DTYPE, meta.length)
                present = ent["length"] > 0
                ent["chunk"][present] = lut[ent["chunk"][present]]
                _write_all(fds[fe.index], ent)
                with open(os.path.join(res.path, pf.aux), "rb") as f:
                    _write_all(fds[fe.aux], f.read(meta.length * AUX_DTYPE.itemsize))
            length += meta.length
        for fd in fds.values():
            os.fsync(fd)
    finally:
        for fd in fds.values():
            os.close(fd)
    _format.fsync_dir(cdir)
    _format.fsync_dir(staging)
    _format.write_meta(staging, Meta(
        length=length, generation=0, commit=1, chunk_bytes=max(1, int(chunk_mb * (1 << 20))),
        fields=tuple(entries), chunks=tuple(chunks), attrs=json.loads(json.dumps(dict(attrs)))))
    return len(chunks)


def _write_all(fd: int, data: Any) -> None:
    view = memoryview(data).cast("B")
    while view:
        view = view[os.write(fd, view):]


# -- hashing ------------------------------------------------------------------------------------------


def hash_image_part(digest: Any, path: str) -> None:
    """Feeds a ``pack_dir`` part's records to ``digest`` exactly as the single-process pack does."""
    from headrace._store.reader import open as open_store

    with open_store(path, verify="never") as st:
        n = len(st)
        for a in range(0, n, 4096):
            ids = np.arange(a, min(n, a + 4096))
            labels = st.gather(ids, fields=["label"])["label"].tolist()
            for blob, p, label in zip(st.views(ids, "image"), st.views(ids, "path"), labels,
                                      strict=True):
                digest.update(struct.pack("<QqQ", blob.nbytes, label, p.nbytes))
                digest.update(p)
                digest.update(blob)


def content_hash(path: str | os.PathLike[str]) -> str:
    """sha256 of a store's content, independent of its chunk layout.

    Covers the schema (every field's name, dtype, shape and codec, in order) and, per field, every
    record's stored length, decoded size, checksum and stored bytes, in record order. Two stores
    with the same records in the same order (e.g. packed with 1 and with N workers) hash the same.
    """
    path = os.fspath(path)
    meta = _format.read_meta(path)
    h = hashlib.sha256()
    h.update(json.dumps([fe.spec.to_json() for fe in meta.fields]).encode())
    h.update(struct.pack("<Q", meta.length))
    maps: dict[int, Any] = {}
    try:
        for fe in meta.fields:
            ent = np.fromfile(os.path.join(path, fe.index), INDEX_DTYPE, meta.length)
            aux = np.fromfile(os.path.join(path, fe.aux), AUX_DTYPE, meta.length)
            h.update(fe.spec.name.encode())
            h.update(np.ascontiguousarray(ent["length"]).tobytes())
            h.update(aux.tobytes())
            for cid, off, ln in zip(ent["chunk"].tolist(), ent["offset"].tolist(),
                                    ent["length"].tolist(), strict=True):
                if ln:
                    m = maps.get(cid)
                    if m is None:
                        with open(os.path.join(path, _format.chunk_name(cid)), "rb") as f:
                            m = maps[cid] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                    h.update(memoryview(m)[off:off + ln])
    finally:
        for m in maps.values():
            try:
                m.close()
            except BufferError:
                pass
    return h.hexdigest()


# -- readers for the pack functions (picklable) ------------------------------------------------------


@dataclass(frozen=True)
class FileReader:
    """``pack_dir``'s records of one range: file bytes, label, relative path."""

    root: str
    paths: tuple[str, ...]
    labels: np.ndarray
    sizes: np.ndarray
    batch_bytes: int = 32 << 20
    batch_files: int = 1024

    def __call__(self) -> Iterator[Mapping[str, Any]]:
        from headrace._sources.file_batches import read_batches

        for a, b, blobs in read_batches(self.root, self.paths, self.sizes,
                                        batch_bytes=self.batch_bytes,
                                        batch_files=self.batch_files):
            yield {"image": blobs, "label": self.labels[a:b],
                   "path": [p.encode("utf-8", "surrogateescape") for p in self.paths[a:b]]}


@dataclass(frozen=True)
class ArrayReader:
    """``pack_arrays``'s rows of one range: in-memory slices, or ``.npy`` sources read here."""

    columns: tuple[tuple[str, Any], ...]  # (name, data slice) or (name, _Source with npy_path)
    start: int
    stop: int
    rows_per_step: int

    def __call__(self) -> Iterator[Mapping[str, Any]]:
        for a in range(self.start, self.stop, self.rows_per_step):
            b = min(self.stop, a + self.rows_per_step)
            batch = {}
            for name, col in self.columns:
                if hasattr(col, "npy_path"):
                    batch[name] = col.read(a, b)
                else:
                    batch[name] = col[a - self.start:b - self.start]
            yield batch


def slice_raw_source(source: Any, start: int, stop: int) -> Any:
    """A ``RawSource`` of records ``[start, stop)`` only (ids from 0), with the same labels.

    A task then carries its own range of the manifest, not the whole (ImageNet: ~100 MB) of it.
    """
    import dataclasses

    m = source.manifest
    sub = dataclasses.replace(
        m, keys=m.keys[start:stop], sizes=m.sizes[start:stop], etags=m.etags[start:stop],
        mtimes_ns=m.mtimes_ns[start:stop], labels=m.labels[start:stop])
    state = source.__getstate__()
    state.update(manifest=sub, snapshot=dataclasses.replace(source.snapshot, manifest=sub),
                 _keys=source._keys[start:stop],
                 _labels=None if source._labels is None else source._labels[start:stop])
    cls: Any = type(source)
    part = cls.__new__(cls)
    part.__setstate__(state)
    return part


@dataclass(frozen=True)
class RawReader:
    """``pack``'s records of one range of a local ``objects`` snapshot."""

    source: Any  # a RawSource of this range only (slice_raw_source): record ids from 0
    batch_bytes: int

    def __call__(self) -> Iterator[Mapping[str, Any]]:
        sizes = self.source.manifest.sizes
        n = len(sizes)
        a = 0
        while a < n:
            b, acc = a, 0
            while b < n and (b == a or (acc + int(sizes[b]) <= self.batch_bytes
                                        and b - a < 4096)):
                acc += int(sizes[b])
                b += 1
            got = self.source.gather(np.arange(a, b))
            rec: dict[str, Any] = {"bytes": got["bytes"].to_list(),
                                   "key": [k.encode() for k in got["key"].tolist()]}
            if "label" in got:
                rec["label"] = got["label"]
            yield rec
            a = b
        self.source.close()


# -- entry points of the three pack functions --------------------------------------------------------


def pack_scan(scan: Any, out: str, *, tasks: int, fields: Mapping[str, Any],
              attrs: Mapping[str, Any], shard_mb: float, digest: Any, workers: int | None,
              executor: cf.Executor | None, progress: bool | None) -> int:
    """``pack_dir`` in parallel: ``scan`` (an ``_image_sources.Scan``) into a store at ``out``.

    ``digest`` is fed every record in order (the single-process ``dataset_hash``); returns the
    number of chunks.
    """
    from headrace._sources.images import LABELS_FILE, write_labels_tsv

    specs = [_format.parse_field_spec(k, v) for k, v in fields.items()]
    sizes = scan.sizes

    def make_reader(a: int, b: int) -> FileReader:
        return FileReader(scan.root, tuple(scan.paths[a:b]), scan.labels[a:b].copy(),
                          sizes[a:b].copy())

    def extra(staging: str) -> None:
        if scan.classes is not None:
            write_labels_tsv(os.path.join(staging, LABELS_FILE), scan.classes)

    return run_parts(
        out, ranges=split_ranges(sizes, tasks), make_reader=make_reader,
        describe=lambda a, b: f"files {scan.paths[a]} .. {scan.paths[b - 1]}",
        fields=specs, chunk_mb=shard_mb, attrs=attrs, workers=workers, executor=executor,
        range_bytes=lambda a, b: int(sizes[a:b].sum()), progress=progress, desc="pack_dir",
        on_part=lambda path: hash_image_part(digest, path), extra_files=extra)


def pack_sources(out: str, *, sources: Sequence[Any], specs: Mapping[str, Any], chunk_mb: float,
                 rows_per_step: int, tasks: int, workers: int | None,
                 executor: cf.Executor | None, progress: bool | None) -> int:
    """``pack_arrays`` in parallel: ``.npy`` sources are read by the workers themselves, in-memory
    ones are sliced here and shipped with their task."""
    n = sources[0].length
    row_bytes = max(1, sum(s.row_bytes for s in sources))

    def make_reader(a: int, b: int) -> ArrayReader:
        cols = tuple((s.name, s if s.npy_path is not None else s.read(a, b)) for s in sources)
        return ArrayReader(cols, a, b, rows_per_step)

    fields = [_format.parse_field_spec(k, v) for k, v in specs.items()]
    return run_parts(
        out, ranges=whole_chunk_ranges(n, tasks, fields, chunk_mb), make_reader=make_reader,
        describe=lambda a, b: "", fields=fields,
        chunk_mb=chunk_mb, attrs={}, workers=workers, executor=executor,
        range_bytes=lambda a, b: (b - a) * row_bytes, progress=progress,
        desc=f"pack {os.path.basename(out)}")


def pack_raw(source: Any, out: str, *, fields: Mapping[str, Any], attrs: Mapping[str, Any],
             chunk_mb: float, batch_bytes: int, tasks: int, workers: int | None,
             executor: cf.Executor | None, bar: Any) -> int:
    """``pack`` (local output) in parallel over a ``RawSource``'s records."""
    sizes = source.manifest.sizes

    def extra(staging: str) -> None:
        if source.classes is not None:
            with open(os.path.join(staging, "_labels.tsv"), "w") as f:
                f.writelines(f"{i}\t{c}\n" for i, c in enumerate(source.classes))

    return run_parts(
        out, ranges=split_ranges(sizes, tasks),
        make_reader=lambda a, b: RawReader(slice_raw_source(source, a, b), batch_bytes),
        describe=lambda a, b: f"keys {source.key(a)} .. {source.key(b - 1)}",
        fields=[_format.parse_field_spec(k, v) for k, v in fields.items()], chunk_mb=chunk_mb,
        attrs=attrs, workers=workers, executor=executor,
        range_bytes=lambda a, b: int(sizes[a:b].sum()), progress=False, desc="pack",
        extra_files=extra, bar=bar)
