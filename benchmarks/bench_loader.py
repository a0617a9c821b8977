"""Shuffled batches from a 200,000 x 3,072-byte uint8 field plus int64 labels, page cache warm.

Side by side, each peer in a fresh subprocess (so each peak RSS is its own):

* ``headrace`` / ``headrace-seq`` / ``headrace-iid``: ``headrace.Loader(store, batch=256,
  order="shuffle" | "sequential" | "iid", epochs=1)`` over one ``Store`` opened once per process,
  at headrace's default threads (one worker fewer than the cores, the consumer's thread gathering
  whenever it would wait: on 2 cores, one worker and the consumer).
* ``headrace-load``: ``headrace.load(path, batch=256, shuffle=True)``, the store opened by ``load``
  every epoch (what a script that builds its loader per epoch pays).
* ``headrace-loaderx`` / ``headrace-loaderx-npy``: the loaderx-style endless
  ``DataLoader(Dataset(x), Dataset(label), num_workers=2, mode=1)`` (IID), ``ceil(rows / 256)``
  steps per epoch, over the store's fields / over the ``.npy`` files (datasets opened once).
* ``headrace-torch``: the shuffled loader through ``headrace.torch.IterableDataset`` and
  ``torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0)`` (zero-copy tensors);
  ``headrace-torch-direct``: the same dataset iterated directly, without torch's ``DataLoader``.
* ``headrace-jax``: the shuffled loader through ``headrace.jax.iterator(loader, prefetch=2)`` onto
  JAX's default device (the CPU here, where ``device_put`` may alias the NumPy buffer).
* the ceilings, one thread, no loader, the ``.npy`` mappings made once per process and kept (as
  headrace keeps its ``Store``): ``ceiling`` gathers ``x[sorted idx], y[sorted idx]`` of each
  shuffled batch; ``ceiling-jax`` does the same and ``jax.device_put``s each batch (the equal-work
  ceiling of ``headrace-jax``); ``ceiling-seq`` copies each batch's contiguous rows (``x[a:b].copy()``: a view
  would read nothing); ``ceiling-iid`` gathers sorted uniform draws with replacement. Each peer's
  ``vs ceiling`` is against the ceiling of its own order (the ``ceiling`` column).
* ``torch``: ``torch.utils.data.DataLoader`` with 2 worker processes over the same memmap, a
  map-style dataset with ``__getitems__`` fed by a ``BatchSampler(RandomSampler)``, so each worker
  gathers a whole sorted batch as the ceiling does (the fair, fast way to use it).
* ``grain``: ``grain.MapDataset.source(...).shuffle(seed).batch(256).to_iter_dataset(
  grain.ReadOptions(num_threads=2, prefetch_buffer_size=16))`` over the same memmap (Grain reads
  records one by one and stacks them, its natural path).

The page cache of every data file is dropped first; each peer's first epoch then reads its data
through its own path (``--warm read``: every file is read once with ``read()`` first; see
``_page_cache.py`` for why the state matters). Every peer reads every row of one epoch per round;
the peers take turns, one epoch each, so load from other processes on a shared machine hits them
alike. ``rows/s`` is the median epoch after the first
and ``vs ceiling`` the median of the per-round ratios (steady state: headrace checksums each record
the first time a process reads it, which the first epoch column shows; the other peers do no
integrity checks at all). ``CPU us/batch`` is the CPU time all of a peer's threads and processes
spent per batch: unlike wall time it barely moves with load from other jobs, and it bounds what a
peer can reach on an idle machine (2 threads at best halve the wall time of their CPU work).
``page faults/epoch`` is the median steady epoch's minor faults (major in brackets), the
process's and its workers': memory a peer maps afresh, or gets back after the machine reclaimed
it while the other peers ran, costs CPU there. Peak RSS
is ``ru_maxrss`` of the peer's process plus its largest child (torch workers); it counts the mmap'd
page-cache pages a peer touched, which are shared and reclaimable, so ``anon MB`` (the peak of the
process's anonymous RSS, sampled every 10 ms during its epochs only, so idle peers take no CPU
from the one being timed) says what a peer really allocated.

``first vs ceiling's first`` compares the first epochs (each peer's process is fresh, its modules
imported before the timer, its data opened inside it; headrace verifies every record's crc32c on
its first read, the ceilings verify nothing). A first epoch is one sample of a few tens of
milliseconds, so ``--firsts`` (default 3) fresh processes per peer each time one: the main run's,
then rounds of new processes taking turns as the main rounds do, the page cache as the main run
left it (``--warm own``: dropped again before each round). The columns show the medians: of the
first epochs, and of the per-round ratios.

Also measured: the sampler's share of headrace's wall time per batch: one epoch of the shuffle
``Order`` evaluated from a fresh order, so the epoch's network build is inside the timer.

Run::

    .venv/bin/python benchmarks/bench_loader.py            # ~3 minutes on 2 cores
    .venv/bin/python benchmarks/bench_loader.py --rounds 5 --warm read --firsts 5  # ~5 minutes
    .venv/bin/python benchmarks/bench_loader.py --rows 50000 --rounds 2   # a quick look

Data is generated once under ``benchmarks/_data/bench_loader/`` (gitignored, ~1.2 GB; the rows are
hard-linked from ``bench_store.py``'s photo-like ``.npy`` when that exists with the same shape).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from _memory import AnonPeak
from _page_cache import WARM_HELP, drop_page_cache, read_files

ROW_BYTES = 3_072
DEFAULT_ROWS = 200_000
BATCH = 256
DATA = Path(__file__).resolve().parent / "_data" / "bench_loader"
PEERS = ("ceiling", "ceiling-seq", "ceiling-iid", "ceiling-jax", "headrace", "headrace-seq", "headrace-iid",
         "headrace-load", "headrace-loaderx", "headrace-loaderx-npy", "headrace-torch",
         "headrace-torch-direct",
         "headrace-jax", "torch", "grain")


# ---------------------------------------------------------------------------------------- data


def prepare(rows: int, *, store: bool) -> Path:
    """Writes x.npy / label.npy and (if asked) a headrace store of the same rows, once per size."""
    root = DATA / f"{rows}x{ROW_BYTES}"
    root.mkdir(parents=True, exist_ok=True)
    if not (root / "npy.ready").exists():
        rng = np.random.default_rng(0)
        if not _reuse_store_bench_rows(rows, root / "x.npy"):
            x = np.lib.format.open_memmap(root / "x.npy", mode="w+", dtype=np.uint8,
                                          shape=(rows, ROW_BYTES))
            step = 10_000
            for start in range(0, rows, step):
                stop = min(rows, start + step)
                x[start:stop] = rng.integers(0, 256, size=(stop - start, ROW_BYTES),
                                             dtype=np.uint8)
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


def _reuse_store_bench_rows(rows: int, dest: Path) -> bool:
    """Hard-links bench_store.py's photo-like rows when they have this shape (saves 614 MB)."""
    src = DATA.parent / f"photo-v1-{rows}x{ROW_BYTES}.npy"
    if not src.exists():
        return False
    x = np.load(src, mmap_mode="r")
    if x.shape != (rows, ROW_BYTES) or x.dtype != np.uint8:
        return False
    del x
    dest.unlink(missing_ok=True)
    try:
        os.link(src, dest)
    except OSError:
        return False
    return True


