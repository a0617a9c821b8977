"""Every loader kind under a real 2-process torchrun (gloo, CPU, loopback), no rank arguments.

One launch (tests/_ranks_worker.py) builds Loader, load, image, text, audio, video and the
loaderx-style DataLoader on each rank; every loader must read RANK/WORLD_SIZE from torchrun, give
each rank a disjoint share that together covers the epoch, pad/drop to equal batch counts, and
refuse (on every rank) stores or settings that differ between the ranks.
"""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

import headrace
from _images import encode, gradient, imagefolder
from _media import sine, write_audio, write_video

WORKER = os.path.join(os.path.dirname(__file__), "_ranks_worker.py")
N = 101  # odd: the padded tail wraps one record
IMAGES = 400  # the DistributedSampler example: batch 32 on 2 ranks is 200 each, none twice


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(nproc, data, out):
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK") and not k.startswith("SLURM_")}
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
           "--master_addr=127.0.0.1", f"--master_port={_free_port()}", "--monitor-interval=0.1",
           WORKER, str(data), str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    if proc.returncode != 0:  # the first worker traceback, not only torchrun's summary
        at = proc.stderr.find("Traceback")
        pytest.fail(f"torchrun x{nproc} failed:\n" + proc.stderr[max(at, 0):][:6000]
                    + proc.stdout[-2000:])
    return [json.loads((out / f"kinds-rank{r}.json").read_text()) for r in range(nproc)]


