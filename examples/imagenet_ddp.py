"""PyTorch's ImageNet example, ported to headrace: DDP, RandomResizedCrop/flip/normalize, resume.

What changed from ``pytorch/examples/imagenet/main.py`` (as little as possible):

    - train_dataset = datasets.ImageFolder(traindir, transforms.Compose([
    -     transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
    -     transforms.ToTensor(), normalize]))
    - train_sampler = DistributedSampler(train_dataset)
    - train_loader = DataLoader(train_dataset, batch_size=..., sampler=train_sampler, ...)
    + train_loader = headrace.image(traindir, batch=..., augment="imagenet", shuffle=True,
    +                               seed=..., to_torch=True)   # rank/world size from torchrun
      for epoch in range(start_epoch, epochs):
          train_loader.set_epoch(epoch)             # same call as DistributedSampler's
    + checkpoint["loader"] = train_loader.state_dict()   # saved beside the model: resumes
    +                                                    # mid-epoch on the same batches

Run on generated data (2 gloo ranks, CPU)::

    python -m torch.distributed.run --nproc_per_node=2 examples/imagenet_ddp.py --out /tmp/run

``--stop-after K`` stops after K steps (saving a checkpoint), ``--resume`` continues from it;
``--out`` gets one JSON line per step and rank (the batch's record ids, a pixel checksum, the
loss), so a resumed run can be compared with an uninterrupted one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from PIL import Image

import headrace


def make_imagefolder(root: Path, classes: int = 4, per_class: int = 24,
                     sides: tuple[int, int] = (40, 80)) -> None:
    """Photo-like JPEGs of odd sizes in ImageFolder layout (``root/<class>/<i>.jpg``)."""
    rng = np.random.default_rng(0)
    for c in range(classes):
        (root / f"class{c}").mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            h, w = int(rng.integers(*sides)), int(rng.integers(*sides))
            y, x = np.mgrid[0:h, 0:w]
            base = np.stack([x * (c + 1) * 3, y * 4, (x + y) * 2], -1) % 256
            img = np.clip(base + rng.normal(0, 12, (h, w, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(img).save(root / f"class{c}" / f"{i}.jpg", quality=90)


class Net(nn.Module):
    def __init__(self, classes: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, stride=2)
        self.fc = nn.Linear(8, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(F.adaptive_avg_pool2d(F.relu(self.conv(x)), 1).flatten(1))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", type=Path, default=None, help="ImageFolder root (default: generated)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--stop-after", type=int, default=None)
    p.add_argument("--resume", action="store_true")
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    args.out.mkdir(parents=True, exist_ok=True)
    data = args.data or args.out / "imagefolder"
    if args.data is None and rank == 0 and not data.exists():
        make_imagefolder(data)
    dist.barrier()

    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(Net(4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    train_loader = headrace.image(str(data), batch=args.batch, augment="imagenet",
                                  random_resized_crop=(args.size, args.size), shuffle=True,
                                  seed=1, to_torch=True, threads=2)
    ckpt_path = args.out / f"checkpoint-rank{rank}.pt"
    start_epoch, step = 0, 0
    if args.resume:
        ckpt = torch.load(ckpt_path, weights_only=False)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        start_epoch, step = ckpt["epoch"], ckpt["step"]
        train_loader.load_state_dict(ckpt["loader"])  # mid-epoch: the rest of that epoch
    log_path = args.out / f"steps-rank{rank}.jsonl"
    for epoch in range(start_epoch, args.epochs):
        if not (args.resume and epoch == start_epoch):
            train_loader.set_epoch(epoch)
        for images, target in train_loader:
            loss = F.cross_entropy(model(images), target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            with open(log_path, "a") as log:
                log.write(json.dumps({"step": step, "epoch": epoch,
                                  "ids": train_loader.last_ids.tolist(),
                                  "pixels": round(float(images.double().sum()), 3),
                                  "loss": round(loss.item(), 6)}) + "\n")
            if step == args.stop_after:
                torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                            "epoch": epoch, "step": step,
                            "loader": train_loader.state_dict()}, ckpt_path)
                break
        else:
            continue
        break
    train_loader.close()
    dist.barrier()  # neither rank leaves while the other is still in a collective
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
    # With torch 2.13 a DDP model keeps the gloo process group (and its worker threads) alive past
    # destroy_process_group, and a worker that frees its last finished work only after interpreter
    # teardown began needs the GIL there and aborts the process ("terminate called without an
    # active exception"; seen in about 1 run in 10 on a loaded machine, see pytorch/pytorch#179291).
    # Everything is saved and flushed by now, so leave without the teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
