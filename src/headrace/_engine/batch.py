"""What the framework adapters share about a delivered batch: its structure, and which fields to keep.

headrace loaders yield batches of several shapes: a mapping of fields (``Loader``, ``text``,
``video``), a tuple (``image``, ``audio``: ``(inputs, labels)``), named tuples, ``Ragged`` and
nestings of these (``mix`` yields whatever its sources yield). An adapter converts the leaves and
rebuilds the same structure around them, so nothing here knows about any one loader kind.

The structure rules follow what JAX pytrees and torch's ``default_convert`` keep: a mapping is
rebuilt as its own type when that type can be built from a dict (else as a ``dict``), a named tuple
as its own type, a tuple as a tuple, a list as a list. ``Ragged`` is a leaf here, because each
adapter has its own rule for variable-length values; everything that is not a container is a leaf.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from headrace._base.errors import ConfigError
from headrace._store.reader import Ragged

__all__ = ["STATE_KEY", "LeafPath", "describe", "map_leaves", "select", "state_of", "token_of"]

LeafPath = tuple[Any, ...]
"""Where a leaf sits in a batch: the keys and indices from the top, e.g. ``("audio", 0)``."""

STATE_KEY = "headrace_checkpoint"
"""The adapters' state when a loader has no ``state_dict()``: ``{STATE_KEY: checkpoint token}``."""


def select(batch: Any, fields: Iterable[str] | None) -> Any:
    """``batch`` itself (``fields=None``), or a dict of the named fields of a mapping batch, in order.

    Raises:
        ConfigError: ``fields`` given for a batch that is not a mapping (a tuple has no names to
            select by), or a name the batch does not hold (named, with the fix).
    """
    if fields is None:
        return batch
    fields = list(fields)
    if not isinstance(batch, Mapping):
        raise ConfigError(
            f"fields={fields!r} selects by name, but this loader yields {_kind(batch)} batches, "
            "which have no field names; leave fields=None (every item is converted), or choose "
            "the items in the loader's transform")
    for name in fields:
        if name not in batch:
            raise ConfigError(
                f"field {name!r} is not in the loader's batches (they hold {sorted(batch)}); "
                "fix fields=")
    return {name: batch[name] for name in fields}


def map_leaves(batch: Any, leaf: Callable[[Any, LeafPath], Any], path: LeafPath = ()) -> Any:
    """The same structure as ``batch`` with every leaf replaced by ``leaf(value, path)``."""
    # The common batches first, by exact type: an ABC isinstance costs more than a leaf.
    kind = type(batch)
    if kind is np.ndarray:
        return leaf(batch, path)
    if kind is dict:
        return {k: leaf(v, (*path, k)) if type(v) is np.ndarray
                else map_leaves(v, leaf, (*path, k)) for k, v in batch.items()}
    if kind is tuple:
        return tuple([map_leaves(v, leaf, (*path, i)) for i, v in enumerate(batch)])
    if isinstance(batch, Ragged):
        return leaf(batch, path)
    if isinstance(batch, Mapping):
        out = {k: map_leaves(v, leaf, (*path, k)) for k, v in batch.items()}
        try:
            return type(batch)(out)  # type: ignore[call-arg]
        except TypeError:  # a mapping type that cannot be built from a dict (as torch does)
            return out
    if isinstance(batch, tuple):
        items = [map_leaves(v, leaf, (*path, i)) for i, v in enumerate(batch)]
        if hasattr(batch, "_fields"):  # a named tuple keeps its type and names
            return type(batch)(*items)
        return tuple(items)
    if isinstance(batch, list):
        return [map_leaves(v, leaf, (*path, i)) for i, v in enumerate(batch)]
    return leaf(batch, path)


def describe(path: LeafPath) -> str:
    """``field 'tokens'`` for a top-level field, else the subscript from the batch: ``batch[0]``."""
    if len(path) == 1 and isinstance(path[0], str):
        return f"field {path[0]!r}"
    return "batch" + "".join(f"[{key!r}]" for key in path)


def state_of(loader: Any) -> dict[str, Any]:
    """The loader's own ``state_dict()``, or ``{STATE_KEY: loader.checkpoint()}`` without one."""
    method = getattr(loader, "state_dict", None)
    if callable(method):
        state: dict[str, Any] = method()
        return state
    return {STATE_KEY: loader.checkpoint()}


def token_of(state: Mapping[str, Any]) -> tuple[bool, bytes | None]:
    """``(True, token)`` when ``state`` is the checkpoint-token form ``{STATE_KEY: bytes | None}``.

    ``(False, None)`` means the state is a loader's own ``state_dict()``, restored by its
    ``load_state_dict``.

    Raises:
        ConfigError: ``state`` is not a mapping, or holds a token that is not bytes.
    """
    if not isinstance(state, Mapping):
        raise ConfigError(
            f"state_dict is a {type(state).__name__}, not a dict: pass what state_dict() returned")
    if set(state) != {STATE_KEY}:
        return False, None
    token = state[STATE_KEY]
    if token is None:
        return True, None
    if isinstance(token, str):  # a token stored as text (e.g. in a JSON file)
        return True, token.encode("ascii")
    if not isinstance(token, bytes | bytearray | memoryview):
        raise ConfigError(
            f"state_dict[{STATE_KEY!r}] is a {type(token).__name__}, not bytes or None: pass what "
            "state_dict() returned")
    return True, bytes(token)


def _kind(batch: Any) -> str:
    if isinstance(batch, tuple):
        return f"{tuple.__len__(batch)}-item {type(batch).__name__}"
    return type(batch).__name__
