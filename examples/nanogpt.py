"""nanoGPT's training loop over ``train.bin``, with headrace in place of ``get_batch``.

nanoGPT (``train.py``) reads tokens from a flat ``uint16`` memmap with random offsets, and
fetches the next batch *before* the step finishes::

    def get_batch(split):
        data = np.memmap(os.path.join(data_dir, f"{split}.bin"), dtype=np.uint16, mode="r")
        ix = torch.randint(len(data) - block_size, (batch_size,))
        x = torch.stack([torch.from_numpy(data[i:i + block_size].astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + block_size].astype(np.int64))
                         for i in ix])
        return x, y

The port (``windows="random"`` is the same sampling: every offset, drawn with replacement)::

    loader = headrace.text("train.bin", dtype="uint16", seq_len=block_size, batch=batch_size,
                           windows="random", targets=True, tokens_dtype="int64", seed=seed,
                           epochs=None, to_torch=True)
    def get_batch(split):
        b = next(loader)
        return b["inputs"], b["targets"]

Because the loop holds one batch ahead, the checkpoint saved at ``iter_num`` is
``loader.checkpoint(at=loader.delivered - 1)``: the token that resumes at the batch fetched but
not trained on yet (``loader.checkpoint()`` would skip it). nanoGPT itself does not resume its
data.

Run on generated tokens: ``python examples/nanogpt.py --out /tmp/gpt`` (``--stop-after K`` and
``--resume`` as in the other examples; one JSON line per step with a checksum of its batch).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
from torch.nn import functional as F

import headrace

VOCAB = 512


class Bigram(nn.Module):
    """The smallest language model nanoGPT's loop can train."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, VOCAB)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.emb(idx)
        return F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--data", type=Path, default=None, help="a train.bin (default: generated)")
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--block", type=int, default=32)
    p.add_argument("--stop-after", type=int, default=None)
    p.add_argument("--resume", action="store_true")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    data = args.data or args.out / "train.bin"
    if args.data is None and not data.exists():  # what nanoGPT's prepare.py writes
        rng = np.random.default_rng(0)
        np.cumsum(rng.integers(0, 7, 200_000), dtype=np.int64).__mod__(VOCAB).astype(
            np.uint16).tofile(data)

    torch.manual_seed(1337)
    model = Bigram()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    iter_num, resume = 0, None
    ckpt_path = args.out / "ckpt.pt"
    if args.resume:
        ckpt = torch.load(ckpt_path, weights_only=False)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        iter_num, resume = ckpt["iter_num"], ckpt["loader"]
    loader = headrace.text(str(data), dtype="uint16", seq_len=args.block, batch=args.batch,
                           windows="random", targets=True, tokens_dtype="int64", seed=1337,
                           epochs=None, to_torch=True, threads=2, resume=resume)

    def get_batch() -> tuple[torch.Tensor, torch.Tensor]:
        b = next(loader)
        return b["inputs"], b["targets"]

    log_path = args.out / "steps.jsonl"
    X, Y = get_batch()  # fetch the very first batch
    while iter_num < args.iters:
        if iter_num == args.stop_after:
            # X, Y are fetched but not trained on: resume at them, not after them
            token = loader.checkpoint(at=loader.delivered - 1)
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "iter_num": iter_num, "loader": token}, ckpt_path)
            break
        loss = model(X, Y)
        batch_sum = int(X.sum()) * 7 + int(Y.sum())
        X, Y = get_batch()  # immediately async prefetch next batch while model is doing the step
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        iter_num += 1
        with open(log_path, "a") as log:
            log.write(json.dumps({"iter": iter_num, "batch": batch_sum,
                              "loss": round(loss.item(), 6)}) + "\n")
    loader.close()


if __name__ == "__main__":
    main()