# --------------------------------------------------------------------------------------- peers


_MAPPED: tuple[np.ndarray, np.ndarray] | None = None


def _mapped(root: Path) -> tuple[np.ndarray, np.ndarray]:
    """The ``.npy`` mappings, made once per process and kept, as headrace keeps its ``Store``."""
    global _MAPPED
    if _MAPPED is None:
        _MAPPED = (np.asarray(np.load(root / "x.npy", mmap_mode="r")),
                   np.asarray(np.load(root / "label.npy", mmap_mode="r")))
    return _MAPPED


def run_ceiling(root: Path, rows: int, repeat: int) -> int:
    """Shuffled: one thread, a kept mapping, ``x[sorted idx], y[sorted idx]`` per batch."""
    x, y = _mapped(root)
    perm = np.random.default_rng(repeat).permutation(rows)
    n = 0
    for start in range(0, rows, BATCH):
        idx = np.sort(perm[start:start + BATCH])
        xb, yb = x[idx], y[idx]
        n += min(len(xb), len(yb))
    return n


def run_ceiling_jax(root: Path, rows: int, repeat: int) -> int:
    """The shuffled ceiling onto JAX's default device: the same gather, then one
    ``jax.device_put([xb, yb])`` per batch (what a hand-written NumPy + JAX loop does; equal work
    for ``headrace-jax``, which places every batch the same way)."""
    import jax

    x, y = _mapped(root)
    perm = np.random.default_rng(repeat).permutation(rows)
    n = 0
    placed: Any = None
    for start in range(0, rows, BATCH):
        idx = np.sort(perm[start:start + BATCH])
        placed = jax.device_put([x[idx], y[idx]])
        n += min(len(placed[0]), len(placed[1]))
    jax.block_until_ready(placed)
    return n


