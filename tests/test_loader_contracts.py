"""The contracts every loader kind keeps: one token format, in-place state, epochs, finished passes.

Each test runs over every kind (``KINDS``) on tiny generated data, so a kind that drifts from the
others fails here by name.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import threading

import numpy as np
import pytest

import headrace
from _images import imagefolder
from _media import sine, write_audio, write_garbage, write_video
from headrace import LoaderError
from headrace._engine.keywords import CORE

N = 12  # records (arrays, images, audio files, token windows) per epoch

KINDS = ["loader", "load", "run", "image", "text", "audio", "video", "dataloader", "distributed"]
FINITE = KINDS


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
        kw.setdefault("ram_gb", None)
        return headrace.run(data["store"], order=order, **kw)
    if kind == "image":
        return headrace.image(data["images"], order=order, **kw)
    if kind == "text":
        return headrace.text(data["tokens"], seq_len=4, eos_id=1, order=order, **kw)
    if kind == "audio":
        return headrace.audio(data["audio"], samples=200, order=order, **kw)
    if kind == "video":
        return headrace.video(data["videos"], clip=2, stride=2, fps=8, order=order,
                              index_dir=data["index"], **kw)
    if kind == "dataloader":  # endless by default, as loaderx; one epoch here unless asked
        kw.setdefault("epochs", 1)
        x = np.arange(3 * N, dtype=np.float32).reshape(N, 3)
        return headrace.DataLoader(x, np.arange(N), num_workers=2, order=order, **kw)
    if kind == "distributed":
        kw.setdefault("rank", 0)
        kw.setdefault("world_size", 1)
        if not kw.get("drop_last"):
            kw.setdefault("tail", "partial")
        return headrace.DistributedDataLoader(data["store"], order=order, **kw)
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
    with make("dataloader", data, epochs=None) as ref:
        ids(ref, 4)
        epoch1 = ids(ref, 4)
    with make("dataloader", data, epochs=None) as ld:
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


# -- nothing to yield ---------------------------------------------------------------------------

def _outcome(fn, limit_s: float = 120.0) -> BaseException | None:
    """What ``fn()`` raised (None: returned), failing if it is still running after ``limit_s``
    (a spin would otherwise hang the suite)."""
    box: list[BaseException | None] = []

    def run() -> None:
        try:
            fn()
            box.append(None)
        except BaseException as e:
            box.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(limit_s)
    assert box, f"still running after {limit_s} s: a spin instead of an error"
    return box[0]


@pytest.mark.parametrize("epochs", [1, None])
@pytest.mark.parametrize("kind", ["image", "audio", "video"])
def test_a_folder_without_records_of_the_kind_is_refused(kind, epochs, data, tmp_path):
    other = {"image": data["audio"], "audio": data["images"], "video": data["audio"]}[kind]
    empty = tmp_path / "empty"
    empty.mkdir()
    for folder in (other, str(empty)):
        err = _outcome(lambda f=folder: make(kind, {**data, "images": f, "audio": f,
                                                    "videos": f}, epochs=epochs))
        assert isinstance(err, headrace.HeadraceError), err
        assert "no" in str(err)


@pytest.fixture(scope="module")
def corrupt(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Folders where every record fails to decode (the index of the videos is intact)."""
    root = tmp_path_factory.mktemp("corrupt")
    out = {}
    for kind, ext in (("audio", "wav"), ("image", "jpg")):
        for i in range(5):
            write_garbage(str(root / kind / f"c{i % 2}" / f"{i}.{ext}"), seed=i)
        out[kind] = str(root / kind)
    for i in range(2):
        path = write_video(str(root / "video" / f"v{i}.mp4"), 36, fps=24, gop=6)
        size = os.path.getsize(path)
        with open(path, "r+b") as f:  # the packet table stays, the frames are garbage
            f.seek(size // 3)
            f.write(np.random.default_rng(i).integers(0, 256, size // 4, np.uint8).tobytes())
    out["video"] = str(root / "video")
    out["index"] = str(root / "index")
    return out


@pytest.mark.parametrize("epochs", [1, 3, None])
@pytest.mark.parametrize("kind", ["image", "audio", "video"])
def test_every_record_failing_under_skip_is_an_error_not_a_spin(kind, epochs, corrupt):
    if kind == "image":
        ld = headrace.image(corrupt["image"], batch=2, resize=(8, 8), on_decode_error="skip",
                            epochs=epochs)
    elif kind == "audio":
        ld = headrace.audio(corrupt["audio"], batch=2, samples=100, on_decode_error="skip",
                            epochs=epochs)
    else:
        ld = headrace.video(corrupt["video"], clip=4, stride=4, fps=8, batch=2,
                            on_error="count", index_dir=corrupt["index"], epochs=epochs)
    with ld:
        err = _outcome(lambda: list(ld))
    assert isinstance(err, headrace.DecodeError), err
    assert "nothing to yield" in str(err)


def test_a_skipped_record_among_good_ones_is_no_error(data, corrupt, tmp_path):
    import shutil

    mixed = tmp_path / "mixed"
    shutil.copytree(data["audio"], mixed)
    shutil.copy(os.path.join(corrupt["audio"], "c0", "0.wav"), mixed / "c0" / "zz.wav")
    with headrace.audio(str(mixed), batch=3, samples=100, on_decode_error="skip",
                        epochs=2) as ld:
        got = sum(len(labels) for _, labels in ld)
        assert got == 2 * N and ld.stats()["audio_decode_failures_total"] == 2


def test_bench_on_an_audio_folder_ends_with_an_error(data, capsys):
    from headrace._cli.main import main

    codes: list[int] = []
    assert _outcome(lambda: codes.append(main(["bench", data["audio"], "--seconds", "1"]))) \
        is None
    assert codes == [2] and "holds no images" in capsys.readouterr().err


# -- keywords ----------------------------------------------------------------------------------

PRIVATE = re.compile(r"\b_\w+\(|__init__|\bopener\b")


@pytest.mark.parametrize(("typo", "meant"), [("seeed", "seed"), ("epohcs", "epochs"),
                                             ("shufle", "shuffle"), ("prefecth", "prefetch")])
@pytest.mark.parametrize("kind", KINDS)
def test_an_unknown_keyword_names_the_closest_valid_one(kind, typo, meant, data):
    with pytest.raises(headrace.ConfigError, match=f"did you mean '{meant}'") as info:
        make(kind, data, **{typo: 1})
    assert not PRIVATE.search(str(info.value)), str(info.value)


def _tag(batch, ids):
    return {"inner": batch, "tagged_ids": np.asarray(ids).copy()}


@pytest.mark.parametrize("kind", KINDS)
def test_every_core_keyword_is_accepted_with_one_meaning(kind, data):
    core = {"order": None, "shuffle": True, "epoch": 0, "epochs": 1, "drop_last": False,
            "tail": "partial", "rank": 0, "world_size": 1, "threads": 2, "inflight": 64 << 20,
            "ram_gb": 8, "queue": 16, "prefetch": 2, "profile": "balanced",
            "constraints": headrace.Constraints(), "runtime": headrace.RuntimeConfig(),
            "resume": None, "timeline": 0.01, "transform": _tag, "tune": True}
    assert set(core) | {"batch", "seed"} == set(CORE)
    if kind == "dataloader":  # loaderx's transform: fn((data, label)) -> (data, label)
        core["transform"] = lambda pair: (pair[0] + 1000, pair[1])
    with make(kind, data, **core) as ld:
        seen = []
        for b in ld:
            if kind == "dataloader":
                assert float(b["data"].min()) >= 1000
                b = {"tagged_ids": b["label"]}
            else:
                assert set(b) == {"inner", "tagged_ids"}  # the transform's result is what comes
            assert b["tagged_ids"].tolist() == np.asarray(ld.last_ids).tolist()
            seen += b["tagged_ids"].tolist()
        assert sorted(seen) == list(range(N))  # shuffled, one epoch
        assert seen != list(range(N))
        timeline = ld.stats_timeline()
    assert timeline["format"] == "headrace-timeline" and timeline["samples"]


@pytest.mark.parametrize("kind", KINDS)
def test_tail_drop_and_drop_last_are_honoured(kind, data):
    for kw, sizes in (({"tail": "drop"}, [5, 5]), ({"drop_last": True}, [5, 5]),
                      ({"tail": "partial"}, [5, 5, 2])):
        with make(kind, data, batch=5, epochs=1, **kw) as ld:
            assert [len(b) for b in ids(ld)] == sizes, kw


@pytest.mark.parametrize("kind", ["load", "run"])
def test_load_and_run_record_a_timeline(kind, data):
    with make(kind, data, timeline=True) as ld:
        ids(ld)
        assert ld.stats_timeline()["format"] == "headrace-timeline"


# -- stats: measured or absent ------------------------------------------------------------------

CONSTANT_KEYS = {"autotune_enabled", "effective_prefetch_batches", "video_channels",
                 "video_decode_backend"}
CUMULATIVE = ("delivered_batches_total", "delivered_samples_total", "delivered_bytes_total",
              "consumer_wait_seconds", "budget_wait_seconds", "gather_busy_seconds",
              "transform_busy_seconds", "inflight_high_water_bytes")


@pytest.mark.parametrize("kind", KINDS)
def test_stats_hold_no_constants_and_no_placeholders(kind, data):
    with make(kind, data, epochs=2) as ld:
        before = ld.stats()
        assert not CONSTANT_KEYS & set(before)
        assert "batch_payload_bytes_p50" not in before  # nothing measured yet: absent, not 0
        ids(ld, 2)
        after = ld.stats()
        assert after["batch_payload_bytes_p50"] > 0 and after["delivered_batches_total"] == 2
        assert not CONSTANT_KEYS & set(after)
        assert all(v is not None for v in after.values()), after


@pytest.mark.parametrize("kind", KINDS)
def test_stats_counters_stay_cumulative_across_restores(kind, data):
    with make(kind, data, epochs=2) as ld:
        ids(ld, 3)
        state = ld.state_dict()
        ids(ld, 2)
        seen = [ld.stats()]
        ld.load_state_dict(state)
        seen.append(ld.stats())
        ids(ld, 2)
        ld.set_epoch(1)
        seen.append(ld.stats())
        ids(ld, 1)
        seen.append(ld.stats())
    for a, b in itertools.pairwise(seen):
        for key in CUMULATIVE:
            assert b[key] >= a[key], (key, a[key], b[key])
    assert seen[-1]["delivered_batches_total"] == 8
