"""Packing a source that comes in *units* (Parquet row groups, table slices, tar shards) into a
new store, in this process or fanned out over ``parallel.run_parts``' executors.

A unit's record count may only be known once it is read (rows with nulls skipped, samples in a
tar shard), so tasks are contiguous runs of units and each part holds what its reader yields.
Either way the store is built under a hidden name next to ``out`` and renamed into place once
committed: a failed pack leaves nothing at ``out``, and ``overwrite=True`` replaces an old store
only after the new one is complete.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from headrace._base.errors import ConfigError, StoreExistsError
from headrace._base.fsutil import discard_dir
from headrace._base.progress import progress as progress_bar
from headrace._base.staging import make_staging
from headrace._pack import parallel as _parallel
from headrace._store import format as _format

__all__ = ["Reader", "batch_nbytes", "codecs_for", "dir_bytes", "pack_units"]

Reader = Callable[[], Iterator[Mapping[str, Any]]]


def batch_nbytes(batch: Mapping[str, Any]) -> int:
    """Bytes of the values in one append batch (for progress bars)."""
    total = 0
    for v in batch.values():
        if isinstance(v, list):
            total += sum(len(x) for x in v)
        else:
            total += int(getattr(getattr(v, "values", v), "nbytes", 0))
    return total


def codecs_for(codec: str | Mapping[str, str], names: Sequence[str]) -> dict[str, str]:
    """``codec=`` as ``{field: codec}``: one codec for all, or a dict (others ``raw``)."""
    if isinstance(codec, str):
        return dict.fromkeys(names, codec)
    unknown = sorted(set(codec) - set(names))
    if unknown:
        raise ConfigError(f"codec= names unknown fields {unknown}; the fields are {list(names)}")
    return {n: codec.get(n, "raw") for n in names}


def dir_bytes(path: str) -> int:
    """Bytes of every file under ``path`` (a store's size on disk)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total


def _target(out: str, overwrite: bool, who: str) -> str:
    """Where to build: ``out`` itself when absent or empty, else (``overwrite``) a sibling."""
    if not os.path.exists(out) or (os.path.isdir(out) and not os.listdir(out)):
        return out
    if not overwrite:
        raise StoreExistsError(f"{who}: {out} exists and is not empty; pass overwrite=True to "
                               "replace the store there, or pick a new out")
    if not os.path.isfile(os.path.join(out, _format.META_NAME)):
        raise StoreExistsError(f"{who}: {out} is not a headrace store; refusing to delete it "
                               "even with overwrite=True")
    return os.path.join(os.path.dirname(out), f".{os.path.basename(out)}.new-{os.getpid()}")


def _serial(target: str, *, fields: Mapping[str, Any], attrs: Mapping[str, Any],
            make_reader: Callable[[int, int], Reader], unit_bytes: np.ndarray, chunk_mb: float,
            progress: bool | None, desc: str) -> None:
    from headrace._store.writer import create

    parent = os.path.dirname(target) or "."
    os.makedirs(parent, exist_ok=True)
    staging = make_staging(target)
    try:
        with create(staging, fields=fields, chunk_mb=chunk_mb, attrs=attrs) as w, \
                progress_bar(int(np.sum(unit_bytes)), desc=desc, enabled=progress) as bar:
            # Unit by unit, so the bar counts input bytes (what its total is in); within a
            # unit it moves with the bytes appended, never past the unit's share.
            for u, share in enumerate(np.asarray(unit_bytes).tolist()):
                shown = 0
                for batch in make_reader(u, u + 1)():
                    w.append(batch)
                    step = min(batch_nbytes(batch), share - shown)
                    bar.update(step)
                    shown += step
                bar.update(share - shown)
        if os.path.isdir(target):
            os.rmdir(target)  # empty (checked by _target)
        os.rename(staging, target)
        _format.fsync_dir(parent)
    except BaseException:
        discard_dir(staging)
        raise


def pack_units(out: str | os.PathLike[str], *, fields: Mapping[str, Any],
               attrs: Mapping[str, Any], unit_bytes: np.ndarray,
               make_reader: Callable[[int, int], Reader],
               describe: Callable[[int, int], str], chunk_mb: float, workers: int | None,
               executor: cf.Executor | None, progress: bool | None, desc: str,
               overwrite: bool, who: str, ship_data: bool = False) -> dict[str, Any]:
    """Packs units ``0 .. len(unit_bytes)-1`` in order into a new store at ``out``.

    Args:
        fields, attrs, chunk_mb: the store's schema, attrs and chunk size bound.
        unit_bytes: each unit's (estimated) input bytes: tasks get runs of about equal bytes.
        make_reader: ``(a, b) -> reader`` of units ``[a, b)``: a picklable callable yielding
            ``Writer.append`` batches (made in this process, run wherever the task runs).
        describe: ``(a, b) -> text`` naming those units in errors.
        workers, executor: as in ``pack_arrays`` (``parallel.plan_tasks``).
        ship_data: the readers carry their data (in-memory tables): stay in this process
            unless ``workers``/``executor`` ask for more, as ``pack_arrays`` does.
        overwrite, who: replace a store at ``out`` (``who`` names the caller in errors).

    Returns:
        ``{"path", "samples", "chunks"}``.
    """
    out = os.path.abspath(os.fspath(out))
    _parallel.check_workers(workers, executor)
    target = _target(out, overwrite, who)
    n = len(unit_bytes)
    total = int(np.sum(unit_bytes))
    if ship_data and workers is None and executor is None:
        tasks = 1
    else:
        tasks = _parallel.plan_tasks(n, total, workers=workers, executor=executor)
    specs = [_format.parse_field_spec(k, v) for k, v in fields.items()]
    try:
        if n and _parallel.use_parallel(tasks, executor):
            cum = np.concatenate([[0], np.cumsum(unit_bytes, dtype=np.int64)])
            _parallel.run_parts(
                target, ranges=_parallel.split_ranges(np.asarray(unit_bytes), tasks),
                make_reader=make_reader, describe=describe, fields=specs, chunk_mb=chunk_mb,
                attrs=attrs, workers=workers, executor=executor,
                range_bytes=lambda a, b: int(cum[b] - cum[a]), progress=progress, desc=desc,
                units=True)
        else:
            _serial(target, fields=fields, attrs=attrs, make_reader=make_reader,
                    unit_bytes=np.asarray(unit_bytes), chunk_mb=chunk_mb, progress=progress,
                    desc=desc)
        if target != out:  # the new store is complete: only now does the old one go
            shutil.rmtree(out)
            os.rename(target, out)
    except BaseException:
        if target != out and os.path.exists(target):
            discard_dir(target)
        raise
    meta = _format.read_meta(out)
    return {"path": out, "samples": meta.length, "chunks": len(meta.chunks)}
