"""A user transform that declares ``rng`` / ``seeds`` gets randomness keyed by (seed, epoch, id):
the same draws on any thread count, after any resume, and new draws each epoch."""

from __future__ import annotations

import json

import numpy as np
import pytest

import headrace
from _images import imagefolder
from _media import sine, write_audio, write_video
from headrace._engine.seeds import record_seeds

N = 12
KINDS = ["loader", "image", "text", "audio", "video"]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("seeds")
    store = str(root / "arrays.hr")
    with headrace.create(store, fields={"x": {"dtype": "float32", "shape": [3]},
                                        "label": "int64"}) as w:
        w.append({"x": np.arange(3 * N, dtype=np.float32).reshape(N, 3), "label": np.arange(N)})
        w.commit()
    imagefolder(root / "images", {"a": N // 2, "b": N // 2}, h=16, w=16)
    for i in range(N):
        write_audio(str(root / "audio" / f"c{i % 2}" / f"{i:02d}.wav"),
                    sine(200 + 50 * i, 8000, 400), 8000)
    for i in range(3):
        write_video(str(root / "videos" / f"v{i}.mp4"), 8, fps=8, size=(16, 16), gop=4)
    tokens = str(root / "tokens.hr")
    with headrace.create(tokens, fields={"tokens": {"dtype": "int32", "shape": None}}) as w:
        w.append({"tokens": [np.arange(3, dtype=np.int32) + 10 * d + 5 for d in range(N)]})
        w.commit()
    return {"store": store, "images": str(root / "images"), "audio": str(root / "audio"),
            "videos": str(root / "videos"), "tokens": tokens, "index": str(root / "vindex")}


def make(kind: str, data: dict[str, str], **kw):
    kw = {"batch": 3, "seed": 5, "order": "shuffle", **kw}
    if kind == "loader":
        return headrace.Loader(data["store"], **kw)
    if kind == "image":
        return headrace.image(data["images"], **kw)
    if kind == "text":
        return headrace.text(data["tokens"], seq_len=4, eos_id=1, **kw)
    if kind == "audio":
        return headrace.audio(data["audio"], samples=200, **kw)
    return headrace.video(data["videos"], clip=2, stride=2, fps=8, index_dir=data["index"], **kw)


def erase(batch, ids, rng):
    """A RandomErasing-like draw: one random value per record, from the generator given."""
    return batch, rng.random(len(ids))


def per_record(batch, ids, seeds):
    return batch, ids, seeds


def draws(loader, count=None):
    out = []
    for _, r in loader:
        out.append(np.asarray(r).copy())
        if count is not None and len(out) == count:
            break
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_rng_transform_replays_exactly_after_resume(kind, data):
    with make(kind, data, transform=erase, epochs=2, threads=3) as ld:
        full = draws(ld)
    assert len(full) >= 6
    with make(kind, data, transform=erase, epochs=2, threads=1) as ld:
        head = draws(ld, 3)
        token = ld.checkpoint()
    with make(kind, data, transform=erase, epochs=2, resume=token) as ld:
        tail = draws(ld)
    assert len(head) + len(tail) == len(full)
    for a, b in zip(head + tail, full, strict=True):
        np.testing.assert_array_equal(a, b)
    # in place too (the torchdata convention)
    with make(kind, data, transform=erase, epochs=2) as ld:
        ld.load_state_dict(json.loads(token))
        again = draws(ld)
    for a, b in zip(again, tail, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kind", ["loader", "image"])
def test_seeds_are_per_record_and_change_each_epoch(kind, data):
    def by_id(loader):
        got: dict[tuple[int, int], int] = {}
        for e in (0, 1):
            loader.set_epoch(e)
            for _, ids, seeds in loader:
                for i, s in zip(np.asarray(ids).tolist(), seeds.tolist(), strict=True):
                    got[(e, i)] = s
        return got

    with make(kind, data, transform=per_record, batch=3) as a, \
            make(kind, data, transform=per_record, batch=5, order="sequential") as b:
        sa, sb = by_id(a), by_id(b)
    assert sa == sb  # independent of batch size and order: a function of (seed, epoch, id)
    assert len(sa) == 2 * N
    assert sa[(0, 3)] != sa[(1, 3)] and sa[(0, 3)] != sa[(0, 4)]
    assert sa[(1, 7)] == int(record_seeds(5, 1, np.array([7]))[0])
    with make(kind, data, transform=per_record, seed=6) as c:
        assert by_id(c)[(0, 3)] != sa[(0, 3)]


def test_plain_transform_is_called_as_before(data):
    seen = []

    def plain(batch, ids):
        seen.append(len(ids))
        return batch

    with make("image", data, transform=plain) as ld:
        list(ld)
    assert sum(seen) == N
