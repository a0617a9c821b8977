"""Folders of random-byte files in class sub-folders: the raw input that the byte-batching and
mx8 tests pack (sizes drawn from a seeded generator, contents random)."""

from __future__ import annotations

import os
import random
from pathlib import Path


def random_files(root: Path, count: int, lo: int, hi: int, *, seed: int,
                 classes: tuple[str, ...] = ("b", "a", "a"), name: str = "{i:03d}.bin") -> Path:
    """``count`` files of ``lo``-``hi`` bytes under ``root``, file ``i`` in folder
    ``classes[i % len(classes)]``; returns ``root``."""
    rng = random.Random(seed)
    for i in range(count):
        d = root / classes[i % len(classes)]
        d.mkdir(parents=True, exist_ok=True)
        (d / name.format(i=i)).write_bytes(os.urandom(rng.randint(lo, hi)))
    return root
