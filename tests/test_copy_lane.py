"""The copy lane: rows copied on a native thread (``_store/_copylane.c``), the reads that start on
it (``Store.gather_start``, the sources' ``gather_start``) and a parked engine that starts each
next batch there."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import numpy as np
import pytest
from headrace._store._copylane import start

import headrace
from _loader_util import read_through_interrupts
from headrace._base.errors import RecordIndexError
from headrace._engine import solo
from headrace._store import lane

# -- the C lane ----------------------------------------------------------------------------------


def test_rows_are_copied_runs_and_scattered_alike() -> None:
    src = np.arange(1000 * 24, dtype=np.uint8).reshape(1000, 24)
    for rows in (np.arange(100, 356), np.random.default_rng(0).integers(0, 1000, 300),
                 np.array([5, 5, 6, 7, 3, 999, 0, 1])):
        rows = rows.astype(np.int64)
        out = np.empty((len(rows), 24), np.uint8)
        p = start(src, 24, rows, out, -1)
        p.wait()
        assert p.done
        np.testing.assert_array_equal(out, src[rows])


def test_a_row_outside_the_limit_is_an_index_error_and_nothing_is_copied() -> None:
    src = np.ones((10, 8), np.uint8)
    out = np.zeros((2, 8), np.uint8)
    with pytest.raises(IndexError, match=r"row 10 is outside 0\.\.9"):
        start(src, 8, np.array([0, 10], np.int64), out, -1)
    with pytest.raises(IndexError, match=r"row 7 is outside 0\.\.6"):
        start(src, 8, np.array([0, 7], np.int64), out, 7)
    with pytest.raises(IndexError, match="row -1"):
        start(src, 8, np.array([-1], np.int64), out, -1)
    assert not out.any()
    with pytest.raises(ValueError, match="out holds 8 bytes"):
        start(src, 8, np.array([0, 1], np.int64), out[:1], -1)
    with pytest.raises(ValueError, match="row_bytes must be > 0"):
        start(src, 0, np.array([0], np.int64), out, -1)


def test_more_copies_than_the_queue_holds_and_dropped_ones_all_finish() -> None:
    src = np.random.default_rng(1).integers(0, 255, (4096, 512), dtype=np.uint8)
    outs, pending = [], []
    for i in range(300):  # the queue holds 64: the rest copy in the caller
        rows = np.arange(i, i + 8, dtype=np.int64)
        outs.append((rows, np.empty((8, 512), np.uint8)))
        pending.append(start(src, 512, rows, outs[-1][1], -1))
    del pending  # dropping a copy in flight waits for it: its buffers stay valid until then
    for rows, out in outs:
        np.testing.assert_array_equal(out, src[rows])


def test_a_waiter_copies_the_jobs_the_lane_has_not_taken_yet() -> None:
    # the lane busy with the first copies: waiting on later ones (in any order) copies them in
    # the waiter, and the lane skips them; every copy comes out right
    rng = np.random.default_rng(5)
    src = rng.integers(0, 255, (2048, 4096), dtype=np.uint8)
    jobs = []
    for _ in range(40):
        rows = rng.integers(0, 2048, 256).astype(np.int64)
        out = np.empty((256, 4096), np.uint8)
        jobs.append((rows, out, start(src, 4096, rows, out, -1)))
    for j in [39, 20, 38, 0, *range(1, 20), *range(21, 38)]:
        rows, out, p = jobs[j]
        p.wait()
        assert p.done
        np.testing.assert_array_equal(out, src[rows])


@pytest.mark.parametrize("rec", [8, 3072, 70_001])
def test_checked_copies_split_in_pieces_give_what_one_call_does(rec: int) -> None:
    # jobs of many pieces (64 KiB each), waited for in a scrambled order: a waiter joins the job
    # the lane is copying, or takes one not started; the copies, the records newly verified and
    # the damaged rows (one sorted list, over pieces copied by both threads) are what one
    # take_checked call gives
    import google_crc32c

    from headrace._store import _copylane
    from headrace._store.crc_rows import take_checked

    assert take_checked is not None
    rng = np.random.default_rng(rec)
    n = 600
    src = rng.integers(0, 256, (n, rec), dtype=np.uint8)
    aux = np.zeros((n, 2), np.uint32)
    aux[:, 0] = [google_crc32c.value(r.tobytes()) for r in src]
    aux[:, 1] = rec
    aux[rng.choice(n, 40, replace=False), 0] ^= 1  # damage spread over every piece
    bits_lane, bits_one = np.zeros((n + 7) // 8, np.uint8), np.zeros((n + 7) // 8, np.uint8)
    jobs = []
    for _ in range(12):
        ids = rng.integers(0, n, 256 if rec < 70_000 else 24).astype(np.int64)
        out = np.empty((len(ids), rec), np.uint8)
        jobs.append((ids, out, _copylane.start_checked(src.reshape(-1), rec, ids, ids, aux,
                                                       bits_lane, out)))
    want = []
    for ids, _out, _p in jobs:  # the same reads in the same order, one call each
        out = np.empty((len(ids), rec), np.uint8)
        new, bad = take_checked(src.reshape(-1), rec, ids, ids, aux, bits_one, out)
        want.append((out, new, np.frombuffer(bad, np.int64).tolist()))
    got: dict[int, tuple[int, list[int]]] = {}
    for j in [5, 0, 11, *range(1, 5), *range(6, 11)]:
        ids, out, p = jobs[j]
        new, bad = p.wait()
        got[j] = (new, np.frombuffer(bad, np.int64).tolist())
        np.testing.assert_array_equal(out, src[ids])
        assert got[j][1] == sorted(got[j][1])
    for j, (_out, _new, bad) in enumerate(want):
        assert got[j][1] == bad  # damaged rows: the same positions whoever copied them
    np.testing.assert_array_equal(bits_lane, bits_one)
    # each good record is counted new once over all jobs, whichever job or thread saw it first
    assert sum(new for new, _ in got.values()) == sum(w[1] for w in want)


def test_a_pending_copy_keeps_its_buffers() -> None:
    src = bytearray(range(256)) * 64
    out = np.empty((64, 256), np.uint8)
    p = start(src, 256, np.arange(64, dtype=np.int64), out, -1)
    with pytest.raises(BufferError):
        src.extend(b"x")  # exported to the lane until the copy is done
    p.wait()
    src.extend(b"x")  # given back
    np.testing.assert_array_equal(out.reshape(-1), np.frombuffer(src, np.uint8)[:-1])


_FORKED = """
import os, numpy as np
from headrace._store._copylane import start
start(np.zeros((4, 4), np.uint8), 4, np.arange(4, dtype=np.int64),
      np.empty((4, 4), np.uint8), -1).wait()  # the parent's lane thread is running
