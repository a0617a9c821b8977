"""Parallel packing (workers= / executor=): same dataset as one process, failures commit nothing.

Local process pools and a real Dask ``LocalCluster`` (2 worker processes) pack image trees and arrays;
every record of every field must equal the single-process pack's, in order, and the dataset hashes
must match. Faults are injected through a real executor that wraps the pack's task function (a
worker that SIGKILLs itself after writing its part, a task that raises), as any user executor could.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
import shutil
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import headrace
from _images import imagefolder, write_tree
from headrace import ConfigError, PackWorkerError, StoreExistsError
from headrace._pack.parallel import content_hash, plan_tasks, split_ranges

# -- helpers -------------------------------------------------------------------------------------


def _records(path: Path) -> dict[str, Any]:
    """Every record of every field, in order, plus the schema and attrs."""
    with headrace.open(path, verify="always") as st:
        ids = np.arange(len(st))
        out: dict[str, Any] = {"__n__": len(st), "__attrs__": st.attrs,
                               "__fields__": {k: v.to_json() for k, v in st.fields.items()}}
        for name, val in st.gather(ids).items():
            out[name] = ([bytes(np.asarray(r).tobytes()) for r in val.to_list()]
                         if hasattr(val, "to_list") else val.tobytes())
    return out


def _same_store(a: Path, b: Path) -> None:
    assert _records(a) == _records(b)
    assert content_hash(a) == content_hash(b)
    la, lb = a / "_labels.tsv", b / "_labels.tsv"
    assert la.exists() == lb.exists()
    if la.exists():
        assert la.read_bytes() == lb.read_bytes()
    headrace.verify(b)


def _nothing_left(out: Path) -> None:
    assert not out.exists()
    assert [p for p in os.listdir(out.parent) if ".partial-" in p] == []


def _faulty(fault: str, index: int, fn: Any, task: Any) -> Any:
    """Runs the pack's task function, except that task ``index`` raises or dies."""
    if task.index == index:
        if fault == "raise":
            raise OSError(f"injected read failure in task {task.index}")
        fn(task)  # the part is written, then the worker dies before it can report
        os.kill(os.getpid(), signal.SIGKILL)
    return fn(task)


class _FaultyExecutor(cf.Executor):
    """An executor that forwards to another one, wrapping each task with ``_faulty``."""

    def __init__(self, inner: cf.Executor, fault: str, index: int) -> None:
        self.inner, self.fault, self.index = inner, fault, index

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> cf.Future[Any]:
        return self.inner.submit(_faulty, self.fault, self.index, fn, *args, **kwargs)


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tree") / "in"
    imagefolder(root, {"cat": 9, "dog": 7, "emu": 8}, h=24, w=32)
    write_tree(root, {"emu/notes.txt": b"not an image", "cat/.hidden.jpg": b"x"})
    return root


