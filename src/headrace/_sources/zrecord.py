"""loaderx 2.8.19 zrecord containers as a loader source: ``headrace.load("train.zr/")``.

Registered with :func:`headrace._sources.base.register_source` under ``"zrecord"``. It claims a
directory holding ``meta.zr``, or a dict ``{name: container path}`` of equally long containers
(a 2.8.19 program's ``Loader({"image": [...], "label": [...]})`` streams, one container each).

Fields: a dense container gives ``{name: (n, *item_shape) array}``; a ragged one gives
``{name: Ragged}`` (flat values) and, when its records have more than one dimension,
``{name}_shape``: a ``(n, ndim)`` uint32 array of each record's dimensions (1-D records need
none: their length is in the offsets). A single container's stream is named ``data``.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from headrace._base.errors import ConfigError
from headrace._sources.base import register_source
from headrace._store.zrecord import DICT_NAME, META_NAME, ZrecordContainer, is_container

__all__ = ["ZrecordSource", "can_open_zrecord", "open_zrecord"]

DEFAULT_NAME = "data"


def _container_like(x: Any) -> bool:
    return isinstance(x, ZrecordContainer) or (isinstance(x, str | os.PathLike) and is_container(x))


def can_open_zrecord(data: Any) -> bool:
    """A container directory, or a non-empty dict of containers (paths or opened)."""
    if isinstance(data, Mapping):
        return bool(data) and all(isinstance(k, str) and _container_like(v)
                                  for k, v in data.items())
    return _container_like(data)


def _digest(path: str) -> str:
    h = hashlib.sha256()
    for name in (META_NAME, DICT_NAME):
        try:
            with open(os.path.join(path, name), "rb") as f:
                while block := f.read(1 << 20):
                    h.update(block)
        except FileNotFoundError:
            pass
    return h.hexdigest()[:16]


class ZrecordSource:
    """One or more zrecord containers of equal length, read as named fields.

    Args:
        streams: ``{name: container path or ZrecordContainer}``; ``close()`` closes the
            containers it opened from paths (not those passed in opened).
    """

    def __init__(self, streams: Mapping[str, Any]) -> None:
        if not streams:
            raise ConfigError("a zrecord source needs at least one container")
        self._paths = {}
        self.containers: dict[str, ZrecordContainer] = {}
        self._owned: list[ZrecordContainer] = []
        try:
            for name, c in streams.items():
                if not isinstance(c, ZrecordContainer):
                    c = ZrecordContainer(c)
                    self._owned.append(c)
                self.containers[name] = c
                self._paths[name] = c.path
        except BaseException:
            self.close()
            raise
        lengths = {name: len(c) for name, c in self.containers.items()}
        if len(set(lengths.values())) > 1:
            self.close()
            raise ConfigError(f"zrecord containers must hold the same number of records, got "
                              f"{lengths}")
        self._length = next(iter(lengths.values()))
        self.fields = tuple(self._field_names())
        self._fingerprint = "zrecord:" + hashlib.sha256(" ".join(
            f"{name}={_digest(c.path)}" for name, c in self.containers.items()).encode()
        ).hexdigest()[:16]

    def _field_names(self) -> list[str]:
        names = []
        for name, c in self.containers.items():
            names.append(name)
            if c.kind == "ragged" and c.ndim > 1:
                names.append(f"{name}_shape")
        if len(set(names)) != len(names):
            raise ConfigError(f"zrecord stream names {list(self.containers)} give repeated "
                              f"fields {names}; rename the streams")
        return names

    def __len__(self) -> int:
        return self._length

    @property
    def fingerprint(self) -> str:
        return self._fingerprint

    def nbytes(self, ids: np.ndarray) -> int:
        total = 0
        for c in self.containers.values():
            total += c.nbytes(ids)
            if c.kind == "ragged":  # int64 offsets, and the u32 shapes of multi-dim records
                total += 8 * (len(ids) + 1) + (4 * c.ndim * len(ids) if c.ndim > 1 else 0)
        return total

    def gather(self, ids: np.ndarray) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, c in self.containers.items():
            if c.kind == "dense":
                out[name] = c.dense(ids)
            else:
                values, dims = c.ragged(ids)
                out[name] = values
                if c.ndim > 1:
                    out[f"{name}_shape"] = dims
        return out

    def close(self) -> None:
        for c in self._owned:
            c.close()
        self._owned = []

    def __reduce__(self) -> tuple[Any, ...]:  # reopened from the paths in another process
        return (ZrecordSource, (dict(self._paths),))

    def __repr__(self) -> str:
        return f"ZrecordSource({self._paths!r}, records={self._length})"


def open_zrecord(data: Any, *, name: str = DEFAULT_NAME, recursive: bool = True,
                 **options: Any) -> ZrecordSource:
    """Opens a container (its stream named ``name``) or a dict of containers as a source.

    ``recursive`` (mx8's listing keyword) changes nothing: a container lists its own records."""
    del recursive
    if options:
        raise ConfigError(f"options {sorted(options)} do not apply to a loaderx zrecord "
                          "container (it accepts name=)")
    streams = dict(data) if isinstance(data, Mapping) else {name: data}
    return ZrecordSource(streams)


register_source("zrecord", can_open_zrecord, open_zrecord)
