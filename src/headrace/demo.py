"""The demo: ``python -m headrace.demo`` (what ``bash scripts/demo.sh`` runs). No arguments, no network.

It makes its own sample data (deterministic 32x32x3 uint8 "images" and int64 labels, saved as .npy
under a cache directory and reused on later runs), packs it into a store with ``pack_arrays``, reads
it back with random gathers, checks records against the source, and prints throughput and memory.

The demo is a list of steps (``STEPS``) sharing one ``Demo`` context, so later features add a step
(a loader, an image pipeline, a training step) by appending to the list. Each step prints its own
lines, prefixed ``[name]``, and may leave results in ``demo.results`` for later steps.

Environment:
    HEADRACE_DEMO_DIR: where the sample data and the store live (default ``./demo_data``).
    HEADRACE_DEMO_RECORDS: how many records to make (default 20000; the tests use fewer).
"""

from __future__ import annotations

import os
import resource
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["STEPS", "Demo", "Step", "main"]

IMAGE_SHAPE = (32, 32, 3)  # 3,072 bytes per record, CIFAR-sized
NUM_CLASSES = 10
SEED = 1234
BATCH = 256


@dataclass
class Demo:
    """What the steps share: where the data lives, how big it is, and what earlier steps found."""

    root: Path
    records: int
    results: dict[str, Any] = field(default_factory=dict)

    @property
    def images_npy(self) -> Path:
        return self.root / f"images-{self.records}.npy"

    @property
    def labels_npy(self) -> Path:
        return self.root / f"labels-{self.records}.npy"

    @property
    def store(self) -> Path:
        return self.root / "store"

    def say(self, step: str, text: str) -> None:
        print(f"[{step}] {text}", flush=True)


@dataclass(frozen=True)
class Step:
    """One stage of the demo: ``run(demo)`` prints its lines and may fill ``demo.results``."""

    name: str
    run: Callable[[Demo], None]


def make_images(start: int, stop: int) -> np.ndarray:
    """Records ``[start, stop)`` of the sample images: a smooth per-record gradient plus noise.

    Deterministic in the record id (not in the chunking), so any slice can be regenerated to check
    what was read back. Compressible like real photos, not all zeros and not pure noise.
    """
    ids = np.arange(start, stop, dtype=np.int64)
    h, w, c = IMAGE_SHAPE
    yy = np.arange(h, dtype=np.int64)[None, :, None, None]
    xx = np.arange(w, dtype=np.int64)[None, None, :, None]
    ch = np.arange(c, dtype=np.int64)[None, None, None, :]
    k = ids[:, None, None, None]
    base = (yy * (1 + k % 5) + xx * (1 + k % 7) + ch * 40 + k * 13) % 256
    noise = (ids[:, None, None, None] * 2654435761 + yy * 97 + xx * 31 + ch * 7) % 23
    return ((base + noise) % 256).astype(np.uint8)


def make_labels(n: int) -> np.ndarray:
    return (np.arange(n, dtype=np.int64) * 7919 + SEED) % NUM_CLASSES


def step_data(demo: Demo) -> None:
    """Writes the sample .npy files once; later runs reuse them."""
    if demo.images_npy.exists() and demo.labels_npy.exists():
        demo.say("data", f"reusing {demo.records} sample images in {demo.root}")
        return
    demo.root.mkdir(parents=True, exist_ok=True)
    tmp = demo.images_npy.with_suffix(".tmp.npy")
    with open(tmp, "wb") as f:  # plain writes in blocks: the demo's own memory stays small
        np.lib.format.write_array_header_1_0(
            f, {"descr": "|u1", "fortran_order": False, "shape": (demo.records, *IMAGE_SHAPE)})
        for start in range(0, demo.records, 1024):
            f.write(make_images(start, min(demo.records, start + 1024)).tobytes())
    np.save(demo.labels_npy, make_labels(demo.records))
    os.replace(tmp, demo.images_npy)  # last: a half-written run is redone, never reused
    size = demo.images_npy.stat().st_size
    demo.say("data", f"made {demo.records} sample images {IMAGE_SHAPE} uint8 + int64 labels "
                     f"({size / 1e6:.1f} MB) in {demo.root}")


