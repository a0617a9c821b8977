"""The consumer's own gathers: a ``next()`` that would wait gathers the next batch itself."""

from __future__ import annotations

import threading
import time

import numpy as np

import headrace


class _SlowDispatchSource:
    """A real Source whose sizing takes a while (as a ``/proc`` read under a busy allocator
    does) and whose gathers take longer: a worker holds the dispatch lock right when the consumer
    wakes for the batch it just posted."""

    fingerprint = "slow-dispatch"

    def __init__(self, n: int) -> None:
        self.n = n
        self.gatherers: list[str] = []

    def __len__(self) -> int:
        return self.n

    def nbytes(self, ids):
        time.sleep(0.004)
        return 8 * len(ids)

    def gather(self, ids):
        self.gatherers.append(threading.current_thread().name)
        time.sleep(0.02)
        return {"v": np.asarray(ids).copy()}

    def close(self) -> None:
        pass


def test_a_consumer_that_found_a_worker_dispatching_is_invited_to_gather():
    # Without the holder's invitation the consumer, finding the lock taken, sleeps until the next
    # post, when the worker is dispatching again: it would never gather a batch itself.
    src = _SlowDispatchSource(40 * 4)
    with headrace.Loader(src, batch=4, threads=1, prefetch=2) as ld:
        got = np.concatenate([b["v"] for b in ld])
    assert got.tolist() == list(range(160))  # every record once, in order
    mine = src.gatherers.count(threading.current_thread().name)
    assert mine >= 10, src.gatherers  # the consumer gathered a share of the 40 batches


def test_default_threads_leave_a_core_to_the_consumer(monkeypatch):
    from headrace._engine import config

    for cores, want in [(1, 1), (2, 1), (4, 3), (9, 8), (64, 8)]:
        monkeypatch.setattr(config, "usable_cores", lambda c=cores: c)
        assert config.default_threads() == want
    monkeypatch.setattr(config, "usable_cores", lambda: 2)
    with headrace.Loader({"v": np.arange(10)}, batch=2) as ld:
        s = ld.stats()
    assert s["threads"] == 1 and s["effective_max_queue_batches"] == 1 + 1 + s["prefetch_batches"]
