"""Keyword checking shared by every loader: an unknown keyword is a ``ConfigError`` naming the
closest valid one, never a ``TypeError`` about an internal function.

Every public loader takes the same core keywords with the same meaning (``CORE``; see
``docs/api.md``). Its constructor is wrapped with :func:`checked`, which compares the keywords of
a call with the function's own signature before it runs (one set difference per construction).
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from headrace._base.errors import ConfigError

__all__ = ["CORE", "checked", "keyword_names", "refuse_unknown"]

#: the keywords every loader accepts, with one meaning (``headrace.Loader``'s)
CORE = ("batch", "order", "shuffle", "seed", "epoch", "epochs", "drop_last", "tail", "rank",
        "world_size", "threads", "inflight", "ram_gb", "queue", "prefetch", "profile",
        "constraints", "runtime", "resume", "timeline", "transform", "tune")

F = TypeVar("F", bound=Callable[..., Any])


def keyword_names(fn: Callable[..., Any]) -> frozenset[str]:
    """The names ``fn`` accepts as keywords (its ``**kwargs``, if any, not included)."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return frozenset(p.name for p in inspect.signature(fn).parameters.values()
                     if p.kind in kinds and p.name != "self")


def refuse_unknown(given: Iterable[str], valid: Iterable[str], where: str) -> None:
    """Raise ``ConfigError`` for the first name of ``given`` not in ``valid``.

    ``where`` is the public name called, e.g. ``"image()"`` (as in ``headrace.image()``).

    The message names the closest valid keyword (``difflib``), when one is close.
    """
    allowed = set(valid)
    for name in given:
        if name in allowed:
            continue
        close = difflib.get_close_matches(name, sorted(allowed), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"unknown {where} argument {name!r}{hint} "
                          f"(see help(headrace.{where.rstrip('()')}))")


def checked(where: str) -> Callable[[F], F]:
    """Decorate a loader constructor: unknown keywords raise ``ConfigError`` (see module)."""

    def wrap(fn: F) -> F:
        names = keyword_names(fn)
        open_ended = any(p.kind is inspect.Parameter.VAR_KEYWORD
                         for p in inspect.signature(fn).parameters.values())
        if open_ended:
            raise TypeError(f"{where}: checked() needs a signature without **kwargs")

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            if not names.issuperset(kwargs):
                refuse_unknown(kwargs, names, where)
            return fn(*args, **kwargs)

        return call  # type: ignore[return-value]

    return wrap


def split_known(options: Mapping[str, Any], valid: Iterable[str]) -> dict[str, Any]:
    """The entries of ``options`` whose names are in ``valid``."""
    allowed = set(valid)
    return {k: v for k, v in options.items() if k in allowed}
