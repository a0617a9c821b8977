"""Both adapters over every loader kind: the batch's own structure, its values, exact resume.

Each kind yields its own batch structure (a dict for ``Loader``/``text``/``video``, an
``(inputs, labels)`` tuple for ``image``/``audio``, whatever its sources yield for ``mix``, and a
named tuple holding a dict and a ``Ragged`` from a transform); the adapters must keep it, convert
every array, and continue exactly after a checkpoint or a state dict.
"""

from __future__ import annotations

import io
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import jax
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import headrace
import headrace.jax
import headrace.torch
from _images import imagefolder
from _media import sine, write_audio, write_video

KINDS = ["arrays", "image", "text", "audio", "video", "mix", "nested"]


class Example(NamedTuple):
    inputs: dict[str, Any]
    tokens: headrace.Ragged
    label: np.ndarray


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("kinds")
    rng = np.random.default_rng(0)
    headrace.pack_arrays(root / "a.hr", x=rng.standard_normal((40, 3)).astype(np.float32),
                         label=np.arange(40))
    headrace.pack_arrays(root / "b.hr", x=rng.standard_normal((24, 3)).astype(np.float32),
                         label=np.arange(100, 124))
    with headrace.create(root / "r.hr", fields={"tokens": "bytes", "label": "int64"}) as writer:
        writer.append({"tokens": [bytes(range(i % 5)) for i in range(24)],
                       "label": np.arange(24)})
        writer.commit()
    imagefolder(root / "img", {"cat": 6, "dog": 6}, h=20, w=24)
    for i in range(6):
        write_audio(str(root / "aud" / f"c{i % 2}" / f"{i}.wav"),
                    sine(300 + 40 * i, 8000, 3000), 8000)
    for i in range(2):
        write_video(str(root / "vid" / f"{i}.mp4"), 24, size=(16, 16))
    (root / "txt").mkdir()
    for i in range(3):
        words = " ".join(f"w{(i * 7 + j) % 50}" for j in range(60))
        (root / "txt" / f"{i}.txt").write_text(words)
    return root


def _nested(batch: dict[str, Any], ids: np.ndarray) -> Example:
    return Example(inputs={"ids": np.asarray(ids), "double": batch["label"] * 2},
                   tokens=batch["tokens"], label=batch["label"])


def make(kind: str, data: Path) -> Callable[..., Any]:
    """``fn(resume=None) -> loader``: the same finite, deterministic loader of that kind."""
    def build(resume: Any = None) -> Any:
        if kind == "arrays":
            return headrace.Loader(data / "a.hr", batch=8, order="shuffle", seed=1, epochs=1,
                                   resume=resume)
        if kind == "image":
            return headrace.image(data / "img", batch=4, shuffle=True, seed=2, resize=(8, 8),
                                  resume=resume)
        if kind == "text":
            return headrace.text(data / "txt", batch=4, seq_len=32, seed=3, resume=resume)
        if kind == "audio":
            return headrace.audio(data / "aud", batch=2, samples=1000, seed=4, resume=resume)
        if kind == "video":
            return headrace.video(data / "vid", batch=4, clip=4, stride=4, fps=24,
                                  resize=(8, 8), seed=5, resume=resume)
        if kind == "mix":
            sources = [headrace.Loader(data / "a.hr", batch=8, order="shuffle", seed=6, epochs=1),
                       headrace.Loader(data / "b.hr", batch=8, order="shuffle", seed=7, epochs=1)]
            return headrace.mix(sources, weights=[2, 1], seed=8, on_source_exhausted="drop",
                                resume=resume)
        assert kind == "nested"
        return headrace.Loader(data / "r.hr", batch=5, order="shuffle", seed=9, epochs=1,
                               transform=_nested, resume=resume)
    return build


def host_batches(kind: str, data: Path) -> list[Any]:
    with make(kind, data)() as loader:
        return list(loader)