def _pack_images(root, name, n, phase=0):
    folder = root / f"{name}-src"
    imagefolder(folder, {"a": n // 2, "b": n - n // 2}, h=8, w=8)
    if phase:  # same shape, other pixels
        for p in sorted(folder.rglob("*.jpg"))[:1]:
            p.write_bytes(encode(gradient(8, 8, phase=phase)))
    out = root / name
    headrace.pack_dir(str(folder), out=str(out))
    return str(out)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    root = tmp_path_factory.mktemp("ranks")
    x = np.arange(N, dtype=np.int64)
    headrace.pack_arrays(root / "arrays", x=x, progress=False)
    headrace.pack_arrays(root / "twin", x=x[::-1].copy(), progress=False)  # same shape
    jsonl = root / "docs.jsonl"
    jsonl.write_text("".join(json.dumps({"text": " ".join(str(10 + (d * 7 + i) % 90)
                                                          for i in range(3 + d % 9))}) + "\n"
                             for d in range(40)))
    headrace.pack_text(str(jsonl), str(root / "text"),
                       tokenizer=lambda s: [int(t) for t in s.split()])
    for c in ("a", "b"):
        for i in range(5 if c == "a" else 4):  # 9 files
            write_audio(str(root / "audio" / c / f"{i}.wav"), sine(200 + 50 * i, 8000, 400), 8000)
    for i in range(3):
        write_video(str(root / "video" / f"{i}.mp4"), 16 + 8 * i, fps=24, size=(16, 16))
    data = {"n": N, "arrays": str(root / "arrays"),
            "twins": [str(root / "arrays"), str(root / "twin")],
            "images": _pack_images(root, "images", IMAGES),
            "image_twins": [_pack_images(root, "img1", 6), _pack_images(root, "img2", 6, 5)],
            "text": str(root / "text"), "audio": str(root / "audio"),
            "video": str(root / "video"), "video_index": str(root / "vindex")}
    path = root / "data.json"
    path.write_text(json.dumps(data))
    out = root / "out"
    out.mkdir()
    reports = _torchrun(2, path, out)
    assert [r["rank"] for r in reports] == [0, 1]
    return reports, data


def _pad_check(per_rank, n, world=2):
    """pad: every rank ceil(n/world) samples and as many batches; together all n, fewer than
    ``world`` twice (the epoch's first ones)."""
    counts = [sum(map(len, b)) for b in per_rank]
    assert counts == [-(-n // world)] * world
    assert len({len(b) for b in per_rank}) == 1  # equal batch counts: DDP never waits
    flat = [i for b in per_rank for batch in b for i in batch]
    assert set(flat) == set(range(n))
    return len(flat) - n


def test_every_kind_reads_its_rank_from_torchrun(ranks):
    reports, _ = ranks
    for r, rep in enumerate(reports):
        assert rep["Loader"]["rank"] == r and rep["Loader"]["world_size"] == 2
        assert rep["image"]["rank"] == r and rep["DataLoader"]["rank"] == r
    assert {r["engine_before_pg"] for r in reports} == {"torchrun-store"}
    assert {r["engine_with_pg"] for r in reports} == {"torch.distributed"}


@pytest.mark.parametrize("kind", ["Loader", "load"])
def test_store_loaders_shard_disjointly_and_completely(ranks, kind):
    reports, _ = ranks
    per_rank = [r[kind]["ids"] for r in reports]
    assert _pad_check(per_rank, N) == 1
    assert [len(b) for b in per_rank] == [reports[0]["loader_len"]] * 2 == [7, 7]
    if kind == "Loader":  # sequential: rank r's k-th batch is step k*W + r; the tail splits in 3s
        assert per_rank[0][0] == list(range(8)) and per_rank[1][0] == list(range(8, 16))
        assert per_rank[0][-1] == [96, 97, 98] and per_rank[1][-1] == [99, 100, 0]


def test_drop_gives_full_batches_and_equal_counts(ranks):
    reports, _ = ranks
    per_rank = [r["load_drop"]["ids"] for r in reports]
    assert [len(b) for b in per_rank] == [N // 16] * 2
    flat = [i for b in per_rank for batch in b for i in batch]
    assert all(len(batch) == 8 for b in per_rank for batch in b)
    assert sorted(flat) == list(range(N // 16 * 16))


def test_image_pads_samples_as_distributed_sampler(ranks):
    reports, _ = ranks
    per_rank = [r["image"]["ids"] for r in reports]
    assert _pad_check(per_rank, IMAGES) == 0  # 200 each, none duplicated (not 224 with 48)
    assert [len(b) for b in per_rank] == [7, 7] == [r["image_len"] for r in reports]
    assert [len(b[-1]) for b in per_rank] == [8, 8]
    drop = [r["image_drop"]["ids"] for r in reports]
    assert [len(b) for b in drop] == [6, 6]  # DistributedSampler + DataLoader(drop_last=True)
    assert all(len(batch) == 32 for b in drop for batch in b)


@pytest.mark.parametrize("kind", ["text", "audio", "video"])
def test_modal_loaders_shard_disjointly_and_completely(ranks, kind):
    reports, _ = ranks
    n = {"text": reports[0]["text_windows"], "audio": 9,
         "video": reports[0]["video_clips"]}[kind]
    assert n >= 5
    _pad_check([r[kind]["ids"] for r in reports], n)


def test_endless_data_loader_interleaves_ranks(ranks):
    reports, _ = ranks
    for r, rep in enumerate(reports):
        want = [[(8 * (2 * k + r) + j) % N for j in range(8)] for k in range(4)]
        assert rep["DataLoader"]["ids"] == want


def test_ranks_on_different_stores_of_one_shape_all_refuse(ranks):
    reports, _ = ranks
    for key in ("other_store", "other_image_store"):
        messages = [r[key] for r in reports]
        assert all(m is not None for m in messages), key  # every rank raised, none hung
        assert all("rank 1 has fingerprint=" in m for m in messages), messages
    assert all("torchrun-store" in r["other_store"] for r in reports)


def test_ranks_with_different_batch_sizes_all_refuse(ranks):
    reports, _ = ranks
    assert all("rank 1 has batch=9 but rank 0 has 8" in r["other_batch"] for r in reports)
    assert all("torch.distributed" in r["other_batch"] for r in reports)
