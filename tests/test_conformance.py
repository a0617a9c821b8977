"""The conformance suite: every public loader kind through the same checks.

The kinds are the table in ``tests/_kinds.py`` (one factory each, on tiny generated data): arrays
through ``Loader`` and ``load``, ``image``, ``text``, ``audio``, ``video``, ``mix`` (text
sources, and array sources), loaderx's ``DataLoader`` and ``DistributedDataLoader``; the last one
also runs under a real 2-process torchrun (``test_torchrun_ranks_conform``). A new loader kind is
done when it is one entry of that table and passes every check here.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from _kinds import KINDS, Data, Kind
from _loader_util import as_plain
from headrace._engine import checkpoint as _checkpoint

ALL = list(KINDS.values())


def kinds(*excluded: str) -> list[Kind]:
    """The kinds a check runs on: all of them but ``excluded`` (named, so a gap is visible)."""
    unknown = set(excluded) - set(KINDS)
    assert not unknown, unknown
    return [k for k in ALL if k.name not in excluded]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Data:
    return Data(tmp_path_factory.mktemp("conformance"))


def read(loader: Any, count: int | None = None) -> list[Any]:
    """Up to ``count`` batches (all when None) as plain, comparable Python data."""
    out: list[Any] = []
    if count == 0:
        return out
    for batch in loader:
        out.append(as_plain(batch))
        if count is not None and len(out) >= count:
            break
    return out


def reference(kind: Kind, data: Data, **kw: Any) -> list[Any]:
    with kind.make(data, **kw) as loader:
        return read(loader, kind.take)


# -- state: checkpoint() / resume= -------------------------------------------------------------


@pytest.mark.parametrize("kind", kinds("mix"), ids=repr)
def test_checkpoint_resume_continues_exactly(kind: Kind, data: Data) -> None:
    ref = reference(kind, data)
    n = len(ref)
    assert n >= 3, f"{kind}: the test data gives only {n} batches"
    for stop in sorted({0, 1, n // 2, n - 1, n}):
        with kind.make(data) as first:
            head = read(first, stop)
            token = first.checkpoint()
        assert isinstance(token, bytes)
        with kind.make(data, resume=token) as second:
            rest = read(second, None if kind.take is None else n - stop)
            if not kind.endless:
                assert next(second, None) is None, f"{kind}: more batches after the end"
        assert head + rest == ref, f"{kind}: stop={stop}: the resumed stream differs"


@pytest.mark.parametrize("kind", kinds("mix", "mix-arrays"), ids=repr)
def test_checkpoint_is_one_json_token_format(kind: Kind, data: Data) -> None:
    with kind.make(data) as loader:
        read(loader, 2)
        token = loader.checkpoint()
    body = json.loads(token.decode("ascii"))
    assert body["format"] == _checkpoint.FORMAT


# -- adapters ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", kinds("image", "audio"), ids=repr)
def test_jax_iterator_accepts_the_batches(kind: Kind, data: Data) -> None:
    import headrace.jax

    with kind.make(data) as loader:
        first = next(loader)
    with kind.make(data) as loader:
        it = headrace.jax.iterator(loader)
        placed = next(it)
        assert isinstance(it.checkpoint(), bytes)
    host = {k: np.asarray(v) for k, v in placed.items()}
    # JAX without x64 holds 64-bit values as 32-bit: compare in the placed dtype
    assert {k: v.tolist() for k, v in host.items()} == {
        k: np.asarray(v).astype(host[k].dtype).tolist() for k, v in first.items()
        if v is not None}


@pytest.mark.parametrize("kind", kinds("image", "audio", "mix"), ids=repr)
def test_torch_adapters_accept_the_batches_and_resume(kind: Kind, data: Data) -> None:
    import torch

    import headrace.torch

    with kind.make(data) as loader:
        batch = next(loader)
        tensors = headrace.torch.as_tensors(batch)
    assert all(isinstance(v, torch.Tensor) for v in tensors.values() if v is not None)

    def factory(resume: bytes | None) -> Any:
        return kind.make(data, resume=resume)

    def plain(t: Any) -> Any:
        return {k: None if v is None else v.tolist() for k, v in sorted(t.items())}

    ds = headrace.torch.IterableDataset(factory)
    it = iter(ds)
    head = [plain(next(it)) for _ in range(2)]
    state = ds.state_dict()
    ds.close()
    ref = [plain(b) for _, b in zip(range(4), iter(headrace.torch.IterableDataset(factory)),
                                    strict=False)]
    again = headrace.torch.IterableDataset(factory)
    again.load_state_dict(state)
    rest = [plain(b) for _, b in zip(range(2), iter(again), strict=False)]
    again.close()
    assert head + rest == ref


# -- timeline, stats, print_stats, close -------------------------------------------------------


@pytest.mark.parametrize("kind", kinds("load", "DataLoader"), ids=repr)
def test_timeline_stats_print_stats_and_close(kind: Kind, data: Data) -> None:
    with kind.make(data, timeline=0.001) as loader:
        got = read(loader, 3)
        s = loader.stats()
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            loader.print_stats()
        tl = loader.stats_timeline()
    assert len(got) == 3
    assert s["delivered_batches_total"] == 3
    assert (out.getvalue() + err.getvalue()).strip()
    json.dumps(tl)  # what headrace.plot reads: plain JSON
    assert tl["samples"], f"{kind}: the timeline recorded nothing"
    loader.close()  # idempotent after the context manager closed it
    assert loader.stats()["status"] == "CLOSED"


@pytest.mark.parametrize("kind", ALL, ids=repr)
def test_close_is_idempotent_and_ends_iteration(kind: Kind, data: Data) -> None:
    loader = kind.make(data)
    next(loader)
    loader.close()
    loader.close()
    with kind.make(data) as again:
        next(again)
    assert next(again, None) is None or kind.endless


# -- ranks under a real launcher ---------------------------------------------------------------

WORKER = os.path.join(os.path.dirname(__file__), "_conformance_worker.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_torchrun_ranks_conform(data: Data, tmp_path: Any) -> None:
    """Two real ranks (torchrun, gloo, loopback): ranks from the launcher, disjoint shards that
    cover the data, exact resume per rank, the adapters, stats and timeline on each rank."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK") and not k.startswith("SLURM_")}
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           "--master_addr=127.0.0.1", f"--master_port={_free_port()}", "--monitor-interval=0.1",
           WORKER, str(data.store), str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    if proc.returncode != 0:
        at = proc.stderr.find("Traceback")
        pytest.fail("torchrun failed:\n" + proc.stderr[max(at, 0):][:6000] + proc.stdout[-2000:])
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for r, rep in enumerate(reports):
        assert rep["rank"] == r and rep["world_size"] == 2
        for name, kind in rep["kinds"].items():
            assert kind["assigned_rank"] == r, name
            assert kind["head"] + kind["rest"] == kind["all"], f"{name}: resume differs on rank {r}"
            assert kind["tensors"], name
            assert kind["delivered"] == len(kind["all"]), name
    for name in reports[0]["kinds"]:
        per_rank = [rep["kinds"][name]["all"] for rep in reports]
        assert len(per_rank[0]) == len(per_rank[1]), f"{name}: ranks read different counts"
        ids = sorted(v for batches in per_rank for b in batches for v in b)
        assert ids == list(range(len(ids))) and len(ids) == 40, f"{name}: not one disjoint cover"
