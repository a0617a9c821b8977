"""The mix schedule: smooth weighted round-robin (nginx SWRR) over whole batches.

Every tick adds each active source's weight to its ``current`` credit, picks the source with the
most credit and charges the winner the total active weight. Ties go to the first source in index order
rotated to start at ``(seed + epoch) mod n``: the same seed and epoch give the same sequence, another
epoch a controlled variation. This is mx8 1.0.7's scheduler, so ``[7, 3]`` with seed 0 gives
``ABAAABAABA`` and with seed 1 ``ABAABAAABA`` (``../shared/reference`` A.12).

Weights are turned into exact integers (``0.7, 0.3`` and ``7, 3`` are the same schedule), so the
arithmetic has no rounding and a run of any length replays bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from numbers import Real

from headrace._base.errors import ConfigError

__all__ = ["SmoothRoundRobin", "exact_weights"]


def exact_weights(weights: Sequence[float], *, count: int | None = None) -> tuple[int, ...]:
    """Validate mix weights and scale them to the smallest equivalent positive integers.

    A float is read as the decimal it prints as (``0.7`` is ``7/10``, not the nearest binary
    fraction), so ``[0.7, 0.3]`` gives ``(7, 3)``.

    Raises:
        ConfigError: empty weights, a count that does not match the sources, or a weight that is not a
            finite number > 0; the message names the index and the value.
    """
    if isinstance(weights, str | bytes) or not isinstance(weights, Sequence):
        try:
            weights = list(weights)  # numpy arrays, tuples, generators
        except TypeError:
            raise ConfigError(f"mix weights must be a sequence of numbers, got {weights!r}") from None
    if len(weights) == 0:
        raise ConfigError("mix requires at least one source (weights is empty)")
    if count is not None and len(weights) != count:
        raise ConfigError(f"mix weights length ({len(weights)}) must match loader count ({count})")
    fractions: list[Fraction] = []
    for i, w in enumerate(weights):
        if isinstance(w, bool) or not isinstance(w, Real):
            raise ConfigError(f"mix weight at index {i} must be a number, got {w!r}")
        if isinstance(w, int):
            value = Fraction(w)
        else:
            wf = float(w)
            if not math.isfinite(wf):
                raise ConfigError(f"mix weight at index {i} is not finite ({w!r})")
            value = Fraction(repr(wf))
        if value <= 0:
            raise ConfigError(f"mix weight at index {i} must be > 0, got {w!r}")
        fractions.append(value)
    scale = math.lcm(*(f.denominator for f in fractions))
    ints = [int(f * scale) for f in fractions]
    g = math.gcd(*ints)
    return tuple(v // g for v in ints)


class SmoothRoundRobin:
    """SWRR state: per-source credit, which sources are active, ticks so far.

    ``pick()`` is pure (it does not change the state); ``commit(i)`` applies the tick that picked
    ``i``. Splitting the two lets the mix drop a source that turns out to be exhausted and re-pick
    the same tick among the others, deterministically.
    """

    def __init__(self, weights: Sequence[int], *, tie_break_offset: int = 0) -> None:
        self.weights = tuple(int(w) for w in weights)
        if not self.weights or any(w <= 0 for w in self.weights):
            raise ConfigError(f"SWRR weights must be positive integers, got {self.weights}")
        n = len(self.weights)
        self.tie_break_offset = tie_break_offset % n
        self.current = [0] * n
        self.active = [True] * n
        self.ticks = 0
        # Index order used to break ties: rotated so it starts at the offset.
        self._order = [(self.tie_break_offset + k) % n for k in range(n)]

    @property
    def any_active(self) -> bool:
        return any(self.active)

    def pick(self) -> int:
        """The source the next tick would pick (state unchanged)."""
        best = -1
        best_credit = 0
        for i in self._order:
            if not self.active[i]:
                continue
            credit = self.current[i] + self.weights[i]
            if best < 0 or credit > best_credit:  # strict: the earlier (rotated) index keeps a tie
                best, best_credit = i, credit
        if best < 0:
            raise RuntimeError("SWRR has no active source to pick")
        return best

    def commit(self, picked: int, *, count: bool = True) -> None:
        """Apply one tick whose winner is ``picked`` (``count=False``: credit it without counting
        a tick, for a pick that found its source exhausted)."""
        total = 0
        for i, w in enumerate(self.weights):
            if self.active[i]:
                self.current[i] += w
                total += w
        self.current[picked] -= total
        self.ticks += int(count)

    def deactivate(self, index: int) -> None:
        """Take a source out of the rotation; its credit is forgotten."""
        self.active[index] = False
        self.current[index] = 0

    def sequence(self, ticks: int) -> list[int]:
        """Pick and commit ``ticks`` times; returns the picks (handy for previews and tests)."""
        out = []
        for _ in range(ticks):
            i = self.pick()
            self.commit(i)
            out.append(i)
        return out
