"""The copy lane: rows copied on a native thread while the caller runs Python.

A parked loader's consumer gathers each batch itself; a gather that is a plain copy (a store's
verified fixed-shape raw fields, a ``.npy`` mapping, an in-memory array) can instead be started
on the lane (``_copylane.c``) one batch ahead, so the copy runs while the consumer does the
previous batch's bookkeeping and its training step; a store's first reads, which check each
record's crc32c as they copy it, start the same way (``start_checked``). ``take_started`` starts
one array's rows; ``Started`` is a read in progress whose ``wait()`` gives what the gather would have returned.
Without the C accelerator nothing starts (``available()`` is False) and callers gather.
"""

from __future__ import annotations

from typing import Any

import numpy as np

try:
    # start_checked: a first read's copy and crc32c check (``_crcrows.take_checked``'s contract)
    from headrace._store._copylane import start as _start
    from headrace._store._copylane import start_checked
except ImportError:  # not built: every read is a plain gather
    _start = start_checked = None

__all__ = ["Started", "Then", "available", "start_checked", "start_rows", "take_started"]


def available() -> bool:
    """True when the copy lane was built (``headrace._store._copylane``)."""
    return _start is not None


class Started:
    """A read in progress on the lane: ``wait()`` returns ``value`` once every copy into it
    finished (its arrays are being written until then: read them only after)."""

    __slots__ = ("_pending", "_value")

    def __init__(self, value: Any, pending: list[Any]) -> None:
        self._value = value
        self._pending = pending

    def wait(self) -> Any:
        for p in self._pending:
            p.wait()
        return self._value


class Then:
    """A read in progress whose result is ``fn(started.wait())`` (a field of it, renamed keys)."""

    __slots__ = ("_fn", "_started")

    def __init__(self, started: Any, fn: Any) -> None:
        self._started = started
        self._fn = fn

    def wait(self) -> Any:
        return self._fn(self._started.wait())


def start_rows(src: np.ndarray, rows: np.ndarray, out: np.ndarray, limit: int) -> Any:
    """Starts copying rows ``rows`` of ``src`` (C-contiguous, rows along axis 0) to ``out``;
    every row is checked against ``[0, limit)`` first (``limit < 0``: every row of ``src``), an
    ``IndexError`` if one is outside. Returns the pending copy (its ``wait()``)."""
    assert _start is not None
    return _start(src, src.strides[0], rows, out, limit)


def take_started(array: np.ndarray, ids: np.ndarray,
                 out: np.ndarray | None = None) -> tuple[np.ndarray, Any] | None:
    """``array.take(ids, axis=0)`` started on the lane: ``(out, pending)``, or None where the
    take is not a plain copy of whole rows (no lane, object or non-contiguous arrays, empty rows).

    Raises:
        IndexError: an id outside ``[0, len(array))`` (nothing is started).
    """
    if (_start is None or array.dtype.hasobject or not array.flags.c_contiguous
            or array.ndim == 0 or not array.strides[0]):
        return None
    if ids.dtype != np.int64 or not ids.flags.c_contiguous:
        ids = np.ascontiguousarray(ids, np.int64)
    if out is None:
        out = np.empty((len(ids), *array.shape[1:]), array.dtype)
    return out, _start(array, array.strides[0], ids, out, len(array))
