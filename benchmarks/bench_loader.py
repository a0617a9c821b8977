"""Shuffled batches from a 200,000 x 3,072-byte uint8 field plus int64 labels, page cache warm.

Side by side, each peer in a fresh subprocess (so each peak RSS is its own):

* ``headrace``: ``headrace.Loader(store, batch=256, order="shuffle", epochs=1)``.
* ``ceiling``: a plain single-thread ``memmap[sorted idx]`` gather of each shuffled batch from
  ``.npy`` files (what one core does with no loader at all).
* ``torch``: ``torch.utils.data.DataLoader`` with 2 worker processes over the same memmap, a
  map-style dataset with ``__getitems__`` fed by a ``BatchSampler(RandomSampler)``, so each worker
  gathers a whole sorted batch as the ceiling does (the fair, fast way to use it).
* ``grain``: ``grain.MapDataset.source(...).shuffle(seed).batch(256).to_iter_dataset(
  grain.ReadOptions(num_threads=2, prefetch_buffer_size=16))`` over the same memmap (Grain reads
  records one by one and stacks them, its natural path).

Every peer reads every row of one epoch per repeat; the best of ``--repeats`` is reported. Peak RSS
is ``ru_maxrss`` of the peer's process plus its largest child (torch workers); it counts the mmap'd
page-cache pages a peer touched, which are shared and reclaimable, so ``anon MB`` (the peak of the
process's anonymous RSS, sampled every 10 ms) says what a peer really allocated.

Also measured: the sampler's share of headrace's wall time per batch (the shuffle ``Order`` that
the loader evaluates for each batch).

Run::

    .venv/bin/python benchmarks/bench_loader.py            # ~1-2 minutes on 2 cores
    .venv/bin/python benchmarks/bench_loader.py --rows 50000 --repeats 1   # a quick look

Data is generated once under ``benchmarks/_data/bench_loader/`` (gitignored, ~1.2 GB).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROW_BYTES = 3_072
DEFAULT_ROWS = 200_000
BATCH = 256
DATA = Path(__file__).resolve().parent / "_data" / "bench_loader"
PEERS = ("ceiling", "headrace", "torch", "grain")


# ---------------------------------------------------------------------------------------- data


def prepare(rows: int, *, store: bool) -> Path:
    """Writes x.npy / label.npy and (if asked) a headrace store of the same rows, once per size."""
    root = DATA / f"{rows}x{ROW_BYTES}"
    root.mkdir(parents=True, exist_ok=True)
    if not (root / "npy.ready").exists():
        x = np.lib.format.open_memmap(root / "x.npy", mode="w+", dtype=np.uint8,
                                      shape=(rows, ROW_BYTES))
        rng = np.random.default_rng(0)
        step = 10_000
        for start in range(0, rows, step):
            stop = min(rows, start + step)
            x[start:stop] = rng.integers(0, 256, size=(stop - start, ROW_BYTES), dtype=np.uint8)
        x.flush()
        del x
        np.save(root / "label.npy", rng.integers(0, 1000, size=rows, dtype=np.int64))
        (root / "npy.ready").write_text("ok\n")
    if store and not (root / "store.ready").exists():
        import shutil

        import headrace

        shutil.rmtree(root / "store", ignore_errors=True)
        headrace.pack_arrays(root / "store", x=str(root / "x.npy"),
                             label=str(root / "label.npy"), progress=False)
        (root / "store.ready").write_text("ok\n")
    return root


def warm(root: Path) -> None:
    """Reads every data file once so that all peers start from a warm page cache."""
    buf = bytearray(1 << 24)
    for path in sorted(root.rglob("*")):
        if path.is_file():
            with open(path, "rb", buffering=0) as f:
                while f.readinto(buf):
                    pass


# --------------------------------------------------------------------------------------- peers


class AnonPeak:
    """Samples this process's anonymous RSS (``RssAnon``) every 10 ms and keeps the peak."""

    def __init__(self) -> None:
        self.peak_kb = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    self.peak_kb = max(self.peak_kb, int(line.split()[1]))
                    return

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            self._sample()

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        self._sample()
        return self.peak_kb


def run_ceiling(root: Path, rows: int, repeat: int) -> int:
    x = np.asarray(np.load(root / "x.npy", mmap_mode="r"))
    y = np.asarray(np.load(root / "label.npy", mmap_mode="r"))
    perm = np.random.default_rng(repeat).permutation(rows)
    n = 0
    for start in range(0, rows, BATCH):
        idx = np.sort(perm[start:start + BATCH])
        xb, yb = x[idx], y[idx]
        n += min(len(xb), len(yb))
    return n


def run_headrace(root: Path, rows: int, repeat: int, threads: int | None = None) -> int:
    import headrace

    n = 0
    with headrace.Loader(root / "store", batch=BATCH, order="shuffle", seed=repeat, epochs=1,
                         threads=threads) as loader:
        for batch in loader:
            n += min(len(batch["x"]), len(batch["label"]))
    return n


class _MemmapRows:
    """Map-style dataset over the .npy memmaps; ``__getitems__`` gathers a whole sorted batch."""

    def __init__(self, root: Path, rows: int) -> None:
        self.root = root
        self.rows = rows
        self._x: np.ndarray | None = None
        self._y: np.ndarray | None = None

    def __len__(self) -> int:
        return self.rows

    def _open(self) -> tuple[np.ndarray, np.ndarray]:
        if self._x is None or self._y is None:  # opened in each worker, after the fork
            self._x = np.asarray(np.load(self.root / "x.npy", mmap_mode="r"))
            self._y = np.asarray(np.load(self.root / "label.npy", mmap_mode="r"))
        return self._x, self._y

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        x, y = self._open()
        return {"x": np.asarray(x[i]), "label": np.asarray(y[i])}

    def __getitems__(self, ids: list[int]) -> dict[str, Any]:
        import torch

        x, y = self._open()
        idx = np.sort(np.asarray(ids))
        return {"x": torch.from_numpy(x[idx]), "label": torch.from_numpy(y[idx])}


