"""Reading a loaderx 2.8.19 zrecord container in place: headrace's reader vs loaderx's own.

    .venv/bin/python benchmarks/bench_zrecord.py              # headrace only (writes the container)
    /tmp/lxv/bin/python benchmarks/bench_zrecord.py --reader loaderx   # loaderx 2.8.19's, same file

A dense raw container of ``--records`` x ``--width`` uint8 records over 4 shards is written under
``benchmarks/_data/`` from the documented layout (``tests/_zrecord_write.py``; the tests check it
matches loaderx's files byte for byte). Then random batches of 256 ids (with replacement,
unsorted) are gathered; records/s over the median batch time, after 200 warm-up batches.
loaderx 2.8.19 needs NumPy >= 2.5 (Python >= 3.12): run ``--reader loaderx`` from a virtualenv
that has it (``pip install loaderx==2.8.19``) on the container this script wrote.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
DATA_DIR = HERE / "_data"


def ensure(path: Path, n: int, width: int) -> None:
    if (path / "meta.zr").exists():
        return
    sys.path.insert(0, str(HERE.parent / "tests"))
    from _zrecord_write import write_container

    rng = np.random.default_rng(0)
    rows = rng.integers(0, 255, (n, width), dtype=np.uint8)
    write_container(str(path), rows, dtype="uint8", item_shape=(width,), data_shards=4)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--records", type=int, default=50_000)
    p.add_argument("--width", type=int, default=3072)
    p.add_argument("--batches", type=int, default=2000)
    p.add_argument("--reader", choices=("headrace", "loaderx"), default="headrace")
    args = p.parse_args(argv)
    path = DATA_DIR / f"zrecord-{args.records}x{args.width}"
    rng = np.random.default_rng(1)
    batches = [rng.integers(0, args.records, 256) for _ in range(args.batches + 200)]
    if args.reader == "loaderx":
        from loaderx import Allocator
        from loaderx import zrecord as z

        view = z.DenseStore(str(path)).bind(Allocator("cpu"))

        def get(ids: np.ndarray) -> object:
            return np.from_dlpack(view[ids.astype(np.uint64)])
    else:
        ensure(path, args.records, args.width)
        from headrace._store.zrecord import ZrecordContainer

        get = ZrecordContainer(path).dense
    for ids in batches[:200]:
        get(ids)
    times = []
    for ids in batches[200:]:
        t0 = time.perf_counter()
        get(ids)
        times.append(time.perf_counter() - t0)
    rate = 256 / float(np.median(times))
    print(f"{args.reader}: {rate:,.0f} records/s ({rate * args.width / 2**30:.2f} GiB/s), "
          f"random batches of 256 x {args.width} B from {path.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