def step_pack(demo: Demo) -> None:
    """Packs the .npy files into a fresh store, streamed (progress bar on a terminal)."""
    import headrace

    if demo.store.exists():
        shutil.rmtree(demo.store)
    info = headrace.pack_arrays(demo.store, image=str(demo.images_npy),
                                label=str(demo.labels_npy), codec="raw")
    mb = info["bytes_written"] / 1e6
    demo.say("pack", f"packed {info['samples']} records into {demo.store}: {mb:.1f} MB in "
                     f"{info['seconds']:.2f} s ({mb / max(info['seconds'], 1e-9):.0f} MB/s)")


def step_read(demo: Demo) -> None:
    """Random gathers of BATCH records: a first pass (checksums verified) then steady state."""
    import headrace

    rng = np.random.default_rng(SEED)
    with headrace.open(demo.store) as st:
        n = len(st)
        t0 = time.perf_counter()
        for ids in np.array_split(rng.permutation(n), max(1, n // BATCH)):
            st.gather(ids)
        first = time.perf_counter() - t0
        batches, rows, nbytes = 0, 0, 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 1.0 or batches < 20:
            got = st.gather(rng.integers(0, n, size=BATCH))
            batches += 1
            rows += BATCH
            nbytes += got["image"].nbytes + got["label"].nbytes
        steady = time.perf_counter() - t0
    demo.results["read_rows_per_s"] = rows / steady
    demo.say("read", f"first pass (every record once, checksums verified): {n / first:,.0f} rows/s")
    demo.say("read", f"random gathers of {BATCH}: {rows / steady:,.0f} rows/s, "
                     f"{nbytes / steady / 1e6:,.0f} MB/s ({batches} batches)")


def step_check(demo: Demo) -> None:
    """Compares a few records read back with the source data."""
    import headrace

    rng = np.random.default_rng(SEED + 1)
    with headrace.open(demo.store) as st:
        n = len(st)
        ids = np.unique(np.concatenate([[0, n - 1], rng.integers(0, n, size=30)]))
        got = st.gather(ids)
    want_labels = make_labels(n)[ids]
    ok = all(np.array_equal(got["image"][k], make_images(int(i), int(i) + 1)[0])
             for k, i in enumerate(ids))
    ok = ok and np.array_equal(got["label"], want_labels)
    if not ok:
        raise SystemExit("[check] FAILED: records read back differ from the source data")
    demo.say("check", f"ok: {len(ids)} records equal the source data")


def _proc_status_kb(key: str) -> int | None:
    """A ``kB`` line of ``/proc/self/status`` (Linux), or None elsewhere."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def step_memory(demo: Demo) -> None:
    """Peak RSS of this process, split into private memory and mapped page-cache pages."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    data = demo.images_npy.stat().st_size
    demo.say("memory", f"peak RSS {peak / 1e6:.0f} MB for a {data / 1e6:.0f} MB dataset")
    anon, file = _proc_status_kb("RssAnon"), _proc_status_kb("RssFile")
    if anon is not None and file is not None:
        demo.say("memory", f"now: {anon * 1024 / 1e6:.0f} MB private + {file * 1024 / 1e6:.0f} MB "
                           "of mapped files (page cache: shared, reclaimable, not a copy)")
    demo.say("memory", "packing streamed the .npy in bounded slices; reads gather straight from "
                       "the mapped chunks")


STEPS: list[Step] = [
    Step("data", step_data),
    Step("pack", step_pack),
    Step("read", step_read),
    Step("check", step_check),
    Step("memory", step_memory),
]


def main(argv: list[str] | None = None) -> int:
    """Runs every step in order; returns the exit status."""
    if argv:
        print("usage: python -m headrace.demo  (no arguments; set HEADRACE_DEMO_DIR to move the "
              "data)", file=sys.stderr)
        return 2
    root = Path(os.environ.get("HEADRACE_DEMO_DIR", "demo_data")).resolve()
    records = int(os.environ.get("HEADRACE_DEMO_RECORDS", "20000"))
    demo = Demo(root=root, records=records)
    t0 = time.perf_counter()
    for step in STEPS:
        step.run(demo)
    print(f"[done] demo finished in {time.perf_counter() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
