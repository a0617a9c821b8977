"""``headrace.pack``: a folder or S3 prefix of files -> a headrace store, local or on S3.

The source is resolved to a pinned snapshot first (so the store holds exactly the listed objects,
and the result names the manifest hash), then read in batches (S3 objects fetched concurrently) and
appended to a store with fields ``bytes`` (the file), ``key`` (its key, UTF-8) and, when labelled,
``label`` (int64 index into ``attrs["classes"]``; names also in ``_labels.tsv``).

A failed pack leaves nothing that looks like a store:

* local ``out``: the store is built in a hidden sibling folder and renamed to ``out`` only after
  its final commit; on failure the folder is removed.
* ``s3://`` ``out``: the store is built in a local scratch folder (``tmp_dir``); each chunk is
  uploaded once complete and its local copy emptied (so the scratch space is a few chunks, not the
  store), then index, aux and labels, and ``meta.json`` goes up last: a reader only sees a store once
  ``meta.json`` exists. On failure the uploaded objects are deleted.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import os
import shutil
import tempfile
import warnings
from typing import Any

import numpy as np

from headrace._base.errors import ConfigError, StoreExistsError
from headrace._base.fsutil import publish_dir
from headrace._base.progress import progress as progress_bar
from headrace._base.staging import make_staging
from headrace._pack import parallel as _parallel_pack
from headrace._remote.links import parse_link
from headrace._remote.objstore import ObjectStore, S3Options
from headrace._remote.resolve import snapshot
from headrace._sources.raw import RawSource

__all__ = ["pack"]


def _batches(sizes: np.ndarray, *, max_bytes: int, max_records: int) -> list[tuple[int, int]]:
    out, start, acc = [], 0, 0
    for i, s in enumerate(sizes.tolist()):
        if i > start and (acc + s > max_bytes or i - start >= max_records):
            out.append((start, i))
            start, acc = i, 0
        acc += s
    if start < len(sizes):
        out.append((start, len(sizes)))
    return out


def _build(src: RawSource, path: str, *, chunk_mb: float, codec: str, batch_bytes: int,
           bar: Any, attrs: dict[str, Any], on_commit: Any = None) -> int:
    """Appends every record of ``src`` to a new store at ``path``.

    With ``on_commit``, the (private, not yet published) store is also committed every few chunks
    and ``on_commit()`` is called, so chunks that are complete can be shipped while packing goes on.
    """
    from headrace._store.writer import create

    fields: dict[str, Any] = {"bytes": {"dtype": "bytes", "shape": None, "codec": codec},
                              "key": "bytes"}
    if src.classes is not None:
        fields["label"] = "int64"
    spans = _batches(src.manifest.sizes, max_bytes=batch_bytes, max_records=4096)
    with create(path, fields=fields, chunk_mb=chunk_mb, attrs=attrs) as w, \
            cf.ThreadPoolExecutor(1, thread_name_prefix="headrace-pack-read") as reader:
        # Read batch k+1 while batch k is written.
        since = 0
        nxt = reader.submit(src.gather, np.arange(*spans[0])) if spans else None
        for k in range(len(spans)):
            assert nxt is not None
            got = nxt.result()
            nxt = reader.submit(src.gather, np.arange(*spans[k + 1])) if k + 1 < len(spans) \
                else None
            rec: dict[str, Any] = {"bytes": got["bytes"].to_list(),
                                   "key": [k_.encode() for k_ in got["key"].tolist()]}
            if "label" in got:
                rec["label"] = got["label"]
            w.append(rec)
            bar.update(int(got["bytes"].offsets[-1]))
            since += int(got["bytes"].offsets[-1])
            if on_commit is not None and since >= 2 * chunk_mb * 2**20:
                w.commit()
                on_commit()
                since = 0
        w.commit()
    if src.classes is not None:
        with open(os.path.join(path, "_labels.tsv"), "w") as f:
            f.writelines(f"{i}\t{c}\n" for i, c in enumerate(src.classes))
    return len(src)


def pack(src: str | os.PathLike[str], *, out: str | os.PathLike[str], progress: bool | None = None,
         labels: bool | None = None, label_mode: str | None = "auto", recursive: bool = True,
         chunk_mb: float = 256, codec: str = "raw", store: str | os.PathLike[str] | None = None,
         max_inflight: int = 32, batch_mb: float = 64, tmp_dir: str | None = None,
         require_labels: bool = False, shard_mb: float | None = None,
         parallel_fetches: int | None = None, workers: int | None = None,
         executor: cf.Executor | None = None, **options: Any) -> dict[str, Any]:
    """Packs every file under ``src`` (local folder or ``s3://`` prefix) into a store at ``out``.

    Args:
        src: dataset link of the files (``@refresh`` re-lists; a plain link uses its pin).
        out: a new local directory or an ``s3://bucket/prefix/`` without a store in it.
        progress: show a progress bar (``None``: only on a terminal).
        labels, label_mode: label records by their top folder (default ``"auto"``: when every
            file is inside a folder).
        recursive: include subfolders.
        chunk_mb, codec: the store's chunk size and the codec of the ``bytes`` field.
        store: manifest store root for the source's snapshot.
        max_inflight: concurrent S3 requests (reads and uploads).
        batch_mb: bytes read per append.
        tmp_dir: scratch folder for an ``s3://`` ``out`` (default: the system temp dir).
        require_labels: fail unless the records get labels (mx8's flag).
        shard_mb, parallel_fetches: mx8's names for ``chunk_mb`` and ``max_inflight``.
        workers: local processes packing contiguous ranges of a local folder in parallel
            (``None``: all cores, but inputs under 64 MiB per process stay in this one; ``1``: this
            process). With ``executor``: the number of tasks. An ``s3://`` source or ``out``
            packs in this process (its reads are already concurrent).
        executor: a ``concurrent.futures.Executor`` to run the tasks on (e.g. a Dask
            ``client.get_executor()``); ``out`` must be on storage its workers share. Same records
            in the same order as one process; chunk boundaries differ.
        **options: S3 settings (``endpoint``, ``region``, ``profile``, ...).

    Returns:
        ``{"samples", "bytes", "out", "manifest_hash", "classes"}``.

    Raises:
        StoreExistsError: ``out`` already holds something.
        LinkError: the source is missing, empty, or changed while being packed.
        PackWorkerError: a parallel task raised or its worker died (nothing is left at ``out``).
    """
    s3 = S3Options.from_kwargs(options)
    if options:
        raise ConfigError(f"unknown options {sorted(options)} for pack()")
    if shard_mb is not None:
        chunk_mb = shard_mb
    if parallel_fetches is not None:
        max_inflight = parallel_fetches
    _parallel_pack.check_workers(workers, executor)
    if not chunk_mb > 0 or max_inflight < 1:
        raise ConfigError(f"chunk_mb must be > 0 and max_inflight >= 1, got {chunk_mb}, "
                          f"{max_inflight}")
    snap = snapshot(src, store=store, recursive=recursive, s3=s3)
    if snap.manifest.kind != "objects":
        raise ConfigError(f"{snap.link.base} is already a headrace store; copy it instead")
    objstore = ObjectStore(snap.link.bucket, options=s3) if snap.link.is_s3 else None
    source = RawSource(snap, labels=labels, label_mode=label_mode, objstore=objstore,
                       threads=max_inflight)
    if require_labels and source.classes is None:
        raise ConfigError(f"require_labels=True but {snap.link.base} has files outside class "
                          "folders (or label_mode='none'); labels come from each file's top folder")
    attrs: dict[str, Any] = {"source": snap.link.base, "manifest_hash": snap.hash}
    if source.classes is not None:
        attrs.update(labels="_labels.tsv", classes=source.classes)
    total = int(snap.manifest.sizes.sum())
    out_text = os.fspath(out)
    remote = "source" if snap.link.is_s3 else "out" if out_text.startswith("s3://") else None
    asked = [k for k, v in (("workers", workers not in (None, 1)),
                            ("executor", executor is not None)) if v]
    if remote is not None and asked:
        warnings.warn(
            f"pack(): {' and '.join(f'{k}=' for k in asked)} ignored: with an s3:// {remote} "
            "the pack runs in this process, its reads and uploads already concurrent (raise "
            "max_inflight= for more requests in flight)", UserWarning, stacklevel=2)
    kw = dict(chunk_mb=chunk_mb, codec=codec, batch_bytes=max(1, int(batch_mb * 2**20)),
              attrs=attrs)
    try:
        with progress_bar(total, desc=f"pack {snap.link.base}", enabled=progress) as bar:
            if out_text.startswith("s3://"):
                _pack_s3(source, out_text, s3=s3, tmp_dir=tmp_dir, max_inflight=max_inflight,
                         bar=bar, **kw)
            else:
                _pack_local(source, out_text, bar=bar, workers=workers, executor=executor, **kw)
    finally:
        source.close()
    return {"samples": len(source), "bytes": total, "out": out_text,
            "manifest_hash": snap.hash, "classes": source.classes}


def _pack_local(source: RawSource, out: str, *, bar: Any, workers: int | None = None,
                executor: cf.Executor | None = None, **kw: Any) -> None:
    out = os.path.abspath(out)
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise StoreExistsError(f"pack output {out} already exists and is not empty; "
                               "choose a new path or remove it")
    tasks = _parallel_pack.plan_tasks(len(source), int(source.manifest.sizes.sum()),
                                      workers=workers, executor=executor)
    if kw["codec"] == "zstd_dict":  # one dictionary per field: trained by one writer
        if executor is not None:
            raise ConfigError("codec zstd_dict packs in this process (a field trains one "
                              "dictionary); drop executor= or use codec 'zstd'")
        tasks = 1
    if source.snapshot.link.is_s3 is False and _parallel_pack.use_parallel(tasks, executor):
        fields: dict[str, Any] = {"bytes": {"dtype": "bytes", "shape": None,
                                            "codec": kw["codec"]}, "key": "bytes"}
        if source.classes is not None:
            fields["label"] = "int64"
        _parallel_pack.pack_raw(source, out, fields=fields, attrs=kw["attrs"],
                                chunk_mb=kw["chunk_mb"], batch_bytes=kw["batch_bytes"],
                                tasks=tasks, workers=workers, executor=executor, bar=bar)
        return
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    staging = make_staging(out)
    try:
        _build(source, staging, bar=bar, **kw)
        publish_dir(staging, out, who="pack")
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _pack_s3(source: RawSource, out: str, *, s3: S3Options, tmp_dir: str | None,
             max_inflight: int, bar: Any, **kw: Any) -> None:
    """Builds in a scratch folder and uploads as it goes; ``meta.json`` goes up last.

    Chunks are uploaded as soon as they are complete (a later chunk of the same field is
    committed), then their local copy is hollowed out (truncated to a sparse file of the same
    size, which the writer never reads again), so the scratch folder holds about ``max_pending``
    chunks, not the whole store.
    """
    from headrace._remote.objstore import ObjectNotFoundError
    from headrace._store.format import chunk_name, read_meta

    link = parse_link(out)
    dest = ObjectStore(link.bucket, options=s3)
    prefix = link.prefix
    try:
        dest.head(prefix + "meta.json")
    except ObjectNotFoundError:
        pass
    else:
        raise StoreExistsError(f"{out} already holds a store (meta.json); choose a new prefix")
    staging = tempfile.mkdtemp(dir=tmp_dir, prefix="headrace-pack-")
    shipped: set[int] = set()
    pending: list[cf.Future[None]] = []
    max_pending = 4

    def ship_chunk(cid: int, size: int) -> None:
        rel = chunk_name(cid)
        dest.put(prefix + rel, _Path(staging, rel))
        path = os.path.join(staging, *rel.split("/"))
        os.truncate(path, 0)  # free the disk space; keep the size the writer expects
        os.truncate(path, size)

    try:
        with cf.ThreadPoolExecutor(min(max_inflight, 8),
                                   thread_name_prefix="headrace-upload") as pool:

            def on_commit() -> None:
                meta = read_meta(staging)
                last: dict[str, int] = {}
                for c in meta.chunks:
                    last[c.field] = max(last.get(c.field, -1), c.id)
                for c in meta.chunks:
                    if c.id != last[c.field] and c.id not in shipped:
                        shipped.add(c.id)
                        pending.append(pool.submit(ship_chunk, c.id, c.size))
                while len(pending) > max_pending:  # bound the scratch space
                    pending.pop(0).result()

            _build(source, staging, bar=bar, on_commit=on_commit, **kw)
            for fut in pending:
                fut.result()
            files = [rel for rel in _all_rel(staging) if not rel.endswith(".tmp")
                     and rel not in {chunk_name(c) for c in shipped}]
            for fut in [pool.submit(dest.put, prefix + rel, _Path(staging, rel))
                        for rel in files]:
                fut.result()
        # The commit point: a store exists on S3 once meta.json does.
        with open(os.path.join(staging, "meta.json"), "rb") as f:
            dest.put(prefix + "meta.json", f.read())
    except BaseException:
        with contextlib.suppress(Exception):
            dest.delete([prefix + rel for rel in _all_rel(staging)])
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _Path(staging: str, rel: str) -> Any:
    import pathlib

    return pathlib.Path(staging, *rel.split("/"))


def _all_rel(staging: str) -> list[str]:
    out = []
    for dirpath, _dirs, names in os.walk(staging):
        for name in names:
            rel = os.path.relpath(os.path.join(dirpath, name), staging).replace(os.sep, "/")
            if rel not in ("meta.json", ".lock"):
                out.append(rel)
    return out
