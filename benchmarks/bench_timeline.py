"""What the stats timeline costs: the same loader with the timeline off, at its default period,
and sampling after every batch (the worst case), side by side in one process.

    .venv/bin/python benchmarks/bench_timeline.py [--rounds 5] [--batches 20000] [--kind mix]

Each round runs every variant once on the same in-memory data (shuffled batches of 256 rows of
256 bytes: small batches, so any per-batch cost shows), in a rotated order so load from other jobs
hits them alike; the table shows the median batches/s, the per-batch cost relative to "off", and
how many snapshots each kept. ``--kind mix`` measures ``headrace.mix`` of two such loaders (one
thread each) instead: its ``stats()``, which asks every source, is the costliest snapshot.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import headrace

VARIANTS = {"off": None, "timeline=True (0.5 s)": 0.5, "every batch (period 1e-9 s)": 1e-9}


def _open(data: dict[str, np.ndarray], kind: str) -> object:
    if kind == "mix":
        half = len(data["y"]) // 2
        return headrace.mix([headrace.Loader({k: v[i * half:(i + 1) * half] for k, v in data.items()},
                                             batch=256, order="shuffle", epochs=None, threads=1)
                             for i in range(2)])
    return headrace.Loader(data, batch=256, order="shuffle", epochs=None, threads=2)


def run(data: dict[str, np.ndarray], period: float | None,
        batches: int, kind: str = "loader") -> tuple[float, float, int]:
    with _open(data, kind) as ld:  # type: ignore[attr-defined]
        if period is not None:
            ld.enable_timeline(period_s=period)
        it = iter(ld)
        for _ in range(50):  # warm up: threads started, queue full
            next(it)
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(batches):
            next(it)
        took, cpu = time.perf_counter() - t0, time.process_time() - c0
        kept = len(ld.stats_timeline()["samples"]) if period is not None else 0
    return batches / took, cpu / batches, kept


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batches", type=int, default=20000)
    ap.add_argument("--kind", choices=("loader", "mix"), default="loader")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    data = {"x": rng.integers(0, 255, (200_000, 256), dtype=np.uint8),
            "y": np.arange(200_000)}
    rates: dict[str, list[float]] = {k: [] for k in VARIANTS}
    cpus: dict[str, list[float]] = {k: [] for k in VARIANTS}
    ratios: dict[str, list[float]] = {k: [] for k in VARIANTS}
    kept: dict[str, int] = {}
    names = list(VARIANTS)
    for r in range(args.rounds):
        this: dict[str, float] = {}
        for name in names[r % len(names):] + names[: r % len(names)]:
            rate, cpu, n = run(data, VARIANTS[name], args.batches, args.kind)
            rates[name].append(rate)
            cpus[name].append(cpu)
            this[name] = rate
            kept[name] = n
        for name in names:
            ratios[name].append(this[name] / this["off"])
    print(f"| {args.kind} timeline | batches/s (median of {args.rounds}) | vs off (median of per-round "
          "ratios) | CPU us per batch (all threads) | snapshots kept |")
    print("|---|---:|---:|---:|---:|")
    for name in names:
        print(f"| {name} | {statistics.median(rates[name]):,.0f} | "
              f"{statistics.median(ratios[name]):.2f}x | "
              f"{1e6 * statistics.median(cpus[name]):.1f} | {kept[name]} |")


if __name__ == "__main__":
    main()
