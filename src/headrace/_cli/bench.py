"""``headrace bench PATH``: run a loader on a dataset for a few seconds and say what limits it.

It iterates an endless loader (``headrace.Loader`` for a store of arrays, ``headrace.image`` for
images: a store made by ``pack_dir``, an mx8 pack or an image folder), optionally sleeping
``--step-ms`` per batch to stand in for the model, records a stats timeline, prints a table
(samples/s, MB/s, high-water memory vs caps, where time went) and the knob to turn, and can draw
the timeline (``--plot out.png``) or save it (``--timeline out.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from typing import Any

from headrace._base.errors import ConfigError
from headrace._engine.timeline import Recorder, advice, summarize

__all__ = ["bench", "cli_configure", "cli_run", "parse_size"]

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1 << 10, "m": 1000**2, "mb": 1000**2,
          "mib": 1 << 20, "g": 1000**3, "gb": 1000**3, "gib": 1 << 30}
_MIB = float(1 << 20)


def parse_size(text: str) -> int:
    """``"256MiB"`` -> 268435456; also ``kB``/``MB``/``GB`` (powers of 1000), ``KiB``/``GiB``
    and plain byte counts."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(text))
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise ConfigError(f"size {text!r} must be a number of bytes with an optional unit, "
                          "e.g. 268435456, 256MiB, 512MB or 2GiB")
    return int(float(m.group(1)) * _UNITS[unit])


def _size_arg(text: str) -> int:
    try:
        return parse_size(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _hw(text: str) -> tuple[int, int]:
    parts = [p for p in re.split(r"[x,]", text) if p]
    try:
        vals = [int(p) for p in parts]
    except ValueError:
        vals = []
    if len(vals) == 1:
        vals *= 2
    if len(vals) != 2 or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"--resize {text!r} must be SIZE or H,W (e.g. 224 or 224,160)")
    return vals[0], vals[1]


def _is_image_data(path: str) -> bool:
    """A store with a ragged ``image`` bytes field, an mx8 pack or a folder (not a store)."""
    if "://" in path:  # a remote store or prefix: read records as they are
        return False
    meta = os.path.join(path, "meta.json")
    if os.path.isfile(meta):
        with open(meta, encoding="utf-8") as f:
            fields = {e.get("name"): e for e in json.load(f).get("fields", [])}
        image = fields.get("image")
        return image is not None and image.get("shape") is None
    return os.path.isdir(path)


def open_loader(path: str, *, batch: int | None, order: str, seed: int,
                threads: int | None, inflight: int | None, ram_gb: float | None,
                queue: int | None, raw: bool, resize: tuple[int, int] | None) -> tuple[Any, str]:
    """An endless loader on ``path`` and a one-line description of it."""
    knobs: dict[str, Any] = {"threads": threads, "inflight": inflight, "ram_gb": ram_gb, "queue": queue}
    if not raw and _is_image_data(path):
        from headrace._modal.image import image

        b = 64 if batch is None else batch
        ld = image(path, batch=b, order=order, seed=seed, epochs=None, resize=resize, **knobs)
        what = f"headrace.image(batch={b}, order={order!r}, resize={resize})"
        return ld, what
    if resize is not None:
        raise ConfigError("--resize applies to images only; drop it, or drop --raw")
    from headrace._engine.loader import Loader

    b = 256 if batch is None else batch
    return Loader(path, batch=b, order=order, seed=seed, epochs=None, **knobs), \
        f"headrace.Loader(batch={b}, order={order!r})"


def bench(loader: Any, *, seconds: float, step_ms: float = 0.0, period_s: float | None = None,
          progress: bool | None = None) -> dict[str, Any]:
    """Iterates ``loader`` for ``seconds`` (sleeping ``step_ms`` per batch); returns its timeline."""
    from headrace._base.progress import progress as progress_bar

    rec = Recorder(period_s=period_s or max(0.05, seconds / 200), capacity=512)
    sleep_s = step_ms / 1000.0
    start = time.monotonic()
    shown = 0.0
    with progress_bar(round(seconds, 1), desc="bench", unit="s", enabled=progress) as bar:
        it = iter(loader)
        while True:
            now = time.monotonic()
            if now - start >= seconds:
                break
            try:
                next(it)
            except StopIteration:
                break
            if sleep_s:
                time.sleep(sleep_s)
            if rec.maybe_record(loader.stats):
                s = loader.stats()
                elapsed = time.monotonic() - start
                step = min(round(elapsed, 1), round(seconds, 1)) - shown
                if step > 0:
                    bar.update(step)
                    shown += step
                bar.set_postfix_str(f"{s.get('delivered_samples_total', 0) / elapsed:,.0f} "
                                    f"samples/s, rss {s.get('counted_rss_bytes', 0) / _MIB:.0f} "
                                    "MiB", refresh=False)
    stats = loader.stats()
    return rec.export(stats, kind=type(loader).__name__)


