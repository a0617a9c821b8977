"""Packing benchmark: ImageNet-like JPEGs -> a store, images/s, headrace (1 worker, all cores, a
Dask cluster) vs ``mx8.pack_dir`` (mx8 1.0.7).

Data: ``bench_image.make_dataset``'s JPEGs (scikit-image photographs, random crops and flips,
short side 300-500 px, quality 85-95, 4:2:0) in an ImageFolder tree of 10 classes, made once and
kept in ``benchmarks/_data/bench_pack-<n>/``. The page cache is warmed first, so the figures are
the packer's own cost (read, checksum, write, fsync), not the disk's. Peers are interleaved over
``--rounds`` rounds; each keeps its best round. Every peer writes a fresh store and the headrace
results are checked to be the same dataset (``dataset_hash``).

Peers:
* ``headrace w=1``: ``pack_dir(..., workers=1)``, the single-process path.
* ``headrace w=N``: ``pack_dir(..., workers=N)`` with N = all local cores (a local process pool).
* ``headrace dask``: ``pack_dir(..., executor=client.get_executor(), workers=N)`` on a Dask
  ``LocalCluster(processes=True, n_workers=N, threads_per_worker=1)`` (cluster start not timed).
* ``mx8``: ``mx8.pack_dir(in_dir, out=..., label_mode="imagefolder")``.

Run: ``.venv/bin/python benchmarks/bench_pack.py [--n 3000] [--rounds 3]``
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))


def _files(root: str) -> list[str]:
    out = []
    for dirpath, _dirs, names in os.walk(root):
        out.extend(os.path.join(dirpath, n) for n in names)
    return sorted(out)


def _dataset(n: int) -> str:
    sys.path.insert(0, HERE)
    from bench_image import make_dataset

    root = os.path.join(HERE, "_data", f"bench_pack-{n}")
    if not os.path.isfile(os.path.join(root, ".done")):
        shutil.rmtree(root, ignore_errors=True)
        t = time.perf_counter()
        make_dataset(os.path.join(root, "jpegs"), n)
        with open(os.path.join(root, ".done"), "w") as f:
            f.write("ok\n")
        print(f"made {n} JPEGs in {time.perf_counter() - t:.1f}s", file=sys.stderr)
    return os.path.join(root, "jpegs")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=3000, help="number of JPEGs")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--no-dask", action="store_true")
    p.add_argument("--verbose", action="store_true", help="print every timed run")
    a = p.parse_args()

    import headrace

    root = _dataset(a.n)
    files = _files(root)
    total = 0
    for f in files:  # warm the page cache
        with open(f, "rb") as fh:
            total += len(fh.read())
    print(f"{len(files)} JPEGs, {total / 1e6:.0f} MB (mean {total / len(files) / 1e3:.0f} kB), "
          f"{os.cpu_count()} cores, best of {a.rounds} rounds", file=sys.stderr)
    work = tempfile.mkdtemp(prefix="bench_pack_", dir=os.path.join(HERE, "_data"))
    hashes: dict[str, str] = {}
    peers: dict[str, Callable[[str], Any]] = {}

    def hr(**kw: Any) -> Callable[[str], Any]:
        def run(out: str) -> Any:
            return headrace.pack_dir(root, out=out, label_mode="imagefolder", progress=False, **kw)
        return run

    peers["headrace w=1"] = hr(workers=1)
    peers[f"headrace w={a.workers}"] = hr(workers=a.workers)
    cluster = client = None
    if not a.no_dask:
        from distributed import Client, LocalCluster

        t = time.perf_counter()
        cluster = LocalCluster(processes=True, n_workers=a.workers, threads_per_worker=1,
                               host="127.0.0.1", dashboard_address=None)
        client = Client(cluster)
        print(f"Dask LocalCluster with {a.workers} workers started in "
              f"{time.perf_counter() - t:.1f}s (not timed)", file=sys.stderr)
        peers["headrace dask"] = hr(executor=client.get_executor(), workers=a.workers)
    import mx8

    peers["mx8"] = lambda out: mx8.pack_dir(root, out=out, label_mode="imagefolder")
    best: dict[str, float] = {}
    try:
        for r in range(a.rounds):
            for name, fn in peers.items():
                out = os.path.join(work, f"{name.replace(' ', '_').replace('=', '')}-{r}")
                t = time.perf_counter()
                res = fn(out)
                dt = time.perf_counter() - t
                best[name] = min(best.get(name, float("inf")), dt)
                if a.verbose:
                    print(f"round {r} {name}: {dt:.3f}s", file=sys.stderr)
                if name.startswith("headrace"):
                    hashes[name] = res["dataset_hash"]
                shutil.rmtree(out, ignore_errors=True)
    finally:
        if client is not None:
            client.close()
        if cluster is not None:
            cluster.close()
        shutil.rmtree(work, ignore_errors=True)
    if len(set(hashes.values())) != 1:
        raise SystemExit(f"headrace peers packed different datasets: {hashes}")
    n = len(files)
    base_mx8 = best.get("mx8")
    base_one = best["headrace w=1"]
    print(f"{'peer':<14} {'images/s':>9} {'MB/s':>7} {'vs mx8':>7} {'vs w=1':>7}")
    for name, dt in best.items():
        vs_mx8 = f"{base_mx8 / dt:.2f}x" if base_mx8 else "-"
        print(f"{name:<14} {n / dt:>9.0f} {total / 1e6 / dt:>7.0f} {vs_mx8:>7} "
              f"{base_one / dt:>6.2f}x")


if __name__ == "__main__":
    main()
