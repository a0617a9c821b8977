"""The script tests/test_conformance.py launches with torchrun (gloo, CPU, loopback).

Usage: ``python -m torch.distributed.run --nproc_per_node=2 ... tests/_conformance_worker.py STORE
OUT``. Each rank builds every launcher-aware loader kind with no rank arguments (the launcher
says), reads it whole, reads it again stopping after 2 batches for a checkpoint and resumes, and
writes ``OUT/rank<r>.json``; the test process does the checking.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

import headrace
import headrace.torch

BATCH = 4


def _ids(batch: Any) -> list[int]:
    return [int(v) for v in batch["x"]]


def _kind(make: Callable[..., Any]) -> dict[str, Any]:
    with make(timeline=0.001) as loader:
        every = [_ids(b) for b in loader]
        s = loader.stats()
        loader.stats_timeline()
    with make() as loader:
        head = [_ids(next(loader)) for _ in range(2)]
        token = loader.checkpoint()
        tensors = bool(headrace.torch.as_tensors(next(loader)))
    with make(resume=token) as loader:
        rest = [_ids(b) for b in loader]
    return {"all": every, "head": head, "rest": rest, "tensors": tensors,
            "delivered": s["delivered_batches_total"], "assigned_rank": s["assigned_rank"]}


def main() -> None:
    store, out = sys.argv[1], sys.argv[2]
    rank = int(os.environ["RANK"])
    report: dict[str, Any] = {"rank": rank, "world_size": int(os.environ["WORLD_SIZE"]),
                              "kinds": {}}
    makers: dict[str, Callable[..., Any]] = {
        "DistributedDataLoader": lambda **kw: headrace.DistributedDataLoader(
            store, batch=BATCH, order="shuffle", seed=3, threads=1, **kw),
        "run": lambda **kw: headrace.run(store, batch=BATCH, order="shuffle", seed=3, threads=1,
                                         **kw),
    }
    for name, make in makers.items():
        report["kinds"][name] = _kind(make)
    dist.init_process_group("gloo")
    dist.barrier()
    dist.destroy_process_group()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    try:
        main()
    except BaseException:
        traceback.print_exc()
        raise
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # the report is written and every loader closed: skip torch's slow teardown
