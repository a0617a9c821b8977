"""Rank / world size / local rank from torchrun, SLURM, jax.distributed, or explicit arguments."""

import subprocess
import sys

import pytest

from headrace import ConfigError
from headrace._engine.launcher import Launch, detect


def test_single_process_without_a_launcher():
    got = detect(environ={})
    assert got == Launch(rank=0, world_size=1, local_rank=0, launcher="single")
    assert not got.distributed


def test_torchrun_env():
    got = detect(environ={"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"})
    assert (got.rank, got.world_size, got.local_rank, got.launcher) == (3, 4, 1, "torchrun")
    assert got.distributed


def test_slurm_env_prefers_the_step_task_count():
    env = {"SLURM_PROCID": "5", "SLURM_NTASKS": "16", "SLURM_STEP_NUM_TASKS": "8",
           "SLURM_LOCALID": "2"}
    got = detect(environ=env)
    assert (got.rank, got.world_size, got.local_rank, got.launcher) == (5, 8, 2, "slurm")
    env.pop("SLURM_STEP_NUM_TASKS")
    assert detect(environ=env).world_size == 16


def test_slurm_batch_script_without_a_step_is_single():
    # sbatch sets SLURM_NTASKS for the allocation, but a plain `python` in the script is one process.
    assert detect(environ={"SLURM_NTASKS": "8", "SLURM_JOB_ID": "1"}).world_size == 1


def test_torchrun_wins_over_slurm():
    # srun torchrun ...: SLURM_PROCID is the node, RANK the process.
    env = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "RANK": "6", "WORLD_SIZE": "8",
           "LOCAL_RANK": "2"}
    got = detect(environ=env)
    assert (got.rank, got.world_size, got.local_rank, got.launcher) == (6, 8, 2, "torchrun")


def test_explicit_arguments_override_each_value():
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "3"}
    got = detect(rank=1, world_size=2, environ=env)
    assert (got.rank, got.world_size, got.local_rank, got.launcher) == (1, 2, 3, "explicit")
    got = detect(rank=0, environ=env)
    assert (got.rank, got.world_size) == (0, 4)
    assert detect(local_rank=0, environ=env).local_rank == 0


@pytest.mark.parametrize(("kwargs", "env", "fragment"), [
    ({}, {"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x'"),
    ({}, {"RANK": "2", "WORLD_SIZE": "2"}, "rank=2 is outside [0, world_size=2)"),
    ({"rank": 1}, {}, "no world size"),
    ({"world_size": 0}, {}, "world_size=0 must be >= 1"),
    ({"rank": -1, "world_size": 2}, {}, "rank=-1"),
])
def test_bad_values_name_the_value(kwargs, env, fragment):
    with pytest.raises(ConfigError, match=fragment.replace("[", r"\[").replace("(", r"\(")
                       .replace(")", r"\)")):
        detect(environ=env, **kwargs)


def test_jax_is_not_imported_unless_asked():
    code = ("import sys; from headrace._engine.launcher import detect; detect(environ={});"
            "print('jax' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_jax_uninitialized_is_single_process():
    got = detect(environ={}, use_jax=True)
    assert (got.rank, got.world_size, got.launcher) == (0, 1, "single")


def test_jax_distributed_two_processes(tmp_path):
    """Two real processes joined by jax.distributed on loopback: each reads its process index,
    and ``agree`` compares through jax's collectives (a disagreement fails on both)."""
    port = _free_port()
    code = (
        "import sys, jax\n"
        "jax.config.update('jax_cpu_collectives_implementation', 'gloo')\n"
        "jax.distributed.initialize(coordinator_address=f'127.0.0.1:{sys.argv[1]}',"
        " num_processes=2, process_id=int(sys.argv[2]), initialization_timeout=60)\n"
        "from headrace import ConfigError\n"
        "from headrace._engine.agree import agree\n"
        "from headrace._engine.launcher import detect\n"
        "got = detect(environ={})\n"
        "same = agree(got, {'fingerprint': 'f', 'seed': 1, 'seed_proposal': got.rank}, env={})\n"
        "assert [p['seed_proposal'] for p in same] == [0, 0], same  # rank 0's choice wins\n"
        "try:\n"
        "    agree(got, {'fingerprint': 'f', 'seed': got.rank}, env={})\n"
        "    print('agreed')\n"
        "except ConfigError as e:\n"
        "    assert \"rank 1 has another seed than rank 0's 0\" in str(e), e\n"
        "    print(got.rank, got.world_size, got.launcher)\n"
        "jax.distributed.shutdown()\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code, str(port), str(i)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**_clean_env(), "JAX_PLATFORMS": "cpu"})
             for i in range(2)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
        outs.append(out.strip().splitlines()[-1].split())  # gloo prints a line of its own
    assert sorted(outs) == [["0", "2", "jax"], ["1", "2", "jax"]]


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _clean_env():
    import os

    return {k: v for k, v in os.environ.items()
            if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK") and not k.startswith("SLURM_")}
