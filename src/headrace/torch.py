"""PyTorch adapter: a headrace loader as a ``torch.utils.data.IterableDataset``.

::

    import headrace.torch
    from torch.utils.data import DataLoader

    ds = headrace.torch.IterableDataset(store, batch=256, order="shuffle", seed=0, threads=4)
    dl = DataLoader(ds, batch_size=None, num_workers=0)   # headrace batches; its threads do the work
    for epoch in range(epochs):
        ds.set_epoch(epoch)
        for batch in dl:
            loss = step(model, batch["x"], batch["label"])
    torch.save({"model": model.state_dict(), "data": ds.state_dict()}, "ckpt.pt")
    ...
    ds.load_state_dict(torch.load("ckpt.pt")["data"])     # the next iteration resumes exactly there

Each batch is a dict of tensors made by ``torch.from_numpy`` (no copy: the tensor shares the loader's
buffer), or of pinned copies with ``pin_memory=True``. Ragged fields come out as
``headrace.Ragged(values, offsets)`` of tensors.

Use ``batch_size=None`` (headrace batches already) and ``num_workers=0``: the loader reads in its own
threads, so worker processes would only add a pickling copy per batch and duplicate the stream;
iterating in a worker process raises ``ConfigError``.

Importing this module imports ``torch``; ``import headrace`` does not.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol, cast

import numpy as np
import torch
import torch.utils.data

from headrace._base.errors import ConfigError
from headrace._engine.batch import selected
from headrace._store.reader import Ragged

__all__ = ["IterableDataset", "as_tensors"]

_STATE_KEY = "headrace_checkpoint"


class _CheckpointingLoader(Protocol):
    """What the adapter needs from a loader: dict batches, a checkpoint, and ``close()``."""

    def __iter__(self) -> Iterator[Mapping[str, Any]]: ...

    def checkpoint(self) -> bytes: ...

    def close(self) -> None: ...


LoaderFactory = Callable[[bytes | None], _CheckpointingLoader]
"""``make_loader(resume_token_or_None) -> loader``, for loaders ``headrace.Loader`` cannot build."""


def _accelerator_available() -> bool:
    return bool(torch.accelerator.is_available())


class IterableDataset(torch.utils.data.IterableDataset[dict[str, Any]]):
    """Batches of a headrace loader as dicts of tensors, with ``state_dict`` / ``load_state_dict``.

    Every ``iter()`` builds a fresh ``headrace.Loader`` (closing the previous one), resumed from the
    state last given to ``load_state_dict`` if any. ``state_dict()`` describes exactly the batches
    this dataset has yielded in the current (or last) iteration; batches the loader buffered but
    did not yield are read again after a resume.

    Args:
        source: what ``headrace.Loader`` reads (a ``Store``, a store path, any source), or a
            factory ``make_loader(resume) -> loader`` called with the token to resume from (or
            ``None``) when the loader needs more than keyword arguments.
        pin_memory: copy each tensor into page-locked memory (faster, asynchronous host-to-GPU
            copies with ``.to(device, non_blocking=True)``). It costs one copy per batch. Without an
            accelerator it warns and is ignored, as ``torch.utils.data.DataLoader`` does.
        fields: fields to convert (others are dropped); ``None`` converts all.
        **loader_kwargs: passed to ``headrace.Loader`` (``batch``, ``order``, ``seed``,
            ``epochs``, ``threads``, ``resume`` ...); not allowed with a factory.

    Raises:
        ConfigError: a factory together with loader keyword arguments, or empty ``fields``.
    """

    def __init__(self, source: Any, *, pin_memory: bool = False,
                 fields: Sequence[str] | None = None, **loader_kwargs: Any) -> None:
        super().__init__()
        self._resume: bytes | None = loader_kwargs.pop("resume", None)
        self._factory: LoaderFactory | None = None
        if callable(source) and not hasattr(source, "gather"):
            if loader_kwargs:
                raise ConfigError(
                    f"loader keyword arguments {sorted(loader_kwargs)} were given with a loader "
                    "factory; pass them inside the factory instead")
            self._factory = source
        self._source = source
        self._loader_kwargs = loader_kwargs
        if pin_memory and not _accelerator_available():
            warnings.warn(
                "headrace.torch.IterableDataset(pin_memory=True): no accelerator is available, "
                "so memory is not pinned; leave pin_memory=False on CPU-only machines",
                UserWarning, stacklevel=2)
            pin_memory = False
        self._pin_memory = pin_memory
        if fields is not None:
            fields = tuple(fields)
            if not fields or not all(isinstance(f, str) for f in fields):
                raise ConfigError(
                    f"fields={fields!r} must be a non-empty sequence of field names, or None for all")
        self._fields = fields
        self._epoch: int | None = None
        self._live: _CheckpointingLoader | None = None
        self._last_token: bytes | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Pickled for a spawned DataLoader worker (which then refuses to run, see __iter__): a live
        # loader's threads cannot travel, and the copy does not need them.
        state = self.__dict__.copy()
        state["_live"] = None
        return state

    def set_epoch(self, epoch: int) -> None:
        """Sets ``epoch=`` for the loaders built from now on (``DistributedSampler`` spelling)."""
        if self._factory is not None:
            raise ConfigError("set_epoch() needs a source, not a loader factory: the factory "
                              "chooses the epoch of the loaders it builds")
        self._epoch = int(epoch)

    def state_dict(self) -> dict[str, Any]:
        """``{"headrace_checkpoint": token}``: where the stream yielded so far ends.

        The token is ``None`` before anything was iterated (a resume then starts from scratch).
        """
        if self._live is not None:
            token: bytes | None = self._live.checkpoint()
        elif self._resume is not None:
            token = self._resume
        else:
            token = self._last_token
        return {_STATE_KEY: token}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Makes the next ``iter()`` resume from ``state_dict`` (a ``state_dict()`` result)."""
        if _STATE_KEY not in state_dict:
            raise ConfigError(
                f"state_dict has keys {sorted(state_dict)}, not {_STATE_KEY!r}: pass what "
                "headrace.torch.IterableDataset.state_dict() returned")
        token = state_dict[_STATE_KEY]
        if token is not None and not isinstance(token, bytes | bytearray | memoryview):
            raise ConfigError(
                f"state_dict[{_STATE_KEY!r}] is a {type(token).__name__}, not bytes or None")
        self.close()
        self._resume = None if token is None else bytes(token)
        self._last_token = None

    def close(self) -> None:
        """Closes the live loader, keeping its checkpoint for ``state_dict()``. Idempotent."""
        live, self._live = self._live, None
        if live is not None:
            self._last_token = live.checkpoint()
            live.close()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if torch.utils.data.get_worker_info() is not None:
            raise ConfigError(
                "headrace.torch.IterableDataset was iterated in a DataLoader worker process; use "
                "DataLoader(ds, batch_size=None, num_workers=0): headrace reads in its own threads "
                "(raise threads= on the loader for more), and workers would duplicate the stream")
        self.close()
        resume, self._resume = self._resume, None
        loader = self._build(resume)
        self._live = loader
        return self._generate(loader)

    def _build(self, resume: bytes | None) -> _CheckpointingLoader:
        if self._factory is not None:
            return self._factory(resume)
        import headrace  # the package itself; imported here so this module stays importable alone

        kwargs = dict(self._loader_kwargs)
        if self._epoch is not None:
            kwargs["epoch"] = self._epoch
        loader: _CheckpointingLoader = headrace.Loader(self._source, resume=resume, **kwargs)
        return loader

    def _generate(self, loader: _CheckpointingLoader) -> Iterator[dict[str, Any]]:
        try:
            for batch in loader:
                yield self._convert(batch)
        finally:
            # Runs on exhaustion, on an error, and when an abandoned iteration is collected; a newer
            # iteration may already own self._live, so only close our own loader.
            if self._live is loader:
                self.close()

    def _convert(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        return as_tensors(batch, pin_memory=self._pin_memory, fields=self._fields)


def as_tensors(batch: Mapping[str, Any], *, pin_memory: bool = False,
               fields: Sequence[str] | None = None) -> dict[str, Any]:
    """Converts one headrace batch (``{field: ndarray | Ragged}``) to tensors, without a copy.

    Each tensor shares its array's memory (``torch.from_numpy``), so the batch must not be written
    to afterwards by anyone else; headrace loaders hand every batch its own arrays. A read-only array
    (a zero-copy view of a read-only mmap) is copied first, since a write through the tensor would
    fault. ``pin_memory=True`` returns page-locked copies instead (needs an accelerator).

    Args:
        batch: a batch from ``headrace.Loader`` / ``headrace.load`` / ``Store.gather``.
        pin_memory: pin each tensor (one copy each).
        fields: the fields to convert, others dropped; ``None`` converts all.

    Returns:
        ``{field: torch.Tensor | Ragged(values_tensor, offsets_tensor)}``.

    Raises:
        ConfigError: a name in ``fields`` is not in the batch.
    """
    out: dict[str, Any] = {}
    for name, value in selected(batch, fields):
        if isinstance(value, Ragged):
            # Ragged is annotated for NumPy; the same NamedTuple carries the two tensors here.
            out[name] = Ragged(cast(Any, _tensor(value.values, pin_memory)),
                               cast(Any, _tensor(value.offsets, pin_memory)))
        else:
            out[name] = _tensor(value, pin_memory)
    return out


def _tensor(array: Any, pin_memory: bool) -> torch.Tensor:
    array = np.asarray(array)
    if not array.flags.writeable:
        # torch.from_numpy warns on a read-only array and a write through the tensor would fault.
        array = array.copy()
    tensor = torch.from_numpy(array)
    return tensor.pin_memory() if pin_memory else tensor