def format_report(summary: dict[str, Any], tips: list[str], *, path: str, what: str,
                  step_ms: float = 0.0) -> str:
    """The table ``headrace bench`` prints."""

    def pct(a: float, cap: Any) -> str:
        return (f"{a / _MIB:,.1f} MiB of {cap / _MIB:,.0f} MiB cap ({a / cap:.0%})" if cap
                else f"{a / _MIB:,.1f} MiB")

    s = summary
    cap_q = s.get("queue_capacity")
    rows = [
        ("samples/s", f"{s['samples_per_second']:,.0f}"),
        ("MB/s", f"{s['bytes_per_second'] / 1e6:,.1f}"),
        ("batches", f"{s['batches']:,} ({s['samples']:,} samples in {s['elapsed_seconds']:.1f} s)"),
        ("in flight, high water", pct(s["inflight_high_water_bytes"], s["max_inflight_bytes"])),
        ("RSS, high water", pct(s["counted_rss_high_water_bytes"], s["max_process_rss_bytes"])),
        ("queue depth, mean", f"{s['queue_depth_mean']:.1f}" + (f" of {cap_q}" if cap_q else "")),
        ("consumer waited", f"{s['consumer_wait_fraction']:.0%} of the time"),
        ("workers busy", f"{s['worker_busy_fraction']:.0%} of {s['threads']} threads "
                         f"(gather {s['gather_busy_fraction']:.0%}, "
                         f"transform/decode {s['transform_busy_fraction']:.0%})"),
        ("budget wait", f"{s['budget_wait_fraction']:.0%} of the time"),
        ("RAM-cap wait", f"{s['ram_wait_fraction']:.0%} of the time"),
        ("verdict", s["verdict"]),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"bench {path}: {what}, {s['threads']} threads", ""]
    lines += [f"{k.ljust(width)}  {v}" for k, v in rows]
    lines += ["", "suggestions:"] + [f"  - {t}" for t in tips]
    if not step_ms:
        lines.append("  (the consumer did nothing, so this is the loader's ceiling; pass "
                     "--step-ms to stand in for your model's step)")
    return "\n".join(lines)


def cli_configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="a store, an mx8 pack or an image folder")
    p.add_argument("--seconds", type=float, default=10.0, help="how long to run (default 10)")
    p.add_argument("--batch", type=int, default=None,
                   help="records per batch (default 256; 64 for images)")
    p.add_argument("--threads", type=int, default=None, help="worker threads")
    p.add_argument("--inflight", type=_size_arg, default=None, metavar="BYTES",
                   help="cap on bytes in flight, e.g. 256MiB or 268435456")
    p.add_argument("--ram-gb", type=float, default=None, help="cap on the process RSS in GB")
    p.add_argument("--queue", type=int, default=None, help="ready batches buffered at most")
    p.add_argument("--order", default="shuffle", choices=("shuffle", "sequential", "iid"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--step-ms", type=float, default=0.0, metavar="MS",
                   help="sleep MS per batch to stand in for a model step (default 0)")
    p.add_argument("--resize", type=_hw, default=None, metavar="H,W",
                   help="images: decode and resize to H,W (or SIZE for a square)")
    p.add_argument("--raw", action="store_true",
                   help="read an image store as bytes (no decoding)")
    p.add_argument("--plot", default=None, metavar="OUT.png",
                   help="draw the timeline (needs matplotlib)")
    p.add_argument("--timeline", default=None, metavar="OUT.json",
                   help="save the timeline as JSON (headrace.plot draws it later)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    bar = p.add_mutually_exclusive_group()
    bar.add_argument("--progress", dest="progress", action="store_true", default=None,
                     help="always show the progress bar (default: only on a terminal)")
    bar.add_argument("--no-progress", dest="progress", action="store_false")


def cli_run(args: argparse.Namespace) -> int:
    if args.seconds <= 0:
        raise ConfigError(f"--seconds must be > 0, got {args.seconds}")
    if args.step_ms < 0:
        raise ConfigError(f"--step-ms must be >= 0, got {args.step_ms}")
    if args.batch is not None and args.batch < 1:  # 0 must not mean "the default"
        raise ConfigError(f"--batch must be a positive number of records, got {args.batch}; "
                          "leave it out for the default (256; 64 for images)")
    if "://" not in args.path and not os.path.exists(args.path):  # s3://... is the loader's
        raise FileNotFoundError(f"no such dataset {args.path!r}: expected a store, an mx8 pack "
                                "or an image folder")
    loader, what = open_loader(args.path, batch=args.batch, order=args.order, seed=args.seed,
                               threads=args.threads, inflight=args.inflight,
                               ram_gb=args.ram_gb, queue=args.queue, raw=args.raw,
                               resize=args.resize)
    try:
        timeline = bench(loader, seconds=args.seconds, step_ms=args.step_ms,
                         progress=args.progress)
    finally:
        loader.close()
    summary = summarize(timeline)
    tips = advice(summary)
    if args.timeline:
        with open(args.timeline, "w", encoding="utf-8") as f:
            json.dump(timeline, f)
    if args.json:
        print(json.dumps({**summary, "suggestions": tips, "loader": what}, indent=1))
    else:
        print(format_report(summary, tips, path=args.path, what=what, step_ms=args.step_ms))
    if args.timeline and not args.json:
        print(f"timeline saved to {args.timeline}")
    if args.plot:
        from headrace._engine.plot import plot

        plot(timeline, args.plot, title=f"headrace bench {args.path}: {what}")
        if not args.json:
            print(f"plot written to {args.plot}")
    return 0
