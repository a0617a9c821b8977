"""One writer, any number of readers: in other processes, while the writer commits."""

import multiprocessing
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import headrace

sys.path.insert(0, os.path.dirname(__file__))  # spawned children inherit sys.path
import _store_child


def test_readers_in_other_processes_see_consistent_prefixes(tmp_path):
    path = str(tmp_path / "s")
    w = headrace.create(path, fields=_store_child.FIELDS, chunk_mb=0.003)
    w.append(_store_child.batch(list(range(10))))
    w.commit()
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(2) as pool:
        results = [pool.apply_async(_store_child.reader_loop, (path, 3.0, seed)) for seed in (1, 2)]
        n, commits = 10, 0
        while not all(r.ready() for r in results):
            k = int(np.random.default_rng(n).integers(1, 8))
            w.append(_store_child.batch(list(range(n, n + k))))
            n += k
            if commits % 7 == 6:
                w.compact()  # rewrites every chunk and unlinks the old ones: contents unchanged
            w.commit()
            commits += 1
        stats = [r.get(timeout=30) for r in results]
    w.close()
    assert commits > 5
    for st in stats:
        assert st["reads"] > 0 and st["refreshes"] > 0, st
        assert 10 <= st["final_len"] <= n
    assert _store_child.read_state(path) == list(range(n))


def test_reader_threads_share_one_store(tmp_path):
    path = str(tmp_path / "s")
    with headrace.create(path, fields=_store_child.FIELDS) as w:
        w.append(_store_child.batch(list(range(200))))
    s = headrace.open(path)
    errors = []

    def read(seed):
        try:
            rng = np.random.default_rng(seed)
            for _ in range(50):
                idx = rng.integers(0, 200, 16)
                assert s.gather(idx)["u"].tolist() == idx.tolist()
        except Exception as e:  # crosses the thread boundary as a value
            errors.append(e)

    threads = [threading.Thread(target=read, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_second_writer_is_refused(tmp_path):
    path = str(tmp_path / "s")
    w = headrace.create(path, fields={"b": "bytes"})
    with pytest.raises(headrace.WriterBusyError, match=rf"{path}.*pid {os.getpid()}"):
        headrace.open(path, mode="a")
    code = textwrap.dedent(f"""
        import headrace
        try:
            headrace.open({path!r}, mode="a")
        except headrace.WriterBusyError as e:
            print("busy:", e)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("busy:") and f"pid {os.getpid()}" in out.stdout
    w.append({"b": [b"one"]})
    w.close()  # releases the lock (and discards the uncommitted append)
    with headrace.open(path, mode="a") as w2:
        w2.append({"b": [b"two"]})
    assert headrace.open(path).gather([0])["b"][0].tobytes() == b"two"


def test_lock_is_released_when_the_writer_process_dies(tmp_path):
    path = str(tmp_path / "s")
    headrace.create(path, fields={"b": "bytes"}).close()
    code = f"import headrace, os; w = headrace.open({path!r}, mode='a'); os._exit(0)"
    subprocess.run([sys.executable, "-c", code], check=True)
    headrace.open(path, mode="a").close()
