"""Gather outputs are written again only once nothing else holds them (views, memoryviews,
tensors, batches kept by the program): a batch the program still has never changes."""

import gc

import numpy as np
import pytest

import headrace
from headrace._store.recycle import Recycler

N, REC = 512, 1024  # batches of 256 rows: 256 KiB, inside the recycled range


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("recycle") / "s"
    x = np.arange(N * REC, dtype=np.uint32).astype(np.uint8).reshape(N, REC)
    x[:, 0] = np.arange(N) % 251
    with headrace.create(path, fields={"x": {"dtype": "uint8", "shape": [REC]},
                                       "y": "int64"}) as w:
        w.append({"x": x, "y": np.arange(N, dtype=np.int64)})
    s = headrace.open(path)
    s.gather(np.arange(N))  # every record verified: the steady path
    s.gather(np.arange(N))
    return s, x


def _ids(seed):
    return np.random.default_rng(seed).permutation(N)[:256]


def test_kept_batches_never_change(store):
    s, x = store
    kept = []
    for seed in range(40):
        b = s.gather(_ids(seed))
        what = seed % 4  # 3: dropped at once, its buffer free for the next gathers
        if what == 0:
            kept.append((seed, b["x"]))
        elif what == 1:
            kept.append((seed, b["x"][10:20]))  # a view keeps its base
        elif what == 2:
            kept.append((seed, memoryview(b["x"])))
        del b
        gc.collect()
        for k, held in kept:
            want = x[_ids(k)][10:20] if k % 4 == 1 else x[_ids(k)]
            assert np.asarray(held).tolist() == want.tolist(), k


def test_dropped_batches_are_reused(store):
    s, _ = store
    a = s.gather(_ids(1))["x"]
    addr = a.__array_interface__["data"][0]
    del a
    b = s.gather(_ids(2))["x"]
    assert b.__array_interface__["data"][0] == addr
    c = s.gather(_ids(3))["x"]  # b is still held: c must be another buffer
    assert c.__array_interface__["data"][0] != addr


def test_torch_tensor_keeps_its_batch(store):
    import torch
    s, x = store
    t = torch.from_numpy(s.gather(_ids(5))["x"])
    for seed in range(6, 30):
        s.gather(_ids(seed))
    assert t.numpy().tolist() == x[_ids(5)].tolist()


def test_jax_array_aliasing_a_batch_keeps_it(store):
    import jax
    s, x = store
    b = s.gather(_ids(7))["x"]
    assert b.ctypes.data % 64 == 0  # what lets XLA:CPU adopt the buffer instead of copying it
    j = jax.device_put(b)
    assert j.unsafe_buffer_pointer() == b.ctypes.data  # aliased, not copied
    del b  # the jax array is now the only holder of the buffer
    for seed in range(8, 30):
        s.gather(_ids(seed))
    assert np.asarray(j).tolist() == x[_ids(7)].tolist()


def test_recycler_bounds():
    r = Recycler(max_arrays=2, max_bytes=1 << 30)
    dt = np.dtype(np.uint8)
    a = r.empty((256, 1024), dt)
    b = r.empty((256, 1024), dt)
    c = r.empty((256, 1024), dt)  # both held ones are in use: a new, unheld array
    assert len({x.__array_interface__["data"][0] for x in (a, b, c)}) == 3
    del c
    d = r.empty((256, 1024), dt)
    assert d.__array_interface__["data"][0] not in (a.__array_interface__["data"][0],
                                                    b.__array_interface__["data"][0])
    small = r.empty((4, 4), dt)  # below the recycled range: never held
    assert small.shape == (4, 4)
    r.clear()
    e = r.empty((256, 1024), dt)
    assert e.__array_interface__["data"][0] not in (a.__array_interface__["data"][0],
                                                    b.__array_interface__["data"][0])
