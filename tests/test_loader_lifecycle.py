"""Lifecycle: close, context manager, finalizer, no leaked threads, error propagation, no hangs."""

from __future__ import annotations

import gc
import subprocess
import sys
import threading
from typing import Any

import numpy as np
import pytest

import headrace
from _loader_util import headrace_threads, wait_for
from headrace import LoaderError
from headrace._engine.stats import sample_memory

pytestmark = pytest.mark.timeout(120)

COLS = {"x": np.arange(200, dtype=np.float32).reshape(50, 4), "y": np.arange(50)}


def test_thousand_open_iterate_close_cycles_leak_no_threads_or_memory():
    base_threads = threading.active_count()
    for _ in range(50):  # warm up allocator and caches before measuring memory
        with headrace.Loader(COLS, batch=16, order="shuffle", threads=2) as ld:
            list(ld)
    gc.collect()
    base_mem = sample_memory().counted_bytes
    for i in range(1000):
        ld = headrace.Loader(COLS, batch=16, order="shuffle", seed=i, threads=2)
        if i % 2:
            assert sum(len(b["y"]) for b in ld) == 50
        else:
            next(ld)  # closed mid-stream, with batches buffered
        ld.close()
        assert threading.active_count() <= base_threads + 3
    gc.collect()
    assert threading.active_count() == base_threads
    assert headrace_threads() == []
    assert sample_memory().counted_bytes - base_mem < 32 << 20


def test_close_is_idempotent_and_stops_iteration():
    ld = headrace.Loader(COLS, batch=8, epochs=None, threads=3)
    next(ld)
    ld.close()
    ld.close()
    assert headrace_threads() == []
    for _ in range(3):
        with pytest.raises(StopIteration):
            next(ld)
    assert ld.stats()["status"] == "CLOSED"


def test_exhaustion_stops_threads_and_repeats_stop_iteration():
    ld = headrace.Loader(COLS, batch=8, threads=2)
    assert len(list(ld)) == 7
    for _ in range(3):
        with pytest.raises(StopIteration):
            next(ld)
    assert wait_for(lambda: headrace_threads() == [])
    assert ld.stats()["status"] == "DONE"
    ld.close()


def test_dropped_loader_is_finalized():
    ld = headrace.Loader(COLS, batch=4, epochs=None, threads=3)
    next(ld)
    assert headrace_threads()
    del ld
    gc.collect()
    assert wait_for(lambda: headrace_threads() == [])


def test_context_manager_closes():
    with headrace.Loader(COLS, batch=4, epochs=None) as ld:
        next(ld)
    assert headrace_threads() == []


@pytest.mark.parametrize("threads", [1, 4])
def test_transform_error_surfaces_in_order_with_record_ids(threads):
    def transform(batch, ids):
        if 13 in ids:
            raise ValueError("bad record")
        return batch

    ld = headrace.Loader(COLS, batch=5, threads=threads, transform=transform)
    got = [next(ld)["y"].tolist() for _ in range(2)]  # batches before the bad one arrive first
    assert got == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    with pytest.raises(LoaderError, match="ValueError in the loader's transform for batch 2") as ei:
        next(ld)
    assert ei.value.record_ids == [10, 11, 12, 13, 14]
    assert isinstance(ei.value.__cause__, ValueError)
    assert any("record ids" in n for n in ei.value.__notes__)
    with pytest.raises(StopIteration):
        next(ld)
    assert wait_for(lambda: headrace_threads() == [])
    ld.close()


class _FailingSource:
    """A real Source whose gather fails for one record (a disk read error, say)."""

    fingerprint = "failing"

    def __len__(self):
        return 20

    def nbytes(self, ids):
        return 8 * len(ids)

    def gather(self, ids):
        if 7 in ids:
            raise OSError("read error")
        return {"v": np.asarray(ids)}

    def close(self):
        pass


def test_worker_error_surfaces_as_loader_error():
    with headrace.Loader(_FailingSource(), batch=4, threads=2) as ld:
        assert next(ld)["v"].tolist() == [0, 1, 2, 3]
        with pytest.raises(LoaderError, match="OSError in the loader's worker") as ei:
            next(ld)
        assert ei.value.record_ids == [4, 5, 6, 7]


