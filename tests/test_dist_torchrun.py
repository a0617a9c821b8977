"""Rank sharding on real processes: torchrun (torch.distributed.run), gloo, CPU, loopback.

Three launches share one store: 4 ranks (coverage with pad and drop, snapshot agreement, a rank that
disagrees, run(), the first steps of a shuffled epoch), then 2 ranks resuming that checkpoint
(elastic 4 -> 2), then 3 ranks resuming the 2-rank checkpoint (2 -> 3). Every global stream is
rebuilt from the per-rank batches and compared with the single-process order.
"""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

import headrace
from headrace import ConfigError
from headrace._engine import checkpoint as _checkpoint
from headrace._engine.launcher import Launch

N = 1000
BATCH = 16
SEED = 7
WORKER = os.path.join(os.path.dirname(__file__), "_dist_worker.py")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(nproc, scenario, store, out, token=None):
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK") and not k.startswith("SLURM_")}
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
           "--master_addr=127.0.0.1", f"--master_port={_free_port()}", "--monitor-interval=0.1",
           WORKER, scenario, str(store), str(out)]
    if token is not None:
        path = out / f"{scenario}.token"
        path.write_text(token)
        cmd.append(str(path))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    if proc.returncode != 0:  # show the first worker traceback, not only torchrun's summary
        at = proc.stderr.find("Traceback")
        pytest.fail(f"torchrun {scenario} x{nproc} failed:\n" + proc.stderr[max(at, 0):][:6000]
                    + proc.stdout[-2000:])
    reports = [json.loads((out / f"{scenario}-rank{r}.json").read_text()) for r in range(nproc)]
    assert [r["rank"] for r in reports] == list(range(nproc))
    return reports


def _global(per_rank):
    """Interleave per-rank batch lists back into the global stream: step k, rank 0..W-1."""
    steps = {len(b) for b in per_rank}
    assert len(steps) == 1, f"ranks read different batch counts: {[len(b) for b in per_rank]}"
    out = []
    for k in range(steps.pop()):
        for batches in per_rank:
            out.extend(batches[k])
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist")
    store = root / "store"
    headrace.pack_arrays(store, x=np.arange(N, dtype=np.int64), progress=False)
    out = root / "out"
    out.mkdir()
    main = _torchrun(4, "main", store, out)
    resume = _torchrun(2, "resume", store, out, token=main[0]["token"])
    finish = _torchrun(3, "finish", store, out, token=resume[0]["token"])
    return {"store": store, "main": main, "resume": resume, "finish": finish}


def test_every_rank_agrees_on_the_snapshot(runs):
    main = runs["main"]
    snapshots = {r["snapshot"] for r in main}
    with headrace.open(runs["store"]) as st:
        from headrace._store.fingerprint import store_fingerprint

        assert snapshots == {store_fingerprint(st)}
    assert {r["launcher"] for r in main} == {"torchrun"}
    assert {r["engine_before_pg"] for r in main} == {"torchrun-store"}
    assert {r["engine_with_pg"] for r in main} == {"torch.distributed"}
    assert [r["stats_rank"] for r in main] == [0, 1, 2, 3]


