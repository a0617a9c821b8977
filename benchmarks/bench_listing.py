"""What building a loader over an image folder costs, first and rebuilt (a loader per epoch).

``--files`` tiny JPEGs in ``--classes`` class folders (an ImageFolder layout; the tree is
backdated, as a dataset on disk is: a directory changed in the last seconds is never trusted).
Peers, each timed over ``--rounds`` builds (median) with the page and dentry caches warm:

* ``walk``: ``os.walk`` plus one ``stat`` per file (the floor of listing with sizes and mtimes,
  which the fingerprint needs; ``torchvision.datasets.ImageFolder`` does about the same);
* ``first``: ``headrace.image(folder)`` built with the listing cache emptied (what every build
  cost before listings were reused);
* ``rebuilt``: ``headrace.image(folder)`` built again over the unchanged folder (the listing is
  checked by one ``stat`` per directory and reused);
* ``changed``: built after one file was added (the folder is listed again).

Run::

    .venv/bin/python benchmarks/bench_listing.py                  # 20,000 files, ~1 minute
    .venv/bin/python benchmarks/bench_listing.py --files 100000 --classes 1000
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import tempfile
import time
from collections.abc import Callable

import numpy as np
from PIL import Image

import headrace
from headrace._sources import walk

_PAST = 1_600_000_000


def _make(root: str, files: int, classes: int) -> None:
    buf = io.BytesIO()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(buf, "JPEG")
    data = buf.getvalue()
    for i in range(files):
        d = os.path.join(root, f"c{i % classes:04d}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"{i:07d}.jpg"), "wb") as f:
            f.write(data)
    _backdate(root)


def _backdate(root: str) -> None:
    for dirpath, _dirs, _files in os.walk(root):
        os.utime(dirpath, (_PAST, _PAST))


def _walk(root: str) -> None:
    for dirpath, _dirs, names in os.walk(root):
        for n in names:
            os.stat(os.path.join(dirpath, n))


def _build(root: str) -> None:
    headrace.image(root, resize=(8, 8), batch=64).close()


def _time(fn: Callable[[], None], rounds: int, before: Callable[[], None] | None = None) -> float:
    out = []
    for _ in range(rounds):
        if before is not None:
            before()
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--files", type=int, default=20_000)
    p.add_argument("--classes", type=int, default=100)
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "imgs")
        _make(root, a.files, a.classes)
        _build(root)  # warm the page and dentry caches and the imports
        extra = os.path.join(root, "c0000", "extra.jpg")

        def change() -> None:
            if os.path.exists(extra):
                os.unlink(extra)
            else:
                os.link(os.path.join(root, "c0000", "0000000.jpg"), extra)

        res = {
            "walk": _time(lambda: _walk(root), a.rounds),
            "first": _time(lambda: _build(root), a.rounds, walk._cache.clear),
            "rebuilt": _time(lambda: _build(root), a.rounds),
            "changed": _time(lambda: _build(root), a.rounds, change),
        }
    print(f"{a.files} files in {a.classes} folders, median of {a.rounds} builds")
    print(f"{'peer':<8} {'ms':>8} {'vs first':>9} {'vs walk':>8}")
    for k, v in res.items():
        print(f"{k:<8} {v * 1e3:>8.1f} {v / res['first']:>8.2f}x {v / res['walk']:>7.2f}x")


if __name__ == "__main__":
    main()
