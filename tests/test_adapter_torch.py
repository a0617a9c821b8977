"""headrace.torch: real torch training steps, zero-copy tensors, exact state_dict round trips."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import headrace
import headrace.torch
from _loader_util import N_CLASSES, N_FEATURES, N_ROWS, make_learnable_store


@pytest.fixture(scope="module")
def store_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_learnable_store(tmp_path_factory.mktemp("torch") / "store")


def as_numpy(batches) -> list[dict[str, np.ndarray]]:
    return [{k: v.numpy().copy() for k, v in b.items()} for b in batches]


def assert_same_stream(got: list[dict[str, np.ndarray]], want: list[dict[str, np.ndarray]]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.keys() == w.keys()
        for k in g:
            np.testing.assert_array_equal(g[k], w[k])


@pytest.fixture
def one_torch_thread():
    """A tiny model runs fastest on one intra-op thread, and the CI box is shared."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.usefixtures("one_torch_thread")
def test_torch_training_steps_through_a_dataloader_reduce_loss(store_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(N_FEATURES, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, N_CLASSES))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    ds = headrace.torch.IterableDataset(store_path, batch=100, order="shuffle", seed=1,
                                        epochs=None)
    losses = []
    for _, batch in zip(range(50), DataLoader(ds, batch_size=None, num_workers=0), strict=False):
        assert batch["x"].dtype == torch.float32 and batch["x"].shape == (100, N_FEATURES)
        assert batch["label"].dtype == torch.int64 and batch["label"].shape == (100,)
        loss = torch.nn.functional.cross_entropy(model(batch["x"]), batch["label"])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    ds.close()
    assert len(losses) == 50
    assert np.mean(losses[-10:]) < 0.3 * np.mean(losses[:5])


def test_tensors_share_the_loader_arrays(store_path: Path) -> None:
    with headrace.Loader(store_path, batch=64, order="shuffle", seed=0, epochs=1) as loader:
        batch = next(iter(loader))
    assert batch["x"].flags.writeable, "the loader should hand out writable arrays"
    tensors = headrace.torch.as_tensors(batch)
    for name in ("x", "label"):
        assert tensors[name].data_ptr() == batch[name].ctypes.data
    tensors["x"][0, 0] = 123.0
    assert batch["x"][0, 0] == 123.0
    assert list(headrace.torch.as_tensors(batch, fields=["label"])) == ["label"]


def test_a_field_the_batch_lacks_is_named() -> None:
    with pytest.raises(headrace.ConfigError, match=r"field 'nope' is not in the loader's batches "
                       r"\(they hold \['a'\]\); fix fields="):
        headrace.torch.as_tensors({"a": np.arange(3)}, fields=["nope"])


def test_read_only_arrays_are_copied_without_a_warning() -> None:
    array = np.arange(6, dtype=np.int64)
    array.flags.writeable = False
    tensor = headrace.torch.as_tensors({"a": array})["a"]
    assert tensor.data_ptr() != array.ctypes.data
    assert tensor.tolist() == list(range(6))


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("order", ["shuffle", "sequential", "iid"])
def test_state_dict_round_trips_give_the_identical_remaining_stream(
        store_path: Path, order: str, threads: int) -> None:
    kwargs = {"batch": 64, "order": order, "seed": 7, "epochs": 1, "threads": threads}
    want = as_numpy(DataLoader(headrace.torch.IterableDataset(store_path, **kwargs),
                               batch_size=None))
    assert len(want) == 32  # 31 full batches and a partial one of 16
    for taken in (0, 1, 17, 31, 32):
        ds = headrace.torch.IterableDataset(store_path, **kwargs)
        it = iter(DataLoader(ds, batch_size=None, num_workers=0))
        head = as_numpy(next(it) for _ in range(taken))
        buffer = io.BytesIO()
        torch.save(ds.state_dict(), buffer)
        ds.close()
        buffer.seek(0)

        resumed = headrace.torch.IterableDataset(store_path, **kwargs)
        resumed.load_state_dict(torch.load(buffer, weights_only=True))
        rest = as_numpy(DataLoader(resumed, batch_size=None, num_workers=0))
        assert_same_stream(head + rest, want)


