"""Sources: what a loader reads (records ``0..N-1``), and ``open_source`` that turns user input into one.

``open_source(data)`` walks a small registry of ``(name, can_open, opener)`` entries, newest first,
so a module that registers later (images, S3, links) can claim inputs before the built-ins do. The
built-ins: an object that already is a ``Source``; a ``Store`` or a store directory (one holding
``meta.json``); a NumPy array, or a dict of arrays / loaderx-style datasets (anything with
``__len__`` and ``__getitems__``).
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np

from headrace._base.errors import ConfigError
from headrace._store import lane
from headrace._store.fingerprint import store_fingerprint
from headrace._store.format import looks_like_store

__all__ = ["ArraySource", "Source", "StoreSource", "is_source", "open_source", "record_sizes",
           "register_source"]


@runtime_checkable
class Source(Protocol):
    """Records ``0..N-1`` a loader can gather from. ``gather`` must be thread-safe.

    Optional: ``work_state()``, a hashable naming the data and how its gathers cost now, cheaper
    to get than the fingerprint (``StoreSource``: the store's path, generation, commit and length,
    and whether first reads still verify records); the loader's solo probe keeps its verdicts per
    state (``_engine.solo``), per fingerprint for a source without one. ``gather_start(ids)``: starts the same gather on
    the copy lane (``_store.lane``) and returns at once, an object whose ``wait()`` returns the
    batch, or None when this gather is not a plain copy (the loader then calls ``gather``); a
    parked consumer starts the next batch that way before it hands over the current one.
    """

    def __len__(self) -> int: ...

    @property
    def fingerprint(self) -> str:
        """Identifies the data version; a checkpoint taken on another fingerprint is refused."""
        ...

    def nbytes(self, ids: np.ndarray) -> int:
        """Bytes ``gather(ids)`` will allocate (exact, or an upper bound)."""
        ...

    def gather(self, ids: np.ndarray) -> dict[str, Any]:
        """``{field: ndarray | Ragged}`` for the records ``ids``, in that order.

        ``ids`` is a read-only int64 array that may share memory with the sampler's memoized
        block (no copy per batch): copy it (``np.array(ids)``) to keep it or to return it in the
        batch.
        """
        ...

    def close(self) -> None: ...


_SOURCE_MEMBERS = ("__len__", "fingerprint", "nbytes", "gather", "close")


def is_source(obj: Any) -> bool:
    """``isinstance(obj, Source)`` without reading the attributes: Python 3.11's protocol check
    evaluates properties, and a store source's ``fingerprint`` is hashed on first use."""
    return all(inspect.getattr_static(obj, name, None) is not None for name in _SOURCE_MEMBERS)


CanOpen = Callable[[Any], bool]
Opener = Callable[..., Source]
_REGISTRY: list[tuple[str, CanOpen, Opener]] = []
_LOCK = threading.Lock()
# Modules that register sources when imported. open_source imports them on a miss, so a user
# never has to import e.g. the S3 module before passing "s3://..." to load().
PLUGIN_MODULES: list[str] = ["headrace._sources.links", "headrace._sources.images",
                              "headrace._sources.zrecord", "headrace._sources.mx8_s3"]


def record_sizes(source: Source, ids: np.ndarray) -> np.ndarray:
    """Per-record bytes of ``ids`` for byte-aware batching (``batch_bytes``/``target_bytes``)."""
    fn = getattr(source, "record_nbytes", None)
    if fn is None:
        raise ConfigError(f"batch_bytes/target_bytes need per-record sizes, which "
                          f"{type(source).__name__} does not give (its records are fixed-size or "
                          "decoded to a fixed shape): use batch= alone")
    return np.asarray(fn(ids), np.int64)


def register_source(name: str, can_open: CanOpen, opener: Opener) -> None:
    """Register (or replace, by ``name``) a source kind; newer registrations are tried first.

    Args:
        name: a short unique name (``"store"``, ``"s3"``, ``"image-folder"``).
        can_open: ``fn(data) -> bool``, cheap; must not raise.
        opener: ``fn(data, **options) -> Source``.
    """
    with _LOCK:
        _REGISTRY[:] = [e for e in _REGISTRY if e[0] != name]
        _REGISTRY.append((name, can_open, opener))


