"""The ``headrace`` command line: ``info``, ``verify``, ``compact``, ``pack-arrays``, ...

Subcommands live in the ``COMMANDS`` list. To add one, append a ``Command`` whose ``configure`` and
``run`` are functions or ``"module:function"`` strings; strings are imported only when that
subcommand is the one invoked, so ``headrace info`` never pays for importing image or S3 code::

    Command("pack-dir", "pack an image folder into a store",
            configure="headrace._image_pack:cli_configure", run="headrace._image_pack:cli_run")

``configure(parser)`` adds arguments to the subcommand's ``argparse`` parser; ``run(args)`` returns
the exit status. A ``HeadraceError`` or ``OSError`` escaping ``run`` is printed as one line (no
traceback) and exits with the status below.

Exit statuses: 0 success; 1 the data is bad (``verify`` found corrupt records, or any command met
a damaged store: ``CorruptionError``); 2 usage error, or the path is not a store / not readable
(missing, not a directory, no permission, another writer holds the lock); 130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from headrace._base.errors import ConfigError, CorruptionError, HeadraceError

__all__ = ["COMMANDS", "Command", "main"]

EXIT_OK, EXIT_BAD_DATA, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

Configure = Callable[[argparse.ArgumentParser], None]
Run = Callable[[argparse.Namespace], int]


@dataclass(frozen=True)
class Command:
    """One subcommand: its name, a one-line help, and how to parse and run it."""

    name: str
    help: str
    configure: Configure | str
    run: Run | str

    def __post_init__(self) -> None:
        if not self.name or " " in self.name:
            raise ConfigError(f"command name {self.name!r} must be one word")


def _resolve(ref: Any) -> Any:
    if not isinstance(ref, str):
        return ref
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


def format_bytes(n: float) -> str:
    """``1234567`` -> ``"1.2 MB"`` (SI units, as ``du --si`` and tqdm print them)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def _table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
                     for r in rows)


# --- info ---------------------------------------------------------------------------------------


def store_summary(path: str) -> dict[str, Any]:
    """Sizes and utilization of a committed store, computed from meta.json and the index files."""
    from headrace._store.snapshot import load_snapshot

    st = load_snapshot(path)  # the files as a reader maps them: regular files only, sizes bound
    meta = st.meta
    n = meta.length
    fields = []
    live_total = 0
    chunk_total = 0
    for entry in meta.fields:
        spec = entry.spec
        mapped = st.fields[spec.name]
        if len(mapped.index) < n:
            raise CorruptionError(f"{path}: field {spec.name!r} has lost (part of) its index or "
                                  f"aux file; run `headrace verify {path}`", field=spec.name)
        index, aux = mapped.index, mapped.aux
        stored = int(index["length"].sum(dtype=np.int64))
        decoded = int(aux["nbytes"].sum(dtype=np.int64))
        chunks = [c for c in meta.chunks if c.field == spec.name]
        chunk_bytes = sum(c.size for c in chunks)
        live_total += stored
        chunk_total += chunk_bytes
        fields.append({
            "name": spec.name, "dtype": str(spec.dtype),
            "shape": "ragged" if spec.shape is None else str(tuple(spec.shape)),
            "codec": spec.codec, "stored_bytes": stored, "decoded_bytes": decoded,
            "chunks": len(chunks), "chunk_bytes": chunk_bytes,
        })
    on_disk = sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())
    return {
        "path": path, "records": n, "generation": meta.generation, "commit": meta.commit,
        "chunk_bytes_max": meta.chunk_bytes, "chunks": len(meta.chunks), "bytes_on_disk": on_disk,
        "live_bytes": live_total, "chunk_bytes": chunk_total,
        "utilization": live_total / chunk_total if chunk_total else 1.0,
        "fields": fields, "attrs": meta.attrs,
    }


def _info_configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="the store directory")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")


