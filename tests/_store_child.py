"""Child processes for the store's crash and concurrency tests (not a test module).

``python _store_child.py forkserver STORE LOG`` reads ``go SEED DELAY_MS WAIT_READY`` lines on stdin;
for each it forks a writer (``crash_worker``) that appends/modifies/deletes/compacts and commits in a
loop, SIGKILLs it DELAY_MS after the fork (or after the writer opened the store, if WAIT_READY is 1)
and prints ``killed <wait status>``. Forking from a process that already
imported numpy and headrace makes each round cost milliseconds, so a test can afford many kills.

The writer logs ``pending <uids>`` before each commit and ``done <uids>`` after it returns, where
``uids`` lists the record ids' contents in order (record i holds content ``uid``, see ``content``).
After a kill the store must equal the last ``done`` state, or the ``pending`` one after it.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
import traceback

import numpy as np

import headrace

FIELDS = {"u": "int64", "x": {"dtype": "uint8", "shape": [16]},
          "b": {"dtype": "bytes", "codec": "zstd"}}


def content(uid: int) -> tuple[bytes, np.ndarray]:
    """The bytes (field b) and 16-byte row (field x) that record content ``uid`` carries."""
    rng = np.random.default_rng(uid)
    return rng.integers(0, 256, uid % 37, dtype=np.uint8).tobytes(), rng.integers(
        0, 256, 16, dtype=np.uint8)


def batch(uids: list[int]) -> dict[str, object]:
    pairs = [content(u) for u in uids]
    return {"u": np.array(uids, np.int64), "x": np.stack([x for _, x in pairs]),
            "b": [b for b, _ in pairs]}


def read_state(path: str) -> list[int]:
    """The uids in a store, after checking every record's content matches its uid."""
    s = headrace.open(path, verify="always")
    got = s.gather(np.arange(len(s)))
    uids = got["u"].tolist()
    for i, u in enumerate(uids):
        b, x = content(u)
        assert got["b"][i].tobytes() == b, f"record {i} (uid {u}): bytes differ"
        assert np.array_equal(got["x"][i], x), f"record {i} (uid {u}): x differs"
    s.close()
    return uids


def _log(fd: int, kind: str, uids: list[int]) -> None:
    os.write(fd, f"{kind} {json.dumps(uids)}\n".encode())


def crash_worker(path: str, log_path: str, seed: int, ready_fd: int) -> None:
    """Writes forever: random ops, a commit after each, logged before and after."""
    rng = random.Random(seed)
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND)
    w = headrace.open(path, mode="a")
    uids = read_state(path)
    os.write(ready_fd, b"r")
    next_uid = seed * 1_000_000
    while True:
        new = list(uids)
        for _ in range(rng.randint(1, 3)):
            op = rng.random()
            if op < 0.45 or not new or (op < 0.7 and len(new) < 5):
                k = rng.randint(1, 6)
                w.append(batch(list(range(next_uid, next_uid + k))))
                new += range(next_uid, next_uid + k)
                next_uid += k
            elif op < 0.7:
                i = rng.randrange(len(new))
                w.modify(i, {k: v[0] for k, v in batch([next_uid]).items()})
                new[i] = next_uid
                next_uid += 1
            elif op < 0.9 or len(new) > 150:
                i = rng.randrange(len(new))
                w.delete(i)
                new[i] = new[-1]
                new.pop()
            else:
                w.compact()
        if rng.random() < 0.1:
            w.rollback()
            continue
        _log(log, "pending", new)
        w.commit()
        _log(log, "done", new)
        uids = new


def forkserver(path: str, log_path: str) -> None:
    for line in sys.stdin:
        cmd, seed, delay_ms, wait_ready = line.split()
        assert cmd == "go"
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            try:
                crash_worker(path, log_path, int(seed), w)
            except BaseException:
                traceback.print_exc()
                os._exit(3)
            os._exit(0)
        os.close(w)
        if wait_ready == "1":  # else the kill may land while the writer opens (recovery)
            os.read(r, 1)
        os.close(r)
        time.sleep(int(delay_ms) / 1000)
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        print(f"killed {status}", flush=True)


def reader_loop(path: str, seconds: float, seed: int) -> dict[str, int]:
    """Reads while another process appends: lengths never shrink and every record is intact.

    Records are written by ``concurrent_writer``: record i has uid i. Returns counters.
    """
    rng = np.random.default_rng(seed)
    s = headrace.open(path)
    last_len, reads, refreshes = len(s), 0, 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if s.refresh():
            refreshes += 1
        n = len(s)
        assert n >= last_len, f"length went back from {last_len} to {n}"
        last_len = n
        if n == 0:
            continue
        idx = rng.integers(0, n, 32)
        got = s.gather(idx)
        assert got["u"].tolist() == idx.tolist(), "records out of place"
        for j, i in enumerate(idx.tolist()):
            b, x = content(i)
            assert got["b"][j].tobytes() == b and np.array_equal(got["x"][j], x), f"record {i}"
        reads += 1
    return {"reads": reads, "refreshes": refreshes, "final_len": last_len}


if __name__ == "__main__":
    if sys.argv[1] == "forkserver":
        forkserver(sys.argv[2], sys.argv[3])
    else:
        raise SystemExit(f"unknown mode {sys.argv[1]!r}")
