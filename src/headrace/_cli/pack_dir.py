"""``headrace pack-dir IN OUT``: pack an image folder into a store (``headrace.pack_dir``)."""

from __future__ import annotations

import argparse

__all__ = ["cli_configure", "cli_run"]


def cli_configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("in_dir", help="the image folder (ImageFolder layout for labels)")
    p.add_argument("out", help="the store directory to create")
    p.add_argument("--label-mode", default=None, choices=("auto", "imagefolder", "none"),
                   help="labels from first-level folders: auto (default), imagefolder, none")
    p.add_argument("--require-labels", action="store_true",
                   help="fail unless every image gets a label")
    p.add_argument("--shard-mb", type=float, default=512, help="chunk file bound in MiB")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing headrace store at OUT")
    p.add_argument("--workers", type=int, default=None, help="parallel packing processes")
    bar = p.add_mutually_exclusive_group()
    bar.add_argument("--progress", dest="progress", action="store_true", default=None,
                     help="always show the progress bar (default: only on a terminal)")
    bar.add_argument("--no-progress", dest="progress", action="store_false")


def cli_run(args: argparse.Namespace) -> int:
    from headrace._pack.dirs import pack_dir

    info = pack_dir(args.in_dir, out=args.out, shard_mb=args.shard_mb,
                    label_mode=args.label_mode, require_labels=args.require_labels,
                    progress=args.progress, overwrite=args.overwrite, workers=args.workers)
    classes = info.get("classes") or []
    skipped = info.get("skipped") or {}
    print(f"packed {info['samples']} images into {info.get('path', args.out)}: "
          f"{info.get('chunks', 0)} chunks, {len(classes)} classes"
          + (f", skipped {sum(skipped.values())} ({', '.join(f'{k} {v}' for k, v in skipped.items())})"
             if skipped and sum(skipped.values()) else ""))
    if info.get("labels_note"):
        print(info["labels_note"])
    print(f"dataset hash {info.get('dataset_hash')}")
    return 0