pid = os.fork()
if pid == 0:
    src = np.arange(200 * 40, dtype=np.uint8).reshape(200, 40)
    out = np.empty((50, 40), np.uint8)
    start(src, 40, np.arange(150, 200, dtype=np.int64), out, -1).wait()
    os._exit(0 if (out == src[150:]).all() else 3)
_, status = os.waitpid(pid, 0)
raise SystemExit(os.waitstatus_to_exitcode(status))
"""


def test_a_forked_child_copies_on_a_lane_of_its_own() -> None:
    # in a fresh interpreter: this one runs JAX's threads, which make fork() unsafe
    done = subprocess.run([sys.executable, "-c", _FORKED], timeout=120)
    assert done.returncode == 0


# -- reads started on the lane ---------------------------------------------------------------------


@pytest.fixture
def store(tmp_path: Any) -> Any:
    rng = np.random.default_rng(2)
    headrace.pack_arrays(tmp_path / "s", x=rng.integers(0, 255, (500, 96), dtype=np.uint8),
                         y=np.arange(500, dtype=np.int64), progress=False)
    with headrace.open(tmp_path / "s") as st:
        yield st


def test_store_reads_start_once_a_gather_planned_them(store: Any) -> None:
    ids = np.arange(100, 164, dtype=np.int64)
    assert store.gather_start(ids, ("x", "y")) is None  # the first gather plans the reads
    store.gather(np.arange(2), ("x", "y"))
    # unverified records (a checked copy) first, verified ones (a plain copy) after
    for idx in (ids, np.random.default_rng(3).integers(0, 500, 200), ids):
        got = store.gather_start(idx, ("x", "y")).wait()
        want = store.gather(idx, ("x", "y"))
        assert got.keys() == want.keys()
        for k in want:
            assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape
            np.testing.assert_array_equal(got[k], want[k])
    with pytest.raises(RecordIndexError, match="record id 500 is out of range"):
        store.gather_start(np.array([3, 500]), ("x", "y"))


def _counted(monkeypatch: pytest.MonkeyPatch, name: str) -> list[int]:
    count = [0]
    real = getattr(lane, name)

    def counted(*a: Any) -> Any:
        count[0] += 1
        return real(*a)

    monkeypatch.setattr(lane, name, counted)
    return count


def _damage_crc(path: Any, field: str, record: int) -> None:
    """Flips a bit of ``record``'s stored crc32c: its bytes then no longer match it."""
    with open(path / f"{field}.aux", "r+b") as f:
        f.seek(record * 8)
        word = f.read(1)[0]
        f.seek(record * 8)
        f.write(bytes([word ^ 1]))


