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


# --- issue 10: an image set, a few training steps, live throughput and memory, the timeline ---

SHAPES = ("circle", "square", "triangle", "stripes")  # the classes: one shape per image
PHOTO_SIZE = 64
TRAIN_HW = (32, 32)


def make_photo(i: int, size: int = PHOTO_SIZE) -> tuple[np.ndarray, int]:
    """Image ``i`` of the synthetic photo set and its class: a shape on a gradient, with noise.

    Deterministic in ``i``. Position, size, colours and background differ per image, so the shape
    (the label) is what a model has to learn; JPEG-encoded it looks like a small photograph.
    """
    rng = np.random.default_rng([SEED, i])
    label = i % len(SHAPES)
    y, x = np.mgrid[0:size, 0:size].astype(np.float32) / size
    angle = rng.uniform(0, 2 * np.pi)
    ramp = (x * np.cos(angle) + y * np.sin(angle) + 1.5) / 3.0
    c0, c1, fg = rng.uniform(0, 255, size=(3, 3)).astype(np.float32)
    img = c0 + (c1 - c0) * ramp[..., None]
    cy, cx = rng.uniform(0.3, 0.7, size=2)
    r = rng.uniform(0.15, 0.3)
    dy, dx = y - cy, x - cx
    if SHAPES[label] == "circle":
        mask = dy * dy + dx * dx < r * r
    elif SHAPES[label] == "square":
        mask = (np.abs(dx) < r) & (np.abs(dy) < r)
    elif SHAPES[label] == "triangle":
        mask = (dy < r) & (np.abs(dx) < (dy + r) / 2)
    else:
        mask = np.sin((x * np.cos(angle + 1) + y * np.sin(angle + 1)) * 40) > 0.3
    img[mask] = 0.35 * img[mask] + 0.65 * fg
    img += rng.normal(0, 6, size=img.shape)
    return np.clip(img, 0, 255).astype(np.uint8), label


def make_photo_folder(root: Path, count: int) -> int:
    """Writes ``count`` JPEGs as ``root/<shape>/<i>.jpg`` (an ImageFolder); returns bytes written."""
    from PIL import Image

    total = 0
    for name in SHAPES:
        (root / name).mkdir(parents=True, exist_ok=True)
    for i in range(count):
        pixels, label = make_photo(i)
        path = root / SHAPES[label] / f"{i:05d}.jpg"
        Image.fromarray(pixels).save(path, quality=90)
        total += path.stat().st_size
    return total


def _photo_count() -> int:
    return int(os.environ.get("HEADRACE_DEMO_IMAGES", "800"))


def step_photos(demo: Demo) -> None:
    """Makes the synthetic photo folder once (JPEG files, 4 classes); later runs reuse it."""
    count = _photo_count()
    root = demo.root / f"photos-{count}"
    demo.results["photos"] = root
    if (root / ".complete").exists():
        demo.say("photos", f"reusing {count} JPEGs in {root}")
        return
    if root.exists():
        shutil.rmtree(root)
    nbytes = make_photo_folder(root, count)
    (root / ".complete").write_text(str(count))
    demo.say("photos", f"made {count} {PHOTO_SIZE}x{PHOTO_SIZE} JPEGs in {len(SHAPES)} classes "
                       f"({', '.join(SHAPES)}), {nbytes / 1e6:.1f} MB in {root}")


def step_pack_photos(demo: Demo) -> None:
    """Packs the JPEG folder into a store with ``headrace.pack_dir`` (labels from the folders)."""
    import headrace

    out = demo.root / "photos.hr"
    t0 = time.perf_counter()
    info = headrace.pack_dir(demo.results["photos"], out=out, overwrite=True)
    demo.results["photo_store"] = out
    demo.say("pack-photos", f"packed {info['samples']} JPEGs ({len(info['classes'])} classes) "
                            f"into {out} in {time.perf_counter() - t0:.2f} s")


