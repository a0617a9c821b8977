"""Store gather benchmark: random batches of 256 records, headrace codecs vs a plain NumPy memmap.

    .venv/bin/python benchmarks/bench_store.py            # 200,000 x 3,072-byte uint8 records

The data (smooth gradients plus noise: compressible like photos, not all zeros, not pure random) is
generated once under ``benchmarks/_data/`` (gitignored) as a ``.npy`` file and packed once per
codec; later runs reuse both. Before timing, every file's cached pages are dropped
(``_page_cache.drop_page_cache``) and each reader reads all of its data once through its own path:
NumPy a sequential pass over its memmap, the store its first pass below. That is the page cache a
training job sees from its second epoch on (``--warm read`` reads every file with ``read()``
instead; see ``_page_cache``). This is repeated ``--cycles`` times.

Per codec it reports:

* first pass: every record read once in a random order, batches of 256. The store opens with
  ``verify="first"`` (the default), so this pass also verifies every record's crc32c once.
* steady state: random batches (uniform, with replacement) after that, the store taking turns
  with ``numpy.load(mmap_mode="r")[sorted_idx]`` (and ``[idx]`` unsorted) in blocks of 25
  batches, so all see the same machine state. Each batch is a fresh random draw; the store gets
  its ids unsorted, as a sampler produces them. Throughput is the batch size over the median
  batch time (robust on a shared machine).
* threaded: ``--threads`` threads gathering random batches at once, as the loader's workers do
  (a decoder that holds the GIL per record does not scale with threads).

The goal for ``raw`` is >= 0.90x NumPy's rows/s.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

import headrace
from _page_cache import WARM_HELP, drop_page_cache, read_files

DATA_DIR = Path(__file__).resolve().parent / "_data"
BLOCK = 25  # batches a reader reads in one turn


def make_rows(start: int, stop: int, row_bytes: int) -> np.ndarray:
    """Rows ``[start, stop)``, deterministic in ``start``: photo-like, compressible but not trivial.

    Each row is a smooth wave at its own level, frequency and phase, with 3-bit sensor-like noise
    on a random-length "textured" part (the rest is smooth, like sky or a wall). zstd and deflate
    store it in ~60% of the bytes, lz4 in ~80%.
    """
    n = stop - start
    rng = np.random.default_rng(start)
    col = np.arange(row_bytes, dtype=np.float32)[None, :]
    freq = rng.uniform(0.002, 0.02, size=(n, 1)).astype(np.float32)
    phase = rng.uniform(0, 6.3, size=(n, 1)).astype(np.float32)
    level = rng.integers(30, 200, size=(n, 1)).astype(np.float32)
    rows = np.sin(col * freq + phase)
    rows *= 40
    rows += level
    noise = rng.integers(0, 8, size=(n, row_bytes), dtype=np.uint8)
    noise[col >= rng.integers(row_bytes // 4, row_bytes, size=(n, 1))] = 0
    rows += noise
    return np.clip(rows, 0, 255).astype(np.uint8)


def ensure_npy(rows: int, row_bytes: int) -> Path:
    path = DATA_DIR / f"photo-v1-{rows}x{row_bytes}.npy"
    if path.exists():
        return path
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    t0 = time.perf_counter()
    with open(tmp, "wb") as f:
        np.lib.format.write_array_header_1_0(
            f, {"descr": "|u1", "fortran_order": False, "shape": (rows, row_bytes)})
        for start in range(0, rows, 4096):
            f.write(make_rows(start, min(rows, start + 4096), row_bytes).tobytes())
    os.replace(tmp, path)
    print(f"generated {path.name} ({path.stat().st_size / 1e6:.0f} MB) in "
          f"{time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return path


def ensure_store(npy: Path, codec: str, rows: int) -> Path:
    path = DATA_DIR / f"{npy.stem}-{codec}"
    meta = path / "meta.json"
    if meta.exists() and json.loads(meta.read_text()).get("length") == rows:
        return path
    if path.exists():
        import shutil
        shutil.rmtree(path)
    info = headrace.pack_arrays(path, x=str(npy), codec=codec)
    print(f"packed {codec}: {info['seconds']:.1f} s", file=sys.stderr)
    return path


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def bench_codec(store_path: Path, mm: np.ndarray, *, batch: int, batches: int,
                seed: int, threads: int, verify: str = "first") -> dict[str, float]:
    n = mm.shape[0]
    with headrace.open(store_path, verify=verify) as st:
        perm = np.random.default_rng(seed).permutation(n)
        t0 = time.perf_counter()
        for start in range(0, n, batch):
            st.gather(perm[start:start + batch])
        first = n / (time.perf_counter() - t0)
        rng = np.random.default_rng(seed + 1)
        # "numpy" gets sorted indices (sorting is not timed), the others unsorted ones.
        readers = {
            "numpy": lambda i: mm[i],
            "numpy_unsorted": lambda i: mm[i],
            "store": lambda i: st.gather(i)["x"],
        }
        times: dict[str, list[float]] = {name: [] for name in readers}
        names = list(readers)
        for k in range(-(-batches // BLOCK)):
            # Readers take turns in blocks of BLOCK batches (the order rotating every round), so
            # a change in machine load hits all alike, while each reads on its own for a while,
            # as a training loop does: turns of one batch made each reader pay for the others'
            # cache and TLB footprint (~1 MB of rows per batch) on every batch. Each batch gets
            # its own random draw.
            for name in names[k % 3:] + names[:k % 3]:
                for _ in range(BLOCK):
                    idx = rng.integers(0, n, size=batch)
                    if name == "numpy":
                        idx.sort()
                    t = time.perf_counter()
                    out = readers[name](idx)
                    times[name].append(time.perf_counter() - t)
                    del out
        # Threads gathering at once, as the loader's workers do: decoders that hold the GIL
        # per record do not scale; best of 3 rounds of 64 batches per thread.
        threaded = 0.0
        if threads > 1:
            from concurrent.futures import ThreadPoolExecutor
            work = [[rng.integers(0, n, size=batch) for _ in range(64)] for _ in range(threads)]

            def run(share: list[np.ndarray]) -> None:
                for i in share:  # each batch dropped at once, as a consumer would (keeping 64
                    st.gather(i)  # batches alive would time fresh-memory page faults instead)

            with ThreadPoolExecutor(threads) as ex:
                best = float("inf")
                for _ in range(3):
                    t = time.perf_counter()
                    list(ex.map(run, work))
                    best = min(best, time.perf_counter() - t)
            threaded = threads * 64 * batch / best
    # Medians of per-batch times: robust to the other processes sharing the machine.
    return {"first": first, "threaded": threaded,
            **{name: batch / float(np.median(t)) for name, t in times.items()}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--row-bytes", type=int, default=3072)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--batches", type=int, default=3000,
                   help="timed steady-state batches, split over the cycles")
    p.add_argument("--warm", choices=("own", "read"), default="own", help=WARM_HELP)
    p.add_argument("--cycles", type=int, default=3,
                   help="page-cache settles, each followed by a share of the batches")
    p.add_argument("--codecs", default="raw,zstd,lz4,deflate")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--verify", choices=("first", "always", "never"), default="first",
                   help="the stores' verify= mode (\"always\": every read checks crc32c)")
    p.add_argument("--threads", type=int, default=2,
                   help="threads gathering at once for the threaded column (1: skip it)")
    args = p.parse_args(argv)

    npy = ensure_npy(args.rows, args.row_bytes)
    codecs = args.codecs.split(",")
    stores = {c: ensure_store(npy, c, args.rows) for c in codecs}
    npy_bytes = npy.stat().st_size
    per_cycle = max(1, args.batches // args.cycles)
    # Cycles: the page cache is dropped and re-read before each, so each cycle's pages sit in
    # other physical memory. On a VM, random reads of the same data ran up to 2x slower or faster
    # from one placement to the next (host page sizes and reclaim); the median over cycles and
    # the range of per-cycle ratios keep that luck from deciding a comparison.
    runs: dict[str, list[dict[str, float]]] = {c: [] for c in codecs}
    for _ in range(args.cycles):
        drop_page_cache([npy, *stores.values()])
        if args.warm == "read":
            read_files([npy, *stores.values()])
        mm = np.load(npy, mmap_mode="r")
        for start in range(0, args.rows, 8192):  # map every page once, as a store's first pass does
            np.asarray(mm[start:start + 8192]).sum()
        for codec in codecs:
            runs[codec].append(bench_codec(stores[codec], mm, batch=args.batch, batches=per_cycle,
                                           seed=args.seed + len(runs[codec]),
                                           threads=args.threads, verify=args.verify))
        del mm

    print(f"random gather, {args.batch} x {args.row_bytes} B rows from {args.rows:,} (page cache "
          f"warm: --warm {args.warm}; {args.cycles} cycles of {per_cycle} batches, medians over "
          f"cycles; verify={args.verify!r})\n")
    header = ("| reader | on disk | size vs .npy | first pass rows/s (verifies) | "
              "steady rows/s | steady MB/s | vs numpy sorted (cycles) | vs numpy unsorted | "
              f"{args.threads} threads rows/s |")
    print(header)
    print("|---|---|---|---|---|---|---|---|---|")
    numpy_rates = []
    unsorted_rates = []
    for codec in codecs:
        cyc = runs[codec]
        r = {k: float(np.median([c[k] for c in cyc])) for k in cyc[0]}
        ratios = [c["store"] / c["numpy"] for c in cyc]
        numpy_rates.append(r["numpy"])
        unsorted_rates.append(r["numpy_unsorted"])
        size = dir_bytes(stores[codec])
        spread = f" ({min(ratios):.2f}-{max(ratios):.2f})" if len(ratios) > 1 else ""
        print(f"| headrace {codec} | {size / 1e6:,.0f} MB | {size / npy_bytes:.2f}x | "
              f"{r['first']:,.0f} | {r['store']:,.0f} | "
              f"{r['store'] * args.row_bytes / 1e6:,.0f} | {np.median(ratios):.2f}x{spread} | "
              f"{r['store'] / r['numpy_unsorted']:.2f}x | "
              f"{r['threaded']:,.0f} ({r['threaded'] / max(r['store'], 1e-9):.1f}x) |")
    for label, rates in (("[sorted_idx]", numpy_rates), ("[idx] (unsorted)", unsorted_rates)):
        rate = float(np.median(rates))
        print(f"| numpy.load(mmap_mode='r'){label} | {npy_bytes / 1e6:,.0f} MB | 1.00x | - | "
              f"{rate:,.0f} | {rate * args.row_bytes / 1e6:,.0f} | | | |")
    print(f"\n'{args.threads} threads': rows/s of {args.threads} threads gathering at once (best "
          "of 3 rounds); in brackets, the ratio to the one-thread steady rows/s.")
    print("'vs numpy' compares with the NumPy batches timed in the same loop (turns of 25 batches); "
          "NumPy's rows/s above are the medians over the codec loops.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
