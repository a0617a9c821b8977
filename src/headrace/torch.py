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

Any loader works, whatever its batches look like: ``IterableDataset(headrace.image(...))`` yields
``(images, labels)`` tuples of tensors. Every array becomes a tensor made by ``torch.from_numpy``
(no copy: the tensor shares the loader's buffer), or a pinned copy with ``pin_memory=True``; the
structure around them stays (dicts, tuples, named tuples, lists; ``Ragged`` fields become
``Ragged(values, offsets)`` of tensors), as torch's ``default_convert`` keeps it.

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
from headrace._engine.batch import STATE_KEY, LeafPath, map_leaves, select, state_of, token_of
from headrace._store.reader import Ragged

__all__ = ["IterableDataset", "as_tensors"]

_STATE_KEY = STATE_KEY

# NumPy dtype kinds torch has no tensor for (strings, objects, records, datetimes): such arrays pass
# through as they are, as torch's default_convert leaves them.
_NOT_TENSORS = frozenset("USOVMm")


class _CheckpointingLoader(Protocol):
    """What the adapter needs from a loader: batches, a checkpoint, and ``close()``."""

    def __iter__(self) -> Iterator[Any]: ...

    def checkpoint(self) -> bytes: ...

    def close(self) -> None: ...


LoaderFactory = Callable[[Any], _CheckpointingLoader]
"""``make_loader(resume) -> loader``, for loaders built anew on every ``iter()``: ``resume`` is
``None``, a checkpoint token or a loader's ``state_dict()``, as a loader's ``resume=`` takes them."""


def _accelerator_available() -> bool:
    return bool(torch.accelerator.is_available())


def _is_loader(source: Any) -> bool:
    """A built headrace loader (iterable, with a checkpoint), not data for ``Loader`` to read."""
    return callable(getattr(source, "checkpoint", None)) and hasattr(source, "__iter__")


class IterableDataset(torch.utils.data.IterableDataset[Any]):
    """Batches of a headrace loader as tensors, with ``state_dict`` / ``load_state_dict``.

    Three ways to give the loader:

    * a built loader (``headrace.image(...)``, ``text``, ``audio``, ``video``, ``mix``, ``Loader``
      ...): ``iter()`` iterates that loader as it is, so its own rules apply (a loader mid-stream
      continues; a finished one starts again only after ``set_epoch``). ``state_dict()`` and
      ``load_state_dict()`` are the loader's own, and ``set_epoch(e)`` calls the loader's.
    * a source for ``headrace.Loader`` (a ``Store``, a store path, any source) with the loader's
      keyword arguments: every ``iter()`` builds a fresh ``Loader`` (closing the previous one),
      resumed from the state last given to ``load_state_dict`` if any.
    * a factory ``make_loader(resume) -> loader``, called like that on every ``iter()`` with the
      state to resume from (``None``, a ``state_dict()`` or a token: pass it on as ``resume=``),
      when building the loader takes more than keywords.

    ``state_dict()`` describes exactly the batches this dataset has yielded in the current (or
    last) iteration; batches the loader buffered but did not yield are read again after a resume.

    Args:
        source: a built loader, what ``headrace.Loader`` reads, or a loader factory (see above).
        pin_memory: copy each tensor into page-locked memory (faster, asynchronous host-to-GPU
            copies with ``.to(device, non_blocking=True)``). It costs one copy per batch. Without an
            accelerator it warns and is ignored, as ``torch.utils.data.DataLoader`` does.
        fields: fields of a mapping batch to convert (others are dropped); ``None`` converts all.
        **loader_kwargs: passed to ``headrace.Loader`` (``batch``, ``order``, ``seed``,
            ``epochs``, ``threads``, ``resume`` ...); only with a source for ``headrace.Loader``.

    Raises:
        ConfigError: a built loader or a factory together with loader keyword arguments, or empty
            ``fields``.
    """

    def __init__(self, source: Any, *, pin_memory: bool = False,
                 fields: Sequence[str] | None = None, **loader_kwargs: Any) -> None:
        super().__init__()
        resume = loader_kwargs.pop("resume", None)
        # What the next built loader restores: a loader's state_dict, or {STATE_KEY: token}.
        self._pending: Mapping[str, Any] | None = None if resume is None else {_STATE_KEY: resume}
        self._factory: LoaderFactory | None = None
        self._given: _CheckpointingLoader | None = None
        if _is_loader(source):
            self._given = source
            what = "a built loader (build it with them instead)"
        elif callable(source) and not hasattr(source, "gather"):
            self._factory = source
            what = "a loader factory (pass them inside the factory instead)"
        if loader_kwargs and (self._given is not None or self._factory is not None):
            raise ConfigError(
                f"loader keyword arguments {sorted(loader_kwargs)} were given with {what}")
        if resume is not None and self._given is not None:
            raise ConfigError("resume= was given with a built loader: build the loader with "
                              "resume=token instead, or call load_state_dict() on this dataset")
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
        self._last_state: dict[str, Any] | None = None
        self._restored: _CheckpointingLoader | None = None  # built by load_state_dict, not read yet

    @property
    def loader(self) -> _CheckpointingLoader | None:
        """The loader batches come from now: the built one given, or the current iteration's."""
        return self._given if self._given is not None else self._live

    def __getstate__(self) -> dict[str, Any]:
        # Pickled for a spawned DataLoader worker (which then refuses to run, see __iter__): a live
        # loader's threads cannot travel, and the copy does not need them.
        state = self.__dict__.copy()
        state["_live"] = state["_given"] = state["_restored"] = None
        return state

    def set_epoch(self, epoch: int) -> None:
        """Starts the next iteration at epoch ``epoch`` (the ``DistributedSampler`` spelling).

        With a built loader this is the loader's own ``set_epoch``; with a source, ``epoch=`` for
        the loaders built from now on.
        """
        if self._given is not None:
            method = getattr(self._given, "set_epoch", None)
            if not callable(method):
                raise ConfigError(f"the {type(self._given).__name__} given has no set_epoch(); "
                                  "build a new loader with epoch= instead")
            method(epoch)
            return
        if self._factory is not None:
            raise ConfigError("set_epoch() needs a source, not a loader factory: the factory "
                              "chooses the epoch of the loaders it builds")
        self._epoch = int(epoch)

    def state_dict(self) -> dict[str, Any]:
        """Where the stream yielded so far ends: the loader's own ``state_dict()``.

        A loader without one gives ``{"headrace_checkpoint": token}``; so does this dataset before
        anything was iterated, with ``None`` (a restore then starts from scratch) or the state
        waiting to be restored.
        """
        loader = self.loader if self._restored is None else self._restored
        if loader is not None:
            return state_of(loader)
        if self._pending is not None:
            return dict(self._pending)
        if self._last_state is not None:
            return self._last_state
        return {_STATE_KEY: None}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Makes the next iteration continue right after ``state_dict`` (a ``state_dict()``).

        A built loader restores it at once (its ``load_state_dict``, which also adopts the
        state's epoch); otherwise the next ``iter()`` builds its loader from it.

        Raises:
            ConfigError: not a state this dataset or its loader made.
        CheckpointError: a state taken on other data, seed, order or batch size.
        """
        is_token, token = token_of(state_dict)
        if self._given is not None:
            if is_token and token is None:
                raise ConfigError(
                    "this state was taken before anything was read, and a built loader cannot "
                    "go back to where it started: build a new loader (or call set_epoch)")
            _restore(self._given, token if is_token else state_dict)
            return
        self.close()
        self._last_state = None
        self._pending = None
        if is_token and token is None:
            return  # the state before anything was read: the next iteration starts afresh
        # Built now, so a state from other data or settings is refused here, not at the next
        # iter(); that iteration then reads from this loader.
        self._restored = self._build({_STATE_KEY: token} if is_token else state_dict)

    def close(self) -> None:
        """Closes the loader (a built one given too), keeping its state for ``state_dict()``.

        Idempotent.
        """
        live, self._live = self._live, None
        if live is not None:
            self._last_state = state_of(live)
            live.close()
        restored, self._restored = self._restored, None
        if restored is not None:
            restored.close()
        if self._given is not None:
            self._given.close()

    def __iter__(self) -> Iterator[Any]:
        if torch.utils.data.get_worker_info() is not None:
            raise ConfigError(
                "headrace.torch.IterableDataset was iterated in a DataLoader worker process; use "
                "DataLoader(ds, batch_size=None, num_workers=0): headrace reads in its own threads "
                "(raise threads= on the loader for more), and workers would duplicate the stream")
        if self._given is not None:
            return self._generate(self._given, owned=False)
        restored, self._restored = self._restored, None
        self.close()
        pending, self._pending = self._pending, None
        loader = restored if restored is not None else self._build(pending)
        self._live = loader
        return self._generate(loader, owned=True)

    def _build(self, state: Mapping[str, Any] | None) -> _CheckpointingLoader:
        if state is None:
            return self._make(None)
        is_token, token = token_of(state)
        # Every headrace loader's resume= takes its own state_dict() as well as a token.
        return self._make(token if is_token else dict(state))

    def _make(self, resume: bytes | dict[str, Any] | None) -> _CheckpointingLoader:
        if self._factory is not None:
            return self._factory(resume)
        import headrace  # the package itself; imported here so this module stays importable alone
        from headrace._sources.shared_store import open_shared, opens_as_store

        kwargs = dict(self._loader_kwargs)
        if self._epoch is not None:
            kwargs["epoch"] = self._epoch
        source = self._source
        if "close_source" not in kwargs and opens_as_store(source):
            # A loader per iteration (epoch) over the same store path: the store this process
            # opened there, while its files are unchanged, so it is mapped and checksummed once.
            source = open_shared(source)
            kwargs["close_source"] = True
            try:
                return headrace.Loader(source, resume=resume, **kwargs)
            except BaseException:
                source.close()
                raise
        loader: _CheckpointingLoader = headrace.Loader(source, resume=resume, **kwargs)
        return loader

    def _generate(self, loader: _CheckpointingLoader, *, owned: bool) -> Iterator[Any]:
        try:
            for batch in loader:
                yield as_tensors(batch, pin_memory=self._pin_memory, fields=self._fields)
        finally:
            # Runs on exhaustion, on an error, and when an abandoned iteration is collected; a newer
            # iteration may already own self._live, so only close our own loader.
            if owned and self._live is loader:
                self.close()


def _restore(loader: Any, state: Any) -> None:
    method = getattr(loader, "load_state_dict", None)
    if not callable(method):
        raise ConfigError(
            f"the {type(loader).__name__} given cannot restore a state in place (it has no "
            "load_state_dict); build it again with resume=state instead")
    method(state if isinstance(state, bytes) else dict(state))


def as_tensors(batch: Any, *, pin_memory: bool = False,
               fields: Sequence[str] | None = None) -> Any:
    """Converts one headrace batch, of any structure, to tensors without a copy.

    Every NumPy array becomes a tensor sharing its memory (``torch.from_numpy``), so the batch must
    not be written to afterwards by anyone else; headrace loaders hand every batch its own arrays.
    A read-only array (a zero-copy view of a read-only mmap) is copied first, since a write through
    the tensor would fault. ``pin_memory=True`` returns page-locked copies instead (needs an
    accelerator). The structure stays as torch's ``default_convert`` keeps it: a dict stays a dict,
    a named tuple its own type, a tuple a tuple, a ``Ragged`` a ``Ragged`` of two tensors; arrays
    of strings or objects, and values that are not arrays, pass through as they are.

    Args:
        batch: a batch from any headrace loader (``Loader``, ``image``, ``text``, ``audio``,
            ``video``, ``mix`` ...) or ``Store.gather``.
        pin_memory: pin each tensor (one copy each).
        fields: the fields of a mapping batch to convert, others dropped; ``None`` converts all.

    Returns:
        ``batch``'s structure with tensors for its arrays, e.g. ``{field: Tensor | Ragged}`` for
        a ``Loader`` batch and ``(images, labels)`` for an ``image`` batch.

    Raises:
        ConfigError: a name in ``fields`` is not in the batch, or ``fields`` with a batch that is
            not a mapping.
    """
    if type(batch) is dict and fields is None and not pin_memory:
        # the usual batch, a dict of writable arrays: one from_numpy each, nothing else
        from_numpy = torch.from_numpy
        out = {}
        for k, v in batch.items():
            if type(v) is not np.ndarray or v.dtype.kind in _NOT_TENSORS or not v.flags.writeable:
                break
            out[k] = from_numpy(v)
        else:
            return out

    def leaf(value: Any, path: LeafPath) -> Any:
        if type(value) is np.ndarray and value.dtype.kind not in _NOT_TENSORS:
            return _tensor(value, pin_memory)  # the common leaf, tested first
        if isinstance(value, Ragged):
            # Ragged is annotated for NumPy; the same NamedTuple carries the two tensors here.
            return Ragged(cast(Any, _tensor(value.values, pin_memory)),
                          cast(Any, _tensor(value.offsets, pin_memory)))
        if isinstance(value, torch.Tensor):
            return value.pin_memory() if pin_memory else value
        if isinstance(value, np.ndarray | np.generic) and value.dtype.kind not in _NOT_TENSORS:
            return _tensor(value, pin_memory)
        return value

    return map_leaves(select(batch, fields), leaf)


def _tensor(array: Any, pin_memory: bool) -> torch.Tensor:
    array = np.asarray(array)
    if not array.flags.writeable:
        # torch.from_numpy warns on a read-only array and a write through the tensor would fault.
        array = array.copy()
    tensor = torch.from_numpy(array)
    return tensor.pin_memory() if pin_memory else tensor