def check_tree(got: Any, want: Any, array_type: type, *, tuple_as: type | None = None,
               where: str = "batch") -> None:
    """``got`` has ``want``'s structure, container for container, with ``array_type`` leaves."""
    if isinstance(want, headrace.Ragged):
        assert type(got) is headrace.Ragged, where
        check_tree(got.values, want.values, array_type, where=f"{where}.values")
        check_tree(got.offsets, want.offsets, array_type, where=f"{where}.offsets")
    elif isinstance(want, dict):
        assert type(got) is type(want), (where, type(got))
        assert list(got) == list(want), where
        for key in want:
            check_tree(got[key], want[key], array_type, tuple_as=tuple_as, where=f"{where}[{key!r}]")
    elif isinstance(want, tuple | list):
        plain = type(want) in (tuple, list)
        expect = tuple_as if (tuple_as is not None and type(want) is tuple) else type(want)
        assert type(got) is expect or (not plain and type(got) is type(want)), (where, type(got))
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            check_tree(g, w, array_type, tuple_as=tuple_as, where=f"{where}[{i}]")
    else:
        assert isinstance(want, np.ndarray), (where, type(want))
        assert isinstance(got, array_type), (where, type(got))
        host = np.asarray(got.cpu() if isinstance(got, torch.Tensor) else got)
        expected = want
        if isinstance(got, jax.Array):  # JAX's own rule: 64-bit values are 32-bit without x64
            expected = want.astype(jax.dtypes.canonicalize_dtype(want.dtype))
        assert host.dtype == expected.dtype, where
        np.testing.assert_array_equal(host, expected, err_msg=where)


def check_stream(got: list[Any], want: list[Any], array_type: type, **kw: Any) -> None:
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        check_tree(g, w, array_type, where=f"batch {i}", **kw)


@pytest.fixture(scope="module")
def reference(data: Path) -> dict[str, list[Any]]:
    return {kind: host_batches(kind, data) for kind in KINDS}


def test_the_kinds_yield_their_own_structures(reference: dict[str, list[Any]]) -> None:
    # What the adapters are up against; each kind gives at least three batches to resume within.
    first = {kind: batches[0] for kind, batches in reference.items()}
    assert all(len(b) >= 3 for b in reference.values()), {k: len(b) for k, b in reference.items()}
    assert type(first["image"]) is tuple and type(first["audio"]) is tuple
    assert {"tokens", "mask"} <= set(first["text"]) and "frames" in first["video"]
    assert type(first["nested"]) is Example
    assert isinstance(first["nested"].tokens, headrace.Ragged)


# -- JAX ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_jax_iterator_keeps_the_structure(kind: str, data: Path,
                                          reference: dict[str, list[Any]]) -> None:
    with make(kind, data)() as loader:
        got = list(headrace.jax.iterator(loader, prefetch=2))
    check_stream(got, reference[kind], jax.Array)


@pytest.mark.parametrize("kind", KINDS)
def test_jax_checkpoint_and_state_dict_continue_exactly(kind: str, data: Path,
                                                        reference: dict[str, list[Any]]) -> None:
    want = reference[kind]
    build = make(kind, data)
    with build() as loader:
        batches = headrace.jax.iterator(loader, prefetch=2)
        head = [next(batches) for _ in range(2)]
        token, state = batches.checkpoint(), batches.state_dict()
        # The loader ran ahead by the prefetched batches; the iterator's state did not.
        assert loader.checkpoint() != token
        batches.close()
    check_stream(head, want[:2], jax.Array)
    with build(resume=token) as resumed:
        check_stream(list(headrace.jax.iterator(resumed)), want[2:], jax.Array)
    with build(resume=state.get("headrace_checkpoint", state)) as resumed:
        check_stream(list(headrace.jax.iterator(resumed)), want[2:], jax.Array)


