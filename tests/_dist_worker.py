"""The script tests/test_dist_torchrun.py launches with torchrun (gloo, CPU, loopback).

Usage: ``python -m torch.distributed.run --nproc_per_node=N ... tests/_dist_worker.py SCENARIO
STORE OUT [TOKEN]``. Each rank writes ``OUT/<scenario>-rank<r>.json`` with what it saw; the test
process does all the checking, so a failure shows up as a readable assertion there.

Scenarios:
  main     (any world size) agreement through torchrun's store before a process group exists,
           full epochs with tail="pad" and tail="drop", ranks that disagree on the seed, run(),
           then the first steps of a shuffled epoch and a checkpoint (elastic resume, part 1).
  resume   (any world size) resume from TOKEN, read some steps, checkpoint, read to the end.
  finish   (any world size) resume from TOKEN and read to the end.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

import torch.distributed as dist

import headrace
from headrace import ConfigError

BATCH = 16
SEED = 7
MAIN_STEPS = 5  # steps read in "main" before the checkpoint
RESUME_STEPS = 4  # steps read in "resume" before its checkpoint


def _ids(loader):
    out = []
    for batch in loader:
        out.append([int(v) for v in batch["x"]])
        assert batch["x"].tolist() == loader.last_ids.tolist()
    return out


def _take(loader, steps):
    return [[int(v) for v in next(loader)["x"]] for _ in range(steps)]


def _elastic(loader):
    s = loader.stats()
    return {k: s[k] for k in ("elastic_transitions_total", "elastic_last_transition_reason",
                              "elastic_current_world_size")}


def main() -> None:
    scenario, store, out = sys.argv[1], sys.argv[2], sys.argv[3]
    token = bytes.fromhex(open(sys.argv[4]).read()) if len(sys.argv) > 4 else None  # noqa: SIM115
    rank = int(os.environ["RANK"])
    report: dict = {"rank": rank, "world_size": int(os.environ["WORLD_SIZE"])}

    if scenario == "main":
        # 1. no process group yet: ranks agree through torchrun's own store
        from headrace._engine.agree import engine_name

        with headrace.DistributedDataLoader(store, batch=BATCH, tail="pad") as ddl:
            report["engine_before_pg"] = engine_name(ddl.launch)
            report["snapshot"] = ddl.manifest_hash
            report["launcher"] = ddl.launch.launcher
            report["len_pad"] = len(ddl)
            report["pad"] = _ids(ddl)
            report["stats_rank"] = ddl.stats()["assigned_rank"]
        dist.init_process_group("gloo")
        # 2. with a process group: all_gather_object
        with headrace.DistributedDataLoader(store, batch_size_samples=BATCH, tail="drop") as ddl:
            report["engine_with_pg"] = engine_name(ddl.launch)
            report["len_drop"] = len(ddl)
            report["drop"] = _ids(ddl)
        # 3. a rank that disagrees fails on every rank, with a clear message
        try:
            headrace.DistributedDataLoader(store, batch=BATCH, seed=SEED + (rank == 1))
            report["disagree"] = None
        except ConfigError as e:
            report["disagree"] = str(e)
        # 4. seed=None: rank 0 draws, everyone uses it
        with headrace.DistributedDataLoader(store, batch=BATCH, seed=None) as ddl:
            report["drawn_seed"] = ddl.seed
        # 5. run() picks the sharded loader from WORLD_SIZE
        with headrace.run(store, batch=BATCH, order="shuffle", seed=SEED) as loader:
            report["run_type"] = type(loader).__name__
            report["run_first"] = [int(v) for v in next(loader)["x"]]
        # 6. elastic resume, part 1: a few steps of a shuffled epoch, then a checkpoint
        ddl = headrace.DistributedDataLoader(store, batch=BATCH, order="shuffle", seed=SEED)
        report["elastic_stats"] = _elastic(ddl)
        report["elastic_read"] = _take(ddl, MAIN_STEPS)
        report["token"] = ddl.checkpoint().hex()
        ddl.close()
    elif scenario in ("resume", "finish"):
        dist.init_process_group("gloo")
        ddl = headrace.DistributedDataLoader(store, batch=BATCH, order="shuffle", seed=SEED,
                                             resume_from=token, autotune=True)
        report["len"] = len(ddl)
        report["elastic_stats"] = _elastic(ddl)
        if scenario == "resume":
            report["elastic_read"] = _take(ddl, RESUME_STEPS)
            report["token"] = ddl.checkpoint().hex()
        report["rest"] = _ids(ddl)
        ddl.close()
    else:
        raise SystemExit(f"unknown scenario {scenario}")
    dist.barrier()
    dist.destroy_process_group()
    with open(os.path.join(out, f"{scenario}-rank{rank}.json"), "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    try:
        main()
    except BaseException:
        traceback.print_exc()
        raise
    # The report is on disk and every loader is closed; skip torch's slow interpreter teardown
    # (seconds per process on a busy 2-core machine).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
