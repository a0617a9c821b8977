"""One byte cap shared by several loaders (the sources of a mix), without a shared deadlock.

A single pool shared naively deadlocks a mix: source A prefetches until the pool is full, the
schedule then asks for source B, B cannot reserve a byte, and A's buffered batches are only freed
when the mix reads A again. So each loader gets a *share*: a guaranteed reserve that nobody else can
take, plus access to the common rest of the cap.

Invariant (held under the parent's condition variable), with ``u_i`` the bytes share ``i`` holds and
``r_i`` its reserve::

    sum_i max(0, u_i - r_i) <= pool = cap - sum_i r_i

hence ``sum_i u_i <= cap`` at every instant: the total never exceeds the shared cap. A request larger
than its share's reserve is refused at once (``check_fits``), because only the reserve is guaranteed:
that is what keeps every source able to deliver its next batch whatever the others hold.
"""

from __future__ import annotations

import threading

from headrace._base.errors import ConfigError
from headrace._engine.budget import ByteBudget

__all__ = ["BudgetShare", "SharedBudget", "split"]


class SharedBudget:
    """A byte cap split into per-loader shares (reserve + a common pool).

    Args:
        cap_bytes: the cap on all shares together.
    """

    def __init__(self, cap_bytes: int) -> None:
        if isinstance(cap_bytes, bool) or not isinstance(cap_bytes, int) or cap_bytes < 1:
            raise ConfigError(f"shared cap_bytes must be an int >= 1, got {cap_bytes!r}")
        self.cap_bytes = cap_bytes
        self._lock = threading.Lock()  # ``with`` on the lock, not the Condition (budget.py)
        self._cv = threading.Condition(self._lock)
        self._reserved = 0
        self._used = 0
        self._overflow = 0  # sum over shares of max(0, used - reserve)
        self._high_water = 0
        self.shares: list[BudgetShare] = []

    @property
    def pool_bytes(self) -> int:
        """The part of the cap no share has reserved."""
        return self.cap_bytes - self._reserved

    @property
    def used_bytes(self) -> int:
        return self._used

    @property
    def high_water_bytes(self) -> int:
        """Most bytes held by all shares together at any instant (never above ``cap_bytes``)."""
        return self._high_water

    def share(self, reserve_bytes: int) -> BudgetShare:
        """A new share with ``reserve_bytes`` guaranteed to it.

        Raises:
            ConfigError: the reserves would exceed the cap.
        """
        if reserve_bytes < 1:
            raise ConfigError(f"reserve_bytes must be >= 1, got {reserve_bytes}")
        with self._lock:
            # Shrinking the pool below what shares already borrowed from it would break the
            # invariant, so a reserve can only come out of the free part of the pool.
            if self._reserved + self._overflow + reserve_bytes > self.cap_bytes:
                raise ConfigError(
                    f"shared byte cap {self.cap_bytes} cannot reserve {reserve_bytes} more bytes "
                    f"({self._reserved} already reserved); raise the mix's inflight cap")
            self._reserved += reserve_bytes
        share = BudgetShare(self, reserve_bytes)
        self.shares.append(share)
        return share


def split(cap_bytes: int, needs: list[int]) -> list[BudgetShare]:
    """One ``SharedBudget`` of ``cap_bytes`` split into a share per loader.

    ``needs[i]`` is what one batch of loader ``i`` reserves. Each share is guaranteed at least one
    batch (so every loader can always deliver its next batch, whatever the others hold) and
    normally ``cap / (2 n)``; the rest of the cap is the common pool.

    Raises:
        ConfigError: the cap cannot hold one batch of every loader at once (names the minimum).
    """
    floor = cap_bytes // (2 * max(1, len(needs)))
    reserves = [max(1, need, floor) for need in needs]
    if sum(reserves) > cap_bytes:
        reserves = [max(1, need) for need in needs]
    if sum(reserves) > cap_bytes:
        total = sum(needs)
        raise ConfigError(
            f"mix shared inflight cap {cap_bytes} bytes is smaller than one batch of every "
            f"source together ({total} bytes: {list(needs)}); raise inflight to at least "
            f"{total} bytes (better {2 * total})")
    shared = SharedBudget(cap_bytes)
    return [shared.share(r) for r in reserves]  # every reserve before any loader runs on one


class BudgetShare(ByteBudget):
    """One loader's view of a :class:`SharedBudget`; a drop-in ``ByteBudget``.

    ``cap_bytes`` is the most this share could ever hold (its reserve plus the whole pool);
    ``reserve_bytes`` is what it is guaranteed. ``close()`` wakes this share's waiters only.
    """

    def __init__(self, parent: SharedBudget, reserve_bytes: int) -> None:
        super().__init__(reserve_bytes + parent.pool_bytes)
        self.parent = parent
        self.reserve_bytes = reserve_bytes
        # one lock and one wake-up for every share of the parent
        self._lock, self._cv = parent._lock, parent._cv
        self._detached = False

    def renew(self) -> BudgetShare:
        """Retire this share and return a fresh one with the same reserve.

        For a loader that is being rebuilt: its old threads may stop holding bytes they will never
        release, so those bytes are written off here; the old share is closed and detached (later
        releases on it only touch its own counters).
        """
        p = self.parent
        with self._lock:
            if not self._detached:
                p._overflow -= max(0, self._used - self.reserve_bytes)
                p._used -= self._used
                self._detached = True
            self._closed = True
            self._cv.notify_all()
            fresh = BudgetShare(p, self.reserve_bytes)
            p.shares[p.shares.index(self)] = fresh
        return fresh

    def check_fits(self, nbytes: int, *, what: str = "request") -> None:
        if nbytes > self.reserve_bytes:
            raise ConfigError(
                f"{what} needs {nbytes} bytes but this loader's guaranteed share of the mix's "
                f"shared byte cap is {self.reserve_bytes} (cap {self.parent.cap_bytes} over "
                f"{len(self.parent.shares)} sources, half of it reserved); raise the mix's "
                f"inflight cap to at least {nbytes * 2 * max(1, len(self.parent.shares))} bytes "
                "or use smaller batches")

    def _allowed(self, nbytes: int) -> bool:
        p = self.parent
        before = max(0, self._used - self.reserve_bytes)
        after = max(0, self._used + nbytes - self.reserve_bytes)
        return p._overflow - before + after <= p.pool_bytes

    def _take(self, nbytes: int) -> None:
        p = self.parent
        p._overflow += max(0, self._used + nbytes - self.reserve_bytes) - max(
            0, self._used - self.reserve_bytes)
        p._used += nbytes
        p._high_water = max(p._high_water, p._used)
        super()._take(nbytes)

    def release(self, nbytes: int) -> None:
        with self._lock:
            if nbytes > self._used:
                raise RuntimeError(f"releasing {nbytes} bytes but only {self._used} are reserved")
            p = self.parent
            if not self._detached:
                p._overflow += max(0, self._used - nbytes - self.reserve_bytes) - max(
                    0, self._used - self.reserve_bytes)
                p._used -= nbytes
            self._used -= nbytes
            self._cv.notify_all()

