"""``Sampler``: loaderx's step-based batch sampler over a pure :class:`~headrace._order.order.Order`.

Batch ``k`` of rank ``r`` out of ``world_size`` W holds the global positions
``(k*W + r)*B .. (k*W + r)*B + B - 1`` (see docs/internals.md, "Order"), so the sampler's only
state is the step ``k``: ``seek(k)`` is exact and O(1), and all ranks together read the same
global stream as one rank would.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

from headrace._base.errors import ConfigError
from headrace._order.make import make_order
from headrace._order.order import Mode, Order, check_int
from headrace._order.order import Mode as _Mode

__all__ = ["Mode", "Sampler", "make_order"]

_MAX_STEP = 2**64 - 1


class Sampler:
    """Endless batches of record ids, loaderx-compatible (``loaderx._sampler.Sampler``).

    ``next()`` returns a fresh ``int64`` array of ``batch_size`` ids in ``[0, length)``; batches are
    a pure function of ``(mode, seed, length, batch_size, rank, world_size, step)``.

    Modes (``Sampler.Mode``): ``SEQUENTIAL`` (0) a circular sliding window
    (length 10, batch 4 -> ``[0 1 2 3] [4 5 6 7] [8 9 0 1]``); ``IID`` (1) uniform with
    replacement; ``SHUFFLE`` (2) a fresh permutation every epoch of ``length`` positions, batches
    crossing epoch boundaries (no record dropped, none repeated within an epoch).

    Differences from loaderx 0.4.1: ids are ``int64`` (loaderx: ``uint64``); the IID stream differs
    (loaderx uses Zig's Sfc64); ``length`` or ``batch_size`` of 0, negative values and unknown
    modes raise instead of crashing (SIGFPE) or silently meaning IID.

    Args:
        length: number of records N, ``1 .. 2**63``.
        batch_size: ids per batch, ``>= 1``.
        mode: a :class:`Mode`, ``0``/``1``/``2`` or ``"sequential"``/``"iid"``/``"shuffle"``.
        seed: ``0 .. 2**64 - 1``.
        rank: this process's rank, ``0 <= rank < world_size``.
        world_size: number of ranks sharing the stream.

    Raises:
        ConfigError: a value out of range (empty dataset, batch 0, rank >= world_size, ...).
        TypeError: a non-int argument (bool and float included).
    """

    Mode = Mode
    __slots__ = ("_b", "_order", "_rank", "_step", "_world")

    def __init__(self, length: int, batch_size: int, mode: _Mode | int | str, seed: int = 42,
                 *, rank: int = 0, world_size: int = 1) -> None:
        self._order: Order = make_order(mode, length, seed=seed)
        if isinstance(batch_size, (int, np.integer)) and not isinstance(batch_size, bool) \
                and batch_size == 0:
            raise ConfigError("Sampler batch_size must be >= 1, got 0: a batch needs a record")
        self._b = check_int("Sampler batch_size", batch_size, 1, 2**63 - 1)
        self._world = check_int("world_size", world_size, 1, 2**63 - 1)
        self._rank = check_int("rank", rank, 0, self._world - 1,
                               f" (ranks are 0..world_size-1 with world_size={self._world})")
        self._step = 0

    # ------------------------------------------------------------------ properties
    @property
    def order(self) -> Order:
        """The pure position -> id function this sampler reads."""
        return self._order

    @property
    def mode(self) -> _Mode:
        return self._order.mode

    @property
    def length(self) -> int:
        return self._order.length

    @property
    def seed(self) -> int:
        return self._order.seed

    @property
    def batch_size(self) -> int:
        return self._b

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world

    @property
    def step(self) -> int:
        """Index of the batch the next ``next()`` returns (batches delivered so far)."""
        return self._step

    def __repr__(self) -> str:
        return (f"Sampler({self.length}, {self._b}, Sampler.Mode.{self.mode.name}, "
                f"seed={self.seed}, rank={self._rank}, world_size={self._world}, "
                f"step={self._step})")

    # ------------------------------------------------------------------ positions
    def position_of(self, step: int) -> int:
        """Global position of the first id of batch ``step`` on this rank."""
        return (step * self._world + self._rank) * self._b

    def epoch_of(self, step: int | None = None) -> int:
        """Epoch (``position // length``) of the first id of batch ``step`` (default: the next)."""
        return self.position_of(self._step if step is None else step) // self.length

    # ------------------------------------------------------------------ iteration
    def next(self) -> npt.NDArray[np.int64]:
        """Return the next batch of ``batch_size`` record ids (a fresh int64 array)."""
        ids = self._order.range(self.position_of(self._step), self._b)
        self._step += 1
        return ids

    def __iter__(self) -> Iterator[npt.NDArray[np.int64]]:
        return self

    def __next__(self) -> npt.NDArray[np.int64]:
        return self.next()

    def seek(self, step: int) -> None:
        """Make batch ``step`` the next one returned (exact, O(1); any step, back or forward)."""
        self._step = check_int("step", step, 0, _MAX_STEP)

    # ------------------------------------------------------------------ state
    def state(self) -> dict[str, int]:
        """A few ints that rebuild this sampler at its current step (see :meth:`from_state`)."""
        return {"mode": int(self.mode), "length": self.length, "batch_size": self._b,
                "seed": self.seed, "rank": self._rank, "world_size": self._world,
                "step": self._step, "position": self.position_of(self._step)}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Sampler:
        """Rebuild a sampler from :meth:`state`; the stream continues where it left off."""
        try:
            s = cls(state["length"], state["batch_size"], state["mode"], state["seed"],
                    rank=state.get("rank", 0), world_size=state.get("world_size", 1))
            s.seek(state["step"])
        except KeyError as e:
            raise ConfigError(f"sampler state misses key {e.args[0]!r}: pass Sampler.state()")\
                from None
        return s