def test_first_reads_check_each_record_on_the_lane_then_copy_plainly(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    x = np.random.default_rng(8).integers(0, 255, (400, 300), dtype=np.uint8)
    headrace.pack_arrays(tmp_path / "s", x=x, progress=False)
    checked, plain = _counted(monkeypatch, "start_checked"), _counted(monkeypatch, "_start")
    with headrace.open(tmp_path / "s") as st:
        st.gather(np.arange(1))
        for lo in range(0, 400, 64):  # every record checked once, on the lane
            np.testing.assert_array_equal(st.gather_start(np.arange(lo, min(lo + 64, 400)))
                                          .wait()["x"], x[lo:lo + 64])
        assert checked[0] == 7 and plain[0] == 0
        ids = np.array([399, 0, 17], np.int64)
        np.testing.assert_array_equal(st.gather_start(ids).wait()["x"], x[ids])
        assert checked[0] == 7 and plain[0] == 1  # all verified: plain copies from here on


@pytest.mark.parametrize("verify", ["first", "always"])
def test_a_damaged_record_read_on_the_lane_raises_naming_it(tmp_path: Any, verify: str) -> None:
    x = np.random.default_rng(9).integers(0, 255, (300, 128), dtype=np.uint8)
    headrace.pack_arrays(tmp_path / "s", x=x, y=np.arange(300), progress=False)
    _damage_crc(tmp_path / "s", "x", 201)
    with headrace.open(tmp_path / "s", verify=verify) as st:
        st.gather(np.arange(3))
        started = st.gather_start(np.array([10, 201, 11, 201]))
        with pytest.raises(headrace.CorruptionError, match=r"'x'.*record ids \[201\]"):
            started.wait()
        np.testing.assert_array_equal(st.gather_start(np.array([10, 11])).wait()["x"],
                                      x[[10, 11]])
        with pytest.raises(headrace.CorruptionError, match=r"record ids \[201\]"):
            st.gather_start(np.array([201])).wait()  # not marked verified by the failed read


def test_store_with_verify_never_starts_at_once(tmp_path: Any) -> None:
    headrace.pack_arrays(tmp_path / "s", x=np.arange(50, dtype=np.float32), progress=False)
    with headrace.open(tmp_path / "s", verify="never") as st:
        st.gather(np.arange(2))  # the steady plan is made by a first read
        np.testing.assert_array_equal(st.gather_start(np.arange(10, 20)).wait()["x"],
                                      np.arange(10, 20, dtype=np.float32))


def test_array_and_dataset_sources_start_plain_takes(tmp_path: Any) -> None:
    from headrace._sources.base import ArraySource

    x = np.arange(300, dtype=np.float32).reshape(100, 3)
    src = ArraySource({"x": x, "y": np.arange(100)})
    ids = np.array([9, 3, 3, 50], np.int64)
    got = src.gather_start(ids).wait()
    np.testing.assert_array_equal(got["x"], x[ids])
    np.testing.assert_array_equal(got["y"], ids)
    assert ArraySource({"o": np.array([None] * 100, object)}).gather_start(ids) is None
    np.save(tmp_path / "x.npy", x)
    ds = headrace.Dataset(str(tmp_path / "x.npy"))
    np.testing.assert_array_equal(ds.gather_start(ids).wait(), x[ids])


def test_shared_and_field_pair_sources_say_when_first_reads_still_verify(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # the solo probe keys its verdicts by this: a verifying epoch is other work than a steady one
    from headrace._compat.loaderx import _source
    from headrace._sources import shared_store
    from headrace._sources.shared_store import open_shared

    headrace.pack_arrays(tmp_path / "s", x=np.arange(300, dtype=np.int64),
                         y=np.arange(300, dtype=np.float32), progress=False)
    monkeypatch.setattr(shared_store, "_SETTLE_NS", 0)  # fresh files are shared at once
    time.sleep(0.05)
    shared = open_shared(str(tmp_path / "s"))
    pair = _source(headrace.Dataset(str(tmp_path / "s"), "x"),
                   headrace.Dataset(str(tmp_path / "s"), "y"))
    assert type(pair).__name__ == "_FieldPairSource"
    assert not shared.work_state()[-1] and not pair.work_state()[-1]
    assert shared.gather_start(np.arange(10)) is None  # verifying: no plain copy yet
    shared.gather(np.arange(300))
    assert shared.work_state()[-1] and pair.work_state()[-1]
    got = pair.gather_start(np.array([7, 3])).wait()
    np.testing.assert_array_equal(got["data"], [7, 3])
    np.testing.assert_array_equal(got["label"], np.array([7, 3], np.float32))
    shared.close()


def test_takes_of_any_shape_start_and_empty_ones_do_not() -> None:
    cube = np.arange(5 * 3 * 2, dtype=np.float64).reshape(5, 3, 2)
    out, p = lane.take_started(cube, np.array([4, 0, 4]))
    p.wait()
    np.testing.assert_array_equal(out, cube[[4, 0, 4]])
    # no rows to copy: nothing starts (the caller gathers, which gives the empty batch)
    assert lane.take_started(np.zeros((0, 3)), np.zeros(0, np.int64)) is None


# -- a parked engine ---------------------------------------------------------------------------------


class _Always(dict):
    """Solo verdicts that say every kind of work went faster with the consumer alone."""

    def get(self, key: Any, default: Any = None) -> Any:
        return True


def _park(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every engine starts with its workers parked and stays so; returns the count of copies
    the lane is given: plain ones (``lane._start``) and checked first reads
    (``lane.start_checked``)."""
    monkeypatch.setattr(solo, "_VERDICTS", _Always())
    monkeypatch.setattr(solo, "_KEEP", 10**9)
    monkeypatch.setattr(solo, "_BUSY_SHARE", 1e9)  # never found busy elsewhere (tiny batches)
    count = [0]
    real = lane._start

    def counted(*a: Any) -> Any:
        count[0] += 1
        return real(*a)

    real_checked = lane.start_checked

    def counted_checked(*a: Any) -> Any:
        count[0] += 1
        return real_checked(*a)

    monkeypatch.setattr(lane, "_start", counted)
    monkeypatch.setattr(lane, "start_checked", counted_checked)
    return count


@pytest.fixture
def parked(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    return _park(monkeypatch)


def _batches(loader: Any, n: int | None = None) -> list[dict[str, np.ndarray]]:
    out = []
    for b in loader:
        out.append({k: np.array(v) for k, v in b.items()})
        if n is not None and len(out) == n:
            break
    return out


def _same(a: list[dict[str, np.ndarray]], b: list[dict[str, np.ndarray]]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for k in x:
            np.testing.assert_array_equal(x[k], y[k])


@pytest.mark.parametrize("order", ["sequential", "shuffle", "iid"])
def test_a_parked_loader_yields_the_batches_its_workers_do(tmp_path: Any, order: str,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    rng = np.random.default_rng(4)
    headrace.pack_arrays(tmp_path / "s", x=rng.integers(0, 255, (999, 40), dtype=np.uint8),
                         y=np.arange(999, dtype=np.int64), progress=False)
    want = _batches(headrace.Loader(str(tmp_path / "s"), batch=32, order=order, seed=5, epochs=3,
                                    threads=2))
    copies = _park(monkeypatch)
    got = _batches(headrace.Loader(str(tmp_path / "s"), batch=32, order=order, seed=5, epochs=3,
                                   threads=2))
    _same(got, want)
    # two fields per batch, all but about one batch an epoch started ahead (the run's first
    # gather plans the reads; first reads check their records on the lane)
    assert copies[0] >= 2 * (3 * 32 - 3)


def test_a_parked_first_epoch_stops_at_the_damaged_record(tmp_path: Any,
                                                         parked: list[int]) -> None:
    x = np.random.default_rng(10).integers(0, 255, (300, 64), dtype=np.uint8)
    headrace.pack_arrays(tmp_path / "s", x=x, progress=False)
    _damage_crc(tmp_path / "s", "x", 201)
    seen = []
    # as the workers report it: the batch, its ids, the store's error as the cause
    with (headrace.Loader(str(tmp_path / "s"), batch=32, order="sequential", epochs=1) as loader,
          pytest.raises(headrace.LoaderError, match=r"batch 6: field 'x', record ids \[201\]")
          as err):
        for batch in loader:
            seen.append(np.array(batch["x"]))
    assert isinstance(err.value.__cause__, headrace.CorruptionError)
    assert len(seen) == 6  # the batches before record 201's, each as stored
    np.testing.assert_array_equal(np.concatenate(seen), x[:192])
    assert parked[0] >= 6  # checked on the lane


def test_the_loaderx_loaders_over_npy_and_store_fields_start_on_the_lane(
        tmp_path: Any, parked: list[int]) -> None:
    x = np.arange(600, dtype=np.float32).reshape(200, 3)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", np.arange(200))
    headrace.pack_arrays(tmp_path / "s", x=x, y=np.arange(200), progress=False)
    for data, label in ((str(tmp_path / "x.npy"), str(tmp_path / "y.npy")),
                        ((str(tmp_path / "s"), "x"), (str(tmp_path / "s"), "y"))):
        before = parked[0]
        ds = (headrace.Dataset(*data) if isinstance(data, tuple) else headrace.Dataset(data))
        ls = (headrace.Dataset(*label) if isinstance(label, tuple) else headrace.Dataset(label))
        with headrace.DataLoader(ds, ls, batch_size=16, mode=2, seed=1) as loader:
            got = [next(loader) for _ in range(40)]
        for b in got:
            np.testing.assert_array_equal(b["data"], x[b["label"]])
        assert parked[0] > before


def test_closing_or_rewinding_with_a_copy_in_flight_is_clean(tmp_path: Any,
                                                              parked: list[int]) -> None:
    headrace.pack_arrays(tmp_path / "s", x=np.arange(4000, dtype=np.int64), progress=False)
    st = headrace.open(tmp_path / "s", verify="never")
    with headrace.Loader(st, batch=100, order="sequential", epochs=None) as loader:
        it = iter(loader)
        first = [next(it)["x"].copy() for _ in range(3)]
        assert loader._engine.aheads  # batches 3 and 4 are being copied
        token = loader.checkpoint()
        loader.set_epoch(0)  # the engine with the copy in flight is dropped
        np.testing.assert_array_equal(next(it)["x"], first[0])
        assert loader.stats()["inflight_bytes"] <= 2 * 800
    with headrace.Loader(st, batch=100, order="sequential", epochs=None,
                         resume=token) as loader:
        np.testing.assert_array_equal(next(iter(loader))["x"], np.arange(300, 400))
    st.close()
    assert parked[0] > 0


def test_the_lane_keeps_its_two_batches_under_a_window_of_one(
        tmp_path: Any, parked: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    # a tuner's first setting (one thread, no prefetch) leaves a window of one batch: the lane
    # still gets the next two, inside the byte budget (a tuned engine parks once its tuner
    # settled, which may be there; here it is parked from the start, as an untuned one would be)
    init = solo.SoloProbe.__init__

    def parked_from_the_start(self: Any, *a: Any, **kw: Any) -> None:
        init(self, *a, **{**kw, "tuned": False})

    monkeypatch.setattr(solo.SoloProbe, "__init__", parked_from_the_start)
    st = headrace.open(_packed(tmp_path, np.arange(3000, dtype=np.int64)), verify="never")
    with headrace.Loader(st, batch=100, order="sequential", epochs=1, tune=True) as loader:
        assert loader._engine.window == 1
        got = [next(loader)["x"].copy(), next(loader)["x"].copy()]
        assert loader._engine.aheads  # the next batch is being copied while this one is used
        got += [b["x"].copy() for b in loader]
        assert loader.stats()["inflight_high_water_bytes"] <= 3 * 800
    np.testing.assert_array_equal(np.concatenate(got), np.arange(3000))
    assert parked[0] >= 20  # without the lane's own window: none
    st.close()


def _packed(tmp_path: Any, x: np.ndarray) -> Any:
    headrace.pack_arrays(tmp_path / "w", x=x, progress=False)
    return tmp_path / "w"


def test_a_transform_runs_on_the_batch_copied_ahead(tmp_path: Any, parked: list[int]) -> None:
    headrace.pack_arrays(tmp_path / "s", x=np.arange(300, dtype=np.int64), progress=False)
    st = headrace.open(tmp_path / "s", verify="never")

    def double(batch: dict[str, Any], ids: np.ndarray) -> dict[str, Any]:
        return {"x": batch["x"] * 2, "ids": ids}

    with headrace.Loader(st, batch=30, order="shuffle", seed=2, epochs=2,
                         transform=double) as loader:
        for b in loader:
            np.testing.assert_array_equal(b["x"], 2 * b["ids"])
    st.close()
    assert parked[0] > 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("where", ["waiting", "starting"])
def test_a_ctrl_c_around_a_batch_copied_ahead_loses_and_repeats_nothing(
        monkeypatch: pytest.MonkeyPatch, parked: list[int], where: str) -> None:
    # a Ctrl-C as the consumer waits for a copied-ahead batch, or right after it reserved one:
    # every batch is still delivered once, in order
    from headrace._engine import loader as _loader

    hits: list[int] = []
    if where == "waiting":
        run = _loader._Engine._run

        def interrupted(self: Any, task: Any, busy: Any, *, inline: bool = False,
                        post: bool = True) -> None:
            if task.pending is not None and len(hits) < 3 and task.k % 5 == 0:
                hits.append(task.k)
                raise KeyboardInterrupt
            return run(self, task, busy, inline=inline, post=post)

        monkeypatch.setattr(_loader._Engine, "_run", interrupted)
    else:
        dispatch = _loader._Engine._dispatch

        def reserved_then_interrupted(self: Any, *, wait: bool, window: int = 0) -> Any:
            task = dispatch(self, wait=wait, window=window)
            if task is not None and not wait and self.aheads and len(hits) < 3 \
                    and task.k % 7 == 0:
                hits.append(task.k)
                raise KeyboardInterrupt  # reserved as the consumer's own, not queued yet
            return task

        monkeypatch.setattr(_loader._Engine, "_dispatch", reserved_then_interrupted)
    x = np.arange(6400)
    with headrace.Loader({"x": x}, batch=32, order="sequential", epochs=1) as ld:
        assert read_through_interrupts(ld) == x.tolist()
    assert len(hits) == 3


def test_loaders_in_several_threads_share_the_lane(parked: list[int]) -> None:
    # one lane for the process: four loaders in four threads, each parked and copying ahead,
    # each gets exactly its own stream
    import threading

    rng = np.random.default_rng(7)
    arrays = [rng.integers(0, 1 << 40, (5000, 16)) for _ in range(4)]
    results: list[Any] = [None] * 4

    def read(i: int) -> None:
        with headrace.Loader({"x": arrays[i]}, batch=64, order="shuffle", seed=i,
                             epochs=2) as ld:
            results[i] = [(b["x"].copy()) for b in ld]

    threads = [threading.Thread(target=read, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for i in range(4):
        want = [b["x"] for b in headrace.Loader({"x": arrays[i]}, batch=64, order="shuffle",
                                                seed=i, epochs=2, threads=1)]
        assert len(results[i]) == len(want)
        for a, b in zip(results[i], want, strict=True):
            np.testing.assert_array_equal(a, b)
    assert parked[0] > 4 * 100


def test_stats_count_the_batches_copied_on_the_lane(tmp_path: Any, parked: list[int]) -> None:
    st = headrace.open(_packed(tmp_path, np.arange(1000, dtype=np.int64)), verify="never")
    with headrace.Loader(st, batch=100, order="shuffle", epochs=2) as ld:
        n = sum(1 for _ in ld)
        assert n == 20
        assert 18 <= ld.stats()["lane_batches_total"] <= 20
        ld.set_epoch(0)  # a new engine: the count goes on
        next(ld)
        assert ld.stats()["lane_batches_total"] >= 19
    st.close()

    class Plain:  # a source that cannot start its reads on the lane
        def __init__(self) -> None:
            self.x = np.arange(1000)

        def __len__(self) -> int:
            return 1000

        fingerprint = "plain"

        def nbytes(self, ids: np.ndarray) -> int:
            return 8 * len(ids)

        def gather(self, ids: np.ndarray) -> dict[str, Any]:
            return {"x": self.x[ids]}

        def close(self) -> None:
            pass

    with headrace.Loader(Plain(), batch=100, order="shuffle", epochs=1) as ld:
        assert sum(len(b["x"]) for b in ld) == 1000
        assert ld.stats()["lane_batches_total"] == 0
