"""JAX adapter: a loader's batches as ``jax.Array``s, placed with a ``Sharding`` and prefetched.

::

    import headrace, headrace.jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    mesh = Mesh(jax.devices(), ("data",))
    loader = headrace.Loader(store, batch=256, order="shuffle", seed=0, epochs=None, tail="drop")
    batches = headrace.jax.iterator(loader, sharding=NamedSharding(mesh, P("data")), prefetch=2)
    for step, batch in zip(range(steps), batches):
        state, loss = train_step(state, batch["x"], batch["label"])
        if step % 1_000 == 0:
            save(batches.state_dict())     # what this loop received, not what sits on the device
    ...
    batches.load_state_dict(saved)         # in place: the next batch is the one after the saved one

Any loader works, whatever its batches look like: the batch's structure is kept as a pytree (a dict
stays a dict, ``image``'s ``(images, labels)`` tuple stays a tuple), with every numeric array placed.

Prefetching uses JAX's asynchronous dispatch rather than a thread: ``jax.device_put`` returns as soon as
the transfer is enqueued, so keeping ``prefetch`` placed batches in a deque overlaps the copies with the
running step. The reading itself already happens in the loader's worker threads. Everything here runs in
the consumer's thread, which keeps the order, the errors and the checkpoint trivially exact.

Importing this module imports ``jax``; ``import headrace`` does not.
"""

from __future__ import annotations

import collections
from collections.abc import Generator, Iterator, Mapping, Sequence
from typing import Any, Protocol

import jax
import numpy as np

from headrace._base.errors import ConfigError
from headrace._engine.batch import STATE_KEY, LeafPath, describe, map_leaves, select, token_of
from headrace._engine.checkpoint import as_state
from headrace._store.reader import Ragged

__all__ = ["DeviceIterator", "iterator"]


_CPU_ALIGN_BYTES = 64
_ALIGN_MIN_BYTES = 64 * 1024  # below this the copy costs about what it saves
_NUMERIC = frozenset("biufc")  # NumPy dtype kinds JAX has arrays for


def _aligned_empty(shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + _CPU_ALIGN_BYTES, np.uint8)
    start = -raw.ctypes.data % _CPU_ALIGN_BYTES
    return raw[start:start + nbytes].view(dtype).reshape(shape)


class _CheckpointingLoader(Protocol):
    """What the adapter needs from a loader: batches and a checkpoint of what was delivered."""

    def __iter__(self) -> Iterator[Any]: ...

    def checkpoint(self) -> bytes: ...


class _Placed:
    """One batch already handed to the device, with the loader state right after it."""

    __slots__ = ("arrays", "ids", "token")

    def __init__(self, arrays: Any, token: bytes, ids: np.ndarray | None) -> None:
        self.arrays = arrays
        self.token = token
        self.ids = ids


