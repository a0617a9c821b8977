"""Image loading benchmark: decode + resize to 224x224 RGB uint8, batch 64, page cache warm.

Data: ImageNet-like JPEGs cut from scikit-image's bundled photographs (random crops of 50-100 % of
the area, flips, a brightness tweak, rescaled so the short side is 300-500 px, quality 85-95,
4:2:0 chroma), in an ImageFolder tree of 10 classes; packed once with ``headrace.pack_dir`` and
once with ``mx8.pack_dir``. Every peer runs in its own subprocess (so its peak RSS is its own) and
reads every image once per timed pass; peers are interleaved over ``--rounds`` rounds of
``--repeat`` passes and each keeps its best (img/s, and CPU ms per image including worker
processes, which is the cost of the decode work whatever the load on the machine). Memory is the
peak RSS above the imports (``VmHWM``: what ``top`` and the OOM killer see, mapped page cache
included) and the peak anonymous RSS above the imports (sampled every 10 ms: what the peer
allocated), against the loader's ``max_inflight_bytes`` cap.

Every peer but headrace runs ``--threads`` threads or worker processes (2: the cores here);
headrace runs its default (one worker fewer than the cores, the consumer's thread gathering
whenever it would wait: two gatherers on 2 cores) unless ``--headrace-threads`` is given.

Peers (uint8 NHWC unless named "default"):
* headrace-default: ``headrace.image(store, batch=64, resize=(224, 224))`` with nothing else set:
  what a user gets (float32 NCHW in [0, 1], ``interpolation="auto"``; like every headrace row
  with ``resize``: libjpeg-turbo's fast IDCT and chroma upsampling, and a 1/2, 1/4 or 1/8
  DCT-scaled decode where that still covers 224x224).
* headrace: the same with ``float_out=False, layout="NHWC"`` (the ceiling's output).
* headrace-linear: that with ``interpolation="linear"``: the same filter and layout as
  ``ceiling-linear``, headrace's decoder (fast IDCT, DCT scaling where it covers the output).
* headrace-fulldecode: that with ``dct_scale=False, fast_decode=False``: exactly the pool's
  work (full-size accurate decode, bilinear), so only the loader differs.
* ceiling-linear: simplejpeg full-size decode + ``cv2.resize(INTER_LINEAR)`` in a plain
  ``ThreadPoolExecutor`` over the files, no loader: the plain thread pool a user would write.
* ceiling: the same decoder with headrace's ``auto`` filter policy (``resize_into``).
  ``ceiling+dct`` runs headrace's own ``decode()`` (DCT scaling) the same way: the best any loader
  could do with that decoder.
* grain: ``MapDataset`` with the ceiling's decoder, ``ReadOptions(num_threads=2)``, batch 64.
* torch: ``DataLoader(num_workers=2)`` over an ImageFolder-style dataset decoding with PIL
  (``open().convert("RGB").resize((224, 224), BILINEAR)``) -- torchvision's ImageFolder cannot be
  installed beside torch 2.13.0 here, so this is the equivalent it would run.
* mx8-default: ``mx8.image(pack, batch=64, resize=(224, 224))`` (float32 NCHW, its default) with
  ``MX8_DECODE_BACKEND=rust``; mx8: the same with ``float_out=False``.
* DALI's CPU pipeline is not installable here (no wheel for this platform/Python), so it has no
  row.

Second scenario, the ImageNet training crop (RandomResizedCrop to 224x224, same boxes for both):
* headrace-rrc: ``headrace.image(store, random_resized_crop=(224, 224), ...)``: the box is picked
  from the header, then decoded at the smallest DCT scale that covers it.
* ceiling-rrc: full-size decode, then crop the same box and resize, in the plain thread pool.

Run: ``.venv/bin/python benchmarks/bench_image.py [--n 2000] [--rounds 2] [--repeat 2]``
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from _memory import AnonPeak, status_mb

OUT = (224, 224)
BATCH = 64
PEERS = ["headrace-default", "headrace", "headrace-linear", "headrace-fulldecode",
         "ceiling-linear", "ceiling", "ceiling+dct", "grain", "torch", "mx8-default", "mx8", "headrace-rrc", "ceiling-rrc"]
# The row each peer's img/s and CPU are compared with: the plain linear thread pool, or the
# same-box full-decode pool for the RandomResizedCrop scenario.
BASE = "ceiling-linear"


def make_dataset(root: str, n: int, seed: int = 0) -> None:
    import cv2
    import simplejpeg
    import skimage.data as d

    names = ["astronaut", "chelsea", "coffee", "rocket", "retina", "hubble_deep_field",
             "immunohistochemistry", "colorwheel", "cat", "camera", "brick", "grass", "gravel"]
    photos = []
    for name in names:
        img = getattr(d, name)()
        if img.ndim == 2:
            img = np.repeat(img[:, :, None], 3, axis=2)
        photos.append(np.ascontiguousarray(img[:, :, :3]))
    rng = np.random.default_rng(seed)
    for i in range(n):
        src = photos[i % len(photos)]
        h, w = src.shape[:2]
        frac = rng.uniform(0.5, 1.0)
        ar = rng.uniform(0.75, 1.5)
        ch = min(h, round(float(np.sqrt(frac * h * w / ar))))
        cw = min(w, round(ch * float(ar)))
        y, x = rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1)
        crop = src[y:y + ch, x:x + cw]
        if rng.random() < 0.5:
            crop = crop[:, ::-1]
        short = rng.integers(300, 501)
        s = short / min(ch, cw)
        size = (max(1, round(cw * s)), max(1, round(ch * s)))
        img = cv2.resize(crop, size, interpolation=cv2.INTER_AREA if s < 1 else cv2.INTER_CUBIC)
        img = np.clip(img.astype(np.float32) * rng.uniform(0.85, 1.15), 0, 255).astype(np.uint8)
        data = simplejpeg.encode_jpeg(np.ascontiguousarray(img), quality=int(rng.integers(85, 96)),
                                      colorsubsampling="420")
        cls = os.path.join(root, f"class{i % 10:02d}")
        os.makedirs(cls, exist_ok=True)
        with open(os.path.join(cls, f"{i:06d}.jpg"), "wb") as f:
            f.write(data)


def list_files(root: str) -> list[str]:
    out = []
    for dirpath, _, files in os.walk(root):
        out += [os.path.join(dirpath, f) for f in files if f.endswith(".jpg")]
    return sorted(out)


def naive_decode(data: bytes) -> np.ndarray:
    """The ceiling's decoder: full-size libjpeg-turbo decode + cv2 resize (headrace's filter)."""
    import simplejpeg

    from headrace._modal.image_decode import resize_into

    return resize_into(simplejpeg.decode_jpeg(data, colorspace="RGB"), OUT)


def read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


# -- peers (each runs in its own process) ----------------------------------------------------------

def _drain(ld, a: argparse.Namespace) -> int:
    n = 0
    with ld:
        a.cap_mb = ld.config.max_inflight_bytes / 2**20
        for images, _labels in ld:
            n += len(images)
    return n


def run_headrace_default(a: argparse.Namespace) -> int:
    import headrace

    return _drain(headrace.image(a.store, batch=BATCH, resize=OUT,
                                 threads=a.headrace_threads), a)


def run_headrace(a: argparse.Namespace) -> int:
    import headrace

    return _drain(headrace.image(a.store, batch=BATCH, resize=OUT, float_out=False,
                                 layout="NHWC", threads=a.headrace_threads), a)


def run_headrace_linear(a: argparse.Namespace) -> int:
    import headrace

    return _drain(headrace.image(a.store, batch=BATCH, resize=OUT, float_out=False,
                                 layout="NHWC", interpolation="linear",
                                 threads=a.headrace_threads), a)


def run_headrace_fulldecode(a: argparse.Namespace) -> int:
    import headrace

    return _drain(headrace.image(a.store, batch=BATCH, resize=OUT, float_out=False,
                                 layout="NHWC", interpolation="linear", dct_scale=False,
                                 fast_decode=False, threads=a.headrace_threads), a)


def _pool_pass(a: argparse.Namespace, fn) -> int:
    files = list_files(a.root)

    def one(p: str) -> np.ndarray:
        return fn(read(p))

    n = 0
    with ThreadPoolExecutor(a.threads) as pool:
        for k in range(0, len(files), BATCH):
            batch = np.stack(list(pool.map(one, files[k:k + BATCH])))
            n += len(batch)
    return n


def run_ceiling(a: argparse.Namespace) -> int:
    return _pool_pass(a, naive_decode)


def run_ceiling_linear(a: argparse.Namespace) -> int:
    import cv2
    import simplejpeg

    def one(data: bytes) -> np.ndarray:
        full = simplejpeg.decode_jpeg(data, colorspace="RGB")
        return cv2.resize(full, OUT[::-1], interpolation=cv2.INTER_LINEAR)

    return _pool_pass(a, one)


def run_ceiling_dct(a: argparse.Namespace) -> int:
    from headrace._modal.image_decode import decode

    return _pool_pass(a, lambda b: decode(b, size=OUT))


def run_grain(a: argparse.Namespace) -> int:
    import grain

    files = list_files(a.root)
    ds = (grain.MapDataset.source(files).map(lambda p: naive_decode(read(p))).batch(BATCH)
          .to_iter_dataset(grain.ReadOptions(num_threads=a.threads, prefetch_buffer_size=4)))
    return sum(len(b) for b in ds)


class _PilFolder:
    """torchvision.datasets.ImageFolder + Resize((224, 224)) equivalent (PIL, bilinear)."""

    def __init__(self, root: str) -> None:
        self.files = list_files(root)
        classes = sorted({os.path.basename(os.path.dirname(f)) for f in self.files})
        self.idx = {c: i for i, c in enumerate(classes)}

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        import torch
        from PIL import Image

        with Image.open(self.files[i]) as im:
            img = im.convert("RGB").resize((OUT[1], OUT[0]), Image.BILINEAR)
        label = self.idx[os.path.basename(os.path.dirname(self.files[i]))]
        return torch.from_numpy(np.asarray(img).copy()), label


def run_torch(a: argparse.Namespace) -> int:
    from torch.utils.data import DataLoader

    dl = DataLoader(_PilFolder(a.root), batch_size=BATCH, num_workers=a.threads,
                    persistent_workers=False)
    return sum(len(x) for x, _ in dl)


def _mx8(a: argparse.Namespace, **kw) -> int:
    os.environ["MX8_DECODE_BACKEND"] = "rust"
    import mx8

    n = 0
    ld = mx8.image(a.mx8, batch=BATCH, resize=OUT, **kw)
    for images, _labels in ld:
        n += len(images)
    ld.close()
    return n


def run_mx8(a: argparse.Namespace) -> int:
    return _mx8(a, float_out=False)


def run_mx8_default(a: argparse.Namespace) -> int:
    return _mx8(a)


def run_headrace_rrc(a: argparse.Namespace) -> int:
    import headrace

    return _drain(headrace.image(a.store, batch=BATCH, random_resized_crop=OUT, float_out=False,
                                 layout="NHWC", threads=a.headrace_threads), a)


def run_ceiling_rrc(a: argparse.Namespace) -> int:
    import simplejpeg

    from headrace._modal.image_augment import ImageSpec, plan_batch
    from headrace._modal.image_decode import image_size, resize_into

    spec = ImageSpec(random_resized_crop=OUT)
    files = list_files(a.root)

    def one(args: tuple[str, int]) -> np.ndarray:
        path, i = args
        data = read(path)
        (plan,) = plan_batch(spec, 0, 0, np.array([i]), [image_size(data)])
        t, le, h, w = plan.box
        full = simplejpeg.decode_jpeg(data, colorspace="RGB")
        return resize_into(full[t:t + h, le:le + w], OUT)

    n = 0
    with ThreadPoolExecutor(a.threads) as pool:
        for k in range(0, len(files), BATCH):
            items = [(files[j], j) for j in range(k, min(k + BATCH, len(files)))]
            n += len(np.stack(list(pool.map(one, items))))
    return n


RUNNERS = {"headrace-default": run_headrace_default, "headrace": run_headrace,
           "headrace-linear": run_headrace_linear, "headrace-fulldecode": run_headrace_fulldecode,
           "ceiling-linear": run_ceiling_linear,
           "ceiling": run_ceiling, "ceiling+dct": run_ceiling_dct, "grain": run_grain,
           "torch": run_torch, "mx8-default": run_mx8_default, "mx8": run_mx8,
           "headrace-rrc": run_headrace_rrc, "ceiling-rrc": run_ceiling_rrc}
# What each peer gets with its own defaults (the "defaults" comparison).
DEFAULTS = ("mx8-default", "torch", "grain")


def _cpu_s() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)  # torch's workers, once joined
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def child(a: argparse.Namespace) -> None:
    fn = RUNNERS[a.peer]
    import cv2  # noqa: F401  (every peer's imports are in the baseline, not in its peak)
    import simplejpeg  # noqa: F401

    import headrace  # noqa: F401

    base_rss, base_anon = status_mb("VmRSS"), status_mb("RssAnon")
    anon = AnonPeak()
    a.cap_mb = None
    best = best_cpu = float("inf")
    n = 0
    for _ in range(a.repeat):
        t, c = time.perf_counter(), _cpu_s()
        n = fn(a)
        best = min(best, time.perf_counter() - t)
        best_cpu = min(best_cpu, _cpu_s() - c)
    ru_children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(json.dumps({"peer": a.peer, "images": n, "seconds": best, "img_s": n / best,
                      "cpu_ms_per_img": 1e3 * best_cpu / max(n, 1),
                      "peak_rss_mb": max(status_mb("VmHWM"), ru_children),
                      "base_rss_mb": base_rss, "anon_above_mb": anon.stop() - base_anon,
                      "cap_mb": a.cap_mb}))


def _base(peer: str) -> str:
    return "ceiling-rrc" if peer.endswith("-rrc") else BASE


def _round_ratio(rounds: list[dict[str, float]], a: str, b: str) -> str:
    """Median over the rounds of a's img/s over b's in the same round (load from elsewhere on the
    machine hits both alike), with the range."""
    rs = sorted(r[a] / r[b] for r in rounds if a in r and b in r)
    if not rs:
        return "-"
    med = float(np.median(rs))
    return f"{med:.2f}x" + (f" ({rs[0]:.2f}-{rs[-1]:.2f})" if len(rs) > 1 else "")


def report(results: dict[str, dict[str, float]], rounds: list[dict[str, float]]) -> None:
    print(f"{'peer':<17} {'img/s':>7} {'vs ' + BASE + ' per round':>27} {'CPU ms/img':>11} "
          f"{'CPU vs base':>12} {'peak RSS MB':>12} {'above imports':>14} {'anon above':>11} "
          f"{'cap MB':>7}")
    for peer, r in results.items():
        base = results.get(_base(peer))
        cratio = f"{base['cpu_ms_per_img'] / r['cpu_ms_per_img']:.2f}x" if base else "-"
        cap = f"{r['cap_mb']:.0f}" if r.get("cap_mb") is not None else "-"
        print(f"{peer:<17} {r['img_s']:>7.0f} {_round_ratio(rounds, peer, _base(peer)):>27} "
              f"{r['cpu_ms_per_img']:>11.2f} {cratio:>12} {r['peak_rss_mb']:>12.0f} "
              f"{r['peak_rss_mb'] - r['base_rss_mb']:>14.0f} {r['anon_above_mb']:>11.0f} "
              f"{cap:>7}")
    goals = []
    if "headrace-default" in results:
        for peer in (*DEFAULTS, BASE):
            if peer in results:
                goals.append((f"headrace-default vs {peer}", "headrace-default", peer, 1.0))
    for a_, b_, want in (("headrace-linear", BASE, 1.3), ("headrace-fulldecode", BASE, 1.0),
                         ("headrace", "ceiling", 1.3),
                         ("headrace-rrc", "ceiling-rrc", 1.0)):
        if a_ in results and b_ in results:
            what = "same work" if a_ == "headrace-fulldecode" else "equal work"
            goals.append((f"{what}: {a_} vs {b_}", a_, b_, want))
    if goals:
        print("\ngoals (img/s ratio, median of per-round ratios; CPU ratio of the best rounds):")
    for label, a_, b_, want in goals:
        cpu = results[b_]["cpu_ms_per_img"] / results[a_]["cpu_ms_per_img"]
        ratio = _round_ratio(rounds, a_, b_)
        ok = ratio != "-" and float(ratio.split("x")[0]) >= want
        print(f"  {label:<45} {ratio:>18}  CPU {cpu:.2f}x  goal >= {want:.1f}x: "
              f"{'met' if ok else 'NOT met'}")
    for peer, r in results.items():
        if r.get("cap_mb") is not None:
            above = r["peak_rss_mb"] - r["base_rss_mb"]
            ok = above <= r["cap_mb"] + 64
            print(f"  memory {peer:<38} {above:>6.0f} MB above imports (anon "
                  f"{r['anon_above_mb']:.0f}), cap {r['cap_mb']:.0f} MB + 64: "
                  f"{'met' if ok else 'NOT met'}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--repeat", type=int, default=2, help="timed passes per peer process")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds over the peers")
    p.add_argument("--threads", type=int, default=2,
                   help="threads (or worker processes) of every peer but headrace's")
    p.add_argument("--headrace-threads", type=int, default=None,
                   help="headrace's worker threads (default: headrace's own, one fewer than the "
                        "cores: the consumer gathers whenever it would wait)")
    p.add_argument("--peers", default=",".join(PEERS))
    p.add_argument("--workdir", default=None)
    p.add_argument("--peer", help=argparse.SUPPRESS)
    p.add_argument("--root", help=argparse.SUPPRESS)
    p.add_argument("--store", help=argparse.SUPPRESS)
    p.add_argument("--mx8", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.peer:
        child(a)
        return
    tmp = tempfile.TemporaryDirectory(prefix="bench_image_") if a.workdir is None else None
    work = a.workdir or tmp.name  # type: ignore[union-attr]
    root, store, pack = (os.path.join(work, x) for x in ("jpegs", "store", "mx8"))
    if not os.path.isdir(root):
        t = time.perf_counter()
        make_dataset(root, a.n)
        print(f"made {a.n} JPEGs in {time.perf_counter() - t:.1f}s", file=sys.stderr)
    files = list_files(root)
    sizes = [os.path.getsize(f) for f in files]
    import headrace

    if not os.path.isdir(store):
        headrace.pack_dir(root, out=store, progress=False)
    peers = a.peers.split(",")
    if "mx8" in peers and not os.path.isdir(pack):
        import mx8

        mx8.pack_dir(root, out=pack, label_mode="imagefolder")
    for f in files:  # warm the page cache
        read(f)
    from headrace._modal.image_decode import image_size

    shorts = [min(image_size(read(f))) for f in files[:200]]
    print(f"{len(files)} JPEGs, mean {np.mean(sizes) / 1e3:.0f} kB, short side "
          f"{min(shorts)}-{max(shorts)} px; decode+resize to {OUT[0]}x{OUT[1]}, batch {BATCH}, "
          f"{a.threads} threads (headrace: "
          f"{a.headrace_threads or 'its default'}), best of {a.rounds} rounds x {a.repeat} "
          "passes", file=sys.stderr)
    # Rounds interleave the peers, so a burst of load from elsewhere on the machine does not
    # land on one peer only; each peer keeps its best round. CPU ms per image (process plus
    # worker processes) is reported too: it is what the decode work costs, load or not.
    results: dict[str, dict[str, float]] = {}
    rounds: list[dict[str, float]] = []  # img/s per peer, per round
    for _ in range(a.rounds):
        this: dict[str, float] = {}
        for peer in peers:
            cmd = [sys.executable, __file__, "--peer", peer, "--root", root, "--store", store,
                   "--mx8", pack, "--repeat", str(a.repeat), "--threads", str(a.threads)]
            if a.headrace_threads is not None:
                cmd += ["--headrace-threads", str(a.headrace_threads)]
            out = subprocess.run(cmd, capture_output=True, text=True)
            if out.returncode != 0:
                print(f"{peer}: failed\n{out.stderr[-2000:]}", file=sys.stderr)
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            this[peer] = r["img_s"]
            old = results.get(peer)
            if old is not None:
                r["img_s"] = max(r["img_s"], old["img_s"])
                r["cpu_ms_per_img"] = min(r["cpu_ms_per_img"], old["cpu_ms_per_img"])
                r["peak_rss_mb"] = max(r["peak_rss_mb"], old["peak_rss_mb"])
                r["anon_above_mb"] = max(r["anon_above_mb"], old["anon_above_mb"])
            results[peer] = r
        rounds.append(this)
    report(results, rounds)
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