def test_consumer_blocked_in_next_is_woken_by_close():
    gate = threading.Event()

    def slow(batch, ids):
        gate.wait(10)
        return batch

    ld = headrace.Loader(COLS, batch=4, threads=1, transform=slow)
    result = []
    t = threading.Thread(target=lambda: result.append(next(ld, "stopped")))
    t.start()
    assert wait_for(lambda: ld.stats()["batches_in_flight"] >= 1)
    closer = threading.Thread(target=ld.close)
    closer.start()
    gate.set()
    t.join(10)
    closer.join(10)
    assert not t.is_alive() and not closer.is_alive()
    assert headrace_threads() == []


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_next_raises_when_every_worker_thread_died_without_posting():
    # A worker killed outside the loader's error handling (here: an exception raised by a trace
    # function on the worker's next Python call after the transform, i.e. while it hands the
    # batch over) never posts its batch; next() must notice the dead threads and raise, not wait.
    class Killed(BaseException):
        pass

    def kill_on_next_call(frame: Any, event: str, arg: Any) -> Any:
        if event == "call":
            raise Killed("worker killed")
        return None

    def transform(batch: dict[str, Any], ids: np.ndarray) -> dict[str, Any]:
        if threading.current_thread().name.startswith("headrace-worker"):
            sys.settrace(kill_on_next_call)  # this thread only
        return batch

    ld = headrace.Loader(COLS, batch=4, threads=1, epochs=None, transform=transform)
    try:
        with pytest.raises(LoaderError, match="worker threads exited without delivering"):
            for _ in range(100_000):
                next(ld)
        assert not any(t.is_alive() for t in ld._engine.threads)
    finally:
        ld.close()
    assert headrace_threads() == []


def test_stats_keys_and_summary():
    with headrace.Loader(COLS, batch=8, threads=2) as ld:
        list(ld)
        s = ld.stats()
        text = headrace.stats(ld)
        assert headrace.stats(ld, raw=True)["delivered_batches_total"] == 7
    for key in ("delivered_batches_total", "delivered_samples_total", "delivered_bytes_total",
                "samples_per_second", "ram_high_water_bytes", "inflight_bytes",
                "inflight_high_water_bytes", "max_inflight_bytes", "queue_depth",
                "queue_high_water", "consumer_wait_seconds", "budget_wait_seconds",
                "process_rss_bytes", "page_cache_resident_bytes", "elapsed_seconds",
                "max_process_rss_bytes", "max_queue_batches", "prefetch_batches",
                "batch_size_samples", "batch_payload_bytes_p50", "batch_payload_bytes_p95"):
        assert key in s, key
    assert s["delivered_samples_total"] == 50
    assert s["delivered_bytes_total"] == 50 * (16 + 8)
    assert s["inflight_bytes"] == 0
    # a finished loader names the epoch it read last, not the one after
    assert text.splitlines()[0].startswith("Status: DONE | Mode: local | Epoch: 0 | Step: 7")
    assert "Progress: 50 samples | 7 batches" in text
    with pytest.raises(headrace.ConfigError, match="expects a loader object"):
        headrace.stats(object())


def test_print_stats_is_one_line(capsys):
    with headrace.Loader(COLS, batch=8) as ld:
        next(ld)
        ld.print_stats()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("[headrace] batches=1 samples=8 ")


_FORK_SCRIPT = """
import multiprocessing as mp, warnings
import numpy as np
import headrace

def child(ld, q):
    try:
        next(ld)
        q.put("no error")
    except Exception as e:
        q.put(f"{type(e).__name__}: {e}")

if __name__ == "__main__":
    ld = headrace.Loader({"x": np.arange(64)}, batch=8, epochs=None, threads=1)
    next(ld)
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=child, args=(ld, q))
    with warnings.catch_warnings():  # Python >= 3.12 warns about fork with threads running
        warnings.simplefilter("ignore", DeprecationWarning)
        p.start()
    p.join(30)
    print(q.get(timeout=5))
    ld.close()
"""


def test_forked_child_gets_a_clear_error_instead_of_a_hang(tmp_path):
    # A fresh interpreter: forking the pytest process itself trips other libraries' at-fork
    # hooks (JAX warns when it has been imported by an earlier test).
    script = tmp_path / "fork_child.py"
    script.write_text(_FORK_SCRIPT)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.strip().startswith("LoaderError: this loader was created in another process")


def test_summary_of_a_foreign_stats_dict():
    class Other:
        def stats(self):
            return {"delivered_batches_total": 3, "mode": "mixed"}

    text = headrace.stats(Other())
    assert text.splitlines()[0] == "Status: RUNNING | Mode: mixed | Epoch: 0 | Step: 3"