def _identity(batch: Any) -> Any:
    return batch


def run_torch(root: Path, rows: int, repeat: int) -> int:
    import torch
    from torch.utils.data import BatchSampler, DataLoader, RandomSampler

    ds = _MemmapRows(root, rows)
    gen = torch.Generator().manual_seed(repeat)
    sampler = BatchSampler(RandomSampler(ds, generator=gen), BATCH, drop_last=False)
    dl = DataLoader(ds, batch_sampler=sampler, num_workers=2, collate_fn=_identity)
    n = 0
    for batch in dl:
        n += min(len(batch["x"]), len(batch["label"]))
    return n


class _GrainSource:
    def __init__(self, root: Path) -> None:
        self.x = np.asarray(np.load(root / "x.npy", mmap_mode="r"))
        self.y = np.asarray(np.load(root / "label.npy", mmap_mode="r"))

    def __len__(self) -> int:
        return self.x.shape[0]

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        return {"x": self.x[i], "label": self.y[i]}


def run_grain(root: Path, rows: int, repeat: int) -> int:
    import grain

    ds = (grain.MapDataset.source(_GrainSource(root)).shuffle(seed=repeat).batch(BATCH)
          .to_iter_dataset(grain.ReadOptions(num_threads=2, prefetch_buffer_size=16)))
    n = 0
    for batch in ds:
        n += min(len(batch["x"]), len(batch["label"]))
    return n


def sampler_seconds_per_batch(rows: int, batches: int = 2_000) -> float:
    """Wall time of the shuffle order for one batch, as the loader evaluates it."""
    from headrace._order import make_order

    order = make_order("shuffle", rows, seed=0)
    order.range(0, BATCH)  # builds the epoch's round tables, as the loader's first batch does
    t0 = time.perf_counter()
    for b in range(batches):
        order.range((b * BATCH) % (rows * 4), BATCH)
    return (time.perf_counter() - t0) / batches


RUNNERS = {"ceiling": run_ceiling, "headrace": run_headrace, "torch": run_torch,
           "grain": run_grain}


def run_peer(peer: str, root: Path, rows: int, repeats: int) -> dict[str, Any]:
    """Runs one peer in this process and returns its measurements."""
    anon = AnonPeak()
    best = float("inf")
    got = 0
    for repeat in range(repeats):
        t0 = time.perf_counter()
        got = RUNNERS[peer](root, rows, repeat)
        best = min(best, time.perf_counter() - t0)
        if got != rows:
            raise RuntimeError(f"{peer} delivered {got} rows, expected {rows}")
    anon_kb = anon.stop()
    self_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    child_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    out: dict[str, Any] = {"peer": peer, "rows": got, "seconds": best,
                           "rows_per_s": got / best, "peak_rss_mb": (self_kb + child_kb) / 1024,
                           "anon_mb": anon_kb / 1024}
    if peer == "headrace":
        out["sampler_s_per_batch"] = sampler_seconds_per_batch(rows)
    return out


# ---------------------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=DEFAULT_ROWS)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--peers", default=",".join(PEERS),
                        help=f"comma-separated subset of {','.join(PEERS)}")
    parser.add_argument("--peer", help=argparse.SUPPRESS)  # internal: run one peer, print JSON
    args = parser.parse_args()

    root = DATA / f"{args.rows}x{ROW_BYTES}"
    if args.peer:
        print(json.dumps(run_peer(args.peer, root, args.rows, args.repeats)))
        return

    t0 = time.perf_counter()
    peers = args.peers.split(",")
    root = prepare(args.rows, store="headrace" in peers)
    warm(root)
    print(f"data: {args.rows:,} x {ROW_BYTES:,} B uint8 + int64 labels in {root} "
          f"(ready in {time.perf_counter() - t0:.1f} s, page cache warm); batch {BATCH}, "
          f"shuffled, best of {args.repeats}, {os.cpu_count()} CPUs")
    results = []
    for peer in peers:
        proc = subprocess.run([sys.executable, __file__, "--peer", peer, "--rows", str(args.rows),
                               "--repeats", str(args.repeats)], capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"{peer}: FAILED\n{proc.stderr[-3000:]}")
            continue
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))

    ceiling = next((r["rows_per_s"] for r in results if r["peer"] == "ceiling"), None)
    print()
    print("| peer | rows/s | vs ceiling | peak RSS MB | anon MB |")
    print("|---|---:|---:|---:|---:|")
    for r in results:
        ratio = f"{r['rows_per_s'] / ceiling:.2f}x" if ceiling else "-"
        print(f"| {r['peer']} | {r['rows_per_s']:,.0f} | {ratio} | {r['peak_rss_mb']:,.0f} | "
              f"{r['anon_mb']:,.0f} |")
    for r in results:
        if "sampler_s_per_batch" in r:
            per_batch = BATCH / r["rows_per_s"]
            print(f"\nsampler: {r['sampler_s_per_batch'] * 1e6:.1f} us per batch of {BATCH} = "
                  f"{100 * r['sampler_s_per_batch'] / per_batch:.2f}% of headrace's "
                  f"{per_batch * 1e6:.0f} us per batch")


if __name__ == "__main__":
    main()