def _info_run(args: argparse.Namespace) -> int:
    s = store_summary(args.path)
    if args.json:
        print(json.dumps(s, indent=1))
        return EXIT_OK
    print(f"store        {s['path']}")
    print(f"records      {s['records']}")
    print(f"generation   {s['generation']} (commit {s['commit']})")
    print(f"chunks       {s['chunks']} (each at most {s['chunk_bytes_max'] / 2**20:g} MiB)")
    print(f"on disk      {format_bytes(s['bytes_on_disk'])}")
    hint = "; `headrace compact` reclaims the rest" if s["utilization"] < 1 else ""
    print(f"utilization  {s['utilization']:.1%} (live {format_bytes(s['live_bytes'])} of "
          f"{format_bytes(s['chunk_bytes'])} in chunks{hint})")
    if s["attrs"]:
        print(f"attrs        {json.dumps(s['attrs'])}")
    rows = [["field", "dtype", "shape", "codec", "chunks", "stored", "decoded", "ratio"]]
    for f in s["fields"]:
        ratio = f["decoded_bytes"] / f["stored_bytes"] if f["stored_bytes"] else 1.0
        rows.append([f["name"], f["dtype"], f["shape"], f["codec"], str(f["chunks"]),
                     format_bytes(f["stored_bytes"]), format_bytes(f["decoded_bytes"]),
                     f"{ratio:.2f}"])
    print()
    print(_table(rows))
    return EXIT_OK


# --- verify -------------------------------------------------------------------------------------


def _progress_flags(p: argparse.ArgumentParser) -> None:
    bar = p.add_mutually_exclusive_group()
    bar.add_argument("--progress", dest="progress", action="store_true", default=None,
                     help="always show the progress bar (default: only on a terminal)")
    bar.add_argument("--no-progress", dest="progress", action="store_false")


def _verify_configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="the store directory")
    p.add_argument("--max-ids", type=int, default=20, metavar="K",
                   help="list at most K bad record ids per field (default 20)")
    _progress_flags(p)


def _verify_run(args: argparse.Namespace) -> int:
    from headrace._store.verify import verify

    report = verify(args.path, progress=args.progress)
    if report.ok:
        print(f"ok: {args.path}: {report.length} records, commit {report.commit}, every record "
              "matches its checksum")
        return EXIT_OK
    total = sum(len(v) for v in report.bad.values())
    print(f"CORRUPT: {args.path}: {total} bad record(s)")
    for problem in report.problems:
        print(f"  {problem}")
    for name, ids in report.bad.items():
        shown = ", ".join(map(str, ids[: args.max_ids]))
        more = f", ... ({len(ids) - args.max_ids} more)" if len(ids) > args.max_ids else ""
        print(f"  field {name}: {len(ids)} bad: {shown}{more}")
    return EXIT_BAD_DATA


# --- compact ------------------------------------------------------------------------------------


def _compact_configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="the store directory")
    _progress_flags(p)


def _compact_run(args: argparse.Namespace) -> int:
    from headrace._store.reader import open as open_store

    with open_store(args.path, mode="a") as writer:
        before, after = writer.compact(progress=args.progress)
    if before == after == 1.0:
        print(f"{args.path}: utilization 100.0%, nothing to reclaim; the store is unchanged")
    else:
        print(f"compacted {args.path}: utilization {before:.1%} -> {after:.1%}")
    return EXIT_OK


# --- pack-arrays --------------------------------------------------------------------------------


def _pack_configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("out", help="the new store directory (must not exist, or be empty)")
    p.add_argument("--field", action="append", required=True, metavar="NAME=FILE.npy",
                   help="a field and the .npy file holding it (repeat for more fields)")
    p.add_argument("--codec", action="append", default=[], metavar="CODEC|NAME=CODEC",
                   help="raw (default), zstd, lz4, deflate or zstd_dict; for all fields, or one field "
                        "with NAME=CODEC (repeatable)")
    p.add_argument("--chunk-mb", type=int, default=256, help="chunk file size bound in MiB")
    p.add_argument("--workers", type=int, default=None,
                   help="parallel packing processes (default: all cores for large inputs)")
    _progress_flags(p)


