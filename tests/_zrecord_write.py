"""Writes loaderx 2.8.19 zrecord containers from the documented byte layout (tests only).

Independent of the reader under test: it follows the format as written down (header fields,
RecordLoc table, round-robin shards, ragged shape headers, one zstd frame per record at level 3)
so the tests can build containers of any size and check them byte for byte against the ones the
real loaderx wrote (``tests/data/zrecord``).
"""

from __future__ import annotations

import json
import os
import struct

import numpy as np
import zstandard

TAGS = {"raw": 0, "zstd": 1, "zstd_dict": 2}


def write_container(path, records, *, dtype, item_shape=None, ndim=None, codec="raw",
                    data_shards=4, dictionary=None, published=True):
    """Writes ``records`` (arrays) as a dense (``item_shape``) or ragged (``ndim``) container."""
    os.makedirs(path, exist_ok=True)
    dt = np.dtype(dtype)
    if item_shape is not None:
        schema = {"dtype": dt.name, "item_shape": list(item_shape)}
    else:
        schema = {"dtype": dt.name, "ndim": ndim}
    schema_b = json.dumps(schema).encode()
    if codec == "zstd":
        comp = zstandard.ZstdCompressor(level=3)
    elif codec == "zstd_dict":
        comp = zstandard.ZstdCompressor(level=3, dict_data=zstandard.ZstdCompressionDict(dictionary))
    shards = [bytearray() for _ in range(data_shards)]
    locs = []
    for i, rec in enumerate(records):
        arr = np.ascontiguousarray(np.asarray(rec, dt))
        body = arr.tobytes()
        if item_shape is None:
            body = struct.pack(f"<{ndim}I", *arr.shape) + body
        stored = body if codec == "raw" else comp.compress(body)
        shard = shards[i % data_shards]
        locs.append(struct.pack("<QII", len(shard), len(stored), len(body)))
        shard += stored
    head = bytearray(0x1000)
    struct.pack_into("<QHBB", head, 0, len(records) if published else 0, len(schema_b),
                     data_shards, TAGS[codec])
    for k, s in enumerate(shards):
        struct.pack_into("<Q", head, 0x10 + 8 * k, len(s))
    head[0x808:0x808 + len(schema_b)] = schema_b
    with open(os.path.join(path, "meta.zr"), "wb") as f:
        f.write(bytes(head) + b"".join(locs))
    for k, s in enumerate(shards):
        with open(os.path.join(path, f"data_{k}.zr"), "wb") as f:
            f.write(bytes(s))
    if codec == "zstd_dict":
        with open(os.path.join(path, "dict.zr"), "wb") as f:
            f.write(dictionary)
    return path
