"""The ports in examples/ run a few steps on generated data and resume exactly after a stop.

Each script writes one JSON line per step (the batch's records or a checksum of its pixels or
tokens, and the loss); a run stopped mid-epoch and resumed must write the same lines as one run
straight through, losses included (same data in the same order, so the same training).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK") and not k.startswith("SLURM_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    env["JAX_PLATFORMS"] = "cpu"
    return env


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        # The whole tail, not from the first traceback on: a rank that aborts in C++ prints its
        # reason ("terminate called ...", "Fatal Python error") before torchrun's own traceback.
        pytest.fail(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n"
                    f"stdout:\n{proc.stdout[-2000:]}\nstderr:\n{proc.stderr[-10000:]}")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(script: str, *args: str) -> None:
    _run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
          "--master_addr=127.0.0.1", f"--master_port={_port()}", "--monitor-interval=0.1",
          str(EXAMPLES / script), *args])


def _python(script: str, *args: str) -> None:
    _run([sys.executable, str(EXAMPLES / script), *args])


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def test_imagenet_ddp_port_resumes_exactly_on_two_gloo_ranks(tmp_path):
    full, cut = tmp_path / "full", tmp_path / "cut"
    _torchrun("imagenet_ddp.py", "--out", str(full))
    _torchrun("imagenet_ddp.py", "--out", str(cut), "--stop-after", "4")  # mid epoch 0 of 6 steps
    _torchrun("imagenet_ddp.py", "--out", str(cut), "--resume")
    for rank in (0, 1):
        want = _lines(full / f"steps-rank{rank}.jsonl")
        assert len(want) == 12  # 96 images, 2 ranks, batch 8, 2 epochs
        assert _lines(cut / f"steps-rank{rank}.jsonl") == want
    ids0 = [set(json.loads(x)["ids"]) for x in _lines(full / "steps-rank0.jsonl")[:6]]
    ids1 = [set(json.loads(x)["ids"]) for x in _lines(full / "steps-rank1.jsonl")[:6]]
    assert not set().union(*ids0) & set().union(*ids1)  # ranks read disjoint shards


def test_flax_port_resumes_exactly(tmp_path):
    import flax  # noqa: F401  (the test needs it installed)
    import optax  # noqa: F401  (the test needs it installed)
    full, cut = tmp_path / "full", tmp_path / "cut"
    _python("flax_grain.py", "--out", str(full))
    _python("flax_grain.py", "--out", str(cut), "--stop-after", "5")
    _python("flax_grain.py", "--out", str(cut), "--resume")
    want = _lines(full / "steps.jsonl")
    assert len(want) == 16  # 512 records, batch 64, 2 epochs
    assert _lines(cut / "steps.jsonl") == want


def test_nanogpt_port_resumes_exactly_with_a_batch_fetched_ahead(tmp_path):
    full, cut = tmp_path / "full", tmp_path / "cut"
    _python("nanogpt.py", "--out", str(full), "--iters", "20")
    _python("nanogpt.py", "--out", str(cut), "--iters", "20", "--stop-after", "7")
    _python("nanogpt.py", "--out", str(cut), "--iters", "20", "--resume")
    want = _lines(full / "steps.jsonl")
    assert len(want) == 20
    assert _lines(cut / "steps.jsonl") == want