class _Slot:
    """Where a placed leaf goes back into the batch's structure."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


def _fill(tree: Any, placed: list[Any]) -> Any:
    """``tree`` with each ``_Slot`` replaced by its placed array."""
    kind = type(tree)
    if kind is dict or kind is tuple:  # a flat dict or tuple of arrays: most batches
        items = tree.values() if kind is dict else tree
        if all(type(v) is _Slot for v in items):
            if kind is dict:
                return {k: placed[v.index] for k, v in tree.items()}
            return tuple([placed[v.index] for v in tree])
    return map_leaves(tree, lambda v, _: placed[v.index] if type(v) is _Slot else v)


def iterator(loader: _CheckpointingLoader, *, sharding: jax.sharding.Sharding | None = None,
             prefetch: int = 2, fields: Sequence[str] | None = None) -> DeviceIterator:
    """Wraps a headrace loader so that it yields its batches as ``jax.Array``s on device.

    Args:
        loader: any headrace loader (``Loader``, ``image``, ``text``, ``audio``, ``video``,
            ``mix`` ...; anything iterable with ``checkpoint()``). The iterator reads it ahead by
            ``prefetch`` batches; take ``checkpoint()`` / ``state_dict()`` from the iterator, not
            from the loader, to save what the training loop actually received.
        sharding: where each array goes. ``None`` puts arrays on JAX's default device. With one
            process, arrays are placed by ``jax.device_put(batch, sharding)``; with several
            (``jax.process_count() > 1``) each process's batch is its local slice and the global
            array is built by ``jax.make_array_from_process_local_data(sharding, local)``, so a
            sharding is then required. A sharding that splits the batch axis over D devices needs
            every batch to be a multiple of D rows: use ``tail="drop"`` or ``"pad"`` on the loader.
        prefetch: batches placed on the device ahead of the one the consumer holds (0 = place
            each batch when it is asked for). Device memory held is ``prefetch + 1`` batches.
        fields: the fields of a mapping batch to place, in any order; ``None`` places them all.
            Use it to leave out host-only fields.

    Returns:
        A ``DeviceIterator`` yielding each batch in its own structure (a pytree: dicts, tuples,
        named tuples and lists stay as they are) with every numeric array a ``jax.Array``; arrays
        of strings or objects, and values that are not arrays, stay on the host as they are.
        Ragged fields come out as ``headrace.Ragged(values, offsets)`` of ``jax.Array``s when the
        sharding is ``None`` or fully replicated; variable-length values cannot be split along
        the batch axis, so any other sharding raises ``ConfigError``.

    Raises:
        ConfigError: ``prefetch`` is negative, ``fields`` is empty or not strings, or several
            processes run without a sharding.
    """
    return DeviceIterator(loader, sharding=sharding, prefetch=prefetch, fields=fields)


class DeviceIterator(Iterator[Any]):
    """Batches of a loader as ``jax.Array``s; see ``headrace.jax.iterator``.

    Invariant: after ``next()`` returns, at most ``prefetch`` placed batches wait in the queue (their
    transfers run while the caller's step runs), and the checkpoint and state are the loader's,
    captured right after the batch last returned by ``next()``.
    """

    def __init__(self, loader: _CheckpointingLoader, *,
                 sharding: jax.sharding.Sharding | None = None, prefetch: int = 2,
                 fields: Sequence[str] | None = None) -> None:
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
            raise ConfigError(
                f"prefetch={prefetch!r} must be an int >= 0 (batches placed ahead; 2 is typical)")
        if fields is not None:
            fields = tuple(fields)
            if not fields or not all(isinstance(f, str) for f in fields):
                raise ConfigError(
                    f"fields={fields!r} must be a non-empty sequence of field names, or None for all")
        self._multiprocess = jax.process_count() > 1
        devices = jax.devices()[:1] if sharding is None else sharding.device_set
        self._cpu = all(d.platform == "cpu" for d in devices)
        if self._multiprocess and sharding is None:
            raise ConfigError(
                f"sharding=None with jax.process_count()={jax.process_count()}: pass the global "
                "sharding, e.g. NamedSharding(Mesh(jax.devices(), ('data',)), P('data')); each "
                "process's loader batch is its local slice of the global batch")
        self._loader = loader
        self._sharding = sharding
        self._prefetch = prefetch
        self._fields = fields
        self._stateful = callable(getattr(loader, "state_dict", None))
        self._closed = False
        self._start()
        self.last_ids: np.ndarray | None = None
        """Record ids of the batch last returned by ``next()`` (when the loader reports them)."""

    def _start(self) -> None:
        # The state before anything is read: a fresh, resumed or restored loader, as it stands.
        self._token = self._loader.checkpoint()
        self._source: Iterator[Any] = iter(self._loader)
        self._queue: collections.deque[_Placed | BaseException] = collections.deque()
        self._exhausted = False

    @property
    def loader(self) -> _CheckpointingLoader:
        """The wrapped loader (it runs ahead of this iterator by up to ``prefetch + 1`` batches)."""
        return self._loader

    def checkpoint(self) -> bytes:
        """The loader's token for exactly the batches this iterator has returned.

        Resume with ``headrace.jax.iterator(headrace.Loader(..., resume=token), ...)``. Batches
        prefetched to the device but not yet returned are not counted, so they are read again.
        """
        return self._token

    def state_dict(self) -> dict[str, Any]:
        """The loader's ``state_dict()`` for exactly the batches this iterator has returned.

        A loader without ``state_dict()`` gives ``{"headrace_checkpoint": token}``. Restore with
        ``load_state_dict`` on this iterator (or on a new one over the same loader settings).
        """
        if self._stateful:
            # A headrace loader's state_dict() is its checkpoint token as a dict
            # (docs/checkpoint.md), so the token kept per batch gives it: no second call per batch.
            return as_state(self._token)
        return {STATE_KEY: self._token}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continues right after ``state`` (a ``state_dict()``): the next ``next()`` is that batch.

        Drops the batches prefetched so far and restores the loader in place with its
        ``load_state_dict`` (which also adopts the state's epoch).

        Raises:
            ConfigError: the loader cannot restore in place (it has no ``load_state_dict``;
                rebuild it with ``resume=`` instead), or ``state`` is not a state dict.
        """
        is_token, _ = token_of(state)
        method = getattr(self._loader, "load_state_dict", None)
        if not callable(method):
            hint = ("resume=state['headrace_checkpoint']" if is_token
                    else "resume=iterator.checkpoint()")
            raise ConfigError(
                f"the {type(self._loader).__name__} cannot restore a state in place (it has no "
                f"load_state_dict); build a new loader with {hint} and a new iterator over it")
        self._queue.clear()
        if isinstance(self._source, Generator):  # a generator over the old position, not the
            self._source.close()                 # loader itself (which stays open)
        method(dict(state))
        self._closed = False
        self._start()
        self.last_ids = None

    def __iter__(self) -> DeviceIterator:
        return self

    def __next__(self) -> Any:
        if self._closed:
            raise StopIteration
        self._fill(self._prefetch + 1)
        if not self._queue:
            raise StopIteration
        item = self._queue.popleft()
        if isinstance(item, BaseException):
            self.close()
            raise item
        self._token = item.token
        self.last_ids = item.ids
        return item.arrays

    def close(self) -> None:
        """Drops the prefetched device batches. Idempotent; the loader is closed by its owner."""
        self._closed = True
        self._queue.clear()

    def __enter__(self) -> DeviceIterator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _fill(self, depth: int) -> None:
        while not self._exhausted and len(self._queue) < depth:
            try:
                host = next(self._source)
                token = self._loader.checkpoint()
                ids = getattr(self._loader, "last_ids", None)
                placed = _Placed(self._place(host), token, None if ids is None else np.array(ids))
            except StopIteration:
                self._exhausted = True
                return
            except Exception as exc:
                # Delivered in stream order: the batches before the failure still reach the caller.
                self._exhausted = True
                self._queue.append(exc)
                return
            self._queue.append(placed)

    def _place(self, host: Any) -> Any:
        # One device_put for the whole batch: its numeric leaves in a list, the structure kept
        # aside with a slot where each goes back.
        if type(host) is dict and self._fields is None:
            # the usual batch, a dict of numeric arrays: no structure to keep aside
            values = list(host.values())
            if all(type(v) is np.ndarray and v.dtype.kind in _NUMERIC for v in values):
                host_values = [self._host(v) for v in values]
                return dict(zip(host, self._put(host_values, [(k,) for k in host]), strict=True))
        leaves: list[Any] = []
        where: list[LeafPath] = []

        def to_host(value: Any, path: LeafPath) -> Any:
            if type(value) is np.ndarray and value.dtype.kind in _NUMERIC:  # the common leaf
                leaves.append(self._host(value))
            elif isinstance(value, Ragged):
                self._check_ragged_placeable(path)
                leaves.append(Ragged(self._host(value.values), self._host(value.offsets)))
            elif isinstance(value, jax.Array):
                leaves.append(value)
            elif isinstance(value, np.ndarray | np.generic) and value.dtype.kind in _NUMERIC:
                leaves.append(self._host(value))
            else:
                return value  # strings, objects, None: stay on the host
            where.append(path)
            return _Slot(len(leaves) - 1)

        tree = map_leaves(select(host, self._fields), to_host)
        return _fill(tree, self._put(leaves, where))

    def _put(self, leaves: list[Any], where: list[LeafPath]) -> list[Any]:
        """``leaves`` placed on the sharding (one ``device_put`` for them all)."""
        try:
            if self._multiprocess:
                sharding = self._sharding
                placed = jax.tree.map(
                    lambda x: jax.make_array_from_process_local_data(sharding, x), leaves)
            else:
                placed = jax.device_put(leaves, self._sharding)
        except ValueError as exc:
            shapes = {describe(p): getattr(v, "shape", None) for p, v in zip(where, leaves, strict=True)}
            exc.add_note(
                f"headrace.jax: placing a batch with shapes {shapes} on {self._sharding}; a "
                "sharding that splits the batch axis needs every batch to divide evenly: build "
                "the loader with tail='drop' (or 'pad') and a batch that is a multiple of the "
                "device count")
            raise
        return list(placed)

    def _host(self, value: Any) -> np.ndarray:
        array = np.asarray(value)
        if (self._cpu and array.nbytes >= _ALIGN_MIN_BYTES and array.ctypes.data % _CPU_ALIGN_BYTES
                and jax.dtypes.canonicalize_dtype(array.dtype) == array.dtype):
            # XLA:CPU adopts a host buffer without a copy only when it is 64-byte aligned; an
            # unaligned one takes its slow copying path (5-10x a memcpy), so one aligned copy
            # here is cheaper. A store's batches are aligned already (its Recycler) and go as
            # they are; arrays JAX converts anyway (int64 without x64) are left alone.
            aligned = _aligned_empty(array.shape, array.dtype)
            np.copyto(aligned, array)
            return aligned
        return array

    def _check_ragged_placeable(self, path: LeafPath) -> None:
        if self._multiprocess or not (
                self._sharding is None or self._sharding.is_fully_replicated):
            raise ConfigError(
                f"{describe(path)} is ragged (values + offsets) and cannot be split along the "
                f"batch axis by {self._sharding}; pad it to a fixed shape in a loader transform, "
                "or leave it out with fields=")
