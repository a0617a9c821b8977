"""Abandoned loaders stop their threads; Ctrl-C reaches the program as ``KeyboardInterrupt``."""

from __future__ import annotations

import gc
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import headrace
from _loader_util import read_through_interrupts
from _media import sine, write_audio, write_garbage
from headrace import LoaderError

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")


def _workers() -> int:
    return sum(t.name.startswith("headrace-worker") for t in threading.enumerate())


def _fails_after_64(batch, ids):
    if ids[0] >= 64:
        raise ValueError("a transform error")
    return batch


@pytest.fixture(scope="module")
def audio_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = str(tmp_path_factory.mktemp("audio"))
    for i in range(4):
        write_audio(f"{root}/{i}.wav", sine(300, 8000, 400), 8000)
    write_garbage(f"{root}/9.wav")  # the third batch of 2 fails to decode
    return root


def _make(kind: str, audio_dir: str):
    data = {"x": np.arange(1024)}
    if kind == "loader":
        return headrace.Loader(data, batch=64, transform=_fails_after_64, threads=2)
    if kind == "dataloader":
        def tf(pair):
            if int(pair[1][0]) >= 64:
                raise ValueError("a transform error")
            return pair
        return headrace.DataLoader(np.arange(1024), np.arange(1024), num_workers=2,
                                   batch_size=64, mode=headrace.Sampler.Mode.SEQUENTIAL,
                                   transform=tf)
    if kind == "audio":
        return headrace.audio(audio_dir, batch=2, samples=100, threads=2)
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["loader", "dataloader", "audio"])
def test_abandoned_loaders_with_a_pending_error_stop_their_threads(kind, audio_dir):
    before = _workers()
    for _ in range(40):
        ld = _make(kind, audio_dir)
        next(ld)  # the failing batch is built (by a worker or by this thread) but not raised
        del ld
    deadline = time.monotonic() + 10
    while _workers() > before and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.05)
    assert _workers() == before


def test_a_stored_error_keeps_its_traceback_as_a_note():
    with headrace.Loader({"x": np.arange(256)}, batch=64, transform=_fails_after_64,
                         threads=1) as ld:
        next(ld)
        with pytest.raises(LoaderError) as info:
            next(ld)
    cause = info.value.__cause__
    assert isinstance(cause, ValueError)
    text = "\n".join(getattr(cause, "__notes__", []))
    assert "record ids" in text
    if cause.__traceback__ is None:  # gathered by the consumer's thread: frames kept as text
        assert "_fails_after_64" in text


def test_keyboard_interrupt_in_a_transform_is_not_wrapped():
    def tf(batch, ids):
        if ids[0] >= 64:
            raise KeyboardInterrupt
        return batch

    # The consumer may run a later batch's transform itself while it waits for batch 0 (it
    # steals work), and a KeyboardInterrupt there is a Ctrl-C at the consumer: raised at once. So
    # it may arrive at the first next(); what matters is that it arrives unwrapped, and only once.
    with headrace.Loader({"x": np.arange(512)}, batch=64, transform=tf, threads=2) as ld:
        got = []
        with pytest.raises(KeyboardInterrupt):
            for _ in range(8):
                got.append(next(ld)["x"][0])
        assert got in ([], [0])


_CHILD = textwrap.dedent("""
    import signal, sys, time
    import numpy as np
    import headrace

    # a suite started in the background by a shell without job control inherits SIGINT ignored,
    # and Python then installs no KeyboardInterrupt handler: the Ctrl-Cs would never arrive
    signal.signal(signal.SIGINT, signal.default_int_handler)

    def slow(batch, ids):
        t = time.perf_counter() + 0.002
        while time.perf_counter() < t:  # CPU work, interruptible between bytecodes
            pass
        return batch

    data = {"x": np.zeros((4096, 16), np.float32)}
    for _ in range(ROUNDS):
        ld = headrace.Loader(data, batch=32, order="shuffle", epochs=None, transform=slow,
                             threads=2)
        print("ready", flush=True)
        try:
            while True:
                next(ld)
        except KeyboardInterrupt:
            result = "KeyboardInterrupt"
        except BaseException as e:
            result = "OTHER " + type(e).__name__ + ": " + str(e).replace("\\n", " ")
        after = "continues"
        try:  # the loader is still consistent: it continues after the interrupt
            next(ld)
        except BaseException as e:
            after = "broken " + type(e).__name__
        ld.close()
        print(result, "|", after, flush=True)
""")


