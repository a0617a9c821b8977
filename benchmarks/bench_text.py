"""Tokens/s delivered by headrace.text vs a plain NumPy memmap (the ceiling) vs mx8 1.0.7's text loader.

One process, one synthetic corpus (random words, a WordLevel tokenizer saved as a local
``tokenizer.json``, nothing downloaded), seq_len 2048, batch 32:

* ``numpy memmap``: the concatenated token stream (EOS between documents) as one flat int32 file;
  a batch is 32 contiguous slices of 2048 tokens copied into one array: the ceiling.
* ``headrace concat``/``concat shuffled``/``pad``: ``headrace.text`` on the store ``pack_text`` made.
* ``headrace stream``: ``headrace.text(raw folder, stream=True)``, tokenizing in the loader's threads
  like mx8 (batch = 32 documents, so rows per batch vary).
* ``mx8 1.0.7``: ``mx8.text`` on an ``mx8.pack_dir`` of the same documents (one file each), same
  tokenizer file; it tokenizes while loading and pads each document (headrace ``pad`` makes the
  same rows).

"tokens/s" counts every delivered position (batch x seq_len); "real tok/s" only mask-True ones;
"CPU ms/Mtok" is the process's CPU time (all threads) per million delivered tokens, the figure to
compare on a shared machine.

    .venv/bin/python benchmarks/bench_text.py [--docs 4000] [--words 2000] [--seconds 8]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

import headrace

SEQ, BATCH = 2048, 32


def make_corpus(root: str, docs: int, words: int, seed: int = 0) -> tuple[str, str]:
    from tokenizers import Tokenizer, models, pre_tokenizers

    rng = np.random.default_rng(seed)
    vocab_words = [f"w{i}" for i in range(5000)]
    vocab = {"[UNK]": 0, "<|endoftext|>": 1, "<s>": 2} | {w: 3 + i for i, w in enumerate(vocab_words)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<|endoftext|>", "<s>"])
    tok_path = os.path.join(root, "tokenizer.json")
    tok.save(tok_path)
    raw = os.path.join(root, "raw")
    os.makedirs(raw)
    lengths = rng.integers(words // 4, words * 7 // 4, docs)
    for d, n in enumerate(lengths.tolist()):
        ids = rng.integers(0, len(vocab_words), n)
        with open(os.path.join(raw, f"{d:06d}.txt"), "w") as f:
            f.write(" ".join(vocab_words[i] for i in ids.tolist()))
    return raw, tok_path


def timed(make: Callable[[], Iterator[Any]], count: Callable[[Any], tuple[int, int]],
          seconds: float) -> tuple[float, float, float, float]:
    """(seconds to the first batch, tokens/s, real tokens/s, CPU seconds per million tokens)
    after the first batch, over at most ``seconds`` or until the iterator ends.

    CPU time is the whole process's (consumer and worker threads): what a batch costs, robust to
    other load on a shared machine, unlike wall-clock rates.
    """
    t0 = time.perf_counter()
    batches = make()
    next(batches)
    first_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    c0 = time.process_time()
    tot = real = 0
    for b in batches:
        a, r = count(b)
        tot += a
        real += r
        if time.perf_counter() - t0 >= seconds:
            break
    dt = time.perf_counter() - t0
    cpu = time.process_time() - c0
    return first_s, tot / dt, real / dt, cpu / max(tot, 1) * 1e6


def memmap_batches(path: str, total: int, shuffle: bool) -> Iterator[np.ndarray]:
    mm = np.memmap(path, np.int32, mode="r")
    windows = -(-total // SEQ)
    order = np.random.default_rng(0).permutation(windows) if shuffle else np.arange(windows)
    while True:
        for k in range(0, windows - BATCH + 1, BATCH):
            out = np.empty((BATCH, SEQ), np.int32)
            for r, w in enumerate(order[k:k + BATCH].tolist()):
                seg = mm[w * SEQ:(w + 1) * SEQ]
                out[r, :len(seg)] = seg
                out[r, len(seg):] = 1
            yield out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--docs", type=int, default=4000)
    ap.add_argument("--words", type=int, default=2000, help="mean words (tokens) per document")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--no-mx8", action="store_true")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="bench-text-")
    try:
        raw, tok_path = make_corpus(root, args.docs, args.words)
        t0 = time.perf_counter()
        info = headrace.pack_text(raw, os.path.join(root, "tok.hr"), tokenizer=tok_path)
        pack_s = time.perf_counter() - t0
        ntok = info["tokens"]
        print(f"corpus: {info['documents']} documents, {ntok} tokens; pack_text "
              f"{pack_s:.2f} s ({ntok / pack_s / 1e6:.2f} M tok/s, tokenizer.json WordLevel)")
        # the ceiling: the concat stream as one flat int32 file
        with headrace.open(os.path.join(root, "tok.hr")) as st:
            recs = st.gather(np.arange(len(st)), "tokens")["tokens"].to_list()
        stream = np.concatenate([np.append(r, np.int32(1)) for r in recs]).astype(np.int32)
        del recs
        flat = os.path.join(root, "flat.i32")
        stream.tofile(flat)
        total = len(stream)
        del stream

        results: list[tuple[str, float, float, float, float]] = []

        def full(b: Any) -> tuple[int, int]:
            return b.size, b.size

        def hr_count(b: dict[str, Any]) -> tuple[int, int]:
            return b["tokens"].size, int(np.count_nonzero(b["mask"]))

        for name, shuffle in (("numpy memmap (ceiling)", False),
                              ("numpy memmap, shuffled windows", True)):
            results.append((name, *timed(lambda s=shuffle: memmap_batches(flat, total, s),
                                         full, args.seconds)))
        tok_store = os.path.join(root, "tok.hr")
        for name, data, kw in (
                ("headrace.text concat", tok_store, {}),
                ("headrace.text concat shuffled", tok_store, {"shuffle": True}),
                ("headrace.text pad (mx8 rows)", tok_store, {"packing": "pad"}),
                ("headrace.text stream (tokenize)", raw,
                 {"packing": "pad", "stream": True, "tokenizer": tok_path,
                  "store": os.path.join(root, "manifests")})):
            loaders: list[Any] = []

            def make(data: str = data, kw: dict[str, Any] = kw,
                     loaders: list[Any] = loaders) -> Iterator[Any]:
                loaders.append(headrace.text(data, seq_len=SEQ, batch=BATCH, epochs=None, **kw))
                return iter(loaders[-1])

            results.append((name, *timed(make, hr_count, args.seconds)))
            loaders[-1].close()
        if not args.no_mx8:
            results.extend(run_mx8(root, raw, tok_path, args.seconds))
        base, base_cpu = results[0][2], results[0][4]
        print(f"\nseq_len {SEQ}, batch {BATCH}, {os.cpu_count()} CPUs")
        print(f"{'loader':34s} {'1st batch':>10s} {'tokens/s':>10s} {'real tok/s':>11s} "
              f"{'vs memmap':>9s} {'CPU ms/Mtok':>11s} {'CPU vs memmap':>13s}")
        for name, first_s, tps, real, cpu in results:
            print(f"{name:34s} {first_s * 1e3:7.1f} ms {tps / 1e6:8.1f} M {real / 1e6:9.1f} M "
                  f"{tps / base:8.3f}x {cpu * 1e3:11.2f} {cpu / base_cpu:12.1f}x")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run_mx8(root: str, raw: str, tok_path: str,
            seconds: float) -> list[tuple[str, float, float, float, float]]:
    try:
        import mx8
        import torch  # noqa: F401  (mx8 imports it for its batches: keep that out of the timing)
    except ImportError as e:
        print(f"mx8 not installed ({e}); pip install mx8==1.0.7")
        return []
    packed = os.path.join(root, "mx8")
    os.environ.setdefault("MX8_MANIFEST_STORE_ROOT", os.path.join(root, "mx8-manifests"))
    t0 = time.perf_counter()
    mx8.pack_dir(raw, out=packed)
    print(f"mx8.pack_dir: {time.perf_counter() - t0:.2f} s (copies text; tokenizes at load)")

    def count(b: Any) -> tuple[int, int]:
        return int(b.token_ids.numel()), int(b.attention_mask.sum())

    def batches() -> Iterator[Any]:  # one pass (mx8 has no epochs)
        return iter(mx8.text(packed, tokenizer=tok_path, seq_len=SEQ, stride=SEQ, batch=BATCH))

    try:
        got = timed(batches, count, seconds)
    except Exception as e:  # report why, keep the rest of the table
        print(f"mx8.text failed: {type(e).__name__}: {e}")
        return []
    return [("mx8 1.0.7 text (pad rows)", *got)]


if __name__ == "__main__":
    main()