@pytest.mark.parametrize("kind", KINDS)
def test_jax_load_state_dict_restores_in_place(kind: str, data: Path,
                                               reference: dict[str, list[Any]]) -> None:
    want = reference[kind]
    build = make(kind, data)
    with build() as loader:
        batches = headrace.jax.iterator(loader, prefetch=2)
        head = [next(batches) for _ in range(2)]
        state = batches.state_dict()
        check_stream(list(batches), want[2:], jax.Array)
    with build() as plain:  # the loader's own state after the same two batches
        next(plain), next(plain)
        assert state == plain.state_dict()
    with build() as loader:
        batches = headrace.jax.iterator(loader, prefetch=2)
        check_stream(list(batches), want, jax.Array)
        # Back to the saved point on the same iterator and loader, after reading to the end.
        batches.load_state_dict(state)
        check_stream(list(batches), want[2:], jax.Array)
    check_stream(head, want[:2], jax.Array)
    # A new iterator over a fresh loader, restored from the saved state dict.
    with build() as fresh:
        batches = headrace.jax.iterator(fresh, prefetch=1)
        next(batches)
        batches.load_state_dict(state)
        check_stream(list(batches), want[2:], jax.Array)


def test_jax_fields_select_from_mappings_only(data: Path) -> None:
    with make("text", data)() as loader:
        batch = next(headrace.jax.iterator(loader, fields=["tokens"]))
    assert list(batch) == ["tokens"] and isinstance(batch["tokens"], jax.Array)
    with make("image", data)() as loader:
        batches = headrace.jax.iterator(loader, fields=["image"])
        with pytest.raises(headrace.ConfigError, match=r"2-item tuple batches.*fields=None"):
            next(batches)


def test_jax_leaves_strings_on_the_host() -> None:
    class Loader:
        def __iter__(self):
            yield {"x": np.arange(3), "path": np.array(["a", "b", "c"]), "meta": None}

        def checkpoint(self) -> bytes:
            return b"t"

    (batch,) = list(headrace.jax.iterator(Loader()))
    assert isinstance(batch["x"], jax.Array)
    assert batch["path"].tolist() == ["a", "b", "c"] and batch["meta"] is None
    assert headrace.jax.iterator(Loader()).state_dict() == {"headrace_checkpoint": b"t"}
    with pytest.raises(headrace.ConfigError, match="resume="):
        headrace.jax.iterator(Loader()).load_state_dict({"headrace_checkpoint": b"t"})


# -- torch ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_torch_as_tensors_keeps_the_structure(kind: str, reference: dict[str, list[Any]]) -> None:
    batch = reference[kind][0]
    tensors = headrace.torch.as_tensors(batch)
    check_tree(tensors, batch, torch.Tensor)


@pytest.mark.parametrize("kind", KINDS)
def test_torch_dataset_over_a_built_loader_through_a_dataloader(
        kind: str, data: Path, reference: dict[str, list[Any]]) -> None:
    ds = headrace.torch.IterableDataset(make(kind, data)())
    direct = list(ds)
    check_stream(direct, reference[kind], torch.Tensor)
    ds.close()
    ds = headrace.torch.IterableDataset(make(kind, data)())
    # torch's default_convert (batch_size=None) turns a plain tuple into a list; it keeps the rest.
    through = list(DataLoader(ds, batch_size=None, num_workers=0))
    check_stream(through, reference[kind], torch.Tensor, tuple_as=list)
    ds.close()


@pytest.mark.parametrize("kind", KINDS)
def test_torch_state_dict_continues_exactly(kind: str, data: Path,
                                            reference: dict[str, list[Any]]) -> None:
    want = reference[kind]
    build = make(kind, data)
    # A factory: every iteration builds its loader, resumed from the state loaded.
    ds = headrace.torch.IterableDataset(lambda resume: build(resume=resume))
    it = iter(DataLoader(ds, batch_size=None, num_workers=0))
    head = [next(it) for _ in range(2)]
    buffer = io.BytesIO()
    torch.save(ds.state_dict(), buffer)
    ds.close()
    check_stream(head, want[:2], torch.Tensor, tuple_as=list)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    resumed = headrace.torch.IterableDataset(lambda resume: build(resume=resume))
    resumed.load_state_dict(state)
    check_stream(list(resumed), want[2:], torch.Tensor)


