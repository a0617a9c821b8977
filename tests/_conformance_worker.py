"""The script tests/test_conformance.py launches with torchrun (gloo, CPU, loopback).

Usage: ``python -m torch.distributed.run --nproc_per_node=2 ... tests/_conformance_worker.py DATA
OUT`` (``DATA``: the root of ``tests/_kinds.Data``). Each rank builds every loader kind of
``tests/_kinds.KINDS``, plus ``run()``, with no rank arguments (the launcher says), reads it whole,
reads it again stopping after one batch for a checkpoint and resumes, and writes
``OUT/rank<r>.json``; the test process does the checking.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed as dist

import headrace
import headrace.torch
from _kinds import BATCH, KINDS, Data, launched  # the script's folder is first on sys.path

ENDLESS_STEPS = 5  # batches read from an endless kind (40 records / (2 ranks x 4))


def _where(loader: Any) -> list[Any]:
    """The records of the batch just delivered: ids, and which source for a mix."""
    ids = [int(v) for v in loader.last_ids]
    source = getattr(loader, "last_source", None)
    return [source, ids]


def _read(loader: Any, steps: int | None) -> list[Any]:
    out: list[Any] = []
    while steps is None or len(out) < steps:
        try:
            batch = next(loader)
        except StopIteration:
            break
        out.append(_where(loader))
        assert headrace.torch.as_tensors(batch) is not None
    return out


def _kind(make: Callable[..., Any], steps: int | None) -> dict[str, Any]:
    with make(timeline=0.001) as loader:
        every = _read(loader, steps)
        s = loader.stats()
        loader.stats_timeline()
    with make() as loader:
        head = _read(loader, 1)
        token = loader.checkpoint()
    with make(resume=token) as loader:
        rest = _read(loader, None if steps is None else steps - 1)
    return {"all": every, "head": head, "rest": rest, "delivered": s["delivered_batches_total"],
            "rank": s.get("rank", s.get("assigned_rank")),
            "world_size": s.get("world_size")}


def main() -> None:
    data = Data(Path(sys.argv[1]), create=False)
    out = sys.argv[2]
    rank = int(os.environ["RANK"])
    report: dict[str, Any] = {"rank": rank, "world_size": int(os.environ["WORLD_SIZE"]),
                              "kinds": {}}
    makers: dict[str, tuple[Callable[..., Any], int | None]] = {
        name: (lambda k=kind, **kw: launched(k, data, **kw),
               ENDLESS_STEPS if kind.endless else None)
        for name, kind in KINDS.items()}
    makers["run"] = (lambda **kw: headrace.run(str(data.store), batch=BATCH, order="shuffle",
                                               seed=3, threads=1, **kw), None)
    for name, (make, steps) in makers.items():
        report["kinds"][name] = _kind(make, steps)
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
