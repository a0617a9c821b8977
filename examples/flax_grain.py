"""A Flax/optax loop in the style of the Grain tutorials, with headrace in place of Grain.

The Grain version::

    source = MnistLikeSource(images, labels)            # __len__ + __getitem__ -> dict
    sampler = grain.IndexSampler(len(source), shuffle=True, seed=0, num_epochs=epochs,
                                 shard_options=grain.NoSharding())
    loader = grain.DataLoader(data_source=source, sampler=sampler,
                              operations=[Normalize(), grain.Batch(batch, drop_remainder=True)],
                              worker_count=0)
    for batch in loader: state = train_step(state, batch)

The port (the arrays are the source; normalising is a ``transform`` in the loader's threads;
``headrace.jax.iterator`` places batches on the device ahead of the step)::

    loader = headrace.Loader({"image": images, "label": labels}, batch=batch, shuffle=True,
                             seed=0, epochs=epochs, drop_last=True, transform=normalize)
    it = headrace.jax.iterator(loader)
    for batch in it: state = train_step(state, batch)
    saved = it.state_dict()          # exactly the batches the loop received

Run on generated data: ``python examples/flax_grain.py --out /tmp/flax`` (``--stop-after K``
and ``--resume`` as in the other examples; one JSON line per step).
"""

from __future__ import annotations

import argparse
import json
import pickle
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

import headrace
import headrace.jax


def make_data(n: int = 512) -> tuple[np.ndarray, np.ndarray]:
    """MNIST-shaped digits: 28x28 uint8 images whose class sets a bright stripe."""
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 10, n).astype(np.int32)
    images = rng.integers(0, 60, (n, 28, 28, 1)).astype(np.uint8)
    for i, c in enumerate(labels):
        images[i, 2 + 2 * c:4 + 2 * c] = 255
    return images, labels


def normalize(batch: dict[str, np.ndarray], ids: np.ndarray) -> dict[str, np.ndarray]:
    return {"image": batch["image"].astype(np.float32) / 255.0, "label": batch["label"]}


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = x.reshape((x.shape[0], -1))
        return nn.Dense(10)(nn.relu(nn.Dense(64)(x)))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--stop-after", type=int, default=None)
    p.add_argument("--resume", action="store_true")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    images, labels = make_data()

    model = MLP()
    tx = optax.adam(1e-3)
    params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 28, 28, 1)))
    opt_state = tx.init(params)

    @jax.jit
    def train_step(params: Any, opt_state: Any, batch: dict[str, jax.Array]) -> Any:
        def loss_fn(p: Any) -> jax.Array:
            logits = model.apply(p, batch["image"])
            return optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()
        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state)
        return optax.apply_updates(params, updates), opt_state, loss

    loader = headrace.Loader({"image": images, "label": labels}, batch=args.batch,
                             shuffle=True, seed=0, epochs=args.epochs, drop_last=True,
                             transform=normalize, threads=2)
    it = headrace.jax.iterator(loader)
    step = 0
    ckpt_path = args.out / "ckpt.pkl"
    if args.resume:
        ckpt = pickle.loads(ckpt_path.read_bytes())
        params, opt_state, step = ckpt["params"], ckpt["opt_state"], ckpt["step"]
        it.load_state_dict(ckpt["data"])
    log_path = args.out / "steps.jsonl"
    for batch in it:
        params, opt_state, loss = train_step(params, opt_state, batch)
        step += 1
        with open(log_path, "a") as log:
            log.write(json.dumps({"step": step, "labels": np.asarray(batch["label"]).tolist(),
                              "pixels": round(float(jnp.sum(batch["image"])), 3),
                              "loss": round(float(loss), 6)}) + "\n")
        if step == args.stop_after:
            ckpt_path.write_bytes(pickle.dumps({"params": jax.device_get(params),
                                                "opt_state": jax.device_get(opt_state),
                                                "step": step, "data": it.state_dict()}))
            break
    loader.close()


if __name__ == "__main__":
    main()