@pytest.mark.parametrize("kind", KINDS)
def test_torch_dataset_over_a_built_loader_restores_in_place(
        kind: str, data: Path, reference: dict[str, list[Any]]) -> None:
    want = reference[kind]
    build = make(kind, data)
    ds = headrace.torch.IterableDataset(build())
    it = iter(DataLoader(ds, batch_size=None, num_workers=0))
    head = [next(it) for _ in range(2)]
    state = ds.state_dict()
    assert state == ds.loader.state_dict()
    ds.close()
    check_stream(head, want[:2], torch.Tensor, tuple_as=list)
    # A built loader restores the state in place, through its own load_state_dict.
    given = headrace.torch.IterableDataset(build())
    given.load_state_dict(state)
    check_stream(list(given), want[2:], torch.Tensor)
    assert given.state_dict() == given.loader.state_dict()
    given.close()


def test_torch_fields_select_from_mappings_only(data: Path) -> None:
    with make("video", data)() as loader:
        batch = next(iter(loader))
    assert list(headrace.torch.as_tensors(batch, fields=["labels", "frames"])) == [
        "labels", "frames"]
    with make("audio", data)() as loader:
        batch = next(iter(loader))
    with pytest.raises(headrace.ConfigError, match=r"2-item tuple batches"):
        headrace.torch.as_tensors(batch, fields=["samples"])


def test_torch_passes_strings_through_as_default_convert_does() -> None:
    batch = {"x": np.arange(3), "path": np.array(["a", "b"]), "n": np.int64(4), "tag": "t"}
    out = headrace.torch.as_tensors(batch)
    assert isinstance(out["x"], torch.Tensor) and out["n"].item() == 4
    assert out["path"].tolist() == ["a", "b"] and out["tag"] == "t"


def test_torch_built_loader_refuses_loader_keywords(data: Path) -> None:
    with make("arrays", data)() as loader, pytest.raises(headrace.ConfigError,
                                                        match="built loader"):
        headrace.torch.IterableDataset(loader, batch=4)


def test_torch_dataset_over_a_built_loader_follows_the_loaders_epochs(data: Path) -> None:
    loader = headrace.Loader(data / "a.hr", batch=8, order="shuffle", seed=1, epochs=1)
    ds = headrace.torch.IterableDataset(loader)
    assert len(list(DataLoader(ds, batch_size=None, num_workers=0))) == 5
    # A finished loader refuses a silent empty pass; set_epoch (the loader's own) reads again.
    with pytest.raises(headrace.LoaderError, match="set_epoch"):
        list(ds)
    ds.set_epoch(1)
    got = list(DataLoader(ds, batch_size=None, num_workers=0))
    with headrace.Loader(data / "a.hr", batch=8, order="shuffle", seed=1, epoch=1) as epoch1:
        check_stream(got, list(epoch1), torch.Tensor)
    ds.close()
    with pytest.raises(headrace.LoaderError, match="closed"):
        list(ds)


class _ReadOnlyMapping(Mapping[str, Any]):
    """A mapping type that cannot be built from a dict: rebuilt as a dict, as torch does."""

    def __init__(self, *, data: dict[str, Any]) -> None:
        self._data = data

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


def _odd_batch() -> Any:
    return [OrderedDict(a=np.arange(3), b=(np.ones(2, np.float32), "tag")),
            _ReadOnlyMapping(data={"c": np.arange(4).reshape(2, 2)}), None]


def test_lists_ordered_dicts_and_other_mappings_keep_their_shape() -> None:
    out = headrace.torch.as_tensors(_odd_batch())
    assert type(out) is list and type(out[0]) is OrderedDict and type(out[1]) is dict
    assert out[0]["a"].tolist() == [0, 1, 2] and out[0]["b"][1] == "tag"
    assert isinstance(out[0]["b"][0], torch.Tensor) and out[1]["c"].shape == (2, 2)
    assert out[2] is None

    class Loader:
        def __iter__(self) -> Iterator[Any]:
            yield _odd_batch()

        def checkpoint(self) -> bytes:
            return b"t"

    (placed,) = list(headrace.jax.iterator(Loader()))
    assert type(placed) is list and type(placed[0]) is OrderedDict and type(placed[1]) is dict
    assert isinstance(placed[0]["a"], jax.Array) and placed[0]["b"][1] == "tag"
    assert np.asarray(placed[1]["c"]).tolist() == [[0, 1], [2, 3]] and placed[2] is None
