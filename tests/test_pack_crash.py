"""pack_arrays killed at random moments, or racing another pack_arrays to the same path.

A pack builds in a private folder and publishes it with one rename, so after a SIGKILL the path is
either absent or a complete store (never an empty or half-written one, never a folder that blocks a
rerun), and of two packs to the same new path one wins and the other is refused with
StoreExistsError, the winner's store intact.
"""

import contextlib
import multiprocessing
import os
import random
import signal
import time

import numpy as np
import pytest

import headrace

N = 3000
ROW = 512


def _data():
    return np.arange(N * ROW // 4, dtype=np.uint32).reshape(N, ROW // 4) % 251


def _pack(out, conn=None, workers=1):
    if conn is not None:
        conn.send("ready")
        conn.recv()  # start together
    try:
        headrace.pack_arrays(out, x=_data(), y=np.arange(N), chunk_mb=0.05, slice_bytes=16 << 10,
                             workers=workers)
    except headrace.StoreExistsError as e:
        os._exit(3 if "was filled by someone else" in str(e) or "not an empty" in str(e) else 4)
    except BaseException as e:
        print(f"pack failed: {type(e).__name__}: {e}", flush=True)
        os._exit(5)
    os._exit(0)


def _complete(path):
    with headrace.open(path) as st:
        assert len(st) == N
        got = st.gather(np.arange(N))
    np.testing.assert_array_equal(got["x"], _data())
    np.testing.assert_array_equal(got["y"], np.arange(N))
    assert headrace.verify(path).ok


@pytest.fixture
def ctx():
    # forkserver, not fork: the test process may run other libraries' threads by now (pyarrow,
    # Dask), and a child forked from it can deadlock on a lock one of them held
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["numpy", "headrace", "headrace._pack.arrays",
                                "headrace._store.writer", "headrace._store.reader"])
    return ctx


def _start(ctx, out, workers=1):
    """A pack in a child that waits for "go"; returns (process, pipe) once it is ready."""
    rx, tx = ctx.Pipe()
    p = ctx.Process(target=_pack, args=(out, rx, workers))
    p.start()
    assert tx.poll(120), "the child did not start"
    assert tx.recv() == "ready"
    return p, tx


def test_pack_arrays_killed_at_random_moments(tmp_path, ctx):
    rng = random.Random(7)
    # how long one pack takes here, to spread the kills over all of it
    p, tx = _start(ctx, str(tmp_path / "probe"))
    t0 = time.perf_counter()
    tx.send("go")
    p.join(600)
    span = time.perf_counter() - t0
    assert p.exitcode == 0
    outcomes = {"absent": 0, "complete": 0}
    for k in range(14):
        out = str(tmp_path / f"s{k}")
        p, tx = _start(ctx, out)
        tx.send("go")
        time.sleep(rng.uniform(0, span))
        with contextlib.suppress(ProcessLookupError):  # it may have finished already
            os.kill(p.pid, signal.SIGKILL)
        p.join(30)
        if not os.path.exists(out):
            outcomes["absent"] += 1
        else:
            _complete(out)  # anything at the path is the whole store
            outcomes["complete"] += 1
            span *= 0.7  # the machine got faster than the probe: aim earlier (a shared CI box)
            continue
        with pytest.raises(headrace.NotAStoreError):
            headrace.open(out)
        _pack_in_a_child(ctx, out)  # a rerun is not blocked by what the kill left
        _complete(out)
    assert outcomes["absent"] >= 3, outcomes  # the kills did land mid-pack


def _pack_in_a_child(ctx, out):
    p, tx = _start(ctx, out)
    tx.send("go")
    p.join(600)
    assert p.exitcode == 0


@pytest.mark.parametrize("workers", [1, 2])
def test_two_packs_to_the_same_new_path(tmp_path, ctx, workers):
    for k in range(4):
        out = str(tmp_path / f"s{k}")
        started = [_start(ctx, out, workers) for _ in range(2)]
        procs = [p for p, _ in started]
        for _, tx in started:
            tx.send("go")
        for p in procs:
            p.join(600)
        codes = sorted(p.exitcode for p in procs)
        assert codes == [0, 3], codes  # one wins; the other is told the path is taken
        _complete(out)
        leftovers = [n for n in os.listdir(tmp_path) if n.startswith(f".s{k}.")]
        assert not leftovers, leftovers
