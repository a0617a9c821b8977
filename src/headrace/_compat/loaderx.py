"""loaderx 0.4.1's ``DataLoader(dataset, labelset, ...)``: endless ``{'data', 'label'}`` batches.

Same constructor and output as loaderx, on headrace's loader: batches come in sampler order no
matter how many workers run (loaderx delivers out of order), a failing transform raises from
``next()`` instead of hanging, ``close()`` never hangs, and ``checkpoint()``/``stats()`` work.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from headrace._base.errors import ConfigError
from headrace._compat.dataset import Dataset
from headrace._engine.config import resolve_config
from headrace._engine.keywords import checked
from headrace._engine.loader import Loader, resolve_order
from headrace._sources.base import ArraySource
from headrace._store import lane

__all__ = ["DataLoader"]


def _identity(x: Any) -> Any:
    return x


class DataLoader(Loader):
    """An endless loader over a dataset and a labelset, as loaderx 0.4.1.

    Example::

        loader = headrace.DataLoader(headrace.Dataset("x.npy"), headrace.Dataset("y.npy"),
                                     batch_size=256, mode=headrace.Sampler.Mode.IID, seed=42)
        batch = next(loader)   # {'data': ndarray[256, ...], 'label': ndarray[256]}

    Args:
        dataset, labelset: ``headrace.Dataset``-like objects (``__len__`` and ``__getitems__``)
            or NumPy arrays, of equal length.
        num_workers: worker threads (0 is taken as 1).
        batch_size: records per batch.
        prefetch_size: ready batches kept ahead of the consumer.
        mode: ``Sampler.Mode.SEQUENTIAL`` (0, circular window), ``IID`` (1) or ``SHUFFLE`` (2).
        seed: sampler seed.
        transform: ``fn((data, label)) -> (data, label)``, run in the workers.
        inflight: byte cap; by default large enough for ``num_workers + prefetch_size`` batches
            (loaderx has no cap, so a ported script never trips over one).
        resume: a ``checkpoint()`` token or ``state_dict()``.
        batch, order, shuffle, threads, prefetch: headrace's names of ``batch_size``, ``mode``,
            ``num_workers``, ``prefetch_size`` (pass one spelling). epoch, epochs (default
            ``None``: endless, as loaderx), drop_last, tail, rank, world_size, ram_gb, queue,
            profile, constraints, runtime, timeline, tune: as ``headrace.Loader`` (rank and world size
            from the launcher unless given: rank ``r``'s batches are steps ``k*W + r`` of the one
            stream, endless or not). ``transform`` keeps
            loaderx's meaning, ``fn((data, label)) -> (data, label)``.
    """

    @checked("DataLoader()")
    def __init__(self, dataset: Any, labelset: Any, num_workers: int = 4, batch_size: int = 256,
                 prefetch_size: int = 4, mode: int = 1, seed: int = 42,
                 transform: Callable[[Any], Any] = _identity, *, inflight: int | None = None,
                 resume: Any = None, batch: int | None = None, order: Any = None,
                 shuffle: bool = False, epoch: int = 0, epochs: int | None = None,
                 drop_last: bool = False, tail: str | None = None, rank: int | None = None,
                 world_size: int | None = None, threads: int | None = None, ram_gb: float | None = None,
                 queue: int | None = None, prefetch: int | None = None,
                 profile: str | None = None, constraints: Any = None, runtime: Any = None,
                 timeline: bool | float = False, tune: bool = False) -> None:
        if len(dataset) != len(labelset):
            raise ConfigError("dataset and labelset must have the same length")
        batch_size = _alias("batch", batch, "batch_size", batch_size, 256)
        num_workers = _alias("threads", threads, "num_workers", num_workers, 4)
        prefetch_size = _alias("prefetch", prefetch, "prefetch_size", prefetch_size, 4)
        if order is not None or shuffle:
            mode = _alias("order", resolve_order(order, shuffle), "mode", mode, 1)
        for name, value in (("num_workers", num_workers), ("prefetch_size", prefetch_size),
                            ("batch_size", batch_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"{name} must be an int >= 0, got {value!r}")
        threads = max(1, num_workers)
        source = _source(dataset, labelset)
        user = transform

        def apply(batch: dict[str, Any], ids: np.ndarray) -> dict[str, Any]:
            data, label = user((batch["data"], batch["label"]))
            return {"data": data, "label": label}

        if inflight is None:
            one = source.nbytes(np.zeros(max(1, batch_size), np.int64))
            default = resolve_config(threads=threads, prefetch=prefetch_size).max_inflight_bytes
            inflight = max(default, one * (threads + prefetch_size))
        super().__init__(source, batch=batch_size, order=mode, seed=seed, epoch=epoch,
                         epochs=epochs, drop_last=drop_last, tail=tail, rank=rank,
                         world_size=world_size,
                         transform=None if transform is _identity else apply, threads=threads,
                         prefetch=prefetch_size,
                         queue=queue if queue is not None else max(1, threads + prefetch_size),
                         inflight=inflight, ram_gb=ram_gb, profile=profile,
                         constraints=constraints, runtime=runtime, resume=resume,
                         close_source=True, timeline=timeline, tune=tune)

    def __len__(self) -> int:
        if self._end_epoch is None:
            raise TypeError("Eternal loader has no length.")
        return super().__len__()


class _FieldPairSource(ArraySource):
    """Two ``Dataset``s over different fields of one store: one gather of both fields per batch
    (one id check, one read plan), where the datasets would gather each on its own. The
    fingerprint is the ``ArraySource``'s, so checkpoints taken either way resume."""

    def __init__(self, dataset: Any, labelset: Any, store: Any) -> None:
        super().__init__({"data": dataset, "label": labelset})
        self._store = store
        self._names = (dataset.field, labelset.field)

    def gather(self, ids: np.ndarray) -> dict[str, Any]:
        return self._renamed(self._store.gather(ids, self._names))

    def gather_start(self, ids: np.ndarray) -> Any:
        started = self._store.gather_start(ids, self._names)
        return None if started is None else lane.Then(started, self._renamed)

    def _renamed(self, got: dict[str, Any]) -> dict[str, Any]:
        return {"data": got[self._names[0]], "label": got[self._names[1]]}

    def work_state(self) -> tuple[str, bool]:
        return self.fingerprint, bool(self._store.checked_all(self._names))


def _source(dataset: Any, labelset: Any) -> ArraySource:
    store = _store_of(dataset)
    if store is not None and store is _store_of(labelset) and dataset.field != labelset.field:
        return _FieldPairSource(dataset, labelset, store)
    return ArraySource({"data": dataset, "label": labelset})


def _store_of(dataset: Any) -> Any:
    """The open store a ``headrace.Dataset`` of a store field reads, else None."""
    if type(dataset) is not Dataset:
        return None
    return dataset._store()


def _alias(name: str, value: Any, loaderx_name: str, loaderx_value: Any, default: Any) -> Any:
    """``batch=`` (headrace's name) or ``batch_size=`` (loaderx's): one value, never two."""
    if value is None:
        return loaderx_value
    if loaderx_value != default and loaderx_value != value:
        raise ConfigError(f"{name}={value!r} conflicts with {loaderx_name}={loaderx_value!r}; "
                          "pass one")
    return value
