"""Shared helpers for loader tests: checkpoint round trips, batch comparison, thread counting."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

import headrace


def read_through_interrupts(loader: Any) -> list[int]:
    """Every ``x`` of ``loader``'s batches, in order, going on after each ``KeyboardInterrupt``
    (what a program that catches Ctrl-C and continues sees)."""
    got = []
    while True:
        try:
            got.append(next(loader)["x"].copy())
        except KeyboardInterrupt:
            continue
        except StopIteration:
            return np.concatenate(got).tolist()


def as_plain(value: Any) -> Any:
    """Turn a batch (dict of ndarray / Ragged, possibly nested) into comparable Python data."""
    if isinstance(value, dict):
        return {k: as_plain(v) for k, v in sorted(value.items())}
    if isinstance(value, headrace.Ragged):
        return ("ragged", value.values.tolist(), value.offsets.tolist())
    if isinstance(value, np.ndarray):
        return (str(value.dtype), value.shape, value.tolist())
    if isinstance(value, tuple | list):
        return [as_plain(v) for v in value]
    return value


def take(loader: Any, count: int | None) -> list[tuple[list[int], Any]]:
    """Read ``count`` batches (all when None) as ``(ids, plain batch)`` pairs."""
    out = []
    for batch in loader:
        out.append((loader.last_ids.tolist(), as_plain(batch)))
        if count is not None and len(out) >= count:
            break
    return out


def run_checkpoint_roundtrip(make_loader: Callable[..., Any], stop_at: Iterable[int], *,
                             total: int | None = None) -> list[tuple[list[int], Any]]:
    """Assert that stopping after ``k`` batches and resuming gives the identical remaining stream.

    Args:
        make_loader: ``fn(resume=None | bytes) -> loader`` building the same loader each time.
        stop_at: numbers of batches to read before checkpointing (0 = before the first batch).
        total: batches to compare (required for endless loaders; default: the whole stream).

    Returns:
        the reference stream, for further checks.
    """
    with make_loader(resume=None) as ref_loader:
        reference = take(ref_loader, total)
    n = len(reference)
    for stop in stop_at:
        assert 0 <= stop <= n, (stop, n)
        with make_loader(resume=None) as first:
            head = take(first, stop) if stop else []
            token = first.checkpoint()
        assert isinstance(token, bytes) and len(token) <= 1024
        with make_loader(resume=token) as second:
            rest = take(second, None if total is None else n - stop) if stop < n else []
            if total is None:
                assert next(second, None) is None
        got = head + rest
        assert len(got) == n, f"stop={stop}: {len(got)} batches, expected {n}"
        for i, (a, b) in enumerate(zip(got, reference, strict=True)):
            assert a == b, f"stop={stop}: batch {i} differs after resume"
    return reference


def wait_for(predicate: Callable[[], bool], *, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return predicate()


def headrace_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("headrace-")]


# A small learnable dataset for the framework adapters' training tests.
N_ROWS = 2_000
N_FEATURES = 64
N_CLASSES = 4


def make_learnable_store(path: Path) -> Path:
    """2,000 x 64 float32 features; the label is the argmax of a fixed linear map (learnable)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((N_ROWS, N_FEATURES), dtype=np.float32)
    w = rng.standard_normal((N_FEATURES, N_CLASSES), dtype=np.float32)
    label = np.argmax(x @ w, axis=1).astype(np.int64)
    with headrace.create(path, fields={
            "x": {"dtype": "float32", "shape": [N_FEATURES]}, "label": "int64"}) as writer:
        writer.append({"x": x, "label": label})
        writer.commit()
    return path