def _numpy_trainer(n_in: int, n_out: int) -> Callable[[np.ndarray, np.ndarray], tuple[float, float]]:
    """Softmax regression by plain NumPy SGD (used when JAX is not installed)."""
    rng = np.random.default_rng(SEED)
    w = rng.normal(0, 0.01, size=(n_in, n_out)).astype(np.float32)
    b = np.zeros(n_out, np.float32)

    def step(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        nonlocal w, b
        logits = x @ w + b
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        loss = float(-np.log(p[np.arange(len(y)), y] + 1e-9).mean())
        acc = float((p.argmax(axis=1) == y).mean())
        p[np.arange(len(y)), y] -= 1
        w -= 0.05 * (x.T @ p) / len(y)
        b -= 0.05 * p.mean(axis=0)
        return loss, acc

    return step


def _jax_trainer(n_in: int, n_out: int) -> Callable[[np.ndarray, np.ndarray], tuple[float, float]]:
    """A tiny CNN (two strided 3x3 convolutions, global average pool, dense) trained with optax's
    Adam, jitted, on JAX's default (CPU) device. Inputs are NHWC batches, flattened."""
    import jax
    import jax.numpy as jnp
    import optax

    h, w = TRAIN_HW
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(SEED), 3)
    params = {"c1": jax.random.normal(k1, (3, 3, 3, 16)) * (2 / 27) ** 0.5,
              "c2": jax.random.normal(k2, (3, 3, 16, 32)) * (2 / 144) ** 0.5,
              "w": jax.random.normal(k3, (32, n_out)) * 0.1, "b": jnp.zeros(n_out)}
    opt = optax.adam(3e-3)
    state = {"params": params, "opt": opt.init(params)}
    dims = ("NHWC", "HWIO", "NHWC")

    def loss_fn(p: Any, x: Any, y: Any) -> tuple[Any, Any]:
        x = x.reshape(-1, h, w, 3)
        x = jax.nn.relu(jax.lax.conv_general_dilated(x, p["c1"], (2, 2), "SAME",
                                                     dimension_numbers=dims))
        x = jax.nn.relu(jax.lax.conv_general_dilated(x, p["c2"], (2, 2), "SAME",
                                                     dimension_numbers=dims))
        logits = x.mean(axis=(1, 2)) @ p["w"] + p["b"]
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
        return loss, (logits.argmax(axis=1) == y).mean()

    @jax.jit
    def update(p: Any, o: Any, x: Any, y: Any) -> tuple[Any, Any, Any, Any]:
        (loss, acc), grads = jax.value_and_grad(loss_fn, has_aux=True)(p, x, y)
        updates, o = opt.update(grads, o)
        return optax.apply_updates(p, updates), o, loss, acc

    def step(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        p, o, loss, acc = update(state["params"], state["opt"], jnp.asarray(x), jnp.asarray(y))
        state["params"], state["opt"] = p, o
        return float(loss), float(acc)

    return step


def step_train(demo: Demo) -> None:
    """Trains a tiny model for a few steps on decoded, augmented batches from the photo store.

    ``headrace.image`` decodes and augments in its worker threads under the in-flight byte cap;
    one line every few steps shows loss, throughput and memory; the stats timeline is recorded
    for the plot step.
    """
    import headrace
    from headrace._engine.timeline import Recorder

    steps = int(os.environ.get("HEADRACE_DEMO_STEPS", "100"))
    try:
        trainer, backend = _jax_trainer, "JAX + optax (CPU)"
        import jax  # noqa: F401
        import optax  # noqa: F401
    except ImportError:
        trainer, backend = _numpy_trainer, "NumPy (install headrace[demo] for JAX)"
    h, w = TRAIN_HW
    train = trainer(h * w * 3, len(SHAPES))
    loader = headrace.image(demo.results["photo_store"], batch=32, shuffle=True, seed=SEED,
                            epochs=None, resize=(40, 40), crop=TRAIN_HW, flip_p=0.5,
                            mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25), layout="NHWC",
                            inflight=16 << 20)
    demo.say("train", f"{backend}: {steps} steps, batch 32, {h}x{w} random crops + flips, "
                      "in-flight cap 16 MiB")
    t0 = time.perf_counter()
    last_t, last_n, n = t0, 0, 0
    with loader:
        for k, (images, labels) in enumerate(loader, start=1):
            loss, acc = train(images.reshape(len(images), -1), labels)
            n += len(labels)
            if k == 1:  # the timeline starts after the first step: JAX compiles it
                rec = Recorder(period_s=0.05, capacity=512)
                rec.record(loader.stats())
            rec.maybe_record(loader.stats)
            if k % 10 == 0 or k == steps:
                s = loader.stats()
                now = time.perf_counter()
                demo.say("train", f"step {k:3d}  loss {loss:.3f}  acc {acc:.2f}  "
                                  f"{(n - last_n) / (now - last_t):7,.0f} img/s  "
                                  f"rss {s['counted_rss_bytes'] / 2**20:5.0f} MiB  "
                                  f"in flight {s['inflight_bytes'] / 2**20:4.1f}/"
                                  f"{s['max_inflight_bytes'] / 2**20:.0f} MiB  "
                                  f"queue {s['queue_depth']}")
                last_t, last_n = now, n
            if k >= steps:
                break
        demo.results["timeline"] = rec.export(loader.stats(), kind="ImageLoader")
    took = time.perf_counter() - t0
    demo.say("train", f"{steps} steps, {n} images in {took:.1f} s ({n / took:,.0f} img/s, "
                      "compile included)")


def step_plot(demo: Demo) -> None:
    """Writes the timeline (JSON) and its plot, and says where the time went."""
    import json

    from headrace._engine.timeline import summarize

    timeline = demo.results["timeline"]
    saved = demo.root / "timeline.json"
    saved.write_text(json.dumps(timeline))
    summary = summarize(timeline)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        demo.say("plot", f"{summary['verdict']}; timeline saved to {saved} (install "
                         "headrace[plot] to draw it)")
        return
    import headrace

    out = headrace.plot(timeline, demo.root / "timeline.png",
                        title="headrace demo: training on synthetic photos")
    demo.say("plot", f"{summary['verdict']} (workers busy "
                     f"{summary['worker_busy_fraction']:.0%} of {summary['threads']} threads)")
    demo.say("plot", f"timeline plot written to {out} (data: {saved})")


STEPS: list[Step] = [
    Step("data", step_data),
    Step("pack", step_pack),
    Step("read", step_read),
    Step("check", step_check),
    Step("memory", step_memory),
    Step("photos", step_photos),
    Step("pack-photos", step_pack_photos),
    Step("train", step_train),
    Step("plot", step_plot),
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
