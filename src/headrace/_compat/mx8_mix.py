"""``headrace.mx8.mix``: mx8 1.0.7's ``mix`` over ``headrace.mix``.

The schedule is headrace's smooth weighted round-robin, which is mx8's (same weights, seed and
epoch give the same source sequence); the mix reads the headrace loaders inside the ``headrace.mx8``
loaders it is given, so they share one byte budget, and each batch comes back as its source would
yield it (``PyBatch``, ``TextBatch``, ...).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from headrace._base.errors import ConfigError
from headrace._compat import mx8_token as mx8_tokens
from headrace._compat.mx8 import _one_rss_cap, _tune, _Wrapped

__all__ = ["MixedDataLoader", "mix"]


class MixedDataLoader(_Wrapped):
    """Batches of several ``headrace.mx8`` loaders in mx8's deterministic schedule; built by
    :func:`mix`. ``stats()`` carries mx8's ``mix_*`` keys; ``checkpoint()`` restores the schedule
    *and* every source's position (mx8 restores the schedule only)."""

    def __init__(self, inner: Any, convert: list[Callable[[Any], Any]]) -> None:
        self._inner = inner
        self._converters = convert

    def _convert(self, batch: Any) -> Any:
        """``batch`` as the source that delivered it (the last one) yields it."""
        return self._converters[self._inner.last_source](batch)

    def stats(self) -> dict[str, Any]:
        s = dict(self._inner.stats())
        s.setdefault("mix_autotune_enabled", bool(s.get("autotune_enabled", False)))
        return s

    def print_stats(self) -> None:
        self._inner.print_stats()


def mix(sources: Sequence[Any], *, weights: Sequence[float], seed: int = 0, epoch: int = 0,
        starvation: int = 10000, on_source_exhausted: str = "error", resume: Any = None,
        job: str | None = None, coord: str | None = None, ram_gb: float | None = None,
        profile: str | None = None, tune: bool | None = None, constraints: Any = None,
        runtime: Any = None) -> MixedDataLoader:
    """mx8's ``mix``: ``weights`` are sampling proportions of whole batches; ``seed`` and
    ``epoch`` set the schedule's tie break; ``on_source_exhausted`` is ``"error"`` or
    ``"allow"`` (continue with the rest; headrace also takes ``"restart"``). ``job``/``coord``:
    the sources are already each rank's share, so the mix has nothing to coordinate; ``profile``:
    the sources keep their own."""
    import headrace

    del job, coord, profile
    _one_rss_cap(ram_gb, constraints)
    token = mx8_tokens.parse(resume, kind="mix_loader")  # other mx8 kinds raise there
    if token is not None:
        resume = None
    sources = list(sources)
    inner: list[Any] = []
    convert: list[Callable[[Any], Any]] = []
    for i, s in enumerate(sources):
        # an inner mix's batch is its source's, which that mix's _convert asks
        if isinstance(s, _Wrapped):
            inner.append(s._inner)
            convert.append(s._convert)
        else:
            raise ConfigError(f"mix requires loaders created by mx8.load(...) (local or "
                              f"distributed), or mx8.text/audio/video; source {i} is a "
                              f"{type(s).__name__}")
    if isinstance(weights, int | float) or weights is None:
        raise ConfigError("mix weights must be a sequence with one weight per loader")
    if len(list(weights)) != len(sources):
        raise ConfigError(f"mix weights length ({len(list(weights))}) must match loader count "
                          f"({len(sources)})")
    m = headrace.mix(inner, weights=list(weights), seed=seed, epoch=epoch, starvation=starvation,
                     on_source_exhausted=on_source_exhausted, resume=resume, ram_gb=ram_gb,
                     constraints=constraints, runtime=runtime, tune=_tune(tune))
    if token is not None:
        try:
            m.load_state_dict(mx8_tokens.mix_state(m.state_dict(), token))
        except BaseException:
            m.close()
            raise
    return MixedDataLoader(m, convert)
