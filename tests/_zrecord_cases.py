"""The loaderx 2.8.19 zrecord containers the tests read: one definition, NumPy only.

``tests/data/zrecord/make_fixtures.py`` writes each case with the real loaderx 2.8.19 (it needs
Python >= 3.12 and NumPy >= 2.5, so it runs in its own virtualenv, not in the test suite);
``tests/test_zrecord.py`` reads the committed containers back and compares every record with the
values defined here, and rebuilds them byte for byte from the documented format.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Case:
    name: str
    kind: str  # "dense" or "ragged"
    dtype: str
    geometry: tuple[int, ...] | int  # dense: item_shape; ragged: ndim
    codec: str  # raw, zstd, zstd_dict
    shards: int
    batches: tuple[tuple[np.ndarray, ...], ...]  # the records of each append call


def _text_like(i: int, width: int) -> np.ndarray:
    # Small records that share most of their bytes (a JSON-ish template with a counter): what a
    # trained dictionary compresses well.
    s = f'{{"id": {i:06d}, "label": "class_{i % 7}", "split": "train", "note": "sample"}}'
    b = np.frombuffer(s.encode().ljust(width, b" ")[:width], np.uint8)
    return b.copy()


def _dense(n: int, shape: tuple[int, ...], dtype: str, start: int = 0) -> tuple[np.ndarray, ...]:
    k = int(np.prod(shape)) if shape else 1
    flat = (np.arange(start * k, (start + n) * k) * 3 - 50).astype(dtype)
    return tuple(flat.reshape(n, *shape))


def _ragged(n: int, ndim: int, dtype: str, start: int = 0) -> tuple[np.ndarray, ...]:
    out = []
    for i in range(start, start + n):
        shape = tuple(1 + (i * (d + 2)) % 4 for d in range(ndim))
        size = int(np.prod(shape))
        out.append((np.arange(size) + 100 * i).astype(dtype).reshape(shape))
    return tuple(out)


CASES: tuple[Case, ...] = (
    # two appends: records keep going round-robin over the shards across append calls
    Case("dense_raw_f32", "dense", "float32", (2, 4), "raw", 4,
         (_dense(6, (2, 4), "float32"), _dense(5, (2, 4), "float32", start=6))),
    Case("dense_zstd_i16", "dense", "int16", (3,), "zstd", 3, (_dense(7, (3,), "int16"),)),
    Case("dense_scalar_u8", "dense", "uint8", (), "raw", 1, (_dense(5, (), "uint8"),)),
    Case("dense_bool", "dense", "bool", (3,), "raw", 2,
         (tuple(np.array([i % 2, i % 3 == 0, True]) for i in range(4)),)),
    Case("ragged_raw_i32", "ragged", "int32", 1, "raw", 2, (_ragged(9, 1, "int32"),)),
    Case("ragged_zstd_f32_2d", "ragged", "float32", 2, "zstd", 3,
         (_ragged(4, 2, "float32"), _ragged(3, 2, "float32", start=4))),
    Case("dense_zstd_dict_u8", "dense", "uint8", (96,), "zstd_dict", 4,
         (tuple(_text_like(i, 96) for i in range(400)),)),
    Case("ragged_zstd_dict_u8", "ragged", "uint8", 1, "zstd_dict", 2,
         (tuple(_text_like(i, 60 + i % 30) for i in range(300)),)),
)


def case(name: str) -> Case:
    return next(c for c in CASES if c.name == name)


def records(c: Case) -> list[np.ndarray]:
    """Every record of the case, in index order."""
    return [np.asarray(r, dtype=c.dtype) for batch in c.batches for r in batch]