def test_pad_covers_every_record_with_equal_batch_counts(runs):
    main = runs["main"]
    per_rank = [r["pad"] for r in main]
    steps = -(-N // (4 * BATCH))  # 16 global steps, the last one shorter
    assert [len(b) for b in per_rank] == [steps] * 4 == [r["len_pad"] for r in main]
    # pad fills samples, not batches: N / 4 = 250 per rank (15 x 16 + 10), as DistributedSampler
    assert all([len(batch) for batch in b] == [BATCH] * 15 + [10] for b in per_rank)
    flat = _global(per_rank)
    assert flat == list(range(N))  # sequential: the global stream is 0..N-1, nothing twice


def test_drop_covers_full_steps_only(runs):
    per_rank = [r["drop"] for r in runs["main"]]
    steps = N // (4 * BATCH)
    assert [len(b) for b in per_rank] == [steps] * 4 == [r["len_drop"] for r in runs["main"]]
    flat = _global(per_rank)
    assert flat == list(range(steps * 4 * BATCH))


def test_disagreeing_ranks_all_fail_clearly(runs):
    messages = [r["disagree"] for r in runs["main"]]
    assert all(m is not None for m in messages)  # every rank raised, none hung
    assert all("rank 1 has seed=8 but rank 0 has 7" in m for m in messages)
    assert all("torch.distributed" in m for m in messages)


def test_seed_drawn_by_rank_zero_is_shared(runs):
    seeds = {r["drawn_seed"] for r in runs["main"]}
    assert len(seeds) == 1 and isinstance(seeds.pop(), int)


def test_run_is_sharded_under_torchrun(runs):
    main = runs["main"]
    assert {r["run_type"] for r in main} == {"DistributedDataLoader"}
    order = headrace.Loader(runs["store"], batch=N, order="shuffle", seed=SEED)
    reference = next(order)["x"].tolist()
    order.close()
    assert _global([[r["run_first"]] for r in main]) == reference[:4 * BATCH]


def test_elastic_resume_4_to_2_to_3_continues_the_same_global_stream(runs):
    with headrace.Loader(runs["store"], batch=N, order="shuffle", seed=SEED) as single:
        reference = next(single)["x"].tolist()
    main, resume, finish = runs["main"], runs["resume"], runs["finish"]
    for run in (main, resume):  # every rank checkpoints the same global position
        assert len({_checkpoint.decode(bytes.fromhex(r["token"])).position for r in run}) == 1
    part1 = _global([r["elastic_read"] for r in main])  # 5 steps x 4 ranks x 16
    part2 = _global([r["elastic_read"] + r["rest"] for r in resume])  # to the end, 2 ranks
    part2_head = _global([r["elastic_read"] for r in resume])
    part3 = _global([r["rest"] for r in finish])  # from the 2-rank checkpoint, 3 ranks
    # stats() measure the world-size change of a resume
    assert {json.dumps(r["elastic_stats"]) for r in main} == {json.dumps(
        {"elastic_transitions_total": 0, "elastic_last_transition_reason": "none",
         "elastic_current_world_size": 4})}
    for run, before, now in ((resume, 4, 2), (finish, 2, 3)):
        for r in run:
            assert r["elastic_stats"] == {
                "elastic_transitions_total": 1, "elastic_current_world_size": now,
                "elastic_last_transition_reason":
                    f"resumed a world_size={before} checkpoint on world_size={now}"}
    # 4 -> 2: nothing lost, nothing read twice (past N: the 2-rank run's pad, from the start)
    both = part1 + part2
    assert both[:N] == reference
    assert both[N:] == reference[:len(both) - N]
    # 2 -> 3: the 3-rank run continues exactly where the 2-rank checkpoint was taken
    done = len(part1) + len(part2_head)
    assert part3[:N - done] == reference[done:]
    assert part3[N - done:] == reference[:len(part3) - (N - done)]  # the pad, from the start
    assert {r["len"] for r in finish} == {-(-(N - done) // (3 * BATCH))}


def test_no_engine_means_a_clear_error_not_a_silent_guess(tmp_path):
    from headrace._engine.agree import agree

    with pytest.raises(ConfigError, match="cannot check that all ranks read the same"):
        agree(Launch(rank=0, world_size=2, launcher="slurm"), {"seed": 1}, env={})
    # a single process has nothing to agree with
    assert agree(Launch(), {"seed": 1}, env={}) == [{"seed": 1}]


# -- in one process: explicit ranks, run() without a launcher ---------------------------------


@pytest.fixture
def small_store(tmp_path, monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(var, raising=False)
    path = tmp_path / "small"
    headrace.pack_arrays(path, x=np.arange(100, dtype=np.int64), progress=False)
    return path


@pytest.mark.parametrize(("world", "tail"), [(3, "pad"), (3, "drop"), (4, "pad")])
def test_explicit_ranks_are_disjoint_and_complete(small_store, world, tail):
    per_rank = []
    for r in range(world):
        with headrace.DistributedDataLoader(small_store, batch=8, rank=r, world_size=world,
                                            tail=tail, check=False) as ddl:
            assert (ddl.assigned_rank, ddl.world_size, ddl.launch.launcher) == (r, world,
                                                                                "explicit")
            per_rank.append([b["x"].tolist() for b in ddl])
    flat = _global(per_rank)
    if tail == "drop":
        assert flat == list(range(len(flat))) and len(flat) > 100 - world * 8
    else:
        assert flat[:100] == list(range(100))
        assert flat[100:] == list(range(len(flat) - 100))


def test_run_without_a_launcher_is_a_plain_loader(small_store):
    with headrace.run(small_store, batch=30) as loader:
        assert type(loader).__name__ == "Loader"
        assert [len(b["x"]) for b in loader] == [30, 30, 30, 10]
    with pytest.warns(UserWarning, match="headrace needs no coordinator"), \
            headrace.run(small_store, batch=30, job="j1", coord="http://x:1") as loader:
        assert len(loader) == 4
    with pytest.raises(ConfigError, match="manifest-store options"):
        headrace.run(small_store, store="/somewhere")
    with headrace.run(small_store, batch=10, rank=1, world_size=2, check=False) as ddl:
        assert type(ddl).__name__ == "DistributedDataLoader" and len(ddl) == 5


def test_distributed_loader_argument_errors(small_store):
    with pytest.raises(ConfigError, match="needs the dataset"):
        headrace.DistributedDataLoader(batch=4)
    with pytest.raises(ConfigError, match="conflicts with batch_size_samples"):
        headrace.DistributedDataLoader(small_store, batch=4, batch_size_samples=8)
    with pytest.warns(UserWarning, match="needs no coordinator"), \
            headrace.DistributedDataLoader(small_store, coord_url="http://c:1", job_id="j",
                                           node_id="n", batch_size_samples=50) as ddl:
        assert len(ddl) == 2 and ddl.stats()["mode"] == "distributed"
