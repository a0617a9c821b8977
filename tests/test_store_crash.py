"""Crash safety: a writer SIGKILLed at random moments never costs more than its open transaction.

A fork server (tests/_store_child.py) starts writers that append, modify, delete, compact and commit in
a loop and kills each one after a random delay. After every kill the store must open, equal exactly
the last committed state (the one logged after ``commit()`` returned, or the one logged just before a
commit that the kill interrupted after it took effect), pass ``verify``, and take new writes.
"""

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pytest

import headrace

sys.path.insert(0, os.path.dirname(__file__))
import _store_child

KILLS = 60


def _expected(log_path):
    """(last done state, pending state after it or None) from the writers' log."""
    done, pending = [], None
    with open(log_path) as f:
        for line in f:
            kind, _, rest = line.partition(" ")
            try:
                uids = json.loads(rest)
            except json.JSONDecodeError:
                continue  # a line torn by the kill
            if kind == "done":
                done, pending = uids, None
            elif kind == "pending":
                pending = uids
    return done, pending


@pytest.fixture
def fast_dir(tmp_path):
    """A directory on tmpfs when there is one: a SIGKILL loses nothing the page cache holds, so
    the test means the same there, and commits (fsyncs) cost microseconds instead of milliseconds."""
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        d = tempfile.mkdtemp(prefix="headrace-crash-", dir="/dev/shm")
        yield d
        shutil.rmtree(d, ignore_errors=True)
    else:
        yield str(tmp_path)


def test_sigkill_at_random_moments(fast_dir):
    path = os.path.join(fast_dir, "s")
    log_path = os.path.join(fast_dir, "log")
    headrace.create(path, fields=_store_child.FIELDS, chunk_mb=0.002).close()
    open(log_path, "w").close()
    server = subprocess.Popen(
        [sys.executable, os.path.join(os.path.dirname(__file__), "_store_child.py"), "forkserver",
         path, log_path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    rng = random.Random(1234)
    seen_pending_state = seen_commits = 0
    try:
        for k in range(KILLS):
            ready = int(rng.random() < 0.8)
            server.stdin.write(f"go {k + 1} {rng.randint(0, 50 if ready else 30)} {ready}\n")
            server.stdin.flush()
            status = server.stdout.readline().split()
            assert status and status[0] == "killed", "the fork server died"
            # killed by SIGKILL, not exited on its own (a worker that raised exits with 3)
            assert os.WIFSIGNALED(int(status[1])), f"worker {k + 1} exited: status {status[1]}"
            done, pending = _expected(log_path)
            got = _store_child.read_state(path)
            assert got in (done, pending), (
                f"kill {k}: store holds {got}, last committed {done}, pending {pending}")
            seen_pending_state += got == pending and pending != done
            with open(log_path, "a") as f:  # the next writer starts from the state found here
                f.write(f"done {json.dumps(got)}\n")
            report = headrace.verify(path)
            assert report.ok, report.summary()
            seen_commits = headrace.open(path).commit_id
    finally:
        server.stdin.close()
        server.wait(timeout=30)
        server.stdout.close()
    print(f"{KILLS} kills, {seen_commits} commits, {seen_pending_state} kills landed mid-commit")
    assert seen_commits >= KILLS // 2  # the writers really committed between kills
    # the store takes new writes after the last kill, and nothing is left over from the crashes
    uids = _store_child.read_state(path)
    with headrace.open(path, mode="a") as w:
        w.append(_store_child.batch([10**9]))
    assert _store_child.read_state(path) == [*uids, 10**9]
    leftovers = [n for n in os.listdir(path) if n.endswith(".tmp")]
    assert not leftovers
    s = headrace.open(path)
    referenced = {f"{c.id}.zr" for c in s.meta.chunks}
    assert set(os.listdir(os.path.join(path, "chunks"))) == referenced
    assert s.gather(np.arange(len(s)))["u"].tolist()[-1] == 10**9
