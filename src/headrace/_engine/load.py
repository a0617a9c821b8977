"""``headrace.load``: mx8's spelling of a loader over a store (or any registered source)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from headrace._base.errors import ConfigError
from headrace._engine.config import Constraints, RuntimeConfig
from headrace._engine.keywords import keyword_names, refuse_unknown
from headrace._engine.loader import Loader, Transform, resolve_order
from headrace._sources.base import open_source
from headrace._sources.shared_store import open_shared, opens_as_store

__all__ = ["load"]


def _open(data: Any, options: dict[str, Any]) -> Any:
    """``open_source`` with a misspelt ``load`` keyword reported as such (``ConfigError``).

    A store path gives the store this process already opened there when its files are unchanged
    (``_sources.shared_store``): a script that calls ``load`` every epoch then maps, scans and
    checksums the store once, as a loader over one kept ``Store`` does.
    """
    try:
        if opens_as_store(data):
            return open_shared(data, **_store_options(options))
        return open_source(data, **options)
    except TypeError as e:
        m = re.search(r"unexpected keyword argument '(\w+)'", str(e))
        if m is None or m.group(1) not in options:
            raise
        refuse_unknown([m.group(1)], keyword_names(load), "load()")
        raise  # not reached: refuse_unknown raised


def _store_options(options: dict[str, Any]) -> dict[str, Any]:
    # ``recursive`` is mx8's listing keyword: a store lists its own records, so it changes nothing
    return {k: v for k, v in options.items() if k != "recursive"}


def _check_bound(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an int record id, got {value!r}")
    if value < 0:
        raise ConfigError(f"{name} must be >= 0, got {value}")
    return value


def load(data: Any, *, batch: int = 512, inflight: int | None = None, queue: int | None = None,
         prefetch: int | None = None, ram_gb: float | None = None, profile: str | None = None,
         resume: bytes | None = None, start: int | None = None, end: int | None = None,
         seed: int = 0, epoch: int = 0, shuffle: bool = False, order: Any = None,
         epochs: int | None = 1, drop_last: bool = False, tail: str | None = None,
         rank: int | None = None, world_size: int | None = None, check: bool | None = None,
         threads: int | None = None,
         constraints: Constraints | None = None, runtime: RuntimeConfig | None = None,
         transform: Transform | None = None,
         transform_nbytes: Callable[[int], int] | None = None,
         timeline: bool | float = False, batch_bytes: int | None = None,
         target_bytes: int | None = None, tune: bool = False, **options: Any) -> Loader:
    """Open ``data`` and return a ``Loader`` yielding ``{field: ndarray | Ragged}`` per batch.

    As mx8's ``load``: one pass, sequential by record id, last batch partial, ``start``/``end``
    select the half-open record range ``[start, end)``. Unlike mx8, ``inflight``, ``queue`` and
    ``prefetch`` are honoured (they win over ``profile``), ``shuffle=True`` (or ``order=``) gives a
    seeded shuffle, and ``epochs`` > 1 or ``None`` (endless) read several epochs.

    A store path opens the store this process already opened there (by ``load`` or ``Dataset``)
    when none of its files changed since, so a ``load`` per epoch maps and checksums the store
    once; any change opens it afresh (``docs/format.md``, "Reading").

    Args:
        data: a store path or ``Store``, or anything a registered source opens (``s3://``,
            dataset links, image folders once those modules are installed).
        batch: records per batch (>= 1).
        inflight: max bytes of batches inside the loader; ``ram_gb``: process RSS cap in GiB.
        queue, prefetch, profile, constraints, runtime: see ``docs/memory.md``.
        resume: a ``checkpoint()`` token; ``seed``/``epoch``: order seed and first epoch.
        start, end: record range, set together.
        shuffle, order: ``order`` is ``"sequential"``, ``"shuffle"`` or ``"iid"``; ``shuffle=True``
            is ``order="shuffle"``.
        epochs, drop_last, tail, rank, world_size, check, threads, transform, transform_nbytes,
            timeline, batch_bytes, target_bytes, tune: as for ``Loader`` (under a launcher, torchrun, SLURM or
            ``jax.distributed``, each rank reads its own share, checked across ranks).
        **options: passed to the source opener (e.g. ``fields=["image"]``, ``verify="never"``).

    Raises:
        ConfigError: bad arguments (range errors use mx8's wording).
        CheckpointError: ``resume`` does not fit this data/seed/order/batch.
    """
    if start is None and end is None:
        pass
    elif start is None or end is None:
        raise ConfigError("start and end must be set together")
    else:
        start = _check_bound("start", start)
        end = _check_bound("end", end)
        if start > end:
            raise ConfigError(f"invalid range (start > end): start={start} end={end}")
    order = resolve_order(order, shuffle)
    source = _open(data, options)
    try:
        if end is not None and end > len(source):
            raise ConfigError(f"end out of range: end={end} > N={len(source)}")
        loader = Loader(source, batch=batch, order=order, seed=seed, epoch=epoch, epochs=epochs,
                        drop_last=drop_last, tail=tail, rank=rank, world_size=world_size,
                        start=start, end=end, transform=transform,
                        transform_nbytes=transform_nbytes, threads=threads, inflight=inflight,
                        ram_gb=ram_gb, queue=queue, prefetch=prefetch, profile=profile,
                        constraints=constraints, runtime=runtime, resume=resume, check=check,
                        close_source=True, timeline=timeline, batch_bytes=batch_bytes,
                        target_bytes=target_bytes, tune=tune)
    except BaseException:
        source.close()
        raise
    return loader
