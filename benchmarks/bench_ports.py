"""The three ports of examples/ against their original loaders: whole-loop samples/s and CPU.

Each peer runs the port's training loop (the same model step as its example) over the same
generated data in its own subprocess, and reports samples/s over the whole loop (loading and
training) and CPU milliseconds per sample (its process and any worker processes: user + system),
the best of ``--repeat`` passes after one warm-up pass.

* imagenet: ``torch.utils.data.DataLoader(num_workers=2)`` over an ImageFolder-style dataset
  doing what torchvision's ``RandomResizedCrop`` + ``RandomHorizontalFlip`` + ``ToTensor`` +
  ``Normalize`` do on PIL images (torchvision cannot be installed beside torch 2.13 here), vs
  ``headrace.image(augment="imagenet", random_resized_crop=...)``; one process (the examples'
  DDP wrapper adds the same all-reduce to both).
* flax: ``grain.python.DataLoader`` (``IndexSampler``, a normalising ``MapTransform``,
  ``Batch``), vs ``headrace.jax.iterator(headrace.Loader(..., transform=normalize))``.
* nanogpt: nanoGPT's ``get_batch`` (a fresh ``np.memmap``, ``torch.randint`` offsets, a stack of
  ``from_numpy`` slices per batch), vs ``headrace.text("train.bin", windows="random", ...)``.

Run: ``.venv/bin/python benchmarks/bench_ports.py [--images 600] [--size 128] [--side 300]
[--repeat 2]`` (images of 300-450 px a side by default, ImageNet's range).
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "examples")]


def _cpu() -> float:
    a = resource.getrusage(resource.RUSAGE_SELF)
    b = resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def _measure(run_pass, repeat: int) -> dict[str, float]:
    run_pass()  # warm-up: page cache, JIT, worker start-up paths
    best = None
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), _cpu()
        n = run_pass()
        dt, dc = time.perf_counter() - t0, _cpu() - c0
        r = {"samples_per_s": n / dt, "cpu_ms_per_sample": 1000 * dc / n, "samples": n}
        if best is None or r["samples_per_s"] > best["samples_per_s"]:
            best = r
    assert best is not None
    return best


# -- imagenet ------------------------------------------------------------------------------------

def imagenet(peer: str, data: Path, size: int, repeat: int) -> dict[str, float]:
    import math
    import random

    import numpy as np
    import torch
    import torch.nn.functional as F
    from imagenet_ddp import Net
    from PIL import Image

    import headrace

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Net(4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mean = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
    files = sorted((str(p), int(p.parent.name[5:])) for p in data.glob("*/*.jpg"))

    class Folder(torch.utils.data.Dataset):
        """ImageFolder + RandomResizedCrop(size) + flip + ToTensor + Normalize, on PIL."""

        def __len__(self) -> int:
            return len(files)

        def __getitem__(self, i: int):
            path, label = files[i]
            img = Image.open(path).convert("RGB")
            w, h = img.size
            area = w * h
            for _ in range(10):  # torchvision's RandomResizedCrop.get_params
                target = area * random.uniform(0.08, 1.0)
                ar = math.exp(random.uniform(math.log(3 / 4), math.log(4 / 3)))
                cw, ch = round(math.sqrt(target * ar)), round(math.sqrt(target / ar))
                if 0 < cw <= w and 0 < ch <= h:
                    top, left = random.randint(0, h - ch), random.randint(0, w - cw)
                    break
            else:
                ch, cw, top, left = h, w, 0, 0
            img = img.resize((size, size), Image.BILINEAR, box=(left, top, left + cw, top + ch))
            if random.random() < 0.5:
                img = img.transpose(Image.FLIP_LEFT_RIGHT)
            x = torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1).float().div(255)
            return (x - mean) / std, label

    def step(images, target) -> None:
        loss = F.cross_entropy(model(images), target)
        opt.zero_grad()
        loss.backward()
        opt.step()

    if peer == "torch":
        # workers exit at the end of each pass, so their CPU time is counted (RUSAGE_CHILDREN)
        loader = torch.utils.data.DataLoader(Folder(), batch_size=32, shuffle=True, num_workers=2)

        def run_pass() -> int:
            n = 0
            for images, target in loader:
                step(images, target)
                n += len(target)
            return n
    else:
        ld = headrace.image(str(data), batch=32, augment="imagenet",
                            random_resized_crop=(size, size), shuffle=True, seed=0,
                            to_torch=True, threads=2)
        state = {"epoch": 0}

        def run_pass() -> int:
            ld.set_epoch(state["epoch"])
            state["epoch"] += 1
            n = 0
            for images, target in ld:
                step(images, target)
                n += len(target)
            return n
    return _measure(run_pass, repeat)


# -- flax ----------------------------------------------------------------------------------------

def flax(peer: str, repeat: int) -> dict[str, float]:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from flax_grain import MLP, make_data, normalize

    import headrace
    import headrace.jax

    images, labels = make_data(4096)
    model, tx = MLP(), optax.adam(1e-3)
    params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 28, 28, 1)))
    state = {"params": params, "opt": tx.init(params), "epoch": 0}

    @jax.jit
    def train_step(params, opt_state, batch):
        def loss_fn(p):
            logits = model.apply(p, batch["image"])
            return optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()
        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state)
        return optax.apply_updates(params, updates), opt_state, loss

    def consume(batches) -> int:
        n = 0
        for b in batches:
            state["params"], state["opt"], loss = train_step(state["params"], state["opt"], b)
            n += len(b["label"])
        jax.block_until_ready(loss)
        return n

    if peer == "grain":
        import grain.python as grain

        class Source(grain.RandomAccessDataSource):
            def __len__(self) -> int:
                return len(labels)

            def __getitem__(self, i: int):
                return {"image": images[i], "label": labels[i]}

        class Normalize(grain.MapTransform):
            def map(self, r):
                return {"image": r["image"].astype(np.float32) / 255.0, "label": r["label"]}

        def run_pass() -> int:
            sampler = grain.IndexSampler(len(labels), shard_options=grain.NoSharding(),
                                         shuffle=True, num_epochs=1, seed=state["epoch"])
            state["epoch"] += 1
            loader = grain.DataLoader(data_source=Source(), sampler=sampler,
                                      operations=[Normalize(), grain.Batch(64, drop_remainder=True)],
                                      worker_count=0)
            return consume(loader)
    else:
        ld = headrace.Loader({"image": images, "label": labels}, batch=64, shuffle=True, seed=0,
                             drop_last=True, transform=normalize, threads=2)

        def run_pass() -> int:
            ld.set_epoch(state["epoch"])
            state["epoch"] += 1
            return consume(headrace.jax.iterator(ld))
    return _measure(run_pass, repeat)


# -- nanogpt -------------------------------------------------------------------------------------

def nanogpt(peer: str, data: Path, repeat: int, steps: int = 300) -> dict[str, float]:
    import numpy as np
    import torch
    from nanogpt import Bigram

    import headrace

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Bigram()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    block, batch = 64, 16

    def get_batch_nanogpt():
        d = np.memmap(data, dtype=np.uint16, mode="r")
        ix = torch.randint(len(d) - block, (batch,))
        x = torch.stack([torch.from_numpy(d[i:i + block].astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy(d[i + 1:i + 1 + block].astype(np.int64)) for i in ix])
        return x, y

    loader = headrace.text(str(data), dtype="uint16", seq_len=block, batch=batch,
                           windows="random", targets=True, tokens_dtype="int64", seed=0,
                           epochs=None, to_torch=True, threads=2)

    def get_batch_headrace():
        b = next(loader)
        return b["inputs"], b["targets"]

    get_batch = get_batch_nanogpt if peer == "nanogpt" else get_batch_headrace

    def run_pass() -> int:
        X, Y = get_batch()
        for _ in range(steps):
            loss = model(X, Y)
            X, Y = get_batch()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        return steps * batch
    return _measure(run_pass, repeat)


def _child(args: argparse.Namespace) -> None:
    port, peer = args.child
    if port == "imagenet":
        r = imagenet(peer, Path(args.data), args.size, args.repeat)
    elif port == "flax":
        r = flax(peer, args.repeat)
    else:
        r = nanogpt(peer, Path(args.data) / "train.bin", args.repeat)
    print(json.dumps(r))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--images", type=int, default=600)
    p.add_argument("--size", type=int, default=128, help="the crop's side")
    p.add_argument("--side", type=int, default=300, help="images' shorter side, from")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--ports", default="imagenet,flax,nanogpt")
    p.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    p.add_argument("--data", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        _child(args)
        return
    import numpy as np
    from imagenet_ddp import make_imagefolder

    peers = {"imagenet": ("torch", "headrace"), "flax": ("grain", "headrace"),
             "nanogpt": ("nanogpt", "headrace")}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        make_imagefolder(root / "images", classes=4, per_class=args.images // 4,
                         sides=(args.side, args.side + args.side // 2))
        rng = np.random.default_rng(0)
        rng.integers(0, 512, 2_000_000).astype(np.uint16).tofile(root / "train.bin")
        env = dict(os.environ, OMP_NUM_THREADS="1", JAX_PLATFORMS="cpu",
                   PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT / "examples")]))
        print(f"{'port':<10}{'loader':<10}{'samples/s':>12}{'CPU ms/sample':>16}")
        for port in args.ports.split(","):
            data = root / "images" if port == "imagenet" else root
            for peer in peers[port]:
                out = subprocess.run(
                    [sys.executable, __file__, "--child", port, peer, "--data", str(data),
                     "--size", str(args.size), "--repeat", str(args.repeat)],
                    env=env, capture_output=True, text=True, check=False)
                if out.returncode != 0:
                    print(f"{port:<10}{peer:<10} failed: {out.stderr[-800:]}")
                    continue
                r = json.loads(out.stdout.strip().splitlines()[-1])
                print(f"{port:<10}{peer:<10}{r['samples_per_s']:>12.0f}"
                      f"{r['cpu_ms_per_sample']:>16.3f}")


if __name__ == "__main__":
    main()
