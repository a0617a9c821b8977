"""``pack_dir``: an image tree -> a headrace store (the encoded bytes as stored, labels, paths).

Streaming: files are read in bounded batches (``read_batches``: a few reads ahead on a small
thread pool) and appended, so packing 10,000 or 10 million files
holds one batch of bytes plus the sorted list of paths, never the whole dataset.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
import warnings
from concurrent.futures import Executor
from typing import Any

from headrace._base.errors import ConfigError
from headrace._base.fsutil import publish_dir, replace_store
from headrace._base.progress import progress as progress_bar
from headrace._base.staging import make_staging
from headrace._pack import parallel as _parallel_pack
from headrace._sources.file_batches import read_batches
from headrace._sources.images import LABELS_FILE, scan_tree, write_labels_tsv

__all__ = ["pack_dir"]

def pack_dir(in_dir: str | os.PathLike[str], *, out: str | os.PathLike[str],
             shard_mb: float = 512, label_mode: str | None = None, require_labels: bool = False,
             progress: bool | None = None, overwrite: bool = False, workers: int | None = None,
             executor: Executor | None = None) -> dict[str, Any]:
    """Packs the images under ``in_dir`` into a new headrace store at ``out``.

    Every image file (by extension: jpg/jpeg/png/webp/gif/bmp/tif/tiff/pnm...) becomes one record,
    in byte-wise order of its relative path: ``image`` (the file's bytes, unchanged), ``label``
    (int64, ``-1`` when unlabeled) and ``path`` (the UTF-8 relative path). Hidden files and files
    in hidden folders, and non-image files, are skipped and counted in ``skipped``.

    Labels (``label_mode``): ``"imagefolder"`` labels each file by its first-level folder and fails
    when a file sits directly in ``in_dir``; ``"auto"`` (also ``None``, mx8's default) does the same
    when the layout is an ImageFolder (one class folder is enough) and otherwise packs unlabeled
    records, warning why; ``"none"`` packs unlabeled records. Class ids follow the byte-wise
    sorted folder names, as mx8 1.0.7 assigns them; the names are written once to ``_labels.tsv``.

    Args:
        in_dir: the image tree.
        out: the store directory to create (may sit inside ``in_dir``; it is not walked).
        shard_mb: bound on one chunk file of the store in MiB (mx8's shard size).
        label_mode: ``"imagefolder"``, ``"auto"``/``None`` or ``"none"``.
        require_labels: fail, listing the offending files, unless every file gets a label.
        progress: a progress bar on stderr (``None``: only on a terminal).
        overwrite: replace an existing headrace store at ``out`` (never any other directory).
        workers: local processes packing contiguous ranges of files in parallel (``None``: all
            cores, but inputs under 64 MiB per process stay in this one; ``1``: this process).
            With ``executor``: the number of tasks. ``docs/packing.md`` has the details.
        executor: a ``concurrent.futures.Executor`` to run the tasks on (a ``ProcessPoolExecutor``,
            a Dask ``client.get_executor()``, a Ray pool); ``out`` must be on storage its workers
            share. Same records, order and ``dataset_hash`` as one process; chunk boundaries differ.

    Returns:
        ``{"samples", "chunks", "shards" (= chunks), "labels_path" (or None), "classes",
        "dataset_hash", "skipped": {"hidden", "non_image"}, "labels_note", "path"}``.
        ``dataset_hash`` is the sha256 over every record's (length, label, path length, path,
        bytes) in order: the same on every machine for the same files and labels.

    Raises:
        ConfigError: bad ``label_mode``/``shard_mb``/``workers``, no image files, or missing labels
            with ``require_labels``/``imagefolder``.
        StoreExistsError: ``out`` exists and ``overwrite`` is false (or it is not a store).
        PackWorkerError: a parallel task raised or its worker died (nothing is left at ``out``).
    """
    from headrace._store.reader import open as open_store
    from headrace._store.writer import create

    if not isinstance(shard_mb, int | float) or not shard_mb > 0:
        raise ConfigError(f"shard_mb={shard_mb!r} must be > 0 (MiB per chunk file, e.g. 512)")
    _parallel_pack.check_workers(workers, executor)
    out = os.path.abspath(os.fspath(out))
    scan = scan_tree(os.fspath(in_dir), label_mode=label_mode, require_labels=require_labels,
                     exclude=out)
    if not scan.paths:
        raise ConfigError(f"input directory {scan.root} produced zero image files (skipped: "
                          f"{scan.skipped})")
    if scan.note is not None:
        warnings.warn(scan.note, UserWarning, stacklevel=2)
    replace_store(out, overwrite=overwrite, who="pack_dir")
    attrs: dict[str, Any] = {"kind": "images"}
    if scan.classes is not None:
        attrs["labels"] = LABELS_FILE
    digest = hashlib.sha256()
    fields = {"image": "bytes", "label": "int64", "path": "bytes"}
    tasks = _parallel_pack.plan_tasks(len(scan.paths), int(scan.sizes.sum()), workers=workers,
                                      executor=executor)
    if _parallel_pack.use_parallel(tasks, executor):
        chunks = _parallel_pack.pack_scan(scan, out, tasks=tasks, fields=fields, attrs=attrs,
                                          shard_mb=shard_mb, digest=digest, workers=workers,
                                          executor=executor, progress=progress)
        return {"samples": len(scan.paths), "chunks": chunks, "shards": chunks,
                "labels_path": (os.path.join(out, LABELS_FILE) if scan.classes is not None
                                else None),
                "classes": scan.classes, "dataset_hash": digest.hexdigest(),
                "skipped": dict(scan.skipped), "labels_note": scan.note, "path": out}
    # Built in a private sibling folder, published with one rename: a kill leaves nothing at out.
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    staging = make_staging(out)
    try:
        with create(staging, fields=fields, chunk_mb=shard_mb, attrs=attrs) as w, \
                progress_bar(int(scan.sizes.sum()), desc="pack_dir", enabled=progress) as bar:
            if scan.classes is not None:
                write_labels_tsv(os.path.join(staging, LABELS_FILE), scan.classes)
            for a, b, blobs in read_batches(scan.root, scan.paths, scan.sizes):
                paths = [p.encode("utf-8", "surrogateescape") for p in scan.paths[a:b]]
                labels = scan.labels[a:b]
                for blob, path, label in zip(blobs, paths, labels.tolist(), strict=True):
                    digest.update(struct.pack("<QqQ", len(blob), label, len(path)))
                    digest.update(path)
                    digest.update(blob)
                w.append({"image": blobs, "label": labels, "path": paths})
                bar.update(sum(map(len, blobs)))
            w.commit()
        publish_dir(staging, out, who="pack_dir")
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    with open_store(out) as st:
        chunks = len(st.meta.chunks)
    labels_path = os.path.join(out, LABELS_FILE) if scan.classes is not None else None
    return {"samples": len(scan.paths), "chunks": chunks, "shards": chunks,
            "labels_path": labels_path, "classes": scan.classes,
            "dataset_hash": digest.hexdigest(), "skipped": dict(scan.skipped),
            "labels_note": scan.note, "path": out}
