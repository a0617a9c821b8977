"""The script tests/test_ranks_torchrun.py launches with torchrun (2 ranks, gloo, CPU, loopback).

Usage: ``python -m torch.distributed.run --nproc_per_node=2 ... tests/_ranks_worker.py DATA OUT``
where ``DATA`` is a JSON file of dataset paths. No loader here is given a rank: every one reads
RANK/WORLD_SIZE from torchrun. Each rank writes ``OUT/kinds-rank<r>.json`` with the record ids of
every batch each loader kind gave it; the test process does the checking.

The first loaders are built before any process group exists (they agree through torchrun's own
store), the rest after ``init_process_group("gloo")`` (through ``all_gather_object``).
"""

from __future__ import annotations

import json
import os
import sys
import traceback

import numpy as np
import torch.distributed as dist

import headrace
from headrace import ConfigError
from headrace._engine.agree import engine_name
from headrace._engine.launcher import detect


def _ids(loader, steps=None):
    out = []
    for k, _ in enumerate(loader):
        out.append([int(v) for v in loader.last_ids])
        if steps is not None and k + 1 == steps:
            break
    return out


def _refused(make):
    try:
        make().close()
    except ConfigError as e:
        return str(e)
    return None


def main() -> None:
    data = json.load(open(sys.argv[1]))  # noqa: SIM115
    out = sys.argv[2]
    rank = int(os.environ["RANK"])
    report: dict = {"rank": rank}

    # -- before a process group: torchrun's store --------------------------------------------
    with headrace.Loader(data["arrays"], batch=8) as ld:
        report["engine_before_pg"] = engine_name(ld._launch)
        report["loader_len"] = len(ld)
        report["Loader"] = {"ids": _ids(ld), "rank": ld.rank, "world_size": ld.world_size}
    report["load"] = {"ids": _ids(headrace.load(data["arrays"], batch=8, shuffle=True, seed=3))}
    report["load_drop"] = {"ids": _ids(headrace.load(data["arrays"], batch=8, tail="drop"))}
    # two stores of one shape, different bytes: every rank refuses, naming the fingerprint
    report["other_store"] = _refused(lambda: headrace.Loader(data["twins"][rank], batch=8))

    dist.init_process_group("gloo")
    report["engine_with_pg"] = engine_name(detect())
    report["other_batch"] = _refused(lambda: headrace.load(data["arrays"], batch=8 + rank))
    report["other_image_store"] = _refused(
        lambda: headrace.image(data["image_twins"][rank], batch=4, resize=(8, 8)))
    with headrace.image(data["images"], batch=32, resize=(8, 8), shuffle=True, seed=1) as ld:
        report["image_len"] = len(ld)
        report["image"] = {"ids": _ids(ld), "rank": ld._current_loader().rank}
    with headrace.image(data["images"], batch=32, resize=(8, 8), tail="drop") as ld:
        report["image_drop"] = {"ids": _ids(ld)}
    with headrace.text(data["text"], seq_len=8, batch=4, add_eos=False) as ld:
        report["text_windows"] = ld.windows
        report["text"] = {"ids": _ids(ld)}
    with headrace.audio(data["audio"], batch=2, samples=64) as ld:
        report["audio"] = {"ids": _ids(ld)}
    with headrace.video(data["video"], clip=4, stride=4, fps=24, batch=2,
                        index_dir=data["video_index"]) as ld:  # one cache, both ranks write it
        report["video_clips"] = ld.clip_count
        report["video"] = {"ids": _ids(ld)}
    x = np.arange(data["n"], dtype=np.int64)
    with headrace.DataLoader(x, x, batch_size=8, mode=0, num_workers=1) as ld:
        report["DataLoader"] = {"ids": _ids(ld, steps=4), "rank": ld.rank}
    dist.barrier()
    dist.destroy_process_group()
    with open(os.path.join(out, f"kinds-rank{rank}.json"), "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    try:
        main()
    except BaseException:
        traceback.print_exc()
        raise
    # The report is on disk and every loader is closed; skip torch's slow interpreter teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
