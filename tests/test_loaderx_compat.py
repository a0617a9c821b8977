"""loaderx 0.4.1's DataLoader spelling, without its defects (out of order, hangs)."""

from __future__ import annotations

import numpy as np
import pytest

import headrace
from _loader_util import headrace_threads, wait_for
from headrace import ConfigError, LoaderError
from headrace._order.make import make_order

pytestmark = pytest.mark.timeout(120)

N = 100
DATA = np.arange(N * 6, dtype=np.float32).reshape(N, 2, 3)
LABELS = np.arange(N, dtype=np.int64) % 10


def test_endless_dict_batches_from_arrays():
    with headrace.DataLoader(DATA, LABELS, num_workers=2, batch_size=16, prefetch_size=2,
                             mode=0, seed=42) as ld:
        with pytest.raises(TypeError, match=r"^Eternal loader has no length\.$"):
            len(ld)
        batches = [next(ld) for _ in range(10)]  # 160 > N: the circular window wraps
    assert set(batches[0]) == {"data", "label"}
    ids = np.concatenate([np.arange(16 * k, 16 * k + 16) % N for k in range(10)])
    got = np.concatenate([b["data"] for b in batches])
    np.testing.assert_array_equal(got, DATA[ids])
    np.testing.assert_array_equal(np.concatenate([b["label"] for b in batches]), LABELS[ids])


def test_iid_order_is_the_same_for_any_number_of_workers():
    streams = []
    for workers in (1, 4):
        with headrace.DataLoader(DATA, LABELS, num_workers=workers, batch_size=8, mode=1,
                                 seed=7) as ld:
            streams.append(np.concatenate([next(ld)["label"] for _ in range(20)]))
    np.testing.assert_array_equal(streams[0], streams[1])
    ids = make_order("iid", N, seed=7).range(0, 160)
    np.testing.assert_array_equal(streams[0], LABELS[ids])


def test_headrace_datasets_and_transform(tmp_path):
    np.save(tmp_path / "x.npy", DATA)
    np.save(tmp_path / "y.npy", LABELS)
    x = headrace.Dataset(tmp_path / "x.npy")
    y = headrace.Dataset(tmp_path / "y.npy")

    def transform(pair):
        data, label = pair
        return data * 2, label + 1

    with headrace.DataLoader(x, y, batch_size=10, mode=headrace.Sampler.Mode.SEQUENTIAL,
                             transform=transform) as ld:
        b = next(ld)
        token = ld.checkpoint()
    np.testing.assert_array_equal(b["data"], DATA[:10] * 2)
    np.testing.assert_array_equal(b["label"], LABELS[:10] + 1)
    with headrace.DataLoader(x, y, batch_size=10, mode=0, transform=transform,
                             resume=token) as ld:
        np.testing.assert_array_equal(next(ld)["label"], LABELS[10:20] + 1)
    x.close()
    y.close()


def test_transform_error_raises_instead_of_hanging():
    def transform(pair):
        raise KeyError("boom")

    ld = headrace.DataLoader(DATA, LABELS, num_workers=4, batch_size=8, transform=transform)
    with pytest.raises(LoaderError, match="KeyError") as ei:
        next(ld)
    assert len(ei.value.record_ids) == 8
    ld.close()  # loaderx 0.4.1 hangs here with 4 workers
    assert wait_for(lambda: headrace_threads() == [])


def test_length_mismatch_and_bad_mode():
    with pytest.raises(ValueError, match="dataset and labelset must have the same length"):
        headrace.DataLoader(DATA, LABELS[:-1])
    with pytest.raises(ConfigError, match="unknown order 7"):
        headrace.DataLoader(DATA, LABELS, mode=7)


class _WideZeros:
    """A loaderx-style dataset of 64 records of 1 MiB each that gathers without allocating."""

    dtype = np.dtype(np.uint8)
    shape = (64, 1 << 20)

    def __len__(self):
        return 64

    def __getitems__(self, ids):
        return np.broadcast_to(np.uint8(0), (len(ids), 1 << 20))


def test_large_batches_get_a_cap_that_fits():
    # Batches of 64 MiB: 4 workers + 4 prefetched exceed the 256 MiB profile default.
    with headrace.DataLoader(_WideZeros(), np.arange(64), num_workers=4, batch_size=64,
                             prefetch_size=4, mode=0) as ld:
        assert next(ld)["data"].shape == (64, 1 << 20)
        assert ld.stats()["max_inflight_bytes"] >= 8 * (64 << 20)
