"""``headrace.loaderx`` against the real loaderx 0.4.1 wheel, on the same data.

The wheel is installed by the test extra's setup (``scripts/test.sh``: it declares Python 3.13
but runs on 3.11), so it is imported here, not skipped: a broken install fails these tests. Its
``Sampler`` (a cffi binding, no threads) and ``Dataset`` (``blosc2.open``) run in this process.
Its ``DataLoader`` runs in a child process: its ``close()`` (called by ``__del__`` too) can hang
with threads blocked in ``Queue.put/get``, so the child keeps every loader referenced, saves what
it read, and leaves with ``os._exit``. The wheel runs one worker wherever the comparison needs
its delivery order (several workers deliver out of order).

What is compared: SEQUENTIAL ids, batches, keys, dtypes and shapes (equal); IID (a different
generator, as docs/migration-loaderx.md says: compared through the ids each side drew); and each
documented departure (out-of-order delivery, transform errors, bad arguments) as what each does.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import blosc2
import loaderx
import numpy as np
import pytest
from loaderx._sampler import Sampler as WheelSampler

import headrace
import headrace.loaderx as hx
from headrace import ConfigError, LoaderError
from test_loaderx_readme import QUICKSTART, _run

pytestmark = pytest.mark.timeout(180)

SEQUENTIAL, IID = 0, 1

# The child's frame: an uncaught error exits at once (sys.excepthook runs before the interpreter
# tears down the loaders, whose __del__ -> close() could hang), and so does the normal end.
_CHILD_HEAD = '''
import os, sys, traceback

def _die(*exc):
    traceback.print_exception(*exc)
    sys.stderr.flush()
    os._exit(1)

sys.excepthook = _die
import json
import numpy as np
import loaderx
from loaderx._sampler import Sampler

ARGS = json.loads(sys.argv[2])
RESULT = {}
'''
_CHILD_TAIL = '''
np.savez(sys.argv[1], **RESULT)
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
'''


def run_wheel(tmp_path, body: str, **args) -> tuple[dict[str, np.ndarray], str]:
    """Runs ``body`` with the loaderx wheel in a child (cwd ``tmp_path``, ``ARGS`` = ``args``);
    returns the arrays it put in ``RESULT`` and its stdout and stderr, together."""
    out = tmp_path / "wheel_result.npz"
    proc = subprocess.run([sys.executable, "-c", _CHILD_HEAD + body + _CHILD_TAIL, str(out),
                           json.dumps(args)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, f"loaderx child failed ({proc.returncode}):\n{proc.stderr}"
    with np.load(out) as got:
        return {k: got[k] for k in got.files}, proc.stdout + proc.stderr


# ------------------------------------------------------------------------------------ the data

# (data, label) pairs of different dtypes and record shapes; 37 records, so that batches of 8
# cross epoch boundaries at a different place every epoch.
N = 37
CASES = {
    "float32": (np.arange(N * 6, dtype=np.float32).reshape(N, 2, 3) / 7,
                np.arange(N, dtype=np.int64)),
    "uint8": ((np.arange(N * 48) * 37 % 251).astype(np.uint8).reshape(N, 4, 4, 3),
              (np.arange(N) % 10).astype(np.int32)),
}


def write_b2nd(tmp_path, data, label) -> tuple[str, str]:
    blosc2.asarray(data, urlpath=str(tmp_path / "data.b2nd"), mode="w")
    blosc2.asarray(label, urlpath=str(tmp_path / "label.b2nd"), mode="w")
    return "data.b2nd", "label.b2nd"


def headrace_inputs(tmp_path, data, label) -> dict[str, tuple[object, object]]:
    """The same records as headrace reads them: the wheel's .b2nd files, .npy files, one store's
    two fields, and the arrays themselves."""
    np.save(tmp_path / "data.npy", data)
    np.save(tmp_path / "label.npy", label)
    headrace.pack_arrays(tmp_path / "store", data=data, label=label, workers=1, progress=False)
    return {
        "b2nd": (hx.Dataset(tmp_path / "data.b2nd"), hx.Dataset(tmp_path / "label.b2nd")),
        "npy": (hx.Dataset(tmp_path / "data.npy"), hx.Dataset(tmp_path / "label.npy")),
        "store": (hx.Dataset(tmp_path / "store", field="data"),
                  hx.Dataset(tmp_path / "store", field="label")),
        "arrays": (data, label),
    }


def assert_same_batch(got: dict, want_data: np.ndarray, want_label: np.ndarray) -> None:
    assert set(got) == {"data", "label"}
    for key, want in (("data", want_data), ("label", want_label)):
        assert isinstance(got[key], np.ndarray)
        assert (got[key].dtype, got[key].shape) == (want.dtype, want.shape), key
        np.testing.assert_array_equal(got[key], want, err_msg=key)


# ------------------------------------------------------------------------------------ Sampler

def test_the_wheel_is_loaderx_0_4_1():
    assert loaderx.__version__ == "0.4.1"
    assert (WheelSampler.Mode.SEQUENTIAL, WheelSampler.Mode.IID) == (0, 1)
    assert (hx.Sampler.Mode.SEQUENTIAL, hx.Sampler.Mode.IID) == (0, 1)


@pytest.mark.parametrize(("length", "batch"), [(10, 4), (3, 5), (37, 8), (1, 1), (7, 7),
                                               (5, 12), (1000, 3)])
def test_sequential_sampler_is_the_wheels_circular_window(length, batch):
    wheel = WheelSampler(length, batch, WheelSampler.Mode.SEQUENTIAL, 42)
    ours = hx.Sampler(length, batch, hx.Sampler.Mode.SEQUENTIAL, 42)
    for _ in range(3 * length // batch + 3):
        w, o = wheel.next(), ours.next()
        # documented departure: int64 ids (loaderx: uint64), same values
        assert (w.dtype, o.dtype) == (np.uint64, np.int64)
        assert o.tolist() == w.tolist()
    if (length, batch) == (3, 5):
        assert hx.Sampler(3, 5, 0).next().tolist() == [0, 1, 2, 0, 1]


def test_iid_sampler_draws_from_a_different_generator():
    # The wheel's stream (Zig Sfc64) as the reference records it, seed 42, length 10, batch 4.
    wheel = WheelSampler(10, 4, WheelSampler.Mode.IID, 42)
    assert [wheel.next().tolist() for _ in range(2)] == [[5, 4, 4, 6], [1, 7, 1, 2]]

    def stream(make, seed, length=1000, batch=64, steps=40):
        s = make(length, batch, 1, seed)
        return np.concatenate([s.next() for _ in range(steps)]).astype(np.int64)

    for make in (WheelSampler, hx.Sampler):
        a, b = stream(make, 7), stream(make, 7)
        np.testing.assert_array_equal(a, b)             # reproducible per seed, both
        assert not np.array_equal(a, stream(make, 8))   # and the seed matters
        assert a.min() >= 0 and a.max() < 1000
        # with replacement: 2560 draws from 1000 ids repeat some and miss some
        assert len(np.unique(a)) < 1000
    # documented departure: headrace's IID is a counter-based generator, not loaderx's Sfc64
    assert not np.array_equal(stream(WheelSampler, 42), stream(hx.Sampler, 42))
    assert hx.Sampler(10, 4, 1, 42).next().tolist() != [5, 4, 4, 6]


def test_mode_2_is_iid_in_the_wheel_and_shuffle_in_headrace():
    wheel2 = WheelSampler(10, 5, 2, 3)
    wheel1 = WheelSampler(10, 5, WheelSampler.Mode.IID, 3)
    for _ in range(6):  # the wheel: any mode other than 0 is IID
        assert wheel2.next().tolist() == wheel1.next().tolist()
    # documented departure: headrace's 2 is SHUFFLE, a fresh permutation every epoch
    ours = hx.Sampler(10, 5, hx.Sampler.Mode.SHUFFLE, 3)
    epochs = [np.concatenate([ours.next(), ours.next()]) for _ in range(3)]
    for e in epochs:
        assert sorted(e.tolist()) == list(range(10))
    assert len({tuple(e.tolist()) for e in epochs}) > 1
    with pytest.raises(ConfigError, match="unknown sampler mode 7"):
        hx.Sampler(10, 5, 7)  # the wheel: IID
    assert WheelSampler(10, 5, 7, 3).next().tolist() == WheelSampler(10, 5, 1, 3).next().tolist()


def test_bad_sampler_arguments_raise_where_the_wheel_misbehaves():
    # documented departures: the wheel returns an empty batch, zeros, or a cffi OverflowError
    assert WheelSampler(10, 0, WheelSampler.Mode.IID, 1).next().tolist() == []
    assert WheelSampler(0, 3, WheelSampler.Mode.IID, 1).next().tolist() == [0, 0, 0]
    for args in ((-1, 4, 0, 1), (10, -1, 0, 1), (10, 4, 256, 1), (10, 4, 0, -1)):
        with pytest.raises(OverflowError):
            WheelSampler(*args)
    for args, message in (((10, 0, 1, 1), "batch_size must be >= 1, got 0"),
                          ((0, 3, 1, 1), "length must be >= 1, got 0"),
                          ((-1, 4, 0, 1), "length must be in"),
                          ((10, -1, 0, 1), "batch_size must be in"),
                          ((10, 4, 256, 1), "unknown sampler mode 256"),
                          ((10, 4, 0, -1), "seed must be in")):
        with pytest.raises(ConfigError, match=message):
            hx.Sampler(*args)


def test_an_empty_sequential_sampler_kills_the_wheel_and_raises_in_headrace():
    # documented departure: Sampler(0, b, SEQUENTIAL).next() is a SIGFPE in the wheel
    code = "from loaderx._sampler import Sampler\nSampler(0, 4, 0, 42).next()\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert proc.returncode == -signal.SIGFPE
    with pytest.raises(ConfigError, match="the dataset is empty"):
        hx.Sampler(0, 4, hx.Sampler.Mode.SEQUENTIAL)


# ------------------------------------------------------------------------------------ Dataset

@pytest.mark.parametrize("case", sorted(CASES))
def test_dataset_reads_what_the_wheels_dataset_reads(tmp_path, case):
    data, label = CASES[case]
    write_b2nd(tmp_path, data, label)
    ids = np.array([5, 3, 3, 36, 0, 17, 5], dtype=np.uint64)  # unsorted, repeated, uint64
    inputs = headrace_inputs(tmp_path, data, label)
    del inputs["arrays"]
    for i, array in enumerate((data, label)):
        wheel = loaderx.Dataset(str(tmp_path / ("data.b2nd", "label.b2nd")[i]))
        for kind, pair in inputs.items():
            ds = pair[i]
            assert len(ds) == len(wheel) == N, kind
            for key in (0, 7, N - 1, -1, -N, np.int64(4), slice(2, 30, 3), slice(None, 5),
                        slice(-4, None)):
                got, want = np.asarray(ds[key]), np.asarray(wheel[key])
                assert (got.dtype, got.shape) == (want.dtype, want.shape), (kind, key)
                np.testing.assert_array_equal(got, want, err_msg=f"{kind} {key}")
                np.testing.assert_array_equal(want, array[key])
            for idx in (ids, ids.tolist(), ids.astype(np.int64)):
                got, want = ds.__getitems__(idx), wheel.__getitems__(idx)
                assert (got.dtype, got.shape) == (want.dtype, want.shape), kind
                np.testing.assert_array_equal(got, want)
            for bad in (N, -N - 1):
                with pytest.raises(IndexError):
                    wheel[bad]
                with pytest.raises(IndexError, match=f"index {bad} is out of range"):
                    ds[bad]
            with pytest.raises(IndexError):
                wheel.__getitems__(np.array([N], dtype=np.uint64))
            with pytest.raises(IndexError, match=f"index {N} is out of range"):
                ds.__getitems__(np.array([N], dtype=np.uint64))
    for pair in inputs.values():
        for ds in pair:
            ds.close()


def test_npy_opens_in_headrace_where_the_wheel_fails(tmp_path):
    np.save(tmp_path / "x.npy", CASES["float32"][0])
    # documented departure: the wheel's Dataset is Blosc2 only
    with pytest.raises(RuntimeError, match="blosc2_schunk_open_offset"):
        loaderx.Dataset(str(tmp_path / "x.npy"))
    with hx.Dataset(tmp_path / "x.npy") as ds:
        np.testing.assert_array_equal(ds[:], CASES["float32"][0])


# ------------------------------------------------------------------------------------ DataLoader

WHEEL_LOADER = '''
dataset = loaderx.Dataset("data.b2nd")
labelset = loaderx.Dataset("label.b2nd")
loader = loaderx.DataLoader(dataset, labelset, num_workers=ARGS["workers"],
                            batch_size=ARGS["batch"], prefetch_size=2, mode=ARGS["mode"],
                            seed=ARGS["seed"], **TRANSFORM)
try:
    len(loader)
except TypeError as e:
    RESULT["len_error"] = np.array(str(e))
for k in range(ARGS["steps"]):
    batch = next(loader)
    RESULT[f"keys_{k}"] = np.array(sorted(batch))
    RESULT[f"data_{k}"] = batch["data"]
    RESULT[f"label_{k}"] = batch["label"]
'''
NO_TRANSFORM = "TRANSFORM = {}\n"
DOUBLE = '''
def double(pair):
    data, label = pair
    return data * 2, label + 1

TRANSFORM = {"transform": double}
'''


def double(pair):
    data, label = pair
    return data * 2, label + 1


def wheel_batches(got: dict[str, np.ndarray], steps: int) -> list[dict[str, np.ndarray]]:
    batches = []
    for k in range(steps):
        assert got[f"keys_{k}"].tolist() == ["data", "label"]
        batches.append({"data": got[f"data_{k}"], "label": got[f"label_{k}"]})
    return batches


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize(("batch", "transform"), [(8, False), (5, True), (40, False)])
def test_sequential_batches_are_the_wheels(tmp_path, case, batch, transform):
    data, label = CASES[case]
    write_b2nd(tmp_path, data, label)
    steps = 3 * N // batch + 2  # over three epochs: both are endless, neither stops
    got, _ = run_wheel(tmp_path, (DOUBLE if transform else NO_TRANSFORM) + WHEEL_LOADER,
                       workers=1, batch=batch, mode=SEQUENTIAL, seed=42, steps=steps)
    assert str(got["len_error"]) == "Eternal loader has no length."
    wheel = wheel_batches(got, steps)
    for k, b in enumerate(wheel):  # the wheel reads its circular window, in order
        ids = np.arange(k * batch, (k + 1) * batch) % N
        want = double((data[ids], label[ids])) if transform else (data[ids], label[ids])
        assert_same_batch(b, *want)
    extra = {"transform": double} if transform else {}
    for kind, (x, y) in headrace_inputs(tmp_path, data, label).items():
        for workers in (1, 4):  # headrace keeps sampler order with any number of workers
            with hx.DataLoader(x, y, num_workers=workers, batch_size=batch, prefetch_size=2,
                               mode=hx.Sampler.Mode.SEQUENTIAL, seed=42, **extra) as ld:
                with pytest.raises(TypeError, match=r"^Eternal loader has no length\.$"):
                    len(ld)
                for want in wheel:
                    assert_same_batch(next(ld), want["data"], want["label"])
        if kind != "arrays":
            x.close()
            y.close()


@pytest.mark.parametrize("case", sorted(CASES))
def test_iid_batches_gather_each_sides_own_sampler_ids(tmp_path, case):
    # The IID streams differ by design (documented): each loader's batches are its own sampler's
    # ids (same seed, length, batch) gathered, with the same keys, dtypes and shapes.
    data, label = CASES[case]
    write_b2nd(tmp_path, data, label)
    steps, batch, seed = 12, 8, 5
    got, _ = run_wheel(tmp_path, NO_TRANSFORM + WHEEL_LOADER, workers=1, batch=batch, mode=IID,
                       seed=seed, steps=steps)
    wheel = wheel_batches(got, steps)
    ours_ids = hx.Sampler(N, batch, hx.Sampler.Mode.IID, seed)
    for kind, (x, y) in headrace_inputs(tmp_path, data, label).items():
        ours_ids.seek(0)
        wheel_ids = WheelSampler(N, batch, WheelSampler.Mode.IID, seed)
        with hx.DataLoader(x, y, num_workers=2, batch_size=batch, prefetch_size=2,
                           mode=hx.Sampler.Mode.IID, seed=seed) as ld:
            for want in wheel:
                w = wheel_ids.next()
                assert_same_batch(want, data[w], label[w])
                if kind != "arrays":  # headrace's Dataset gathers the wheel's ids the same
                    assert_same_batch({"data": x.__getitems__(w), "label": y.__getitems__(w)},
                                      want["data"], want["label"])
                o = ours_ids.next()
                ours = next(ld)
                assert_same_batch(ours, data[o], label[o])
                assert set(ours) == set(want)
        if kind != "arrays":
            x.close()
            y.close()


def test_several_workers_reorder_in_the_wheel_not_in_headrace(tmp_path):
    # documented departure: with several workers the wheel delivers its batches out of order.
    # Each batch it delivers is still one of its sampler's windows, never one twice.
    data, label = CASES["float32"]
    write_b2nd(tmp_path, data, label)
    steps, batch = 30, 8  # 8*k mod 37 differs for k < 37: the first label names the step
    got, _ = run_wheel(tmp_path, NO_TRANSFORM + WHEEL_LOADER, workers=4, batch=batch,
                       mode=SEQUENTIAL, seed=42, steps=steps)
    start_of = {(k * batch) % N: k for k in range(N)}
    delivered = []
    for b in wheel_batches(got, steps):
        k = start_of[int(b["label"][0])]
        ids = np.arange(k * batch, (k + 1) * batch) % N
        assert_same_batch(b, data[ids], label[ids])
        delivered.append(k)
    assert len(set(delivered)) == steps
    # 4 workers + 2 queued index batches + 2 ready batches: at most 8 steps ahead of delivery
    assert max(delivered) < steps + 8
    with hx.DataLoader(data, label, num_workers=4, batch_size=batch, prefetch_size=2,
                       mode=0) as ld:
        assert [int(next(ld)["label"][0]) for _ in range(steps)] == \
            [(k * batch) % N for k in range(steps)]


def test_a_failing_transform_stalls_the_wheel_and_raises_in_headrace(tmp_path):
    data, label = CASES["float32"]
    write_b2nd(tmp_path, data, label)
    body = '''
def fail(pair):
    raise KeyError("boom")

loader = loaderx.DataLoader(loaderx.Dataset("data.b2nd"), loaderx.Dataset("label.b2nd"),
                            num_workers=1, batch_size=8, mode=0, transform=fail)
worker = loader.threads[1]
worker.join()  # the only worker dies on its first batch
RESULT["alive"] = np.array([t.is_alive() for t in loader.threads])
RESULT["ready"] = np.array(loader.batches.qsize())
'''
    got, stderr = run_wheel(tmp_path, body)
    # documented departure: the wheel's worker dies (traceback on stderr) and nothing will ever
    # fill its batch queue, so next() would block forever; the sampler thread keeps running
    assert got["alive"].tolist() == [True, False]
    assert int(got["ready"]) == 0
    assert "KeyError: 'boom'" in stderr

    def fail(pair):
        raise KeyError("boom")

    ld = hx.DataLoader(data, label, num_workers=1, batch_size=8, mode=0, transform=fail)
    with pytest.raises(LoaderError, match="KeyError") as ei:
        next(ld)
    assert sorted(ei.value.record_ids) == list(range(8))
    ld.close()


def test_length_mismatch_is_the_wheels_error_without_its_del_noise(tmp_path):
    data, label = CASES["float32"]
    write_b2nd(tmp_path, data, label[:-1])
    body = '''
try:
    loaderx.DataLoader(loaderx.Dataset("data.b2nd"), loaderx.Dataset("label.b2nd"))
except ValueError as e:
    RESULT["error"] = np.array(str(e))
import gc
gc.collect()
'''
    got, stderr = run_wheel(tmp_path, body)
    message = str(got["error"])
    assert message == "dataset and labelset must have the same length"
    # documented departure: the wheel's half-built loader then fails in __del__
    assert "AttributeError" in stderr and "stop_signal" in stderr
    x, y = hx.Dataset(tmp_path / "data.b2nd"), hx.Dataset(tmp_path / "label.b2nd")
    with pytest.raises(ValueError, match=f"^{message}$"):
        hx.DataLoader(x, y)
    x.close()
    y.close()


def test_readme_quick_start_prints_what_the_wheel_prints(tmp_path, monkeypatch):
    # loaderx's README Quick Start at its defaults (4 workers, IID, batches of 256), once with
    # the wheel and once with headrace.loaderx: the same two printed shapes.
    n = 1000
    blosc2.asarray(np.arange(n * 8, dtype=np.float32).reshape(n, 8),
                   urlpath=str(tmp_path / "train_data.b2nd"), mode="w")
    blosc2.asarray(np.arange(n, dtype=np.int64), urlpath=str(tmp_path / "train_label.b2nd"),
                   mode="w")
    original = QUICKSTART.replace("from headrace.loaderx import", "from loaderx import")
    assert original != QUICKSTART
    _, printed = run_wheel(tmp_path, original)
    assert printed == "(256, 8)\n(256,)\n"
    monkeypatch.chdir(tmp_path)
    scope, ours = _run(QUICKSTART)
    scope["loader"].close()
    assert ours == printed