def _match(data: Any) -> Opener | None:
    with _LOCK:
        entries = list(reversed(_REGISTRY))
    for _name, can_open, opener in entries:
        if can_open(data):
            return opener
    return None


def import_plugins() -> None:
    """Import every plugin module that is installed, so each has registered its opener."""
    for module in PLUGIN_MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name != module:
                raise


def opener_of(data: Any) -> Opener | None:
    """The opener ``open_source`` would use for ``data`` (plugins first), or None."""
    import_plugins()
    return _match(data)


def open_source(data: Any, **options: Any) -> Source:
    """Turn ``data`` (a Source, Store, store path, array(s), or a registered kind) into a Source.

    Raises:
        ConfigError: nothing registered can open ``data``.
    """
    # Paths and URLs: every plugin first, so which kind claims a folder never depends on what
    # the program imported before (a folder of images is "image-folder" even when the link
    # module registered first; see docs/images.md).
    opener = None if isinstance(data, str | os.PathLike) else _match(data)
    if opener is None:
        import_plugins()
        opener = _match(data)
    if opener is None:
        if isinstance(data, str | os.PathLike) and not os.path.exists(os.fspath(data)):
            raise ConfigError(f"no such dataset {os.fspath(data)!r}: the path does not exist")
        raise ConfigError(f"cannot read {data!r}: expected a headrace store (directory with "
                          "meta.json) or Store, a NumPy array, a dict of arrays/datasets, or a "
                          "Source")
    return opener(data, **options)


# -- the record store ------------------------------------------------------------------------------

class StoreSource:
    """A ``Store`` as a loader source.

    Args:
        store: an open ``Store``.
        fields: the fields to read (default all).
        owned: close the store when the source is closed (True when opened from a path).
    """

    def __init__(self, store: Any, *, fields: list[str] | str | None = None,
                 owned: bool = False) -> None:
        self.store = store
        names = list(store.fields)
        if fields is not None:
            wanted = [fields] if isinstance(fields, str) else list(fields)
            unknown = [f for f in wanted if f not in names]
            if unknown:
                raise ConfigError(f"unknown fields {unknown}; this store has {names}")
            names = wanted
        self.fields = tuple(names)  # a tuple: the store's steady-state plan is keyed by it
        self._ragged = sum(1 for f in names if store.fields[f].shape is None)
        self._owned = owned
        # hashed on first use (a checkpoint, the ranks' agreement): every aux entry, about 2 ms
        # a million records, which a loader that never checkpoints need not pay at its start
        self._fingerprint: str | None = None
        self._length = len(store)
        # Every field fixed-shape: a batch's bytes are n * row bytes (no per-batch index reads;
        # gather still checks the ids).
        self._row_bytes = (int(store.nbytes(np.zeros(1, np.int64), names))
                           if not self._ragged and len(store) else None)

    def __len__(self) -> int:
        return len(self.store)

    @property
    def fingerprint(self) -> str:
        fp = self._fingerprint
        if fp is None:  # two threads asking at once compute the same value
            fp = self._fingerprint = store_fingerprint(self.store, length=self._length)
        return fp

    def nbytes(self, ids: np.ndarray) -> int:
        if self._row_bytes is not None:
            return len(ids) * self._row_bytes
        # Ragged fields also allocate their int64 offsets (n + 1 of them).
        return int(self.store.nbytes(ids, self.fields)) + self._ragged * 8 * (len(ids) + 1)

    def record_nbytes(self, ids: np.ndarray) -> np.ndarray:
        """Each record's bytes for byte-aware batching: its variable-size fields (the row bytes
        when every field is fixed-size)."""
        ids = np.asarray(ids, np.int64)
        if self._row_bytes is not None:
            return np.full(len(ids), self._row_bytes, np.int64)
        out = np.zeros(len(ids), np.int64)
        for name in self.fields:
            if self.store.fields[name].shape is None:
                self.store.nbytes(ids, [name])  # validates ids and sizes as a gather would
                out += np.asarray(self.store.aux_entries(name)["nbytes"], np.int64)[ids]
        return out

    def gather(self, ids: np.ndarray) -> dict[str, Any]:
        return self.store.gather(ids, self.fields)  # a fresh dict per call already

    def gather_start(self, ids: np.ndarray) -> Any:
        return self.store.gather_start(ids, self.fields)

    def work_state(self) -> tuple[Any, ...]:
        """The store's identity (path, generation, commit, length), the fields, and whether
        first reads still check records (a verifying epoch is other work than a steady one, for
        the solo probe's verdicts)."""
        st = self.store
        meta = st.meta
        return (st.path, meta.generation, meta.commit, meta.length, self.fields,
                bool(st.checked_all(self.fields)))

    def close(self) -> None:
        if self._owned:
            self.store.close()

    def __repr__(self) -> str:
        return f"StoreSource({self.store!r}, fields={self.fields})"


