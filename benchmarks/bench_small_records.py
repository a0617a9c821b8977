"""Small-record codecs: stored size and gather speed of raw, zstd, lz4 and zstd_dict.

    .venv/bin/python benchmarks/bench_small_records.py          # 200,000 JSON-like rows

Per-record compression restarts from nothing on every record, so records of a few hundred bytes
barely shrink; a dictionary trained on the field's own records (``zstd_dict``) carries what they
share. The records are metadata rows as a captioned-image or tabular dataset stores them: the same
keys in the same order, values drawn from vocabularies and ranges (ids, floats, words, a URL), from
~150 to ~400 bytes. Each codec's store is packed once under ``benchmarks/_data/`` (gitignored).

Reported per codec: the bytes of the record data (chunk files; the dictionary is counted for
zstd_dict), the ratio raw/codec, and gather throughput: random batches of 256 (ids with
replacement, unsorted, as a sampler draws them), after one full pass (which also verifies every
record's crc32c); records/s over the median batch time of ``--batches`` batches.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

import headrace

DATA_DIR = Path(__file__).resolve().parent / "_data"
WORDS = ["red", "green", "blue", "small", "large", "wooden", "metal", "glass", "river",
         "mountain", "city", "street", "dog", "cat", "bird", "car", "tree", "house", "window",
         "door", "light", "shadow", "morning", "evening", "summer", "winter", "old", "new"]
TAGS = ["outdoor", "indoor", "portrait", "landscape", "night", "day", "people", "animal",
        "vehicle", "food", "art", "architecture", "nature", "sport"]


def make_records(n: int, seed: int = 0) -> list[bytes]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        k = int(rng.integers(4, 14))
        caption = " ".join(WORDS[j] for j in rng.integers(0, len(WORDS), k))
        row = {
            "id": int(i), "shard": int(i // 10_000), "width": int(rng.integers(200, 2000)),
            "height": int(rng.integers(200, 2000)), "aesthetic": round(float(rng.random()) * 10, 3),
            "nsfw": round(float(rng.random()) * 0.1, 4), "caption": caption,
            "tags": [TAGS[j] for j in rng.integers(0, len(TAGS), int(rng.integers(1, 5)))],
            "url": f"https://images.example.org/{int(rng.integers(0, 1 << 40)):x}/{i}.jpg",
            "license": ("cc-by", "cc-by-sa", "cc0")[int(rng.integers(0, 3))],
        }
        out.append(json.dumps(row).encode())
    return out


def ensure_store(records: list[bytes], codec: str, tag: str) -> Path:
    path = DATA_DIR / f"small-{tag}-{codec}"
    if (path / "meta.json").exists():
        return path
    shutil.rmtree(path, ignore_errors=True)
    t0 = time.perf_counter()
    with headrace.create(path, fields={"meta": {"dtype": "bytes", "codec": codec}}) as w:
        for start in range(0, len(records), 50_000):
            w.append({"meta": records[start:start + 50_000]})
    print(f"packed {codec}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return path


def data_bytes(path: Path) -> int:
    chunks = sum(p.stat().st_size for p in (path / "chunks").iterdir())
    return chunks + sum(p.stat().st_size for p in path.glob("*.dict"))


def bench(path: Path, n: int, *, batch: int, batches: int, seed: int) -> float:
    st = headrace.open(path)
    rng = np.random.default_rng(seed)
    for ids in np.array_split(rng.permutation(n), max(1, n // batch)):  # first pass: verifies
        st.gather(ids)
    times = []
    for _ in range(batches):
        ids = rng.integers(0, n, batch)
        t0 = time.perf_counter()
        st.gather(ids)
        times.append(time.perf_counter() - t0)
    st.close()
    return batch / float(np.median(times))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--records", type=int, default=200_000)
    p.add_argument("--codecs", default="raw,zstd,lz4,zstd_dict")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--batches", type=int, default=400)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    records = make_records(args.records, args.seed)
    mean = sum(map(len, records)) / len(records)
    print(f"{args.records} records, mean {mean:.0f} B, min {min(map(len, records))} B, "
          f"max {max(map(len, records))} B")
    tag = f"{args.records}-{args.seed}"
    sizes = {}
    print("| codec | data bytes | raw / codec | gather rec/s (median, batch "
          f"{args.batch}) |\n|---|---|---|---|")
    for codec in args.codecs.split(","):
        path = ensure_store(records, codec, tag)
        sizes[codec] = data_bytes(path)
        rate = bench(path, args.records, batch=args.batch, batches=args.batches, seed=args.seed)
        ratio = sizes.get("raw", sizes[codec]) / sizes[codec]
        print(f"| {codec} | {sizes[codec] / 1e6:,.2f} MB | {ratio:.2f}x | {rate:,.0f} |")
    if "zstd" in sizes and "zstd_dict" in sizes:
        print(f"zstd_dict stores {sizes['zstd'] / sizes['zstd_dict']:.2f}x smaller than zstd")
    return 0


if __name__ == "__main__":
    sys.exit(main())