@pytest.fixture(scope="module")
def single(tree: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("single") / "store"
    return out, headrace.pack_dir(tree, out=out, workers=1, shard_mb=0.01)


@pytest.fixture(scope="module")
def arrays(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    d = tmp_path_factory.mktemp("arrays")
    rng = np.random.default_rng(0)
    x = rng.integers(0, 255, (300, 4, 5), dtype=np.uint8)
    np.save(d / "x.npy", x)
    return {"x": str(d / "x.npy"), "y": np.arange(300, dtype=np.int64) * 7,
            "z": rng.random((300, 3)).astype(np.float32),
            "tok": [np.arange(i % 13, dtype=np.int32) for i in range(300)]}


def _pack_arrays(out: Path, arrays: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return headrace.pack_arrays(out, codec={"z": "zstd", "tok": "lz4"}, chunk_mb=0.001,
                                slice_bytes=2000, **arrays, **kw)


# -- planning ------------------------------------------------------------------------------------


def test_ranges_are_contiguous_cover_everything_and_balance_bytes():
    sizes = np.array([5, 1, 1, 1, 1, 1, 0, 9, 2, 3] * 7)
    for t in (1, 2, 3, 7, 70, 500):
        r = split_ranges(sizes, t)
        assert r[0][0] == 0 and r[-1][1] == len(sizes) and len(r) == min(t, len(sizes))
        assert all(a < b for a, b in r) and all(r[i][1] == r[i + 1][0] for i in range(len(r) - 1))
    halves = split_ranges(np.ones(10, np.int64), 2)
    assert halves == [(0, 5), (5, 10)]


def test_plan_keeps_small_inputs_in_process_unless_asked():
    assert plan_tasks(1000, 10_000, workers=None, executor=None) == 1
    assert plan_tasks(1000, 10_000, workers=3, executor=None) == 3
    assert plan_tasks(2, 10_000, workers=8, executor=None) == 2
    assert plan_tasks(1000, 4 << 30, workers=None, executor=None) >= min(os.cpu_count() or 1, 64)
    with cf.ThreadPoolExecutor(1) as ex:
        assert plan_tasks(1000, 10_000, workers=None, executor=ex) == 1
        assert plan_tasks(1000, 10_000, workers=5, executor=ex) == 5


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_bad_workers_are_refused_before_anything_is_written(tree, tmp_path, bad):
    with pytest.raises(ConfigError, match="workers="):
        headrace.pack_dir(tree, out=tmp_path / "o", workers=bad)
    with pytest.raises(ConfigError, match="executor="):
        headrace.pack_arrays(tmp_path / "a", x=np.arange(3), executor="dask")
    assert not (tmp_path / "o").exists() and not (tmp_path / "a").exists()


# -- local process pools -------------------------------------------------------------------------


def test_pack_dir_with_workers_is_the_same_dataset(tree, single, tmp_path):
    ref, ref_res = single
    res = headrace.pack_dir(tree, out=tmp_path / "par", workers=3, shard_mb=0.01)
    assert res["dataset_hash"] == ref_res["dataset_hash"]
    for key in ("samples", "classes", "skipped", "labels_note"):
        assert res[key] == ref_res[key]
    assert res["labels_path"] == str(tmp_path / "par" / "_labels.tsv")
    _same_store(ref, tmp_path / "par")
    assert sorted(os.listdir(tmp_path)) == ["par"]  # no staging or part folders left


def test_pack_arrays_with_workers_is_the_same_dataset(arrays, tmp_path):
    _pack_arrays(tmp_path / "one", arrays, workers=1)
    res = _pack_arrays(tmp_path / "four", arrays, workers=4)
    assert res["samples"] == 300 and res["bytes_written"] > 0
    _same_store(tmp_path / "one", tmp_path / "four")
    with headrace.open(tmp_path / "four") as st:
        assert len({c.id for c in st.meta.chunks}) == len(st.meta.chunks)


def test_any_executor_works_even_threads(arrays, tmp_path):
    _pack_arrays(tmp_path / "one", arrays, workers=1)
    with cf.ThreadPoolExecutor(3) as ex:
        _pack_arrays(tmp_path / "threads", arrays, executor=ex, workers=6)
    _same_store(tmp_path / "one", tmp_path / "threads")


def test_pack_of_a_local_folder_with_workers_is_the_same_dataset(tree, tmp_path):
    ms = tmp_path / "manifests"
    a = headrace.pack(tree, out=tmp_path / "one", workers=1, store=ms, chunk_mb=0.01)
    b = headrace.pack(tree, out=tmp_path / "two", workers=2, store=ms, chunk_mb=0.01)
    assert a == {**b, "out": a["out"]}
    _same_store(tmp_path / "one", tmp_path / "two")


def test_parallel_pack_refuses_a_non_empty_out(arrays, tmp_path):
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "keep.txt").write_text("mine")
    with pytest.raises(StoreExistsError):
        _pack_arrays(tmp_path / "o", arrays, workers=2)
    assert os.listdir(tmp_path / "o") == ["keep.txt"]
    (tmp_path / "e").mkdir()  # an empty folder is fine
    _pack_arrays(tmp_path / "e", arrays, workers=2)
    assert (tmp_path / "e" / "meta.json").exists()


def test_a_killed_worker_commits_nothing_and_a_rerun_succeeds(tree, single, tmp_path):
    out = tmp_path / "store"
    # forkserver: forking this pytest process trips JAX's at-fork warning once a test imported it
    ctx = multiprocessing.get_context("forkserver")
    with cf.ProcessPoolExecutor(2, mp_context=ctx) as pool, \
            pytest.raises(PackWorkerError, match=r"pack task \d of 4 .*worker died") as ei:
        headrace.pack_dir(tree, out=out, executor=_FaultyExecutor(pool, "kill", 1),
                          workers=4, shard_mb=0.01)
    assert ei.value.task is not None and ei.value.start is not None
    assert "Nothing was committed" in str(ei.value)
    _nothing_left(out)
    headrace.pack_dir(tree, out=out, workers=2, shard_mb=0.01)
    _same_store(single[0], out)


# -- Dask ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dask_executor() -> Any:
    import dask
    from distributed import Client, LocalCluster

    # A task whose worker dies fails at once (instead of after 3 retries on restarted workers).
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}), LocalCluster(processes=True, n_workers=2, threads_per_worker=1, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as client:
        yield client.get_executor()


def test_dask_cluster_packs_an_image_tree_and_arrays_like_one_process(
        dask_executor, tree, single, arrays, tmp_path):
    res = headrace.pack_dir(tree, out=tmp_path / "img", executor=dask_executor, workers=3,
                            shard_mb=0.01)
    assert res["dataset_hash"] == single[1]["dataset_hash"]
    _same_store(single[0], tmp_path / "img")
    _pack_arrays(tmp_path / "one", arrays, workers=1)
    _pack_arrays(tmp_path / "dask", arrays, executor=dask_executor, workers=5)
    _same_store(tmp_path / "one", tmp_path / "dask")


def test_dask_task_that_raises_fails_the_pack_and_a_rerun_succeeds(
        dask_executor, arrays, tmp_path):
    out = tmp_path / "store"
    with pytest.raises(PackWorkerError, match=r"pack task 2 of 3 \(records 200\.\.299\).*"
                                              r"OSError: injected read failure") as ei:
        _pack_arrays(out, arrays, executor=_FaultyExecutor(dask_executor, "raise", 2), workers=3)
    assert (ei.value.task, ei.value.start, ei.value.stop) == (2, 200, 300)
    assert isinstance(ei.value.__cause__, OSError)
    _nothing_left(out)
    _pack_arrays(out, arrays, executor=dask_executor, workers=3)
    _pack_arrays(tmp_path / "one", arrays, workers=1)
    _same_store(tmp_path / "one", out)


def test_dask_worker_killed_mid_pack_commits_nothing_and_a_rerun_succeeds(
        dask_executor, tree, single, tmp_path):
    out = tmp_path / "store"
    with pytest.raises(PackWorkerError, match=r"pack task 1 of 3 .*worker died \(KilledWorker"):
        headrace.pack_dir(tree, out=out, executor=_FaultyExecutor(dask_executor, "kill", 1),
                          workers=3, shard_mb=0.01)
    _nothing_left(out)
    headrace.pack_dir(tree, out=out, executor=dask_executor, workers=3, shard_mb=0.01)
    _same_store(single[0], out)


def test_a_task_that_raises_in_a_local_pool_names_its_range(tree, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(tree, src)
    ms = tmp_path / "manifests"
    headrace.resolve(src, store=ms)  # pins the listing; the pack below reads that snapshot
    (src / "emu" / "7.jpg").write_bytes(b"changed after the snapshot")
    out = tmp_path / "store"
    with pytest.raises(PackWorkerError, match=r"pack task 1 of 2 \(records 13\.\.24: keys "
                                              r"dog/4\.jpg \.\. emu/notes\.txt\).*LinkError"
                                              r".*emu/7\.jpg changed") as ei:
        headrace.pack(src, out=out, workers=2, store=ms)
    assert isinstance(ei.value.__cause__, headrace.LinkError)
    _nothing_left(out)
    res = headrace.pack(f"{src}@refresh", out=out, workers=2, store=ms)
    assert res["samples"] == 25  # every file (pack is not image-only), hidden ones skipped
    headrace.verify(out)
