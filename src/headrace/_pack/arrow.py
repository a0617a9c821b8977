"""``pack_arrow``: Hugging Face datasets, Arrow tables and Parquet files -> a store.

Sources: a ``datasets.Dataset`` (or a ``DatasetDict`` with ``split=``), a ``pyarrow.Table`` /
``RecordBatch``, or Parquet: a file, a folder, a glob, or a list of them, local or ``s3://``.
Columns become fields as ``arrow_fields`` lays out (HF features are read from the dataset, or
from the ``huggingface`` schema metadata that ``datasets`` writes into Parquet files).

Streaming: a Parquet file is read one row group at a time, in record batches of at most
``batch_mb``; a dataset or table in slices of that size. Memory holds one row group (Arrow
decodes a column chunk whole) and one batch, whatever the source's size. The units of work
are row groups (Parquet) or row ranges (tables, datasets): ``workers=`` / ``executor=`` pack
runs of them in parallel into one store with the same records and content hash.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import json
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from headrace._base.errors import ConfigError
from headrace._pack.arrow_fields import (
    MEDIA_FEATURES,
    NULL_POLICIES,
    Column,
    convert_batch,
    plan_columns,
)
from headrace._pack.inputs import InputFile, list_inputs
from headrace._pack.units import codecs_for, dir_bytes, pack_units

__all__ = ["pack_arrow"]

# Rows per unit of a table or dataset (each unit is one task's smallest share).
_TABLE_UNIT_BYTES = 64 << 20


def _features_from_metadata(schema: Any) -> dict[str, Any] | None:
    meta = schema.metadata or {}
    raw = meta.get(b"huggingface")
    if not raw:
        return None
    try:
        info = json.loads(raw)
    except ValueError:
        return None
    feats = (info.get("info") or {}).get("features")
    return feats if isinstance(feats, dict) else None


def _jsonable(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=list))


# -- readers (picklable; run in this process or in a worker) ----------------------------------------


@dataclass(frozen=True)
class _ParquetReader:
    """Row groups ``units`` (``(file index, row group, first source row)``) of ``files``."""

    files: tuple[InputFile, ...]
    units: tuple[tuple[int, int, int], ...]
    cols: tuple[Column, ...]
    nulls: str
    batch_rows: tuple[int, ...]  # per file: rows per record batch

    def __call__(self) -> Iterator[Mapping[str, Any]]:
        import pyarrow.parquet as pq

        names = [c.name for c in self.cols]
        k = 0
        while k < len(self.units):
            fi = self.units[k][0]
            j = k
            while j < len(self.units) and self.units[j][0] == fi:
                j += 1
            f = self.files[fi]
            # A local file goes to Arrow's own reader (no Python bytes in between).
            with contextlib.nullcontext(f.name) if f.client is None else f.open() as fh:
                pf = pq.ParquetFile(fh)
                for _fi, rg, row0 in self.units[k:j]:
                    row = row0
                    for rb in pf.iter_batches(batch_size=self.batch_rows[fi], row_groups=[rg],
                                              columns=names, use_threads=False):
                        batch, got = convert_batch(self.cols, rb, row, self.nulls, f.name)
                        row += rb.num_rows
                        if got:
                            yield batch
            k = j


@dataclass(frozen=True)
class _TableReader:
    """Rows of an in-memory ``pyarrow.Table`` (``table`` is already the task's slice)."""

    table: Any
    row0: int
    cols: tuple[Column, ...]
    nulls: str
    batch_rows: int
    where: str

    def __call__(self) -> Iterator[Mapping[str, Any]]:
        for a in range(0, self.table.num_rows, self.batch_rows):
            part = self.table.slice(a, self.batch_rows)
            batch, got = convert_batch(self.cols, part, self.row0 + a, self.nulls, self.where)
            if got:
                yield batch


@dataclass(frozen=True)
class _DatasetReader:
    """Rows ``[start, stop)`` of an HF ``datasets.Dataset`` (memory-mapped or in memory)."""

    dataset: Any
    start: int
    stop: int
    cols: tuple[Column, ...]
    nulls: str
    batch_rows: int
    where: str

    def __call__(self) -> Iterator[Mapping[str, Any]]:
        ds = self.dataset.with_format("arrow")
        for a in range(self.start, self.stop, self.batch_rows):
            b = min(self.stop, a + self.batch_rows)
            batch, got = convert_batch(self.cols, ds[a:b], a, self.nulls, self.where)
            if got:
                yield batch


# -- sources ----------------------------------------------------------------------------------------


@dataclass
class _Plan:
    cols: list[Column]
    unit_bytes: np.ndarray
    make_reader: Any
    describe: Any
    source: str
    ship_data: bool
    rows: int  # rows in the source (before nulls="skip" drops any)


def _rows_for(row_bytes: float, batch_bytes: int) -> int:
    return int(max(1, min(1 << 20, batch_bytes // max(1.0, row_bytes))))


def _is_hf(obj: Any, name: str) -> bool:
    return any(c.__name__ == name and c.__module__.startswith("datasets")
               for c in type(obj).__mro__)


def _plan_parquet(spec: Any, columns: Any, nulls: str, batch_bytes: int,
                  options: dict[str, Any]) -> _Plan:
    import pyarrow.parquet as pq

    files = list_inputs(spec, suffixes=(".parquet", ".parq", ".pq"), what="Parquet",
                        options=options)

    def meta_of(f: InputFile) -> Any:
        try:
            with f.open() as fh:
                return pq.ParquetFile(fh).metadata
        except Exception as e:
            if isinstance(e, ConfigError):
                raise
            raise ConfigError(f"{f.name} is not a readable Parquet file ({e})") from e

    with cf.ThreadPoolExecutor(min(16, len(files))) as pool:  # footers of many S3 objects
        metas = list(pool.map(meta_of, files))
    schema = metas[0].schema.to_arrow_schema()
    cols = plan_columns(schema, _features_from_metadata(schema), columns)
    names = [c.name for c in cols]
    for f, m in zip(files[1:], metas[1:], strict=True):
        other = m.schema.to_arrow_schema()
        for n in names:
            if n not in other.names or not other.field(n).type.equals(schema.field(n).type):
                got = other.field(n).type if n in other.names else "missing"
                raise ConfigError(f"{f.name}: column {n!r} is {got}, but {files[0].name} has "
                                  f"{schema.field(n).type}; every Parquet file of one store "
                                  "needs the same columns and types")
    units, sizes, batch_rows = [], [], []
    row = 0
    for fi, m in enumerate(metas):
        fbytes = sum(m.row_group(g).total_byte_size for g in range(m.num_row_groups))
        batch_rows.append(_rows_for(fbytes / max(1, m.num_rows), batch_bytes))
        for g in range(m.num_row_groups):
            rg = m.row_group(g)
            if rg.num_rows == 0:
                continue
            units.append((fi, g, row))
            sizes.append(max(1, rg.total_byte_size))
            row += rg.num_rows
    ftuple, br = tuple(files), tuple(batch_rows)

    def make_reader(a: int, b: int) -> _ParquetReader:
        return _ParquetReader(ftuple, tuple(units[a:b]), tuple(cols), nulls, br)

    def describe(a: int, b: int) -> str:
        first, last = units[a], units[b - 1]
        return (f"{files[first[0]].name} row group {first[1]} .. {files[last[0]].name} "
                f"row group {last[1]}")

    src = files[0].name if len(files) == 1 else f"{files[0].name} .. ({len(files)} files)"
    return _Plan(cols, np.asarray(sizes, np.int64), make_reader, describe, src, False, row)


def _plan_table(table: Any, columns: Any, nulls: str, batch_bytes: int) -> _Plan:
    import pyarrow as pa

    if isinstance(table, pa.RecordBatch):
        table = pa.Table.from_batches([table])
    cols = plan_columns(table.schema, _features_from_metadata(table.schema), columns)
    table = table.select([c.name for c in cols])
    n = table.num_rows
    row_bytes = table.nbytes / max(1, n)
    per_unit = _rows_for(row_bytes, _TABLE_UNIT_BYTES)
    starts = list(range(0, n, per_unit))
    rows = _rows_for(row_bytes, batch_bytes)

    def make_reader(a: int, b: int) -> _TableReader:
        lo = starts[a] if a < len(starts) else n
        hi = starts[b] if b < len(starts) else n
        return _TableReader(table.slice(lo, hi - lo), lo, tuple(cols), nulls, rows,
                            "pyarrow.Table")

    sizes = np.asarray([min(per_unit, n - s) * row_bytes for s in starts], np.int64) + 1
    return _Plan(cols, sizes, make_reader, lambda a, b: f"rows from {starts[a]}",
                 "pyarrow.Table", True, n)


def _plan_dataset(ds: Any, columns: Any, nulls: str, batch_bytes: int) -> _Plan:
    features = _jsonable(ds.features.to_dict())
    schema = ds.features.arrow_schema
    cols = plan_columns(schema, features, columns)
    n = len(ds)
    try:
        total = int(ds.data.nbytes)
    except Exception:  # an unusual table: the estimate only sizes batches and tasks
        total = n
    row_bytes = total / max(1, n)
    per_unit = _rows_for(row_bytes, _TABLE_UNIT_BYTES)
    starts = list(range(0, n, per_unit))
    rows = _rows_for(row_bytes, batch_bytes)
    in_memory = not ds.cache_files
    where = f"dataset {getattr(ds, 'split', None) or ''}".rstrip()
    sub = ds.select_columns([c.name for c in cols])

    def make_reader(a: int, b: int) -> _DatasetReader:
        lo = starts[a] if a < len(starts) else n
        hi = starts[b] if b < len(starts) else n
        if in_memory:  # a task carries only its rows
            return _DatasetReader(sub.select(range(lo, hi)), 0, hi - lo, tuple(cols), nulls,
                                  rows, where)
        return _DatasetReader(sub, lo, hi, tuple(cols), nulls, rows, where)

    sizes = np.asarray([min(per_unit, n - s) * row_bytes for s in starts], np.int64) + 1
    src = "datasets.Dataset" + (f" {ds.cache_files[0]['filename']}" if ds.cache_files else "")
    return _Plan(cols, sizes, make_reader, lambda a, b: f"rows from {starts[a]}", src,
                 in_memory, n)


def _saved_dataset(source: Any) -> Any:
    """A folder written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``, loaded
    (memory-mapped), or ``None`` for anything else."""
    if not isinstance(source, str | os.PathLike) or not os.path.isdir(source):
        return None
    if not any(os.path.isfile(os.path.join(source, n))
               for n in ("state.json", "dataset_dict.json")):
        return None
    try:
        import datasets
    except ImportError:
        raise ConfigError(f"{os.fspath(source)} was written by datasets' save_to_disk; "
                          "reading it needs the datasets package: pip install "
                          "'headrace[arrow]'") from None
    return datasets.load_from_disk(os.fspath(source))


def _plan(source: Any, split: str | None, columns: Any, nulls: str, batch_bytes: int,
          options: dict[str, Any]) -> _Plan:
    saved = _saved_dataset(source)
    if saved is not None:
        source = saved
    if _is_hf(source, "DatasetDict"):
        splits = list(source)
        if split is None or split not in source:
            raise ConfigError(f"a DatasetDict holds the splits {splits}; pass split=<one of "
                              f"them> (got split={split!r}), or pass dataset[{splits[0]!r}]")
        source = source[split]
    elif split is not None and not _is_hf(source, "Dataset"):
        raise ConfigError("split= only applies to a datasets.DatasetDict")
    if _is_hf(source, "IterableDataset") or _is_hf(source, "IterableDatasetDict"):
        raise ConfigError("a streaming (Iterable) dataset has no files to read in order; load "
                          "it with streaming=False, or pass its Parquet files (e.g. the "
                          "hf:// or s3:// paths it was made from)")
    if _is_hf(source, "Dataset"):
        return _plan_dataset(source, columns, nulls, batch_bytes)
    try:
        import pyarrow as pa
    except ImportError:
        raise ConfigError("pack_arrow needs pyarrow: pip install 'headrace[arrow]'") from None
    if isinstance(source, pa.Table | pa.RecordBatch):
        return _plan_table(source, columns, nulls, batch_bytes)
    if isinstance(source, str | os.PathLike) or (
            isinstance(source, Sequence) and source and all(
                isinstance(s, str | os.PathLike) for s in source)):
        return _plan_parquet(source, columns, nulls, batch_bytes, options)
    raise ConfigError(f"pack_arrow cannot read a {type(source).__name__}; pass a "
                      "datasets.Dataset (or a DatasetDict with split=), a pyarrow.Table, or "
                      "Parquet files (a path, folder, glob or list; local or s3://)")


def _roles(cols: Sequence[Column], label: str | None) -> dict[str, Any]:
    """attrs that let ``image()`` / ``audio()`` find the media and label fields."""
    attrs: dict[str, Any] = {}
    for c in cols:
        role = MEDIA_FEATURES.get(c.feature or "")
        if role is not None and f"{role}_field" not in attrs:
            attrs[f"{role}_field"] = c.field
    labelled = [c for c in cols if c.feature == "ClassLabel"]
    if label is not None:
        match = [c for c in cols if c.name == label]
        if not match or match[0].kind != "fixed" or match[0].shape != () or \
                np.dtype(match[0].dtype).kind not in "iu":
            raise ConfigError(f"label={label!r} must name a selected integer column (the "
                              f"columns are {[c.name for c in cols]})")
        labelled = match
    if labelled:
        attrs["label_field"] = labelled[0].field
        if labelled[0].classes is not None:
            attrs["classes"] = list(labelled[0].classes)
    return attrs


def pack_arrow(source: Any, out: str | os.PathLike[str], *,
               columns: Sequence[str] | Mapping[str, str] | None = None,
               codec: str | Mapping[str, str] = "raw", nulls: str = "error",
               split: str | None = None, label: str | None = None, chunk_mb: float = 256,
               batch_mb: float = 64, workers: int | None = None,
               executor: cf.Executor | None = None, progress: bool | None = None,
               overwrite: bool = False, **options: Any) -> dict[str, Any]:
    """Packs a Hugging Face dataset, an Arrow table or Parquet files into a new store at ``out``.

    Example::

        ds = datasets.load_dataset("parquet", data_files="train-*.parquet")["train"]
        headrace.pack_arrow(ds, "train.hr")                    # one field per column
        headrace.pack_arrow("s3://bucket/data/*.parquet", "train.hr", codec="zstd")
        loader = headrace.image("train.hr", batch=64)          # an Image + ClassLabel dataset

    One field per column: numbers -> fixed scalars, fixed-size lists -> fixed shapes, lists of
    numbers -> ragged, strings and binary -> ragged bytes, HF ``Image``/``Audio``/``Video`` ->
    their encoded bytes (``image()``/``audio()``/``video()`` decode them), ``ClassLabel`` -> int64
    labels with its names as ``classes``. ``docs/packing.md`` has the full table.

    Args:
        source: a ``datasets.Dataset``, a ``DatasetDict`` (with ``split``), a folder written by
            their ``save_to_disk``, a ``pyarrow.Table`` or ``RecordBatch``, or Parquet: a file,
            folder, glob (``data/*.parquet``) or list of them, local or ``s3://``.
        out: the new store's directory (absent, or empty; see ``overwrite``).
        columns: the columns to pack (default: all), or ``{column: field}`` to rename.
        codec: one codec (``raw``, ``zstd``, ``lz4``, ``deflate``) for every field, or
            ``{field: codec}`` (others ``raw``).
        nulls: ``"error"`` (default: raise naming the column and row), ``"skip"`` (drop rows
            that hold a null anywhere, counted in ``skipped_rows``) or ``"fill"`` (zeros, empty
            records, ``False``).
        split: the split of a ``DatasetDict``.
        label: the integer column that ``image()``/``audio()`` read as labels (default: the
            first ``ClassLabel`` column).
        chunk_mb: chunk file size bound in MiB.
        batch_mb: bytes of input converted and appended per step (memory bound, with one
            Parquet row group).
        workers, executor: parallel packing over row groups / row ranges, as in ``pack_arrays``
            (in-memory tables and datasets stay in this process unless asked).
        progress: a progress bar on stderr (``None``: only on a terminal).
        overwrite: replace a store at ``out`` (only a store; the old one goes once the new one
            is complete).
        **options: S3 settings for ``s3://`` sources (``endpoint``, ``region``, ...).

    Returns:
        ``{"path", "samples", "fields", "columns", "classes", "skipped_rows", "chunks",
        "bytes_written", "seconds", "source"}``.

    Raises:
        ConfigError: a bad source, option, column selection or field name.
        SchemaError: a column type with no field layout (loaderx's rejects: nested lists of
            lists, structs, maps, decimals), or a null with ``nulls="error"``.
        StoreExistsError: ``out`` is not empty (and not a store to overwrite).
        PackWorkerError: a parallel task failed (nothing is left at ``out``).
    """
    from headrace._remote.objstore import S3Options

    t0 = time.perf_counter()
    if nulls not in NULL_POLICIES:
        raise ConfigError(f"nulls={nulls!r} must be one of {list(NULL_POLICIES)}")
    if not isinstance(batch_mb, int | float) or not batch_mb > 0:
        raise ConfigError(f"batch_mb={batch_mb!r} must be a positive number of MiB")
    s3 = S3Options.from_kwargs(options)
    if options:
        raise ConfigError(f"unknown options {sorted(options)} for pack_arrow()")
    plan = _plan(source, split, columns, nulls, int(batch_mb * (1 << 20)), {"s3": s3})
    cols = plan.cols
    fields: dict[str, Any] = {}
    codecs = codecs_for(codec, [c.field for c in cols])
    for c in cols:
        fields.update(c.specs(codecs[c.field]))
    attrs: dict[str, Any] = {"kind": "arrow", "source": plan.source,
                             "columns": {c.name: c.describe() for c in cols}}
    attrs.update(_roles(cols, label))
    res = pack_units(out, fields=fields, attrs=attrs, unit_bytes=plan.unit_bytes,
                     make_reader=plan.make_reader, describe=plan.describe, chunk_mb=chunk_mb,
                     workers=workers, executor=executor, progress=progress,
                     desc=f"pack {os.path.basename(os.fspath(out))}", overwrite=overwrite,
                     who="pack_arrow", ship_data=plan.ship_data)
    return {"path": res["path"], "samples": res["samples"], "fields": fields,
            "columns": attrs["columns"], "classes": attrs.get("classes"),
            "skipped_rows": plan.rows - res["samples"],
            "chunks": res["chunks"], "bytes_written": dir_bytes(res["path"]),
            "seconds": time.perf_counter() - t0, "source": plan.source}
