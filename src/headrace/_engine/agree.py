"""Make every rank agree on what it reads, through the launcher's own engine.

A sharded epoch is only correct when every rank reads the same dataset snapshot with the same seed,
order and batch size: one rank on another generation, or a seed taken from ``time()``, silently
breaks "disjoint and complete". So before reading, the ranks exchange those values and compare.

No coordinator server of our own: the exchange uses what the job already runs, first available:

1. ``torch.distributed`` when its process group is initialized: ``all_gather_object``;
2. ``jax.distributed`` when initialized: ``multihost_utils.process_allgather`` of a digest;
3. torchrun's agent store (``TORCHELASTIC_USE_AGENT_STORE=True``), before any process group
   exists: a ``TCPStore`` client to ``MASTER_ADDR:MASTER_PORT`` under a ``headrace/`` prefix.

Every rank receives every rank's values, so on a disagreement *every* rank raises the same
``ConfigError`` at the same point (no rank is left waiting in a collective).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import sys
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from headrace._base.errors import ConfigError
from headrace._engine.launcher import Launch

__all__ = ["agree", "engine_name"]

_TIMEOUT_S = 300.0
_JAX_SLOTS = 32  # digests each rank sends through jax.distributed (see _gather_jax)
_DIFFERS = "__differs__"  # a rank whose values are known only by digest: the keys that differ
_calls = itertools.count()  # names each agreement round in the torchrun store


def _torch_initialized() -> bool:
    dist = sys.modules.get("torch.distributed")
    return bool(dist is not None and dist.is_available() and dist.is_initialized())


def _jax_initialized() -> bool:
    if "jax" not in sys.modules:
        return False
    import jax

    return bool(jax.distributed.is_initialized())


def _agent_store_available(env: Mapping[str, str]) -> bool:
    return (env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
            and bool(env.get("MASTER_ADDR")) and bool(env.get("MASTER_PORT")))


def engine_name(launch: Launch, env: Mapping[str, str] | None = None) -> str | None:
    """Which engine ``agree`` would use for ``launch`` (None: single process or none available)."""
    env = os.environ if env is None else env
    if not launch.distributed:
        return None
    if _torch_initialized():
        return "torch.distributed"
    if _jax_initialized():
        return "jax.distributed"
    if _agent_store_available(env):
        return "torchrun-store"
    return None


def _gather_torch(launch: Launch, payload: dict[str, Any]) -> list[dict[str, Any]]:
    import torch.distributed as dist

    if dist.get_world_size() != launch.world_size or dist.get_rank() != launch.rank:
        raise ConfigError(
            f"this process is rank {launch.rank} of {launch.world_size} ({launch.launcher}) but "
            f"torch.distributed says rank {dist.get_rank()} of {dist.get_world_size()}; pass "
            "rank=/world_size= that match the process group (or none)")
    out: list[Any] = [None] * launch.world_size
    dist.all_gather_object(out, payload)
    return out


def _gather_jax(launch: Launch, payload: dict[str, Any]) -> list[dict[str, Any]]:
    import numpy as np
    from jax.experimental import multihost_utils

    # Collectives move arrays, not objects: exchange a digest per compared key (so a difference
    # names its key) plus rank 0's full payload (for messages and for values rank 0 chooses,
    # like a seed left to it). Every rank sends the same shape: _JAX_SLOTS digests, the first of
    # the key names themselves, the last one covering any keys past the others.
    compared = {k: v for k, v in payload.items() if not k.endswith("_proposal")}
    keys = sorted(compared)
    named = keys[:_JAX_SLOTS - 2]
    digest = np.zeros((_JAX_SLOTS, 8), np.uint8)
    digest[0] = _digest8(keys)
    for i, k in enumerate(named):
        digest[1 + i] = _digest8([k, compared[k]])
    digest[-1] = _digest8([[k, compared[k]] for k in keys[len(named):]])
    text = json.dumps(payload, sort_keys=True).encode()
    digests = np.asarray(multihost_utils.process_allgather(digest)).reshape(-1, _JAX_SLOTS, 8)
    size = np.asarray(multihost_utils.broadcast_one_to_all(np.int64(len(text))))
    buf = np.zeros(int(size), dtype=np.uint8)
    if launch.rank == 0:
        buf[:] = np.frombuffer(text, dtype=np.uint8)
    first = json.loads(bytes(np.asarray(multihost_utils.broadcast_one_to_all(buf))).decode())
    out: list[dict[str, Any]] = []
    for r in range(digests.shape[0]):
        if bytes(digests[r]) == bytes(digests[0]):
            out.append(first)
        elif bytes(digests[r][0]) != bytes(digests[0][0]):  # other keys: only "it differs"
            out.append({_DIFFERS: ["the set of values compared"]})
        else:  # only digests are known: enough to name the keys that differ
            bad = [k for i, k in enumerate(named) if bytes(digests[r][1 + i])
                   != bytes(digests[0][1 + i])]
            if bytes(digests[r][-1]) != bytes(digests[0][-1]):
                bad.append(", ".join(keys[len(named):]))
            out.append({_DIFFERS: bad})
    return out


def _digest8(value: Any) -> Any:
    import numpy as np

    raw = hashlib.sha256(json.dumps(value, sort_keys=True).encode()).digest()[:8]
    return np.frombuffer(raw, np.uint8)


def _gather_store(launch: Launch, payload: dict[str, Any],
                  env: Mapping[str, str]) -> list[dict[str, Any]]:
    from torch.distributed import PrefixStore, TCPStore

    store = TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), launch.world_size,
                     is_master=False, timeout=timedelta(seconds=_TIMEOUT_S),
                     wait_for_workers=False)
    run = f"{env.get('TORCHELASTIC_RUN_ID', 'run')}/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    prefix = PrefixStore(f"headrace/agree/{run}/{next(_calls)}/", store)
    prefix.set(str(launch.rank), json.dumps(payload, sort_keys=True))
    keys = [str(r) for r in range(launch.world_size)]
    try:
        prefix.wait(keys, timedelta(seconds=_TIMEOUT_S))
    except Exception as e:  # torch raises its own DistStoreError / RuntimeError on a timeout
        missing = [k for k in keys if not prefix.check([k])]
        raise ConfigError(
            f"rank {launch.rank} of {launch.world_size} waited {_TIMEOUT_S:.0f} s for ranks "
            f"{missing} to build the same loader ({type(e).__name__}). Every rank must build "
            "its loaders in the same sequence; a loader only some ranks build (e.g. evaluation "
            "on rank 0) passes world_size=1") from None
    return [json.loads(prefix.get(k).decode()) for k in keys]


def agree(launch: Launch, payload: dict[str, Any], *, what: str = "the dataset",
          env: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Exchange ``payload`` between all ranks and require it to be identical everywhere.

    Args:
        launch: this process's rank and world size.
        payload: JSON-able values every rank must share (snapshot fingerprint, seed, ...). A key
            ending in ``"_proposal"`` is not compared: rank 0's value is the one everyone uses.
        what: named in the error message.
        env: the environment (default ``os.environ``).

    Returns:
        Every rank's payload, indexed by rank (a single process gets ``[payload]``).

    Raises:
        ConfigError: ranks disagree (the message names the ranks, the keys and their values), or a
            multi-process job has no engine to compare through.
    """
    env = os.environ if env is None else env
    engine = engine_name(launch, env)
    if not launch.distributed:
        return [payload]
    if engine == "torch.distributed":
        everyone = _gather_torch(launch, payload)
    elif engine == "jax.distributed":
        everyone = _gather_jax(launch, payload)
    elif engine == "torchrun-store":
        everyone = _gather_store(launch, payload, env)
    else:
        raise ConfigError(
            f"rank {launch.rank} of {launch.world_size} ({launch.launcher}) cannot check that all "
            f"ranks read the same {what}: no torch.distributed process group, no jax.distributed "
            "and no torchrun store is available. Call torch.distributed.init_process_group() or "
            "jax.distributed.initialize() before building the loader, or pass rank= and "
            "world_size= explicitly (or check=False) to read without the check")
    reference = everyone[0]
    problems = []
    for r, theirs in enumerate(everyone):
        if _DIFFERS in theirs:
            problems += [f"rank {r} has another {key} than rank 0's {reference[key]!r}"
                         if key in reference else f"rank {r} differs from rank 0 in {key}"
                         for key in theirs[_DIFFERS]]
            continue
        for key in sorted(set(reference) | set(theirs)):
            if key.endswith("_proposal"):
                continue
            if theirs.get(key) != reference.get(key):
                problems.append(f"rank {r} has {key}={theirs.get(key)!r} but rank 0 has "
                                f"{reference.get(key)!r}")
    if problems:
        raise ConfigError(
            f"ranks disagree on {what} (checked through {engine}): " + "; ".join(problems[:8])
            + (f"; ... {len(problems) - 8} more" if len(problems) > 8 else "")
            + f" (this is rank {launch.rank}: "
            + json.dumps({k: v for k, v in payload.items() if not k.endswith("_proposal")},
                         sort_keys=True) + ")"
            + ". Every rank must open the same snapshot with the same seed, order and batch size "
            "(pin the snapshot, e.g. 'path@sha256:...', and pass the same seed everywhere)")
    return everyone