def _is_store(data: Any) -> bool:
    return type(data).__name__ == "Store" and type(data).__module__ == "headrace._store.reader"


def _is_store_dir(data: Any) -> bool:
    # Also a folder that only a store could have left (no meta.json, but chunks/ and index files
    # from a killed pack): opening it as a store says it is damaged, instead of yielding the
    # store's own files as records.
    if not isinstance(data, str | os.PathLike):
        return False
    path = os.fspath(data)
    return isinstance(path, str) and os.path.isdir(path) and looks_like_store(path)


def _open_store(data: Any, *, fields: list[str] | str | None = None,
                verify: str = "first", recursive: bool = True) -> Source:
    del recursive  # mx8's listing keyword: a store lists its own records, so it changes nothing
    if _is_store(data):
        return StoreSource(data, fields=fields, owned=False)
    from headrace._store.reader import open as open_store

    return StoreSource(open_store(os.fspath(data), verify=verify),  # type: ignore[arg-type]
                       fields=fields, owned=True)


# -- in-memory arrays and loaderx-style datasets ----------------------------------------------------

def _is_arraylike(x: Any) -> bool:
    return isinstance(x, np.ndarray) or (hasattr(x, "__len__") and hasattr(x, "__getitems__"))


class ArraySource:
    """Named NumPy arrays or loaderx-style datasets (``__len__`` + ``__getitems__``) as a source.

    ``nbytes`` is exact for arrays and for datasets exposing ``dtype`` and a fixed ``shape``; for
    anything else (ragged datasets) it is estimated from record 0, so the byte cap is approximate
    for those. In-memory data has no generation: the fingerprint covers names, shapes, dtypes and
    the content of NumPy columns (all of it up to 64 MiB a column, else 4096 evenly spaced rows),
    so ranks that generated different arrays of one shape are told apart.

    Args:
        columns: ``{name: array or dataset}``, all of the same length.
    """

    def __init__(self, columns: Mapping[str, Any]) -> None:
        if not columns:
            raise ConfigError("an ArraySource needs at least one named array")
        lengths = {name: len(col) for name, col in columns.items()}
        if len(set(lengths.values())) > 1:
            raise ConfigError(f"all arrays must have the same length, got {lengths}")
        self.columns = dict(columns)
        self._length = next(iter(lengths.values()))
        self._row_bytes = {name: self._row_nbytes(col) for name, col in self.columns.items()}
        desc = [[name, str(getattr(c, "dtype", "?")), list(getattr(c, "shape", ())),
                 type(c).__name__] for name, c in self.columns.items()]
        h = hashlib.sha256(json.dumps(desc).encode())
        for col in self.columns.values():
            if isinstance(col, np.ndarray):
                h.update(_content_sample(col))
        self._fingerprint = f"arrays:{self._length}:{h.hexdigest()[:16]}"

    def _row_nbytes(self, col: Any) -> int:
        dtype = getattr(col, "dtype", None)
        shape = getattr(col, "shape", None)
        if dtype is not None and shape is not None and len(shape) >= 1 and (
                isinstance(col, np.ndarray) or len(shape) > 1):
            return int(np.dtype(dtype).itemsize * int(np.prod(shape[1:], dtype=np.int64)))
        if self._length == 0:
            return 0
        # A 1-D dataset holds scalars (an ndarray comes back: exact) or ragged records (a Ragged
        # comes back: record 0's size is only an estimate).
        probe = self._take(col, np.zeros(1, np.int64))
        return max(1, _payload_nbytes(probe))

    def __len__(self) -> int:
        return self._length

    @property
    def fingerprint(self) -> str:
        return self._fingerprint

    def nbytes(self, ids: np.ndarray) -> int:
        return len(ids) * sum(self._row_bytes.values())

    @staticmethod
    def _take(col: Any, ids: np.ndarray) -> Any:
        if isinstance(col, np.ndarray):
            return np.take(col, ids, axis=0)
        return col.__getitems__(ids)

    def gather(self, ids: np.ndarray) -> dict[str, Any]:
        return {name: self._take(col, ids) for name, col in self.columns.items()}

    def gather_start(self, ids: np.ndarray) -> Any:
        """Every column's take on the copy lane (NumPy arrays, and datasets that can start
        theirs), else None."""
        if not lane.available():
            return None
        out: dict[str, Any] = {}
        pending: list[Any] = []
        for name, col in self.columns.items():
            if isinstance(col, np.ndarray):
                got = lane.take_started(col, ids)
                if got is None:
                    return None
                out[name], copy = got
                pending.append(copy)
                continue
            fn = getattr(col, "gather_start", None)
            started = fn(ids) if fn is not None else None
            if started is None:
                return None
            out[name] = started
        return _Columns(out, pending)

    def close(self) -> None:
        pass