def test_state_dict_before_and_after_iterating(store_path: Path) -> None:
    ds = headrace.torch.IterableDataset(store_path, batch=500, order="sequential", epochs=1)
    assert ds.state_dict() == {"headrace_checkpoint": None}
    ds.load_state_dict(ds.state_dict())  # None: start from scratch
    assert len(list(ds)) == 4
    # The loader's own state_dict: JSON-able, and the same position as its checkpoint token.
    state = ds.state_dict()
    assert len(json.dumps(state)) <= 1024 and state["position"] == N_ROWS
    # A new iteration starts the stream again; loading the end state resumes at the end.
    assert len(list(ds)) == 4
    ds.load_state_dict(state)
    assert list(ds) == []
    # The token form (what a loader without state_dict() gives) restores the same way.
    with headrace.Loader(store_path, batch=500, order="sequential", epochs=1) as loader:
        next(loader)
        ds.load_state_dict({"headrace_checkpoint": loader.checkpoint()})
    assert len(list(ds)) == 3
    with pytest.raises(headrace.CheckpointError):
        ds.load_state_dict({"other": 1})
    with pytest.raises(headrace.ConfigError, match="not bytes or None"):
        ds.load_state_dict({"headrace_checkpoint": 3})


def test_abandoned_iteration_is_replaced_by_the_next(store_path: Path) -> None:
    ds = headrace.torch.IterableDataset(store_path, batch=100, order="shuffle", seed=2, epochs=1)
    first = iter(ds)
    a = next(first)
    second = iter(ds)  # closes the loader behind `first`
    b = next(second)
    np.testing.assert_array_equal(a["label"].numpy(), b["label"].numpy())
    assert len(list(second)) == 19
    ds.close()
    ds.close()  # idempotent


def test_set_epoch_changes_the_shuffle(store_path: Path) -> None:
    ds = headrace.torch.IterableDataset(store_path, batch=N_ROWS, order="shuffle", seed=4,
                                        epochs=1)
    (epoch0,) = as_numpy(ds)
    ds.set_epoch(1)
    (epoch1,) = as_numpy(ds)
    assert not np.array_equal(epoch0["label"], epoch1["label"]) or not np.array_equal(
        epoch0["x"], epoch1["x"])
    assert sorted(map(tuple, epoch0["x"].tolist())) == sorted(map(tuple, epoch1["x"].tolist()))


def test_loader_factory(store_path: Path) -> None:
    seen: list[Any] = []

    def make_loader(resume: Any) -> headrace.Loader:
        seen.append(resume)
        return headrace.Loader(store_path, batch=400, order="sequential", epochs=1,
                               resume=resume)

    with headrace.open(store_path) as store:
        labels = store.gather(np.arange(N_ROWS))["label"]
    ds = headrace.torch.IterableDataset(make_loader, fields=["label"])
    it = iter(ds)
    first = next(it)
    assert list(first) == ["label"]
    np.testing.assert_array_equal(first["label"].numpy(), labels[:400])
    state = ds.state_dict()
    ds.load_state_dict(state)
    rest = [b["label"].numpy() for b in ds]
    np.testing.assert_array_equal(np.concatenate(rest), labels[400:])
    assert seen == [None, state]  # the factory passes it on as resume=
    with pytest.raises(headrace.ConfigError, match="factory"):
        headrace.torch.IterableDataset(make_loader, batch=3)
    with pytest.raises(headrace.ConfigError, match="factory"):
        ds.set_epoch(2)


def test_ragged_fields_become_ragged_tensors(tmp_path: Path) -> None:
    with headrace.create(tmp_path / "r", fields={"tokens": "bytes", "label": "int64"}) as writer:
        writer.append({"tokens": [b"a", b"bcd", b"", b"ef"], "label": np.arange(4)})
        writer.commit()
    ds = headrace.torch.IterableDataset(tmp_path / "r", batch=4, order="sequential", epochs=1)
    (batch,) = list(DataLoader(ds, batch_size=None))
    tokens = batch["tokens"]
    assert isinstance(tokens, headrace.Ragged)
    assert tokens.values.dtype == torch.uint8
    assert bytes(tokens.values.numpy()) == b"abcdef"
    assert tokens.offsets.tolist() == [0, 1, 4, 4, 6]


def test_worker_processes_are_refused(store_path: Path) -> None:
    ds = headrace.torch.IterableDataset(store_path, batch=100, order="sequential", epochs=1)
    # spawn: forking a process that runs JAX/loader threads is unsafe (and JAX warns).
    batches = iter(DataLoader(ds, batch_size=None, num_workers=1, multiprocessing_context="spawn"))
    with pytest.raises(headrace.ConfigError, match="num_workers=0"):
        next(batches)
    del batches  # shuts the worker down now rather than at the test's teardown


def test_pin_memory(store_path: Path) -> None:
    if torch.accelerator.is_available():
        ds = headrace.torch.IterableDataset(store_path, batch=100, pin_memory=True, epochs=1)
        assert next(iter(ds))["x"].is_pinned()
    else:  # CPU-only: warn and carry on unpinned, as torch's DataLoader does
        with pytest.warns(UserWarning, match="pin_memory"):
            ds = headrace.torch.IterableDataset(store_path, batch=100, pin_memory=True, epochs=1)
        assert not next(iter(ds))["x"].is_pinned()
    ds.close()
