"""``headrace pack-arrow SOURCE OUT`` and ``headrace pack-webdataset SHARDS... OUT``: Parquet files,
a saved HF dataset or tar shards into a store (``headrace.pack_arrow`` / ``pack_webdataset``)."""

from __future__ import annotations

import argparse
from typing import Any

from headrace._base.errors import ConfigError

__all__ = ["arrow_configure", "arrow_run", "webdataset_configure", "webdataset_run"]


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--codec", action="append", default=[], metavar="CODEC|FIELD=CODEC",
                   help="raw (default), zstd, lz4 or deflate; for all fields, or one field "
                        "with FIELD=CODEC (repeatable)")
    p.add_argument("--chunk-mb", type=float, default=256, help="chunk file bound in MiB")
    p.add_argument("--batch-mb", type=float, default=64,
                   help="bytes converted and appended per step (the memory bound)")
    p.add_argument("--workers", type=int, default=None,
                   help="parallel packing processes (default: all cores for large inputs)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing headrace store at OUT")
    p.add_argument("--endpoint", default=None, help="S3 endpoint URL for s3:// inputs")
    bar = p.add_mutually_exclusive_group()
    bar.add_argument("--progress", dest="progress", action="store_true", default=None,
                     help="always show the progress bar (default: only on a terminal)")
    bar.add_argument("--no-progress", dest="progress", action="store_false")


def _codec(texts: list[str]) -> Any:
    """One codec for every field, or ``FIELD=CODEC`` pairs (the other fields stay raw)."""
    bare = [t for t in texts if "=" not in t]
    pairs = [t for t in texts if "=" in t]
    if (bare and pairs) or len(bare) > 1:
        raise ConfigError(f"--codec {texts}: give one codec for every field, or FIELD=CODEC "
                          "pairs (the other fields stay raw), not both")
    if bare:
        return bare[0]
    out = {}
    for text in pairs:
        name, _, value = text.partition("=")
        if not name or not value:
            raise ConfigError(f"--codec {text!r} must look like FIELD=CODEC")
        out[name] = value
    return out or "raw"


def _pairs(texts: list[str], what: str) -> Any:
    if not texts:
        return None
    if all("=" not in t for t in texts):
        return texts
    out = {}
    for t in texts:
        name, sep, field = t.partition("=")
        if not name or (sep and not field):
            raise ConfigError(f"{what} {t!r} must be NAME or NAME=FIELD")
        out[name] = field or name
    return out


def _print(info: dict[str, Any], what: str) -> None:
    mb_s = info["bytes_written"] / max(info["seconds"], 1e-9) / 1e6
    print(f"packed {info['samples']} {what} into {info['path']}: fields "
          f"{', '.join(info['fields'])}; {info['bytes_written'] / 1e6:.1f} MB in "
          f"{info['seconds']:.1f} s ({mb_s:.0f} MB/s)")


def arrow_configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", nargs="+",
                   help="Parquet file(s), folder, glob or s3:// URL, or a folder written by "
                        "datasets' save_to_disk; the last argument is OUT")
    p.add_argument("--column", action="append", default=[], metavar="NAME[=FIELD]",
                   help="pack only these columns (repeatable), optionally renamed")
    p.add_argument("--nulls", choices=("error", "skip", "fill"), default="error",
                   help="a null: fail naming row and column (default), skip the row, fill zeros")
    p.add_argument("--split", default=None, help="the split of a saved DatasetDict")
    p.add_argument("--label", default=None, help="the integer column image()/audio() read as "
                                                 "labels (default: the first ClassLabel)")
    _common(p)


def _out_and_inputs(items: list[str]) -> tuple[list[str], str]:
    if len(items) < 2:
        raise ConfigError("give the input(s) and then OUT, e.g. `headrace pack-arrow "
                          "data/*.parquet train.hr`")
    return items[:-1], items[-1]


def arrow_run(args: argparse.Namespace) -> int:
    from headrace._pack.arrow import pack_arrow

    inputs, out = _out_and_inputs(args.source)
    source: Any = inputs[0] if len(inputs) == 1 else inputs
    columns = _pairs(args.column, "--column")
    s3 = {"endpoint": args.endpoint} if args.endpoint else {}
    info = pack_arrow(source, out, columns=columns, codec=_codec(args.codec), nulls=args.nulls,
                      split=args.split, label=args.label, chunk_mb=args.chunk_mb,
                      batch_mb=args.batch_mb, workers=args.workers, progress=args.progress,
                      overwrite=args.overwrite, **s3)
    _print(info, "rows")
    if info["skipped_rows"]:
        print(f"skipped {info['skipped_rows']} rows holding nulls")
    if info["classes"]:
        print(f"classes {info['classes']}")
    return 0


def webdataset_configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("shards", nargs="+",
                   help="tar shard(s), folder, glob or brace pattern "
                        "('shard-{000000..000099}.tar'; quote it), local or s3://; the last "
                        "argument is OUT")
    p.add_argument("--field", action="append", default=[], metavar="EXT[=FIELD]",
                   help="keep only these extensions (repeatable), optionally renamed "
                        "(default: the first sample's extensions)")
    p.add_argument("--missing", choices=("error", "skip", "fill"), default="error",
                   help="a sample lacking a file: fail (default), skip it, or store empty/-1")
    _common(p)


def webdataset_run(args: argparse.Namespace) -> int:
    from headrace._pack.webdataset import pack_webdataset

    inputs, out = _out_and_inputs(args.shards)
    fields = _pairs(args.field, "--field")
    s3 = {"endpoint": args.endpoint} if args.endpoint else {}
    info = pack_webdataset(inputs, out, fields=fields, codec=_codec(args.codec),
                           missing=args.missing,
                           chunk_mb=args.chunk_mb, batch_mb=args.batch_mb,
                           workers=args.workers, progress=args.progress,
                           overwrite=args.overwrite, **s3)
    _print(info, f"samples from {info['shards']} shards")
    return 0
