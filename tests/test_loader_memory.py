"""The byte cap is a cap: high-water marks under adversarial sizes, no deadlock, RAM cap errors."""

from __future__ import annotations

import random
import threading
import time

import numpy as np
import pytest

import headrace
from _loader_util import take
from headrace import ConfigError, MemoryCapError
from headrace._engine.budget import ByteBudget
from headrace._order.make import make_order

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def ragged_store(tmp_path_factory):
    """48 records whose sizes range log-uniformly over 1 B .. 1 MiB, plus a label."""
    rng = np.random.default_rng(1)
    sizes = np.exp(rng.uniform(0, np.log(1 << 20), 48)).astype(np.int64)
    sizes[[5, 17]] = [1, 1 << 20]
    path = tmp_path_factory.mktemp("ragged") / "s"
    with headrace.create(path, fields={"blob": "bytes", "label": "int64"}) as w:
        w.append({"blob": [bytes([i % 251]) * int(s) for i, s in enumerate(sizes)],
                  "label": np.arange(48)})
        w.commit()
    return path, sizes


def test_high_water_never_exceeds_the_cap_under_adversarial_sizes(ragged_store):
    path, sizes = ragged_store
    batch = 4
    order = make_order("shuffle", len(sizes), seed=3)
    ids = order.range(0, 2 * len(sizes))
    # blob values + int64 offsets (batch + 1) + int64 labels
    per_batch = (sizes[ids].reshape(-1, batch).sum(axis=1) + 8 * (2 * batch + 1)).tolist()
    cap = int(2.5 * max(per_batch))
    held = []
    with headrace.load(path, batch=batch, shuffle=True, seed=3, epochs=2, inflight=cap,
                       threads=4, queue=32, prefetch=16) as ld:
        for i, b in enumerate(ld):
            assert int(b["blob"].offsets[-1]) + 8 * (2 * batch + 1) == per_batch[i]
            held.append(b)  # the consumer keeps everything: must not count, must not hang
            if len(held) % 3 == 0:
                time.sleep(0.01)  # let producers run into the cap
            s = ld.stats()
            assert s["inflight_bytes"] <= cap
        s = ld.stats()
    assert len(held) == len(per_batch)
    assert s["inflight_high_water_bytes"] <= cap
    assert s["inflight_high_water_bytes"] > max(per_batch)  # several batches were in flight
    assert s["max_inflight_bytes"] == cap
    assert s["delivered_bytes_total"] == sum(per_batch)


def test_consumer_holding_every_batch_with_a_one_batch_cap_does_not_hang():
    x = np.ones((40, 100), np.uint8)
    with headrace.Loader({"x": x}, batch=10, inflight=1000, threads=3) as ld:
        held = list(ld)
        s = ld.stats()
    assert len(held) == 4
    assert s["inflight_high_water_bytes"] == 1000


def test_cap_smaller_than_one_batch_is_an_error_saying_the_minimum():
    x = np.ones((40, 100), np.uint8)
    with pytest.raises(ConfigError, match="raise inflight to at least 1000 bytes"):
        headrace.Loader({"x": x}, batch=10, inflight=999)
    with pytest.raises(ConfigError, match="at least 1400 bytes"):
        headrace.Loader({"x": x}, batch=10, inflight=1000, transform_nbytes=lambda n: 40 * n)


def test_a_later_ragged_batch_over_the_cap_raises_in_order(tmp_path):
    path = tmp_path / "s"
    with headrace.create(path, fields={"blob": "bytes"}) as w:
        w.append({"blob": [b"a"] * 8 + [b"b" * 5000] + [b"c"] * 3})
        w.commit()
    with headrace.load(path, batch=4, inflight=1000) as ld:
        assert len(next(ld)["blob"]) == 4
        assert len(next(ld)["blob"]) == 4
        with pytest.raises(ConfigError, match="at least 5043"):
            next(ld)
        assert next(ld, None) is None  # the loader stopped cleanly


def test_process_over_the_ram_cap_raises_memory_cap_error():
    ballast = np.ones(64 << 20, np.uint8)  # 64 MiB the loader does not own
    cap = headrace.Constraints(max_ram_bytes=16 << 20, max_inflight_bytes=4096)
    with headrace.Loader({"v": np.arange(100)}, batch=4, constraints=cap, threads=1) as ld:
        ld._ram_wait_s = 0.2
        with pytest.raises(MemoryCapError, match="exceeds max_process_rss_bytes 16777216"):
            next(ld)
        s = ld.stats()
        assert s["counted_rss_bytes"] > 16 << 20
        assert s["ram_wait_seconds"] > 0
    assert ballast.sum() == 64 << 20
    with pytest.raises(MemoryError):  # mx8 code catching MemoryError keeps working
        raise MemoryCapError("x")


def test_page_cache_is_reported_not_counted(ragged_store):
    path, _ = ragged_store
    with headrace.load(path, batch=8) as ld:
        take(ld, None)
        s = ld.stats()
    assert s["page_cache_resident_bytes"] > 0
    assert s["counted_rss_bytes"] == s["process_rss_bytes"] - s["page_cache_resident_bytes"]


def test_budget_hammered_by_threads_never_exceeds_cap():
    budget = ByteBudget(1000)
    used = [0]
    peak = [0]
    lock = threading.Lock()

    def worker(seed):
        rng = random.Random(seed)
        for _ in range(300):
            n = rng.randint(0, 1000)
            assert budget.acquire(n)
            with lock:
                used[0] += n
                peak[0] = max(peak[0], used[0])
            with lock:
                used[0] -= n
            budget.release(n)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak[0] <= 1000
    assert budget.high_water_bytes <= 1000
    assert budget.used_bytes == 0


def test_budget_rejects_impossible_requests_and_wakes_on_close():
    budget = ByteBudget(100)
    with pytest.raises(ConfigError, match="at least 101"):
        budget.acquire(101)
    assert budget.acquire(100)
    assert budget.acquire(1, timeout_s=0.01) is False
    result = []
    t = threading.Thread(target=lambda: result.append(budget.acquire(50)))
    t.start()
    time.sleep(0.05)
    budget.close()
    t.join(5)
    assert result == [False]
    budget.release(100)
    assert budget.acquire(1) is False


def test_budget_is_first_come_first_served():
    budget = ByteBudget(100)
    assert budget.acquire(90)
    order = []
    big = threading.Thread(target=lambda: (budget.acquire(100), order.append("big")))
    big.start()
    time.sleep(0.05)
    small = threading.Thread(target=lambda: (budget.acquire(5), order.append("small")))
    small.start()
    time.sleep(0.05)
    assert order == []  # 5 bytes would fit, but the older 100-byte request goes first
    budget.release(90)
    big.join(5)
    budget.release(100)
    small.join(5)
    assert order == ["big", "small"]
