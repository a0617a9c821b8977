"""Per-record random seeds for the user's ``transform``: a pure function of (seed, epoch, id).

A transform that declares a parameter ``seeds`` receives one ``uint64`` per record of the batch,
and one that declares ``rng`` receives a ``numpy.random.Generator`` seeded by those values. The
seeds come from a counter hash (SplitMix64's finalizer, chained over the key), not from a
generator's state, so they do not depend on the thread that runs the transform, on which worker
took which batch, or on where a resumed run started: a resumed loader replays the same
augmentations, and a new epoch draws new ones.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["SeededUser", "record_seeds", "wanted"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
# keeps these seeds apart from the image augmentations' own draws (same hash, another stream)
_SALT = np.uint64(0x5EED5EED00C0FFEE)
_ARGS = ("rng", "seeds")


def _mix(z: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def record_seeds(seed: int, epoch: int, ids: np.ndarray) -> np.ndarray:
    """One ``uint64`` per id, a pure function of ``(seed, epoch, id)``."""
    with np.errstate(over="ignore"):
        key = _mix(np.array([seed & 0xFFFFFFFFFFFFFFFF], np.uint64) + _GOLDEN)
        key = _mix(key ^ np.array([epoch & 0xFFFFFFFFFFFFFFFF], np.uint64) ^ _SALT)
        rid = np.asarray(ids, np.int64).astype(np.uint64)
        return _mix(key ^ (rid * _GOLDEN))


def wanted(fn: Callable[..., Any]) -> tuple[str, ...]:
    """Which of ``rng`` / ``seeds`` the transform ``fn`` declares as parameters."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin or C callable: the plain (batch, ids) form
        return ()
    return tuple(a for a in _ARGS if a in params)


class SeededUser:
    """Calls ``fn(batch, ids, **{rng, seeds})`` with the arguments it declares.

    The engine calls it with the batch's epoch (``takes_epoch``): it is the epoch of the batch's
    first sample, so a batch of an endless loader that runs across an epoch boundary is seeded
    by the epoch it starts in.
    """

    takes_epoch = True

    def __init__(self, fn: Callable[..., Any], seed: int) -> None:
        self.fn = fn
        self.seed = int(seed)
        self.args = wanted(fn)

    def __call__(self, batch: Any, ids: np.ndarray, epoch: int = 0) -> Any:
        if not self.args:
            return self.fn(batch, ids)
        seeds = record_seeds(self.seed, epoch, ids)
        kw: dict[str, Any] = {}
        if "seeds" in self.args:
            kw["seeds"] = seeds
        if "rng" in self.args:
            kw["rng"] = np.random.default_rng(seeds)  # SeedSequence over the batch's seeds
        return self.fn(batch, ids, **kw)