def test_ctrl_c_arrives_as_keyboard_interrupt_every_time():
    rounds = 24
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    child = subprocess.Popen([sys.executable, "-c", _CHILD.replace("ROUNDS", str(rounds))],
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
    rng = random.Random(0)
    results = []
    try:
        assert child.stdout is not None
        for _ in range(rounds):
            line = child.stdout.readline()
            assert line.strip() == "ready", (line, child.stderr.read() if child.stderr else "")
            time.sleep(rng.uniform(0.01, 0.08))
            child.send_signal(signal.SIGINT)
            results.append(child.stdout.readline().strip())
        _, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert results == ["KeyboardInterrupt | continues"] * rounds, results
    assert child.returncode == 0, err
    assert "release unlocked lock" not in err


def _slow(batch, ids):
    time.sleep(0.005)  # the worker stays busy, so the waiting consumer gathers batches itself
    return batch


@pytest.mark.timeout(60)
def test_a_ctrl_c_between_the_consumers_reservation_and_its_post_loses_no_batch(monkeypatch):
    """A Ctrl-C can land after the consumer reserved a batch for itself and before it posted it:
    that batch is gathered again, never lost (it held the window: next() waited forever)."""
    from headrace._engine import loader as _loader

    run, hits = _loader._Engine._run, []

    def interrupted(self, task, busy, *, inline=False, post=True):
        if inline and not hits:
            hits.append(task.k)
            raise KeyboardInterrupt  # reserved, not posted
        return run(self, task, busy, inline=inline, post=post)

    monkeypatch.setattr(_loader._Engine, "_run", interrupted)
    with headrace.Loader({"x": np.arange(640)}, batch=32, order="sequential", epochs=1,
                         transform=_slow, threads=1) as ld:
        assert read_through_interrupts(ld) == list(range(640))
    assert hits  # the consumer did gather inline, and was interrupted there


@pytest.mark.timeout(60)
def test_a_ctrl_c_while_the_consumer_retakes_the_lock_is_a_keyboard_interrupt(monkeypatch):
    """``Condition.wait`` interrupted while it takes the lock back returns without the lock; the
    consumer takes it back, so the Ctrl-C arrives as such (not RuntimeError('release unlocked
    lock')) and the loader continues."""
    from headrace._engine import loader as _loader

    monkeypatch.setattr(_loader._Engine, "_inline", lambda self: None)  # always wait
    with headrace.Loader({"x": np.arange(640)}, batch=32, order="sequential", epochs=1,
                         transform=_slow, threads=1) as ld:
        engine = ld._engine
        real, hits = engine.ready_cv, []

        class Interrupted:
            def wait(self, timeout=None):
                if not hits:
                    hits.append(1)
                    engine.lock.release()  # as an interrupted re-acquire leaves it
                    raise KeyboardInterrupt
                return real.wait(timeout)

            def __getattr__(self, name):
                return getattr(real, name)

        engine.ready_cv = Interrupted()
        seen = []
        with pytest.raises(KeyboardInterrupt):
            while True:
                seen.append(next(ld)["x"].copy())
        engine.ready_cv = real
        rest = read_through_interrupts(ld)
    assert hits
    assert np.concatenate([*seen, rest]).tolist() == list(range(640))


class _InterruptedAsAcquired:
    """A re-entrant lock whose first non-blocking acquire succeeds and then raises
    ``KeyboardInterrupt``, as CPython does when a Ctrl-C arrives during the C call: the signal is
    handled right after the call returns, before any statement could record the acquisition."""

    def __init__(self) -> None:
        self.inner = threading.RLock()
        self.fired = False

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        got = self.inner.acquire(blocking, timeout)
        if got and not blocking and not self.fired:
            self.fired = True
            raise KeyboardInterrupt
        return got

    def release(self) -> None:
        self.inner.release()

    def _is_owned(self) -> bool:
        return self.inner._is_owned()


@pytest.mark.parametrize("invite", [False, True])
def test_a_ctrl_c_as_the_consumer_takes_the_dispatch_lock_leaves_it_free(invite):
    # left taken, the lock would stop every worker's dispatch for good: next() waits forever
    from types import SimpleNamespace

    from headrace._engine.loader import _Engine

    lock = _InterruptedAsAcquired()
    engine = SimpleNamespace(dispatch_lock=lock, inline_wanted=False,
                             _dispatch=lambda **kw: pytest.fail("dispatched after the Ctrl-C"))
    with pytest.raises(KeyboardInterrupt):
        _Engine._dispatch_if_free(engine, invite=invite)  # type: ignore[arg-type]
    assert lock.fired and not lock._is_owned()
    got: list[bool] = []
    other = threading.Thread(target=lambda: got.append(lock.inner.acquire(timeout=1)))
    other.start()
    other.join()
    assert got == [True]  # another thread (a worker) takes it at once


def test_a_dispatch_lock_a_ctrl_c_left_taken_is_given_back_on_the_next_call():
    # the last window (between asking who owns the lock and releasing it): a lock the consumer
    # still holds on entry is one an interrupt left behind, and is let go before anything else
    from types import SimpleNamespace

    from headrace._engine.loader import _Engine

    lock = threading.RLock()
    lock.acquire()  # what an interrupted release leaves: owned by the consumer's thread
    engine = SimpleNamespace(dispatch_lock=lock, inline_wanted=False,
                             _dispatch=lambda **kw: None)
    assert _Engine._dispatch_if_free(engine) is None  # type: ignore[arg-type]
    assert not lock._is_owned()  # type: ignore[attr-defined]
    got: list[bool] = []
    other = threading.Thread(target=lambda: got.append(lock.acquire(timeout=1)))
    other.start()
    other.join()
    assert got == [True]
