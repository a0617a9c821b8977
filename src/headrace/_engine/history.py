"""The tokens of recently delivered batches, for loops that fetch ahead.

A training loop that fetches the next batch before its step (nanoGPT's ``X, Y = get_batch()``
at the end of the step, a device prefetcher, an eval that draws from the same stream) has taken
more batches from the loader than the model has trained on, so ``loader.checkpoint()`` saved
beside the model resumes past batches the model never saw. ``loader.checkpoint(at=i)`` is the
token that resumes at delivered batch ``i`` (counted from 0 since the loader was built;
``loader.delivered`` is how many it has delivered), for the last :data:`KEEP` batches.

Each ``next()`` keeps the loader's token from just before it. A loader with a ``_token_mark()``
keeps a mark instead, ``(encode, *args)``, and the token ``encode(*args)`` is made only when
``checkpoint(at=)`` asks for it: ``headrace.Loader``'s mark is its cached encoder and two
integers, so a loop that never asks pays no encoding per batch.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

from headrace._base.errors import CheckpointError, ConfigError, HeadraceError

__all__ = ["KEEP", "TokenLog", "token_at", "tracked"]

KEEP = 256  # tokens kept: batches a loop may hold ahead of its step

F = TypeVar("F", bound=Callable[..., Any])


class TokenLog:
    """``(index, token)`` of the last :data:`KEEP` deliveries; ``count`` = batches delivered."""

    __slots__ = ("count", "tokens")

    def __init__(self) -> None:
        self.count = 0
        # a token, a mark (encode, *args) not yet encoded, or None (the loader had no token)
        self.tokens: deque[Any] = deque(maxlen=KEEP)


def _log(obj: Any) -> TokenLog:
    log = obj.__dict__.get("_token_log")
    if log is None:
        log = obj.__dict__["_token_log"] = TokenLog()
    return log


def tracked(next_fn: F) -> F:
    """Decorates a loader's ``__next__``: keeps the token from before each delivered batch."""

    @functools.wraps(next_fn)
    def __next__(self: Any) -> Any:
        mark = getattr(self, "_token_mark", None)
        try:
            before: Any = self.checkpoint() if mark is None else mark()
        except HeadraceError:  # closed, say: __next__ raises its own error
            before = None
        out = next_fn(self)
        log = self.__dict__.get("_token_log") or _log(self)
        log.tokens.append(before)
        log.count += 1
        return out

    return __next__  # type: ignore[return-value]


def delivered(obj: Any) -> int:
    return _log(obj).count


def token_at(obj: Any, at: Any) -> bytes:
    """The token resuming at delivered batch ``at`` (that batch is the next one delivered)."""
    if isinstance(at, bool) or not isinstance(at, int):
        raise ConfigError(f"checkpoint(at={at!r}): at is a delivered batch's index (an int, "
                          "see loader.delivered)")
    log = _log(obj)
    if at == log.count:
        return obj.checkpoint()
    oldest = log.count - len(log.tokens)
    if at > log.count or at < 0:
        raise ConfigError(f"checkpoint(at={at}): this loader has delivered {log.count} "
                          f"batches (indices 0..{log.count - 1}); at= must be in "
                          f"{max(0, oldest)}..{log.count}")
    if at < oldest:
        raise CheckpointError(f"checkpoint(at={at}): only the last {KEEP} batches' tokens are "
                              f"kept (indices {oldest}..{log.count}); save the token closer to "
                              "the step that consumes the batch")
    tok = log.tokens[at - oldest]
    if tok is None:
        raise CheckpointError(f"checkpoint(at={at}): the loader had no token then (it was "
                              "closed)")
    if type(tok) is tuple:  # a mark: encoded now, once
        tok = tok[0](*tok[1:])
        log.tokens[at - oldest] = tok
    return tok
