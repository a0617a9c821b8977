"""Loops that fetch ahead: ``checkpoint(at=i)`` resumes at delivered batch ``i``; and what
``loader.epoch`` says once a loader has delivered all its epochs."""

from __future__ import annotations

import numpy as np
import pytest

import headrace
from _images import imagefolder
from _media import sine, write_audio
from headrace import CheckpointError, ConfigError

N = 20


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("ahead")
    imagefolder(root / "images", {"a": N // 2, "b": N // 2}, h=12, w=12)
    for i in range(N):
        write_audio(str(root / "audio" / f"{i:02d}.wav"), sine(200 + 20 * i, 8000, 200), 8000)
    return {"images": str(root / "images"), "audio": str(root / "audio")}


def make(kind, data, **kw):
    kw = {"batch": 3, "shuffle": True, "seed": 2, **kw}
    if kind == "loader":
        return headrace.Loader({"x": np.arange(N)}, **kw)
    if kind == "image":
        return headrace.image(data["images"], **kw)
    if kind == "text":
        return headrace.text(np.arange(N * 8, dtype=np.int32), seq_len=8, **kw)
    return headrace.audio(data["audio"], samples=100, **kw)


KINDS = ["loader", "image", "text", "audio"]


@pytest.mark.parametrize("kind", KINDS)
def test_checkpoint_at_resumes_at_that_delivered_batch(kind, data):
    with make(kind, data, epochs=2) as ld:
        for _ in range(9):  # runs into the second epoch (7 batches an epoch)
            next(ld)
        assert ld.delivered == 9
        tokens = {i: ld.checkpoint(at=i) for i in (0, 3, 6, 7, 8, 9)}
        assert tokens[9] == ld.checkpoint()
    with make(kind, data, epochs=2) as ld:
        want = [np.asarray(ld.last_ids).copy() for _ in iter(lambda: next(ld, None), None)]
    for i, token in tokens.items():
        with make(kind, data, epochs=2, resume=token) as ld:
            rest = [np.asarray(ld.last_ids).copy() for _ in iter(lambda: next(ld, None), None)]
        assert len(rest) == len(want) - i
        for a, b in zip(rest, want[i:], strict=True):
            np.testing.assert_array_equal(a, b)


def test_a_prefetching_loop_saves_the_batch_it_has_not_trained_on():
    x = {"x": np.arange(40)}
    seen, stop = [], 4
    with headrace.Loader(x, batch=4, shuffle=True, seed=1) as ld:
        batch = next(ld)  # fetched ahead, as nanoGPT's loop does
        for step in range(10):
            if step == stop:
                token = ld.checkpoint(at=ld.delivered - 1)
                wrong = ld.checkpoint()
                break
            seen.append(batch["x"].tolist())  # "train" on it
            batch = next(ld)
        pending = batch["x"].tolist()
    with headrace.Loader(x, batch=4, shuffle=True, seed=1, resume=token) as ld:
        assert next(ld)["x"].tolist() == pending  # the batch the model has not seen
    with headrace.Loader(x, batch=4, shuffle=True, seed=1, resume=wrong) as ld:
        assert next(ld)["x"].tolist() != pending  # checkpoint() alone would skip it


def test_checkpoint_at_refuses_what_it_cannot_give():
    with headrace.Loader({"x": np.arange(400)}, batch=1, epochs=1) as ld:
        with pytest.raises(ConfigError, match="delivered 0"):
            ld.checkpoint(at=1)
        for _ in range(300):
            next(ld)
        with pytest.raises(ConfigError, match="at= must be in"):
            ld.checkpoint(at=301)
        with pytest.raises(ConfigError, match="an int"):
            ld.checkpoint(at=2.0)
        with pytest.raises(CheckpointError, match="last 256"):
            ld.checkpoint(at=10)
        assert ld.checkpoint(at=44)  # 300 - 256


@pytest.mark.parametrize("kind", KINDS)
def test_a_finished_loader_says_the_epoch_it_read_last(kind, data):
    with make(kind, data, epoch=4) as ld:
        assert ld.epoch == 4
        list(ld)
        assert ld.epoch == 4  # not 5
        ld.set_epoch(6)
        assert ld.epoch == 6
    with make(kind, data, epoch=4, epochs=2) as ld:
        list(ld)
        assert ld.epoch == 5
