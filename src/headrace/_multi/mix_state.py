"""A mix's checkpoint: the loaders' one token format, with every source's state nested inside.

``MixedLoader.state_dict()`` is a ``headrace-ckpt-1`` JSON object of kind ``"mix"``
(``_engine.checkpoint.encode_body``): the schedule (credits, active sources, ticks), the mix's
counters, and ``sources``, each source's own ``state_dict()`` (whatever its kind: a ``Loader``'s,
a text loader's, another mix's). ``checkpoint()`` is that object as bytes. Restoring checks the
mix's own settings here, then hands each source its nested state (``load_state_dict``), which
checks that source's data, seed, order and batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from headrace._base.errors import CheckpointError
from headrace._engine import checkpoint as _checkpoint

__all__ = ["KIND", "MixState", "decode", "encode"]

KIND = "mix"
# One loader's token is at most MAX_TOKEN_BYTES; a mix holds one state per source (a source that
# is itself a mix nests its own), plus its own keys. The bound only refuses garbage early.
_PER_SOURCE_BYTES = 64 * _checkpoint.MAX_TOKEN_BYTES
_COUNTERS = ("delivered_batches", "delivered_samples", "delivered_bytes", "starvation_total",
             "exhausted_total", "restarts", "steps_since_emit")


@dataclass
class MixState:
    """What a mix checkpoint holds (per-source lists have one entry per source slot).

    Attributes:
        seed, epoch, weights, policy: the mix's settings (``weights`` as exact integers).
        ticks, current, active: the schedule (``SmoothRoundRobin``'s state).
        counters: ``delivered_batches`` ... ``steps_since_emit``, one list each.
        snapshot_emitted_total: snapshot events logged so far.
        sources: each source's ``state_dict()``.
        source_epochs: the epoch the mix last rewound each source to (``None``: never), set
            before the source's state is restored: a state at the very end of an epoch means
            "finished" or "the next epoch's start" depending on the epochs the source reads.
    """

    seed: int
    epoch: int
    weights: list[int]
    policy: str
    ticks: int
    current: list[int]
    active: list[bool]
    counters: dict[str, list[int]]
    snapshot_emitted_total: int
    sources: list[dict[str, Any]]
    source_epochs: list[int | None]


def encode(state: MixState) -> bytes:
    """The token of ``state`` (``headrace-ckpt-1``, kind ``"mix"``)."""
    body = {"seed": state.seed, "epoch": state.epoch, "source_count": len(state.sources),
            "weights": list(state.weights), "policy": state.policy, "schedule_ticks": state.ticks,
            "scheduler_current": list(state.current),
            "active": [int(a) for a in state.active],
            **{k: list(state.counters[k]) for k in _COUNTERS},
            "snapshot_emitted_total": state.snapshot_emitted_total,
            "source_epochs": list(state.source_epochs), "sources": list(state.sources)}
    return _checkpoint.encode_body(KIND, body, max_bytes=_max_bytes(len(state.sources)))


def _max_bytes(n: int) -> int:
    return 512 + n * _PER_SOURCE_BYTES


def decode(token: Any, *, seed: int, weights: Sequence[int], count: int) -> MixState:
    """Parse and check a mix token (bytes or a ``state_dict()``) against the mix resuming it.

    Raises:
        CheckpointError: not a mix token, malformed, or taken with another seed, other weights
            or another number of sources (each names the token's and the current value).
    """
    body = _checkpoint.decode_body(token, kind=KIND, max_bytes=_max_bytes(count),
                                   what="a mix (headrace.mix)")

    def need(key: str, current: Any) -> None:
        if body.get(key) != current:
            raise CheckpointError(f"resume {key} mismatch: token={body.get(key)!r} "
                                  f"current={current!r}; build the mix with the same {key}")

    need("seed", seed)
    need("source_count", count)
    if body.get("weights") != list(weights):
        raise CheckpointError(
            f"resume weights mismatch: token={body.get('weights')} current={list(weights)} "
            "(as exact integer ratios); a changed weight would silently skew the schedule, "
            "so resume with the weights the checkpoint was taken with")

    def integer(key: str) -> int:
        v = body.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise CheckpointError(f"mix checkpoint field {key!r} is missing or malformed: {v!r}")
        return v

    def ints(key: str, *, signed: bool = False) -> list[int]:
        v = body.get(key)
        if (not isinstance(v, list) or len(v) != count
                or any(isinstance(x, bool) or not isinstance(x, int) or (x < 0 and not signed)
                       for x in v)):
            raise CheckpointError(f"mix checkpoint field {key!r} is missing or malformed (it "
                                  f"must hold {count} integers): {v!r}")
        return list(v)

    sources = body.get("sources")
    if not isinstance(sources, list) or len(sources) != count or not all(
            isinstance(s, dict) for s in sources):
        raise CheckpointError(f"mix checkpoint field 'sources' must hold {count} source states")
    epochs = body.get("source_epochs")
    if not isinstance(epochs, list) or len(epochs) != count or any(
            e is not None and (isinstance(e, bool) or not isinstance(e, int) or e < 0)
            for e in epochs):
        raise CheckpointError(f"mix checkpoint field 'source_epochs' must hold {count} epochs "
                              f"or nulls: {epochs!r}")
    policy = body.get("policy")
    if not isinstance(policy, str):
        raise CheckpointError(f"mix checkpoint field 'policy' is malformed: {policy!r}")
    return MixState(
        seed=seed, epoch=integer("epoch"), weights=list(weights), policy=policy,
        ticks=integer("schedule_ticks"), current=ints("scheduler_current", signed=True),
        active=[bool(a) for a in ints("active")],
        counters={k: ints(k) for k in _COUNTERS},
        snapshot_emitted_total=integer("snapshot_emitted_total"), sources=sources,
        source_epochs=list(epochs))