class _Columns(lane.Started):
    """An ``ArraySource`` batch in progress: arrays being copied, and datasets' own reads
    (``wait()`` gives each dataset's records)."""

    __slots__ = ()

    def wait(self) -> dict[str, Any]:
        out = super().wait()
        return {name: v if isinstance(v, np.ndarray) else v.wait() for name, v in out.items()}


_HASH_WHOLE_BYTES = 64 << 20
_HASH_SAMPLE_ROWS = 4096


def _content_sample(col: np.ndarray) -> bytes:
    """The bytes of ``col`` that its fingerprint hashes: all of a small array, else a fixed,
    evenly spaced sample of rows (hashing gigabytes at every loader construction costs more
    than it protects). Object arrays hold pointers, which differ between processes: not hashed."""
    if col.dtype.hasobject:
        return b""
    if col.nbytes > _HASH_WHOLE_BYTES and len(col) > _HASH_SAMPLE_ROWS:
        col = col[np.linspace(0, len(col) - 1, _HASH_SAMPLE_ROWS).astype(np.int64)]
    return np.ascontiguousarray(col).tobytes()


def _payload_nbytes(value: Any) -> int:
    """Bytes held by a gathered value (ndarray, Ragged, tuple/list/dict of those)."""
    if type(value) is dict:  # the usual batch, once per delivery: no ABC checks per value
        return sum(v.nbytes if type(v) is np.ndarray else _payload_nbytes(v)
                   for v in value.values())
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, Mapping):
        return sum(_payload_nbytes(v) for v in value.values())
    if isinstance(value, tuple | list):
        return sum(_payload_nbytes(v) for v in value)
    nbytes = getattr(value, "nbytes", None)
    return int(nbytes) if isinstance(nbytes, int | np.integer) else 0


def _open_arrays(data: Any, **options: Any) -> Source:
    if options:
        raise ConfigError(f"options {sorted(options)} do not apply to in-memory arrays")
    if isinstance(data, Mapping):
        return ArraySource(data)
    return ArraySource({"data": data})


def _can_open_arrays(data: Any) -> bool:
    if isinstance(data, Mapping):
        return bool(data) and all(isinstance(k, str) and _is_arraylike(v)
                                  for k, v in data.items())
    return isinstance(data, np.ndarray)


def _is_source(data: Any) -> bool:
    return not isinstance(data, np.ndarray | Mapping | str | os.PathLike) and is_source(data)


def _pass_through(data: Any, **options: Any) -> Source:
    if options:
        raise ConfigError(f"options {sorted(options)} do not apply to an already-open source")
    return data


payload_nbytes = _payload_nbytes
register_source("arrays", _can_open_arrays, _open_arrays)
register_source("store", lambda d: _is_store(d) or _is_store_dir(d), _open_store)
register_source("source", _is_source, _pass_through)