def run_ceiling_seq(root: Path, rows: int, repeat: int) -> int:
    """Sequential: each batch's contiguous rows copied out of the kept mapping (a bare view would
    read nothing; headrace's batches are in memory)."""
    x, y = _mapped(root)
    n = 0
    for start in range(0, rows, BATCH):
        xb, yb = x[start:start + BATCH].copy(), y[start:start + BATCH].copy()
        n += min(len(xb), len(yb))
    return n


def run_ceiling_iid(root: Path, rows: int, repeat: int) -> int:
    """IID: ``rows`` uniform draws with replacement, sorted per batch, gathered from the mapping."""
    x, y = _mapped(root)
    rng = np.random.default_rng(repeat)
    n = 0
    for start in range(0, rows, BATCH):
        idx = np.sort(rng.integers(0, rows, size=min(BATCH, rows - start)))
        xb, yb = x[idx], y[idx]
        n += min(len(xb), len(yb))
    return n


_STORE: Any = None


def _store(root: Path) -> Any:
    import headrace

    global _STORE
    if _STORE is None:
        # One Store for all repeats, as in training: its default verify="first" checksums each
        # record the first time this process reads it, so the first epoch also pays for crc32c.
        _STORE = headrace.open(root / "store")
    return _STORE


def _run_loader(root: Path, repeat: int, order: str) -> int:
    import headrace

    n = 0
    with headrace.Loader(_store(root), batch=BATCH, order=order, seed=repeat, epochs=1) as loader:
        for batch in loader:
            n += min(len(batch["x"]), len(batch["label"]))
    return n


def run_headrace(root: Path, rows: int, repeat: int) -> int:
    return _run_loader(root, repeat, "shuffle")


def run_headrace_seq(root: Path, rows: int, repeat: int) -> int:
    return _run_loader(root, repeat, "sequential")


def run_headrace_iid(root: Path, rows: int, repeat: int) -> int:
    return _run_loader(root, repeat, "iid")


def run_headrace_load(root: Path, rows: int, repeat: int) -> int:
    """``headrace.load(path, shuffle=True)``: the path opened by ``load`` itself each epoch."""
    import headrace

    n = 0
    with headrace.load(root / "store", batch=BATCH, shuffle=True, seed=repeat) as loader:
        for batch in loader:
            n += min(len(batch["x"]), len(batch["label"]))
    return n


_LOADERX: dict[str, Any] = {}