def _split_pair(text: str, what: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name or not value:
        raise ConfigError(f"{what} {text!r} must look like NAME=VALUE")
    return name, value


def _pack_run(args: argparse.Namespace) -> int:
    from headrace._pack.arrays import pack_arrays

    fields: dict[str, Any] = {}
    for text in args.field:
        name, path = _split_pair(text, "--field")
        if name in fields:
            raise ConfigError(f"--field {name!r} given twice; give each field once")
        fields[name] = path
    default = "raw"
    per_field: dict[str, str] = {}
    for text in args.codec:
        if "=" in text:
            name, value = _split_pair(text, "--codec")
            per_field[name] = value
        else:
            default = text
    codec = {name: per_field.get(name, default) for name in fields}
    unknown = sorted(set(per_field) - set(fields))
    if unknown:
        raise ConfigError(f"--codec names unknown fields {unknown}; the fields are {list(fields)}")
    info = pack_arrays(args.out, codec=codec, chunk_mb=args.chunk_mb, progress=args.progress,
                       workers=args.workers, **fields)
    mb_s = info["bytes_written"] / max(info["seconds"], 1e-9) / 1e6
    print(f"packed {info['samples']} records, fields {', '.join(info['fields'])} into "
          f"{info['path']}: {format_bytes(info['bytes_written'])} in {info['seconds']:.1f} s "
          f"({mb_s:.0f} MB/s)")
    return EXIT_OK


COMMANDS: list[Command] = [
    Command("info", "show records, fields, codecs, sizes and utilization of a store",
            _info_configure, _info_run),
    Command("verify", "check every record's checksum (exit 1 and list bad ids if any)",
            _verify_configure, _verify_run),
    Command("compact", "rewrite live records into fresh chunks, reclaiming dead bytes",
            _compact_configure, _compact_run),
    Command("pack-arrays", "pack .npy files (one per field) into a new store",
            _pack_configure, _pack_run),
    Command("pack-dir", "pack an image folder into a new store (labels from folders)",
            "headrace._cli.pack_dir:cli_configure", "headrace._cli.pack_dir:cli_run"),
    Command("pack-arrow", "pack Parquet files or a saved HF dataset into a new store",
            "headrace._cli.pack_arrow:arrow_configure", "headrace._cli.pack_arrow:arrow_run"),
    Command("pack-webdataset", "pack WebDataset tar shards into a new store",
            "headrace._cli.pack_arrow:webdataset_configure",
            "headrace._cli.pack_arrow:webdataset_run"),
    Command("convert-zrecord", "convert loaderx 2.8.19 zrecord containers into a new store",
            "headrace._cli.convert_zrecord:cli_configure", "headrace._cli.convert_zrecord:cli_run"),
    Command("bench", "run a loader on a dataset for a few seconds; report what limits it",
            "headrace._cli.bench:cli_configure", "headrace._cli.bench:cli_run"),
]


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The top-level parser with one subparser per entry of ``COMMANDS``.

    A lazily referenced (``"module:function"``) ``configure`` is imported only for the subcommand
    named in ``argv`` (or for every subcommand when ``argv`` is ``None``).
    """
    from headrace import __version__

    wanted = None if argv is None else next((a for a in argv if not a.startswith("-")), "")

    parser = argparse.ArgumentParser(
        prog="headrace", description="headrace: a bounded-memory, deterministic data runtime.")
    parser.add_argument("--version", action="version", version=f"headrace {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for cmd in COMMANDS:
        p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.help)
        if wanted is None or wanted == cmd.name or not isinstance(cmd.configure, str):
            _resolve(cmd.configure)(p)
        p.set_defaults(_run=cmd.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the CLI; returns the exit status (the console script passes it to ``sys.exit``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(argv).parse_args(argv)
    try:
        return int(_resolve(args._run)(args))
    except CorruptionError as e:
        print(f"headrace {args.command}: error: {e}", file=sys.stderr)
        return EXIT_BAD_DATA
    except HeadraceError as e:
        print(f"headrace {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # `headrace info x | head`: the reader left; exit quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BAD_DATA
    except OSError as e:  # unreadable paths, a full disk: one line, not a traceback
        print(f"headrace {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"headrace {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
