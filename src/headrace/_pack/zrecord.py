"""``convert_zrecord``: loaderx 2.8.19 zrecord containers into one headrace store.

Reading a container needs no conversion (``headrace.load("train.zr/")``); converting buys the
store's features: per-record checksums, appends and edits, several fields in one directory,
S3 reads. Records are copied in bounded slices (``slice_bytes`` decoded per append), in index
order, so record i of the store is record i of every container.

Fields: a dense container becomes a fixed-shape field (its dtype and ``item_shape``); a ragged one
a ragged field of flat values, plus ``<name>_shape`` (uint32, ``(ndim,)`` per record) when its
records have more than one dimension. The codec is the container's (``raw``, ``zstd``,
``zstd_dict``: a ``zstd_dict`` field trains its own dictionary on the first slice), unless
``codec=`` says otherwise.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from headrace._base.errors import ConfigError, StoreExistsError
from headrace._base.fsutil import undo_dir
from headrace._base.progress import progress as _progress_bar
from headrace._sources.zrecord import DEFAULT_NAME, ZrecordSource
from headrace._store.codecs import MIN_SAMPLES, check_codec

__all__ = ["convert_zrecord"]

DEFAULT_SLICE_BYTES = 64 << 20


def _specs(src: ZrecordSource, codec: str | Mapping[str, str] | None
           ) -> tuple[dict[str, Any], dict[str, str]]:
    names = list(src.containers)
    if isinstance(codec, Mapping):
        unknown = sorted(set(codec) - set(names))
        if unknown:
            raise ConfigError(f"codec= names unknown streams {unknown}; the streams are {names}")
    specs: dict[str, Any] = {}
    codecs: dict[str, str] = {}
    for name, c in src.containers.items():
        chosen = codec.get(name) if isinstance(codec, Mapping) else codec
        if chosen is None:
            chosen = c.codec
            if chosen == "zstd_dict" and len(c) < MIN_SAMPLES:
                chosen = "zstd"  # too few records to train a dictionary on
        codecs[name] = check_codec(chosen, field=name)
        if np.dtype(c.dtype.str) != c.dtype:
            raise ConfigError(
                f"stream {name!r}: dtype {c.dtype} has no headrace store dtype (a store keeps "
                "NumPy's own dtypes); read the container in place with headrace.load() instead")
        shape = None if c.item_shape is None else list(c.item_shape)
        specs[name] = {"dtype": c.dtype.str, "shape": shape, "codec": codecs[name]}
        if c.kind == "ragged" and c.ndim > 1:
            specs[f"{name}_shape"] = {"dtype": "<u4", "shape": [c.ndim], "codec": "raw"}
    return specs, codecs


def _describe(src: ZrecordSource) -> dict[str, Any]:
    return {name: {"kind": c.kind, "dtype": str(c.dtype),
                   **({"item_shape": list(c.item_shape)} if c.item_shape is not None
                      else {"ndim": c.ndim}),
                   "codec": c.codec, "data_shards": c.data_shards}
            for name, c in src.containers.items()}


def convert_zrecord(src: str | os.PathLike[str] | Mapping[str, str | os.PathLike[str]],
                    out: str | os.PathLike[str], *, name: str = DEFAULT_NAME,
                    codec: str | Mapping[str, str] | None = None, chunk_mb: float = 256,
                    slice_bytes: int = DEFAULT_SLICE_BYTES,
                    progress: bool | None = None) -> dict[str, Any]:
    """Converts loaderx 2.8.19 zrecord containers into a new headrace store.

    Example::

        headrace.loaderx.convert_zrecord({"image": "img.zr", "label": "lbl.zr"}, "train")

    Args:
        src: a container directory (its field is named ``name``), or ``{field: container}`` of
            containers holding the same number of records.
        out: the new store directory (must not exist, or be empty).
        name: the field name of a single container.
        codec: the store codec for every field, or ``{field: codec}``; default: each
            container's own (``zstd_dict`` falls back to ``zstd`` below 10 records).
        chunk_mb: the store's chunk size bound in MiB.
        slice_bytes: decoded bytes copied per append (bounds this call's memory).
        progress: show a progress bar (default: only on a terminal).

    Returns:
        ``{"path", "samples", "fields", "source", "bytes_written", "seconds"}``: ``fields`` the
        store's field specs, ``source`` what each container was.

    Raises:
        NotAStoreError: a path is not a container. ConfigError: containers of different lengths,
        unknown codec names, a dtype the store cannot keep. StoreExistsError: ``out`` is not empty.
    """
    from headrace._store.writer import create

    if slice_bytes <= 0:
        raise ConfigError(f"slice_bytes must be positive, got {slice_bytes}")
    t0 = time.perf_counter()
    source = ZrecordSource(dict(src) if isinstance(src, Mapping) else {name: src})
    out_path = Path(out)
    try:
        specs, _codecs = _specs(source, codec)
        n = len(source)
        if out_path.exists() and (not out_path.is_dir() or any(out_path.iterdir())):
            raise StoreExistsError(f"cannot create a store at {out_path}: it exists and is not "
                                   "an empty directory; pick a new path")
        created = not out_path.exists()
        per_record = max(1, source.nbytes(np.arange(min(n, 1024), dtype=np.int64))
                         // max(1, min(n, 1024)))
        step = max(MIN_SAMPLES, slice_bytes // per_record)
        described = _describe(source)
        try:
            with create(out_path, fields=specs, chunk_mb=chunk_mb,
                        attrs={"converted_from": "loaderx-zrecord", "zrecord": described}
                        ) as writer, _progress_bar(n, desc=f"convert {out_path.name}",
                                                   unit="rec", enabled=progress) as bar:
                for start in range(0, n, step):
                    ids = np.arange(start, min(n, start + step), dtype=np.int64)
                    writer.append(source.gather(ids))
                    bar.update(len(ids))
        except BaseException:
            undo_dir(out_path, made=created)  # leave nothing half-written to block a retry
            raise
    finally:
        source.close()
    return {"path": str(out_path), "samples": n, "fields": specs, "source": described,
            "bytes_written": sum(p.stat().st_size for p in out_path.rglob("*") if p.is_file()),
            "seconds": time.perf_counter() - t0}