def _run_loaderx(root: Path, rows: int, repeat: int, kind: str) -> int:
    """loaderx-style ``DataLoader(Dataset, Dataset, mode=1)`` (IID), ``ceil(rows / batch)`` steps
    of the endless loader; the datasets are opened once per process and kept."""
    import headrace

    if kind not in _LOADERX:
        if kind == "store":
            _LOADERX[kind] = (headrace.Dataset(root / "store", field="x"),
                              headrace.Dataset(root / "store", field="label"))
        else:
            _LOADERX[kind] = (headrace.Dataset(root / "x.npy"), headrace.Dataset(root / "label.npy"))
    data, labels = _LOADERX[kind]
    loader = headrace.DataLoader(data, labels, num_workers=2, batch_size=BATCH, mode=1,
                                 seed=repeat)
    n = 0
    try:
        for _ in range(-(-rows // BATCH)):
            batch = next(loader)
            n += min(len(batch["data"]), len(batch["label"]), rows - n)
    finally:
        loader.close()
    return n


def run_headrace_loaderx(root: Path, rows: int, repeat: int) -> int:
    return _run_loaderx(root, rows, repeat, "store")


def run_headrace_loaderx_npy(root: Path, rows: int, repeat: int) -> int:
    return _run_loaderx(root, rows, repeat, "npy")


def run_headrace_torch(root: Path, rows: int, repeat: int) -> int:
    """headrace through its torch adapter and a ``DataLoader(num_workers=0)``: tensors, no copy."""
    import torch.utils.data

    import headrace
    import headrace.torch

    ds = headrace.torch.IterableDataset(_store(root), batch=BATCH, order="shuffle", seed=repeat,
                                        epochs=1)
    n = 0
    for batch in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0):
        n += min(len(batch["x"]), len(batch["label"]))
    ds.close()
    return n


def run_headrace_torch_direct(root: Path, rows: int, repeat: int) -> int:
    """The same ``IterableDataset`` iterated by the training loop itself, no ``DataLoader``: what
    the adapter costs without torch's per-batch ``DataLoader.__next__`` (a profiler
    ``record_function`` and its fetcher)."""
    import headrace
    import headrace.torch

    ds = headrace.torch.IterableDataset(_store(root), batch=BATCH, order="shuffle", seed=repeat,
                                        epochs=1)
    n = 0
    for batch in ds:
        n += min(len(batch["x"]), len(batch["label"]))
    ds.close()
    return n


def run_headrace_jax(root: Path, rows: int, repeat: int) -> int:
    """headrace through ``headrace.jax.iterator`` onto JAX's default device, 2 batches ahead."""
    import jax

    import headrace
    import headrace.jax

    n = 0
    with headrace.Loader(_store(root), batch=BATCH, order="shuffle", seed=repeat, epochs=1) as loader:
        for batch in headrace.jax.iterator(loader, prefetch=2):
            n += min(len(batch["x"]), len(batch["label"]))
        jax.block_until_ready(batch)
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


def sampler_seconds_per_batch(rows: int) -> float:
    """Wall time of the shuffle order per batch over one epoch, as the loader evaluates it: from a
    fresh ``Order``, so the epoch's network build (its round tables) is inside the timer."""
    from headrace._order.make import make_order

    batches = -(-rows // BATCH)
    t0 = time.perf_counter()
    order = make_order("shuffle", rows, seed=0)
    for b in range(batches):  # the call the loader's dispatcher makes (read-only ids, no copy)
        order.shared_range(b * BATCH, min(BATCH, rows - b * BATCH))
    return (time.perf_counter() - t0) / batches


RUNNERS = {"ceiling": run_ceiling, "ceiling-seq": run_ceiling_seq, "ceiling-iid": run_ceiling_iid,
           "ceiling-jax": run_ceiling_jax,
           "headrace": run_headrace, "headrace-seq": run_headrace_seq,
           "headrace-iid": run_headrace_iid, "headrace-load": run_headrace_load,
           "headrace-loaderx": run_headrace_loaderx,
           "headrace-loaderx-npy": run_headrace_loaderx_npy,
           "headrace-torch": run_headrace_torch,
           "headrace-torch-direct": run_headrace_torch_direct, "headrace-jax": run_headrace_jax,
           "torch": run_torch, "grain": run_grain}
# the ceiling of equal work for each peer: the same order (so the same gather pattern)
CEILING_OF = {"headrace-seq": "ceiling-seq", "ceiling-seq": "ceiling-seq",
              "headrace-iid": "ceiling-iid", "ceiling-iid": "ceiling-iid",
              "headrace-loaderx": "ceiling-iid", "headrace-loaderx-npy": "ceiling-iid",
              "ceiling-jax": "ceiling-jax", "headrace-jax": "ceiling-jax"}


def _faults() -> tuple[int, int]:
    """Page faults of this process and its exited children: (minor, major). A peer's memory that
    the machine reclaimed while other peers ran (a VM's proactive reclaim takes pages idle for a
    few seconds) comes back through them, at a cost the CPU column includes."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_minflt + kids.ru_minflt, me.ru_majflt + kids.ru_majflt


def _cpu_seconds() -> float:
    """CPU time of this process (all threads) and of its exited children (torch workers)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def import_for(peer: str) -> None:
    """Imports what ``peer`` runs before its first timed epoch, as the ceilings have NumPy: a first
    epoch then counts opening and reading the data, not loading Python modules (headrace's
    top-level names import their modules on first use)."""
    if peer.startswith("headrace"):
        import headrace

        for name in ("open", "Loader", "load", "Dataset", "DataLoader"):
            getattr(headrace, name)
    if peer in ("torch", "headrace-torch", "headrace-torch-direct"):
        import torch.utils.data  # noqa: F401
    if peer in ("headrace-torch", "headrace-torch-direct"):
        import headrace.torch
    if peer in ("headrace-jax", "ceiling-jax"):
        import jax  # noqa: F401
    if peer == "headrace-jax":
        import headrace.jax
    if peer == "grain":
        import grain  # noqa: F401


def serve_peer(peer: str, root: Path, rows: int) -> None:
    """Child process: runs one epoch of ``peer`` per ``run`` line on stdin, prints JSON lines."""
    import_for(peer)
    anon = AnonPeak(running=False)
    repeat = 0
    print(json.dumps({"ready": peer}), flush=True)
    for line in sys.stdin:
        if line.strip() == "run":
            anon.resume()
            cpu0, faults0 = _cpu_seconds(), _faults()
            t0 = time.perf_counter()
            got = RUNNERS[peer](root, rows, repeat)
            seconds = time.perf_counter() - t0
            cpu, faults1 = _cpu_seconds() - cpu0, _faults()
            anon.pause()
            repeat += 1
            if got != rows:
                raise RuntimeError(f"{peer} delivered {got} rows, expected {rows}")
            result = {"seconds": seconds, "cpu_seconds": cpu,
                      "minor_faults": faults1[0] - faults0[0],
                      "major_faults": faults1[1] - faults0[1]}
            if peer == "headrace":  # timed right after the epoch, under the same machine load
                result["sampler_s_per_batch"] = sampler_seconds_per_batch(rows)
            print(json.dumps(result), flush=True)
        else:
            break
    out: dict[str, Any] = {
        "anon_mb": anon.stop(),
        "peak_rss_mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                        + resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 1024}
    print(json.dumps(out), flush=True)


class Peer:
    """A peer's child process, driven one epoch at a time."""

    def __init__(self, name: str, rows: int) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--peer", name, "--rows", str(rows)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.seconds: list[float] = []
        self.sampler_s: list[float] = []
        self.cpu_s: list[float] = []
        self.faults: list[tuple[int, int]] = []  # (minor, major) per epoch
        self.final: dict[str, Any] = {}
        self._read()  # the "ready" line

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"peer {self.name} exited with {self.proc.wait()}")
        result: dict[str, Any] = json.loads(line)
        return result

    def epoch(self) -> float:
        assert self.proc.stdin is not None
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        result = self._read()
        self.seconds.append(float(result["seconds"]))
        self.cpu_s.append(float(result["cpu_seconds"]))
        self.faults.append((int(result["minor_faults"]), int(result["major_faults"])))
        if "sampler_s_per_batch" in result:
            self.sampler_s.append(float(result["sampler_s_per_batch"]))
        return self.seconds[-1]

    def finish(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("done\n")
        self.proc.stdin.flush()
        self.final = self._read()
        self.proc.wait()


# ---------------------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=DEFAULT_ROWS)
    parser.add_argument("--rounds", type=int, default=5,
                        help="epochs per peer; the first is reported on its own")
    parser.add_argument("--peers", default=",".join(PEERS),
                        help=f"comma-separated subset of {','.join(PEERS)}")
    parser.add_argument("--warm", choices=("own", "read"), default="own", help=WARM_HELP)
    parser.add_argument("--firsts", type=int, default=3,
                        help="first epochs per peer, each in a fresh process (median shown)")
    parser.add_argument("--peer", help=argparse.SUPPRESS)  # internal: serve one peer
    args = parser.parse_args()

    if args.peer:
        serve_peer(args.peer, DATA / f"{args.rows}x{ROW_BYTES}", args.rows)
        return

    t0 = time.perf_counter()
    names = args.peers.split(",")
    root = prepare(args.rows, store=any(n.startswith("headrace") for n in names))
    drop_page_cache([root])
    if args.warm == "read":
        read_files([root])
    print(f"data: {args.rows:,} x {ROW_BYTES:,} B uint8 + int64 labels in {root} "
          f"(ready in {time.perf_counter() - t0:.1f} s, page cache dropped, then warmed "
          f"by --warm {args.warm}); batch {BATCH}, "
          f"shuffled, {args.rounds} rounds of one epoch per peer, first epochs from "
          f"{args.firsts} fresh processes each, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f} at start")
    peers = [Peer(name, args.rows) for name in names]
    # Round-robin epochs: on a shared machine, load changes hit every peer alike, and each ratio
    # compares epochs run back to back.
    for _ in range(args.rounds):
        for peer in peers:
            peer.epoch()
    for peer in peers:
        peer.finish()
    firsts = {p.name: [p.seconds[0]] for p in peers}
    for _ in range(args.firsts - 1):
        if args.warm == "own":
            drop_page_cache([root])
        fresh = [Peer(name, args.rows) for name in names]
        for peer in fresh:
            firsts[peer.name].append(peer.epoch())
        for peer in fresh:
            peer.finish()

    def steady(peer: Peer) -> list[float]:
        return peer.seconds[1:] or peer.seconds

    by_name = {p.name: p for p in peers}
    print()
    print("| peer | ceiling | rows/s | vs ceiling | first epoch rows/s | first vs ceiling's first "
          "| CPU us/batch | CPU vs ceiling | page faults/epoch | peak RSS MB | anon MB |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    batches = -(-args.rows // BATCH)
    for peer in peers:
        rate = args.rows / float(np.median(steady(peer)))
        cpu = float(np.median(peer.cpu_s[1:] or peer.cpu_s))
        ceiling = by_name.get(CEILING_OF.get(peer.name, "ceiling"))
        ratio = cpu_ratio = first_ratio = "-"
        if ceiling is not None:
            ratios = [c / s for c, s in zip(steady(ceiling), steady(peer), strict=True)]
            ratio = f"{np.median(ratios):.2f}x"
            first_ratios = [c / s for c, s in zip(firsts[ceiling.name], firsts[peer.name],
                                                  strict=True)]
            first_ratio = f"{np.median(first_ratios):.2f}x"
            cpu_ratio = f"{cpu / float(np.median(ceiling.cpu_s[1:] or ceiling.cpu_s)):.2f}x"
        faults = peer.faults[1:] or peer.faults
        minor = float(np.median([f[0] for f in faults]))
        major = float(np.median([f[1] for f in faults]))
        print(f"| {peer.name} | {ceiling.name if ceiling else '-'} | {rate:,.0f} | {ratio} | "
              f"{args.rows / float(np.median(firsts[peer.name])):,.0f} | {first_ratio} | "
              f"{cpu / batches * 1e6:,.0f} | {cpu_ratio} | {minor:,.0f} ({major:,.0f}) | "
              f"{peer.final['peak_rss_mb']:,.0f} | {peer.final['anon_mb']:,.0f} |")
    jx, plain = by_name.get("headrace-jax"), by_name.get("ceiling")
    if jx is not None and plain is not None:  # the ceiling that places nothing, for reference
        ratios = [c / s for c, s in zip(steady(plain), steady(jx), strict=True)]
        print(f"\nheadrace-jax against the plain shuffled ceiling (no device_put): "
              f"{np.median(ratios):.2f}x")
    for peer in peers:
        if peer.sampler_s:
            shares = [b / (e / batches) for b, e in zip(peer.sampler_s, peer.seconds, strict=True)]
            per_batch = float(np.median(steady(peer))) / batches
            cpu_shares = [b / (c / batches)
                          for b, c in zip(peer.sampler_s, peer.cpu_s, strict=True)]
            cpu_per_batch = float(np.median(peer.cpu_s[1:] or peer.cpu_s)) / batches
            print(f"\nsampler: {np.median(peer.sampler_s[1:] or peer.sampler_s) * 1e6:.1f} us per "
                  f"batch of {BATCH}; median share of headrace's time per batch "
                  f"({per_batch * 1e6:.0f} us): {100 * np.median(shares[1:] or shares):.2f}%; "
                  f"of its CPU time per batch ({cpu_per_batch * 1e6:.0f} us, all threads): "
                  f"{100 * np.median(cpu_shares[1:] or cpu_shares):.2f}%")


if __name__ == "__main__":
    main()
