"""Writes the containers of ``tests/_zrecord_cases.py`` with the real loaderx 2.8.19.

loaderx 2.8.19 needs NumPy >= 2.5 (Python >= 3.12), so this runs outside the test suite:

    python3.13 -m venv /tmp/lxv && /tmp/lxv/bin/pip install loaderx==2.8.19
    /tmp/lxv/bin/python tests/data/zrecord/make_fixtures.py

A zstd_dict case trains its dictionary with loaderx's own ``train_dict`` on a raw copy of the
records, as a 2.8.19 user does.
"""

import os
import shutil
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # tests/

from loaderx import Allocator  # noqa: E402
from loaderx import zrecord as z  # noqa: E402

from _zrecord_cases import CASES  # noqa: E402


def _writer(c, path, codec, dict_bytes=None):
    dtype = np.dtype(c.dtype)
    kw = {"codec": codec, "data_shards": c.shards}
    if dict_bytes is not None:
        kw["dict_bytes"] = dict_bytes
    if c.kind == "dense":
        return z.DenseWriter(path, dtype, c.geometry, **kw)
    return z.RaggedWriter(path, dtype, c.geometry, **kw)


def _append(c, w, batch):
    if c.kind == "dense":
        w.append(np.ascontiguousarray(np.stack([np.asarray(r, c.dtype) for r in batch])))
    else:
        w.append(z.RaggedBatch.from_records([np.asarray(r, c.dtype) for r in batch]))


def _write(c, path, codec, dict_bytes=None):
    with _writer(c, path, codec, dict_bytes) as w:
        for batch in c.batches:
            _append(c, w, batch)


def main():
    for c in CASES:
        out = os.path.join(HERE, c.name)
        shutil.rmtree(out, ignore_errors=True)
        dict_bytes = None
        if c.codec == "zstd_dict":
            with tempfile.TemporaryDirectory() as tmp:
                raw = os.path.join(tmp, "raw")
                _write(c, raw, "raw")
                store = (z.DenseStore if c.kind == "dense" else z.RaggedStore)(raw)
                dict_bytes = z.train_dict(store.bind(Allocator("cpu")))
                store.close()
        _write(c, out, c.codec, dict_bytes)
        print(c.name, sorted(os.listdir(out)))


if __name__ == "__main__":
    main()
