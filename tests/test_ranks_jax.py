"""Ranks from ``jax.distributed`` (two real processes on loopback, CPU): a Loader given no rank
reads this process's share, and ranks on stores of one shape but other bytes all refuse, naming
the fingerprint, through jax's own collectives."""

import json
import os
import socket
import subprocess
import sys
import textwrap

import numpy as np

import headrace

SCRIPT = textwrap.dedent("""
    import json, sys
    import jax

    rank, port, same, twins, out = (int(sys.argv[1]), sys.argv[2], sys.argv[3],
                                    json.loads(sys.argv[4]), sys.argv[5])
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                               process_id=rank, initialization_timeout=60)
    import headrace
    from headrace._engine.agree import engine_name

    report = {}
    with headrace.Loader(same, batch=4) as ld:
        report["engine"] = engine_name(ld._launch)
        report["share"] = (ld.rank, ld.world_size)
        report["ids"] = [b["x"].tolist() for b in ld]
    try:
        headrace.Loader(twins[rank], batch=4).close()
        report["refused"] = None
    except headrace.ConfigError as e:
        report["refused"] = str(e)
    with open(f"{out}/jax-rank{rank}.json", "w") as f:
        json.dump(report, f)
    jax.distributed.shutdown()
    print("ok", rank)
""")


def test_jax_distributed_ranks_shard_and_refuse_other_stores(tmp_path):
    x = np.arange(18, dtype=np.int64)
    headrace.pack_arrays(tmp_path / "a", x=x, progress=False)
    headrace.pack_arrays(tmp_path / "b", x=x[::-1].copy(), progress=False)
    twins = json.dumps([str(tmp_path / "a"), str(tmp_path / "b")])
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK") and not k.startswith("SLURM_")}
    env["JAX_PLATFORMS"] = "cpu"
    procs = [subprocess.Popen([sys.executable, "-c", SCRIPT, str(r), str(port),
                               str(tmp_path / "a"), twins, str(tmp_path)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in (0, 1)]
    try:
        outs = [p.communicate(timeout=180) for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    for r, (p, (out, err)) in enumerate(zip(procs, outs, strict=True)):
        assert p.returncode == 0, err[-4000:]
        assert out.strip().endswith(f"ok {r}")
    reports = [json.loads((tmp_path / f"jax-rank{r}.json").read_text()) for r in (0, 1)]
    assert {rep["engine"] for rep in reports} == {"jax.distributed"}
    assert [rep["share"] for rep in reports] == [[0, 2], [1, 2]]
    # 18 records, batch 4, 2 ranks: 9 each (4 + 4 + 1), together every record once
    assert reports[0]["ids"] == [[0, 1, 2, 3], [8, 9, 10, 11], [16]]
    assert reports[1]["ids"] == [[4, 5, 6, 7], [12, 13, 14, 15], [17]]
    for rep in reports:  # every rank refused, naming what differs
        assert rep["refused"] is not None
        assert "rank 1 has another fingerprint than rank 0's 'store:g0:" in rep["refused"]
        assert "jax.distributed" in rep["refused"]
