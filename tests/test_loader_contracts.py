"""The contracts every loader kind keeps: one token format, in-place state, epochs, finished passes.

Each test runs over every kind (``KINDS``) on tiny generated data, so a kind that drifts from the
others fails here by name.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import headrace
from _images import imagefolder
from _media import sine, write_audio, write_video
from headrace import LoaderError

N = 12  # records (arrays, images, audio files, token windows) per epoch

KINDS = ["loader", "load", "run", "image", "text", "audio", "video", "dataloader", "distributed"]
FINITE = [k for k in KINDS if k != "dataloader"]  # the loaderx DataLoader is always endless


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("contracts")
    store = str(root / "arrays.hr")
    with headrace.create(store, fields={"x": {"dtype": "float32", "shape": [3]}, "label": "int64"}) as w:
        w.append({"x": np.arange(3 * N, dtype=np.float32).reshape(N, 3),
                  "label": np.arange(N)})
        w.commit()
    images = root / "images"
    imagefolder(images, {"a": N // 2, "b": N // 2}, h=16, w=16)
    audio = root / "audio"
    for i in range(N):
        write_audio(str(audio / f"c{i % 2}" / f"{i:02d}.wav"), sine(200 + 50 * i, 8000, 400),
                    8000)
    videos = root / "videos"
    for i in range(3):  # 3 videos x 4 clips of 2 frames = 12 clips
        write_video(str(videos / f"v{i}.mp4"), 8, fps=8, size=(16, 16), gop=4)
    tokens = str(root / "tokens.hr")
    with headrace.create(tokens, fields={"tokens": {"dtype": "int32", "shape": None}}) as w:
        # each document exactly one window of 4 tokens with its EOS
        w.append({"tokens": [np.arange(3, dtype=np.int32) + 10 * d + 5 for d in range(N)]})
        w.commit()
    return {"store": store, "images": str(images), "audio": str(audio), "videos": str(videos),
            "tokens": tokens, "index": str(root / "video-index")}


def make(kind: str, data: dict[str, str], **kw):
    """A loader of ``kind`` with ``batch=3`` over ``N`` records, shuffled, plus ``kw``."""
    kw = {"batch": 3, "seed": 5, **kw}
    order = kw.pop("order", "shuffle")
    if kind == "loader":
        return headrace.Loader(data["store"], order=order, **kw)
    if kind == "load":
        return headrace.load(data["store"], order=order, **kw)
    if kind == "run":
        return headrace.run(data["store"], order=order, ram_gb=None, **kw)
    if kind == "image":
        return headrace.image(data["images"], order=order, **kw)
    if kind == "text":
        return headrace.text(data["tokens"], seq_len=4, eos_id=1, order=order, **kw)
    if kind == "audio":
        return headrace.audio(data["audio"], samples=200, order=order, **kw)
    if kind == "video":
        return headrace.video(data["videos"], clip=2, stride=2, fps=8, order=order,
                              index_dir=data["index"], **kw)
    if kind == "dataloader":
        kw.pop("epochs", None)
        resume = kw.pop("resume", None)
        x = np.arange(3 * N, dtype=np.float32).reshape(N, 3)
        return headrace.DataLoader(x, np.arange(N), num_workers=2, batch_size=kw.pop("batch"),
                                   mode=headrace.Sampler.Mode.SHUFFLE, seed=kw.pop("seed"),
                                   resume=resume)
    if kind == "distributed":
        return headrace.DistributedDataLoader(data["store"], order=order, rank=0, world_size=1,
                                              tail="partial", **kw)
    raise AssertionError(kind)


@pytest.fixture(autouse=True)
def _one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_NTASKS", "SLURM_PROCID"):
        monkeypatch.delenv(var, raising=False)


def ids(loader, count: int | None = None) -> list[list[int]]:
    """The record ids of the next ``count`` batches (all that are left when None)."""
    out = []
    while count is None or len(out) < count:
        try:
            next(loader)
        except StopIteration:
            break
        out.append(np.asarray(loader.last_ids).tolist())
    return out


# -- state: one token format, in place ---------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_state_dict_is_the_token_as_json(kind, data):
    with make(kind, data, epochs=2) as ld:
        ids(ld, 2)
        state = ld.state_dict()
        token = ld.checkpoint()
    assert json.loads(json.dumps(state)) == state == json.loads(token)
    assert state["format"] == "headrace-ckpt-1" and state["kind"] == "loader"
    assert state["position"] == 6


@pytest.mark.parametrize("kind", KINDS)
def test_load_state_dict_continues_exactly(kind, data):
    with make(kind, data, epochs=2) as ref:
        head = ids(ref, 3)
        state = ref.state_dict()
        rest = ids(ref, 5)
    with make(kind, data, epochs=2) as fresh:  # restored in place, into a new loader
        fresh.load_state_dict(state)
        assert ids(fresh, 5) == rest
    with make(kind, data, epochs=2) as same:  # ... and into the loader that took it
        assert ids(same, 3) == head
        ids(same, 4)
        same.load_state_dict(state)
        assert ids(same, 5) == rest
    with make(kind, data, epochs=2, resume=state) as by_dict:  # resume= takes the dict too
        assert ids(by_dict, 5) == rest


@pytest.mark.parametrize("kind", KINDS)
def test_restoring_adopts_the_tokens_epoch(kind, data):
    with make(kind, data, epochs=3) as ref:
        ids(ref, 9)  # 4 batches per epoch: into epoch 2
        assert ref.epoch == 2
        state = ref.state_dict()
        rest_of_epoch_2 = ids(ref, 3)
    with make(kind, data, epochs=1) as ld:  # built for epoch 0 only
        ld.load_state_dict(state)
        assert ld.epoch == 2
        assert ids(ld, 3) == rest_of_epoch_2
    with make(kind, data, epochs=1, resume=state) as ld:
        assert ld.epoch == 2 and ids(ld, 3) == rest_of_epoch_2


@pytest.mark.parametrize("kind", FINITE)
def test_set_epoch_rewinds_to_that_epoch(kind, data):
    with make(kind, data, epoch=1) as ref:
        epoch1 = ids(ref)
    assert len(epoch1) == 4 and sorted(i for b in epoch1 for i in b) == list(range(N))
    with make(kind, data) as ld:
        epoch0 = ids(ld)
        assert epoch0 != epoch1  # reshuffled
        ld.set_epoch(1)
        assert ld.epoch == 1 and ids(ld) == epoch1
        ld.set_epoch(0)
        ids(ld, 1)
        ld.set_epoch(0)  # mid-epoch: back to its start
        assert ids(ld) == epoch0


def test_set_epoch_on_an_endless_loaderx_loader(data):
    with make("dataloader", data) as ref:
        ids(ref, 4)
        epoch1 = ids(ref, 4)
    with make("dataloader", data) as ld:
        ld.set_epoch(1)
        assert ld.epoch == 1 and ids(ld, 4) == epoch1


# -- a finished loader -------------------------------------------------------------------------

@pytest.mark.parametrize("kind", FINITE)
def test_iterating_a_finished_loader_names_the_fix(kind, data):
    with make(kind, data, epochs=2) as ld:
        first = [np.asarray(ld.last_ids).tolist() for _ in ld]
        assert len(first) == 8
        with pytest.raises(LoaderError, match=r"set_epoch\(E\).*epochs=None"):
            for _ in ld:
                pass
        with pytest.raises(StopIteration):  # next() keeps the iterator protocol
            next(ld)
        ld.set_epoch(0)
        assert [np.asarray(ld.last_ids).tolist() for _ in ld] == first


@pytest.mark.parametrize("kind", KINDS)
def test_a_for_over_a_loader_mid_stream_continues(kind, data):
    with make(kind, data, epochs=2) as ref:
        whole = ids(ref, 8)
    with make(kind, data, epochs=2) as ld:
        got = []
        for _ in ld:
            got.append(np.asarray(ld.last_ids).tolist())
            if len(got) == 3:
                break
        for _ in ld:
            got.append(np.asarray(ld.last_ids).tolist())
            if len(got) == 8:
                break
    assert got == whole


@pytest.mark.parametrize("kind", KINDS)
def test_a_closed_loader_refuses_a_pass(kind, data):
    ld = make(kind, data, epochs=1)
    ld.close()
    with pytest.raises(LoaderError, match="closed"):
        iter(ld)
    with pytest.raises(LoaderError, match="closed"):
        ld.set_epoch(0)


def test_contract_kinds_cover_the_public_loaders():
    assert os.path.basename(__file__) == "test_loader_contracts.py"
    assert {"image", "text", "audio", "video", "load", "run"} <= set(KINDS)
