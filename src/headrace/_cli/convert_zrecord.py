"""``headrace convert-zrecord SRC... OUT``: loaderx 2.8.19 containers into a store."""

from __future__ import annotations

import argparse

__all__ = ["cli_configure", "cli_run"]


def cli_configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("src", nargs="+", metavar="[NAME=]CONTAINER",
                   help="a zrecord container directory (meta.zr); several as NAME=DIR, one "
                        "field each, all with the same number of records")
    p.add_argument("out", help="the new store directory (must not exist, or be empty)")
    p.add_argument("--codec", default=None,
                   help="store codec of every field (default: each container's own)")
    p.add_argument("--chunk-mb", type=float, default=256, help="chunk file size bound in MiB")
    bar = p.add_mutually_exclusive_group()
    bar.add_argument("--progress", dest="progress", action="store_true", default=None,
                     help="always show the progress bar (default: only on a terminal)")
    bar.add_argument("--no-progress", dest="progress", action="store_false")


def cli_run(args: argparse.Namespace) -> int:
    from headrace._base.errors import ConfigError
    from headrace._pack.zrecord import convert_zrecord

    named = [s for s in args.src if "=" in s]
    if named and len(named) != len(args.src):
        raise ConfigError("give every container as NAME=DIR, or a single DIR")
    src: object
    if named:
        pairs = [s.split("=", 1) for s in args.src]
        src = dict(pairs)
        if len(src) != len(pairs) or not all(k and v for k, v in pairs):
            raise ConfigError(f"containers {args.src} must be NAME=DIR with distinct NAMEs")
    elif len(args.src) == 1:
        src = args.src[0]
    else:
        raise ConfigError("several containers need names: NAME=DIR NAME=DIR ... OUT")
    info = convert_zrecord(src, args.out, codec=args.codec, chunk_mb=args.chunk_mb,  # type: ignore[arg-type]
                           progress=args.progress)
    fields = ", ".join(f"{k} ({v['codec']})" for k, v in info["fields"].items())
    print(f"converted {info['samples']} records into {info['path']}: fields {fields}; "
          f"{info['bytes_written']} bytes in {info['seconds']:.2f} s")
    return 0
