"""What mixing costs: ``headrace.mix`` over two loaders, side by side in one process.

Two in-memory sources of ``--rows`` x 1,024-byte uint8 rows plus int64 labels, weights 7:3, shuffled,
batches of 256, ``--batches`` batches per peer per round; peers take turns each round so load from
other processes hits them alike. Peers:

* ``loader``: one ``headrace.Loader`` read directly (the ceiling: no mixing at all);
* ``mix``: ``headrace.mix([a, b], weights=[7, 3])`` over two such loaders, with their shared budget;
* ``naive``: ``random.choices`` between the same two loaders' iterators (what people write by hand:
  not resumable, proportions only on average);
* ``grain``: ``grain.MapDataset.mix([a, b], weights=[0.7, 0.3])`` (per record), shuffled, batched,
  ``to_iter_dataset`` with 2 threads.

And the LLM case, token windows of two pre-tokenized corpora (``--docs`` documents of 50-1,000
tokens each, ``seq_len`` 2,049, batches of 16 windows): ``text`` (one ``headrace.text`` loader, the
ceiling) and ``mix-text`` (``headrace.mix`` of two, 7:3, on one shared byte budget).

Reports rows/s (median over rounds), the ratio to ``loader`` (``text`` for ``mix-text``), and the
realized share of source A over the batches read (7/10 requested).

Run::

    .venv/bin/python benchmarks/bench_mix.py                 # ~1 minute on 2 cores
    .venv/bin/python benchmarks/bench_mix.py --rows 20000 --batches 100 --rounds 2
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable, Iterator

import numpy as np

import headrace

ROW_BYTES = 1024
BATCH = 256


def _arrays(rows: int, tag: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(tag)
    x = rng.integers(0, 255, size=(rows, ROW_BYTES), dtype=np.uint8)
    x[:, 0] = tag  # which source a row came from
    return {"x": x, "y": np.arange(rows, dtype=np.int64)}


def _loader(data: dict[str, np.ndarray], seed: int) -> headrace.Loader:
    return headrace.Loader(data, batch=BATCH, order="shuffle", seed=seed, epochs=None, threads=2)


def _run(batches: Iterator[dict[str, np.ndarray]], count: int) -> tuple[float, float]:
    t0 = time.perf_counter()
    a = rows = 0
    for _, b in zip(range(count), batches, strict=False):
        rows += len(b["y"])
        a += int(np.count_nonzero(b["x"][:, 0] == 0))
    return rows / (time.perf_counter() - t0), a / max(rows, 1)


def peer_loader(a: dict, b: dict, count: int) -> tuple[float, float]:
    with _loader(a, 1) as ld:
        return _run(ld, count)


def peer_mix(a: dict, b: dict, count: int) -> tuple[float, float]:
    with headrace.mix([_loader(a, 1), _loader(b, 2)], weights=[7, 3]) as m:
        return _run(m, count)


def peer_naive(a: dict, b: dict, count: int) -> tuple[float, float]:
    la, lb = _loader(a, 1), _loader(b, 2)
    rng = random.Random(0)

    def gen() -> Iterator[dict[str, np.ndarray]]:
        while True:
            yield next(la) if rng.random() < 0.7 else next(lb)

    try:
        return _run(gen(), count)
    finally:
        la.close()
        lb.close()


def peer_grain(a: dict, b: dict, count: int) -> tuple[float, float]:
    import grain

    class Rows:
        def __init__(self, d: dict[str, np.ndarray]) -> None:
            self.d = d

        def __len__(self) -> int:
            return len(self.d["y"])

        def __getitem__(self, i: int) -> dict[str, np.ndarray]:
            return {"x": self.d["x"][i], "y": self.d["y"][i]}

    ds = grain.MapDataset.mix([grain.MapDataset.source(Rows(a)).shuffle(seed=1),
                               grain.MapDataset.source(Rows(b)).shuffle(seed=2)],
                              weights=[0.7, 0.3])
    it = iter(ds.repeat().batch(BATCH).to_iter_dataset(
        grain.ReadOptions(num_threads=2, prefetch_buffer_size=16)))
    return _run(it, count)


TEXT_BATCH = 16
SEQ = 2049


def _ints(text: str) -> list[int]:
    return [int(t) for t in text.split()]


_ints.eos_id = 0  # type: ignore[attr-defined]


def _corpus(root: str, docs: int, tag: int) -> str:
    """A token store of ``docs`` documents; every token of corpus ``tag`` is ``tag + 2 * k``."""
    import json
    import os

    rng = np.random.default_rng(tag)
    src = os.path.join(root, f"c{tag}.jsonl")
    with open(src, "w") as f:
        for n in rng.integers(50, 1000, docs):
            ids = (tag + 2 * rng.integers(1, 30000, n)).tolist()
            f.write(json.dumps({"text": " ".join(map(str, ids))}) + "\n")
    out = os.path.join(root, f"c{tag}.hr")
    headrace.pack_text(src, out, tokenizer=_ints, progress=False)
    return out


def _text(path: str, seed: int) -> headrace.TextLoader:
    return headrace.text(path, batch=TEXT_BATCH, seq_len=SEQ, shuffle=True, seed=seed,
                         epochs=None, threads=2)


def _run_text(batches: Iterator[dict[str, np.ndarray]], count: int) -> tuple[float, float]:
    t0 = time.perf_counter()
    a = rows = 0
    for _, b in zip(range(count), batches, strict=False):
        rows += len(b["tokens"])
        # corpus 1's tokens are odd (its EOS, 0, is not: a row's majority says)
        a += int(np.count_nonzero((b["tokens"] % 2).mean(axis=1) > 0.5))
    return rows / (time.perf_counter() - t0), 1 - a / max(rows, 1)


def peer_text(a: str, b: str, count: int) -> tuple[float, float]:
    with _text(a, 1) as ld:
        return _run_text(ld, count)


def peer_mix_text(a: str, b: str, count: int) -> tuple[float, float]:
    with headrace.mix([_text(a, 1), _text(b, 2)], weights=[7, 3]) as m:
        return _run_text(m, count)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--batches", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--docs", type=int, default=2000)
    args = parser.parse_args()
    a, b = _arrays(args.rows, 0), _arrays(args.rows, 1)
    peers: dict[str, Callable[[dict, dict, int], tuple[float, float]]] = {
        "loader": peer_loader, "mix": peer_mix, "naive": peer_naive, "grain": peer_grain}
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in peers}
    for _ in range(args.rounds):
        for name, fn in peers.items():
            results[name].append(fn(a, b, args.batches))
    import tempfile

    with tempfile.TemporaryDirectory() as root:
        ta, tb = _corpus(root, args.docs, 0), _corpus(root, args.docs, 1)
        text_peers = {"text": peer_text, "mix-text": peer_mix_text}
        for name in text_peers:
            results[name] = []
        for _ in range(args.rounds):
            for name, tfn in text_peers.items():
                results[name].append(tfn(ta, tb, args.batches))
    print(f"{args.batches} batches per peer (arrays: {BATCH} rows x {ROW_BYTES} B; text: "
          f"{TEXT_BATCH} windows x {SEQ} tokens), weights 7:3, median of {args.rounds} rounds")
    print(f"{'peer':8} {'rows/s':>12} {'vs single':>10} {'share A':>8}")
    for name, rs in results.items():
        base = statistics.median(r for r, _ in results["text" if "text" in name else "loader"])
        rate = statistics.median(r for r, _ in rs)
        share = statistics.median(s for _, s in rs)
        print(f"{name:8} {rate:12,.0f} {rate / base:10.2f} {share:8.3f}")


if __name__ == "__main__":
    main()
