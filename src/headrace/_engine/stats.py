"""Loader counters, process memory sampling, and the mx8-style ``stats()`` helpers.

Memory is read from ``/proc/self/statm`` (a ~5 us read, cheap enough per batch): ``resident``
pages split into ``shared`` (file-backed and shmem pages: mmap'd store chunks live here, which the
kernel can drop at any time) and the rest (anonymous memory the process really owns). The RSS cap
is compared against the anonymous part; the file-backed part is reported as page cache.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, TextIO

import numpy as np

from headrace._base.errors import ConfigError

__all__ = ["LoaderCounters", "MemorySample", "format_line", "format_summary", "sample_memory",
           "stats"]

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_GIB = float(1 << 30)
_MIB = float(1 << 20)
_PAYLOAD_WINDOW = 256  # recent batches kept for the p50/p95 payload size (mx8's window)


@dataclass(frozen=True)
class MemorySample:
    """One reading of this process's memory.

    Attributes:
        rss_bytes: total resident set size, as ``ps``/``top`` show it.
        page_cache_bytes: the resident file-backed (mmap'd files) and shared pages within it.
        counted_bytes: ``rss_bytes - page_cache_bytes``: what the RSS cap is compared against.
    """

    rss_bytes: int
    page_cache_bytes: int

    @property
    def counted_bytes(self) -> int:
        return max(0, self.rss_bytes - self.page_cache_bytes)


def sample_memory() -> MemorySample:
    """Read this process's memory use (``/proc/self/statm``; peak RSS elsewhere)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            parts = f.read().split()
        return MemorySample(int(parts[1]) * _PAGE, int(parts[2]) * _PAGE)
    except (OSError, IndexError, ValueError):
        import resource  # no /proc (macOS): the peak is the best cheap figure there is

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return MemorySample(peak if sys.platform == "darwin" else peak * 1024, 0)


class LoaderCounters:
    """Counters the loader's threads update; ``snapshot()`` turns them into the stats dict.

    Counter updates come from one thread each (delivery counters from the consumer, memory samples
    from any thread under ``_lock``), so plain attributes suffice for the single-writer ones.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.started = time.monotonic()
        self.first_delivery: float | None = None
        self.delivered_batches = 0
        self.delivered_samples = 0
        self.delivered_bytes = 0
        self.consumer_wait_s = 0.0
        self.ram_wait_s = 0.0
        self.queue_high_water = 0
        self.rss_bytes = 0
        self.page_cache_bytes = 0
        self.counted_bytes = 0
        self.rss_high_water = 0
        self.counted_high_water = 0
        self.payloads: deque[int] = deque(maxlen=_PAYLOAD_WINDOW)
        self._last: MemorySample | None = None
        self._last_at = 0.0
        self.sample()

    def sample(self, *, max_age_s: float = 0.0) -> MemorySample:
        """Read memory now, or reuse the last reading if it is younger than ``max_age_s``."""
        now = time.monotonic()
        last = self._last
        if max_age_s > 0 and last is not None and now - self._last_at < max_age_s:
            return last
        m = sample_memory()
        self._last, self._last_at = m, now
        with self._lock:
            self.rss_bytes = m.rss_bytes
            self.page_cache_bytes = m.page_cache_bytes
            self.counted_bytes = m.counted_bytes
            self.rss_high_water = max(self.rss_high_water, m.rss_bytes)
            self.counted_high_water = max(self.counted_high_water, m.counted_bytes)
        return m

    def on_delivery(self, *, samples: int, nbytes: int, waited_s: float) -> None:
        now = time.monotonic()
        if self.first_delivery is None:
            self.first_delivery = now
        self.delivered_batches += 1
        self.delivered_samples += samples
        self.delivered_bytes += nbytes
        self.consumer_wait_s += waited_s
        self.payloads.append(nbytes)

    def snapshot(self) -> dict[str, Any]:
        elapsed = time.monotonic() - self.started
        rate = self.delivered_samples / elapsed if elapsed > 0 else 0.0
        sizes = np.fromiter(self.payloads, dtype=np.int64, count=len(self.payloads))
        out = {
            "delivered_batches_total": self.delivered_batches,
            "delivered_samples_total": self.delivered_samples,
            "delivered_bytes_total": self.delivered_bytes,
            "samples_per_second": rate,
            "bytes_per_second": self.delivered_bytes / elapsed if elapsed > 0 else 0.0,
            "elapsed_seconds": elapsed,
            "consumer_wait_seconds": self.consumer_wait_s,
            "ram_wait_seconds": self.ram_wait_s,
            "process_rss_bytes": self.rss_bytes,
            "page_cache_resident_bytes": self.page_cache_bytes,
            "counted_rss_bytes": self.counted_bytes,
            "ram_high_water_bytes": self.rss_high_water,
            "counted_rss_high_water_bytes": self.counted_high_water,
            "queue_high_water": self.queue_high_water,
            "batch_payload_window_size": int(sizes.size),
        }
        if sizes.size:  # measured, or absent before the first batch (never a placeholder 0)
            p50 = int(np.percentile(sizes, 50))
            p95 = int(np.percentile(sizes, 95))
            out["batch_payload_bytes_p50"] = p50
            out["batch_payload_bytes_p95"] = p95
            if p50:
                out["batch_payload_bytes_p95_over_p50"] = p95 / p50
        return out


def format_line(s: dict[str, Any]) -> str:
    """The ``print_stats()`` line (mx8's format, prefix ``[headrace]``, sizes in MiB)."""
    return (f"[headrace] batches={s.get('delivered_batches_total', 0)} "
            f"samples={s.get('delivered_samples_total', 0)} "
            f"inflight={s.get('inflight_bytes', 0) / _MIB:.1f}MB "
            f"rss={s.get('process_rss_bytes', 0) / _MIB:.1f}MB "
            f"hwm={s.get('ram_high_water_bytes', 0) / _MIB:.1f}MB "
            f"rate={s.get('samples_per_second', 0.0):.1f}/s "
            f"wait={s.get('consumer_wait_seconds', 0.0):.2f}s")


def _pressure(counted: int, cap: int) -> str:
    if cap <= 0:
        return "STABLE"
    ratio = counted / cap
    if ratio >= 0.95:
        return "CRITICAL"
    if ratio >= 0.80:
        return "ELEVATED"
    return "STABLE"


def format_summary(s: dict[str, Any]) -> str:
    """The multi-line human summary of ``headrace.stats(loader)`` (mx8's layout, A.11).

    Works on any stats dict (loaders, mixes, distributed loaders): missing keys show as 0 / n/a.
    """
    batches = s.get("delivered_batches_total", 0)
    samples = s.get("delivered_samples_total", 0)
    cap = int(s.get("max_process_rss_bytes", 0) or 0)
    counted = int(s.get("counted_rss_bytes", s.get("process_rss_bytes", 0)) or 0)
    pct = 100.0 * counted / cap if cap else 0.0
    p50 = s.get("batch_payload_bytes_p50", 0)
    ratio = f"{s.get('batch_payload_bytes_p95_over_p50', 0.0):.2f}" if p50 else "n/a"
    status = s.get("status") or ("RUNNING" if batches else "WARMING")
    return "\n".join([
        f"Status: {status} | Mode: {s.get('mode', 'local')} | "
        f"Epoch: {s.get('epoch', 0)} | Step: {batches}",
        f"Progress: {samples} samples | {batches} batches",
        f"Throughput: {s.get('samples_per_second', 0.0):.1f} samples/s | "
        f"{s.get('bytes_per_second', 0.0) / _GIB:.2f} GB/s",
        f"Memory: {counted / _GIB:.2f} GB / {cap / _GIB:.2f} GB ({pct:.1f}%) | "
        f"Pressure: {_pressure(counted, cap)}",
        f"Stability: p95/p50={ratio} | jitter_slo_breaches=n/a",
        f"Autotune: {'enabled' if s.get('autotune_enabled') else 'disabled'} | prefetch={s.get('prefetch_batches', 'n/a')} | "
        f"queue={s.get('max_queue_batches', 'n/a')} | threads={s.get('threads', 'n/a')} | "
        f"consumer_wait={s.get('consumer_wait_seconds', 0.0):.2f}s | "
        f"budget_wait={s.get('budget_wait_seconds', 0.0):.2f}s",
    ])


def stats(loader: Any, *, raw: bool = False) -> str | dict[str, Any]:
    """A loader's stats: the dict with ``raw=True``, else a multi-line human summary.

    Args:
        loader: any object with a ``stats()`` method returning a dict (every headrace loader).
        raw: return ``loader.stats()`` itself.

    Raises:
        ConfigError: ``loader`` has no ``stats()`` method or it does not return a dict.
    """
    fn = getattr(loader, "stats", None)
    if not callable(fn):
        raise ConfigError("headrace.stats expects a loader object with a .stats() method, "
                          f"got {type(loader).__name__}")
    s = fn()
    if not isinstance(s, dict):
        raise ConfigError("headrace.stats expected loader.stats() to return a dict, "
                          f"got {type(s).__name__}")
    if raw:
        return s
    return format_summary(s)


def print_line(s: dict[str, Any], *, file: TextIO | None = None) -> None:
    print(format_line(s), file=sys.stderr if file is None else file, flush=True)
