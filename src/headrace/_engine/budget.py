"""The byte budget: producers reserve bytes *before* allocating, and block while the cap is full.

Invariant (held under ``_lock``): ``0 <= used_bytes <= cap_bytes`` at every instant, so the high-water
mark never exceeds the cap. Requests are served first come, first served: a large request is not
starved by a stream of small ones. A request larger than the cap could never be served, so it is an
error at once (never a hang); ``close()`` wakes every waiter, which then gets ``False``.
"""

from __future__ import annotations

import threading
import time
from collections import deque

from headrace._base.errors import ConfigError

__all__ = ["ByteBudget"]


class ByteBudget:
    """A counting semaphore over bytes with a high-water mark.

    Args:
        cap_bytes: the most bytes that may be reserved at once (>= 1).
    """

    def __init__(self, cap_bytes: int) -> None:
        if isinstance(cap_bytes, bool) or not isinstance(cap_bytes, int) or cap_bytes < 1:
            raise ConfigError(f"cap_bytes must be an int >= 1, got {cap_bytes!r}")
        self.cap_bytes = cap_bytes
        # ``with`` takes the lock itself, not the Condition: a Condition's __enter__/__exit__
        # are Python functions, where a Ctrl-C in the consumer's thread can be raised before the
        # lock is let go (every later acquire, every worker's, would then wait forever)
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._used = 0
        self._high_water = 0
        self._wait_s = 0.0
        self._closed = False
        self._queue: deque[int] = deque()  # tickets of waiting acquirers, FIFO
        self._next_ticket = 0

    @property
    def used_bytes(self) -> int:
        return self._used

    @property
    def high_water_bytes(self) -> int:
        return self._high_water

    @property
    def wait_seconds(self) -> float:
        """Total time acquirers spent blocked on a full budget."""
        return self._wait_s

    @property
    def closed(self) -> bool:
        return self._closed

    def check_fits(self, nbytes: int, *, what: str = "request") -> None:
        """Raise ``ConfigError`` if ``nbytes`` could never be reserved under this cap."""
        if nbytes > self.cap_bytes:
            raise ConfigError(
                f"{what} needs {nbytes} bytes but the byte budget (max_inflight_bytes) is "
                f"{self.cap_bytes}; raise inflight / max_inflight_bytes to at least {nbytes} "
                f"or use smaller batches")

    def acquire(self, nbytes: int, *, timeout_s: float | None = None) -> bool:
        """Reserve ``nbytes``, blocking while the budget is full.

        Returns:
            True once reserved; False if the budget was closed (or ``timeout_s`` passed) first.

        Raises:
            ConfigError: ``nbytes`` is larger than the cap (it could never be served).
        """
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        self.check_fits(nbytes)
        with self._lock:
            if self._closed:
                return False
            if not self._queue and self._allowed(nbytes):
                self._take(nbytes)
                return True
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            ticket = self._next_ticket
            self._next_ticket += 1
            self._queue.append(ticket)
            start = time.monotonic()
            try:
                while not self._closed:
                    if self._queue[0] == ticket and self._allowed(nbytes):
                        self._take(nbytes)
                        return True
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        return False
                    self._cv.wait(remaining)
                return False
            finally:
                self._queue.remove(ticket)
                self._wait_s += time.monotonic() - start
                self._cv.notify_all()  # the next ticket may now be at the head

    def _allowed(self, nbytes: int) -> bool:
        """Whether ``nbytes`` more fit now (a subclass may share a larger pool)."""
        return self._used + nbytes <= self.cap_bytes

    def _take(self, nbytes: int) -> None:
        self._used += nbytes
        if self._used > self._high_water:
            self._high_water = self._used

    def release(self, nbytes: int) -> None:
        """Give back ``nbytes`` reserved earlier and wake waiters."""
        with self._lock:
            if nbytes > self._used:
                raise RuntimeError(f"releasing {nbytes} bytes but only {self._used} are reserved")
            self._used -= nbytes
            if self._queue:  # every blocked acquirer holds a ticket; none: nobody to wake
                self._cv.notify_all()

    def close(self) -> None:
        """Wake every waiter; later ``acquire`` calls return False at once."""
        with self._lock:
            self._closed = True
            self._cv.notify_all()
