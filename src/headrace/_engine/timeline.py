"""The stats timeline: periodic snapshots of a loader's ``stats()``, bounded in count and memory.

A :class:`Recorder` keeps cumulative counters only (samples, bytes, seconds waited or busy) plus
point readings (queue depth, bytes in flight, RSS). Rates and fractions are derived at export time
from consecutive kept snapshots, so dropping snapshots (to stay within ``capacity``) never makes
them wrong: a long run is kept end to end at a coarser period instead of losing its beginning.

Cost: the loader calls :meth:`Recorder.record` from its consumer's ``next()`` only once the period
has passed (a clock compare otherwise); a snapshot is one ``stats()`` call (a ``/proc`` read and a
dict). The buffer holds at most ``capacity`` snapshots.

The exported timeline (``loader.stats_timeline()``) is plain JSON: save it with ``json.dump`` and
draw it later with ``headrace.plot(path, "out.png")``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import Any

from headrace._base.errors import ConfigError

__all__ = ["FORMAT", "VERSION", "Recorder", "TimelineMixin", "advice", "load_timeline",
           "summarize", "timeline_period"]

FORMAT = "headrace-timeline"
VERSION = 1

# Cumulative counters and point readings copied from stats() into each snapshot.
_KEYS = ("delivered_batches_total", "delivered_samples_total", "delivered_bytes_total",
         "consumer_wait_seconds", "budget_wait_seconds", "ram_wait_seconds",
         "gather_busy_seconds", "transform_busy_seconds", "queue_depth", "batches_in_flight",
         "inflight_bytes", "process_rss_bytes", "page_cache_resident_bytes", "counted_rss_bytes",
         # the settings, which an autotuned loader moves while it runs (docs/autotune.md)
         "threads", "prefetch_batches", "effective_max_queue_batches")
_CUMULATIVE = ("delivered_batches_total", "delivered_samples_total", "delivered_bytes_total", "consumer_wait_seconds",
               "budget_wait_seconds", "ram_wait_seconds", "gather_busy_seconds",
               "transform_busy_seconds")
# Caps and settings taken from the last stats() into the timeline's header.
_HEADER = ("threads", "max_inflight_bytes", "max_process_rss_bytes",
           "effective_max_queue_batches", "batch_size_samples", "inflight_high_water_bytes",
           "counted_rss_high_water_bytes", "ram_high_water_bytes", "autotune_enabled",
           "autotune_adjustments")

LOADER_BOUND_WAIT = 0.2  # the consumer waited this share of the time or more: loader-bound


class Recorder:
    """Snapshots of ``stats()`` dicts, at most one per ``period_s``, at most ``capacity`` kept.

    Args:
        period_s: seconds between snapshots (> 0).
        capacity: snapshots kept (>= 8); when full, every other one is dropped and the period
            doubles.
    """

    def __init__(self, *, period_s: float = 0.5, capacity: int = 512) -> None:
        if not isinstance(period_s, int | float) or isinstance(period_s, bool) or period_s <= 0:
            raise ConfigError(f"timeline period_s must be a number > 0, got {period_s!r}")
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 8:
            raise ConfigError(f"timeline capacity must be an int >= 8, got {capacity!r}")
        self.period_s = float(period_s)
        self.capacity = capacity
        self.started = time.monotonic()
        self.next_at = self.started + self.period_s
        self.records = 0  # snapshots taken in all (kept or later dropped)
        self._samples: list[dict[str, float]] = []

    def __len__(self) -> int:
        return len(self._samples)

    def due(self) -> bool:
        return time.monotonic() >= self.next_at

    def _snap(self, stats: Mapping[str, Any], now: float) -> dict[str, float]:
        snap = {"t": now - self.started}
        for key in _KEYS:
            v = stats.get(key, 0)
            snap[key] = float(v) if isinstance(v, int | float) else 0.0
        return snap

    def record(self, stats: Mapping[str, Any]) -> None:
        """Keep one snapshot of ``stats`` (a loader's ``stats()`` dict) taken now."""
        now = time.monotonic()
        self._samples.append(self._snap(stats, now))
        self.records += 1
        if len(self._samples) >= self.capacity:
            del self._samples[::2]  # keeps the newest; the time axis stays covered
            self.period_s *= 2
        self.next_at = now + self.period_s

    def maybe_record(self, stats_fn: Any) -> bool:
        """``record(stats_fn())`` if the period has passed; for loaders without a built-in hook."""
        if time.monotonic() < self.next_at:
            return False
        self.record(stats_fn())
        return True

    def export(self, stats: Mapping[str, Any] | None = None, *, kind: str = "loader") -> dict[str, Any]:
        """The timeline as a JSON-serializable dict.

        ``stats`` (the loader's current ``stats()``) fills the header with caps and high waters
        and, when newer than the last kept snapshot, ends the series (it is not stored).
        """
        samples = list(self._samples)
        if stats is not None:
            snap = self._snap(stats, time.monotonic())
            if not samples or any(snap[k] != samples[-1][k] for k in _KEYS):
                samples.append(snap)
        header: dict[str, Any] = {}
        for key in _HEADER:
            v = (stats or {}).get(key)
            header[key] = v if isinstance(v, int | float) else None
        return {"format": FORMAT, "version": VERSION, "kind": kind, "period_s": self.period_s,
                "capacity": self.capacity, "records": self.records, **header,
                "samples": derive(samples, threads=header.get("threads") or 1)}


def timeline_period(timeline: bool | float | None) -> float | None:
    """The period of a loader's ``timeline=`` argument: ``True`` 0.5 s, a number that many
    seconds, ``False``/``None`` off (``None`` returned)."""
    if timeline is None or timeline is False:
        return None
    if timeline is True:
        return 0.5
    if not isinstance(timeline, int | float) or not timeline > 0:
        raise ConfigError(f"timeline= must be True, False or a period in seconds > 0, got "
                          f"{timeline!r}")
    return float(timeline)


class TimelineMixin:
    """``timeline=``, ``enable_timeline()`` and ``stats_timeline()`` for a loader class.

    The class sets ``_timeline_kind``, has ``stats()``, checks its ``timeline=`` argument with
    :func:`timeline_period` before doing any work, calls ``_start_timeline(period)`` at the end of
    its constructor (so ``t = 0`` is when the loader is ready), ``_tick_timeline()`` after each delivered batch (one attribute test when off,
    one clock compare when not due) and ``_end_timeline()`` when it raises ``StopIteration``.
    The one recorder spans everything the object does (epochs, inner loaders rebuilt).
    """

    _timeline_kind = "loader"
    _timeline: Recorder | None = None
    _timeline_end: float | None = None  # delivered_batches_total at the last end-of-run record

    def stats(self) -> dict[str, Any]:  # pragma: no cover - every loader class defines it
        raise NotImplementedError

    def _start_timeline(self, period_s: float | None) -> None:
        """Starts recording every ``period_s`` seconds (from :func:`timeline_period`); ``None``: off."""
        if period_s is not None:
            self.enable_timeline(period_s=period_s)

    def _tick_timeline(self) -> None:
        tl = self._timeline
        if tl is not None and time.monotonic() >= tl.next_at:
            tl.record(self.stats())

    def _end_timeline(self) -> None:
        """Records the end of the run, once however often ``next()`` is called past it."""
        tl = self._timeline
        if tl is None:
            return
        stats = self.stats()
        done = stats.get("delivered_batches_total")
        if done != self._timeline_end:
            self._timeline_end = done
            tl.record(stats)

    def enable_timeline(self, *, period_s: float = 0.5, capacity: int = 512) -> None:
        """Record a snapshot of ``stats()`` every ``period_s`` seconds (see ``stats_timeline()``).

        Sampling happens in ``next()`` once the period has passed (one clock compare per batch
        otherwise); at most ``capacity`` snapshots are kept: when full, every other one is dropped
        and the period doubles, so a long run stays covered end to end in bounded memory.
        """
        self._timeline = Recorder(period_s=period_s, capacity=capacity)
        self._timeline_end = None

    def stats_timeline(self) -> dict[str, Any]:
        """The recorded snapshots as a JSON-serializable dict (``headrace.plot`` draws it).

        Raises:
            ConfigError: the timeline was never enabled (``timeline=True`` or ``enable_timeline``).
        """
        if self._timeline is None:
            raise ConfigError(f"this {type(self).__name__} records no timeline; create it with "
                              "timeline=True or call enable_timeline() before iterating")
        return self._timeline.export(self.stats(), kind=self._timeline_kind)


def derive(samples: list[dict[str, float]], *, threads: int) -> list[dict[str, float]]:
    """Adds per-interval rates and fractions between consecutive snapshots (from t=0, zeros).

    A counter that went backwards (a loader that restarts per epoch) counts from zero again.
    """
    out = []
    prev: dict[str, float] = {"t": 0.0, **{k: 0.0 for k in _CUMULATIVE}}
    for s in samples:
        dt = max(s["t"] - prev["t"], 1e-9)
        d = _delta(s, prev)
        busy = d["gather_busy_seconds"] + d["transform_busy_seconds"]
        out.append({**s,
                    "samples_per_second": d["delivered_samples_total"] / dt,
                    "bytes_per_second": d["delivered_bytes_total"] / dt,
                    "consumer_wait_fraction": min(1.0, d["consumer_wait_seconds"] / dt),
                    "worker_busy_fraction": min(1.0, busy / (dt * max(1, int(
                        s.get("threads") or threads)))),
                    "budget_wait_fraction": min(1.0, d["budget_wait_seconds"] / dt)})
        prev = s
    return out


def _delta(s: Mapping[str, float], prev: Mapping[str, float]) -> dict[str, float]:
    return {k: s[k] - prev[k] if s[k] >= prev[k] else s[k] for k in _CUMULATIVE}


def _totals(samples: list[dict[str, float]]) -> dict[str, float]:
    """Each cumulative counter summed over the run, surviving counter restarts (new epochs)."""
    total = dict.fromkeys(_CUMULATIVE, 0.0)
    prev: dict[str, float] = dict.fromkeys(_CUMULATIVE, 0.0)
    for s in samples:
        for k, v in _delta(s, prev).items():
            total[k] += v
        prev = s
    return total


def load_timeline(obj: Any) -> dict[str, Any]:
    """A timeline from a loader (``stats_timeline()``), a timeline dict, or a saved JSON path."""
    if isinstance(obj, str | os.PathLike):
        try:
            with open(obj, encoding="utf-8") as f:
                obj = json.load(f)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{os.fspath(obj)!r} is not a saved timeline (JSON): {e}") from None
    elif not isinstance(obj, Mapping):
        fn = getattr(obj, "stats_timeline", None)
        if not callable(fn):
            raise ConfigError(
                f"expected a loader with stats_timeline(), a timeline dict or a path to a saved "
                f"timeline, got {type(obj).__name__}; create the loader with timeline=True")
        obj = fn()
    if not isinstance(obj, Mapping) or obj.get("format") != FORMAT:
        raise ConfigError("not a headrace timeline (missing \"format\": \"headrace-timeline\"); "
                          "save loader.stats_timeline() with json.dump")
    if obj.get("version") != VERSION:
        raise ConfigError(f"timeline version {obj.get('version')!r} is not supported (this "
                          f"headrace reads version {VERSION}); upgrade headrace")
    return dict(obj)


def summarize(timeline: Mapping[str, Any]) -> dict[str, Any]:
    """Whole-run figures of a timeline: rates, where time went, high waters, the verdict."""
    samples = timeline.get("samples") or []
    elapsed = float(samples[-1]["t"]) if samples else 0.0
    last = _totals(samples)
    threads = int(timeline.get("threads") or 1)

    def frac(seconds: float, per: float = 1.0) -> float:
        return min(1.0, seconds / (elapsed * per)) if elapsed > 0 else 0.0

    busy = last.get("gather_busy_seconds", 0.0) + last.get("transform_busy_seconds", 0.0)
    depths = [s["queue_depth"] for s in samples]
    wait = frac(last.get("consumer_wait_seconds", 0.0))
    out = {
        "elapsed_seconds": elapsed,
        "samples": int(last.get("delivered_samples_total", 0)),
        "batches": int(last.get("delivered_batches_total", 0)),
        "samples_per_second": last.get("delivered_samples_total", 0.0) / elapsed if elapsed else 0.0,
        "bytes_per_second": last.get("delivered_bytes_total", 0.0) / elapsed if elapsed else 0.0,
        "consumer_wait_fraction": wait,
        "worker_busy_fraction": frac(busy, threads),
        "gather_busy_fraction": frac(last.get("gather_busy_seconds", 0.0), threads),
        "transform_busy_fraction": frac(last.get("transform_busy_seconds", 0.0), threads),
        "budget_wait_fraction": frac(last.get("budget_wait_seconds", 0.0)),
        "ram_wait_fraction": frac(last.get("ram_wait_seconds", 0.0)),
        "queue_depth_mean": sum(depths) / len(depths) if depths else 0.0,
        "queue_capacity": timeline.get("effective_max_queue_batches"),
        "threads": threads,
        "max_inflight_bytes": timeline.get("max_inflight_bytes"),
        "max_process_rss_bytes": timeline.get("max_process_rss_bytes"),
        "inflight_high_water_bytes": timeline.get("inflight_high_water_bytes")
        or max((s["inflight_bytes"] for s in samples), default=0),
        "counted_rss_high_water_bytes": timeline.get("counted_rss_high_water_bytes")
        or max((s["counted_rss_bytes"] for s in samples), default=0),
        "loader_bound": wait >= LOADER_BOUND_WAIT,
    }
    out["verdict"] = (f"loader-bound: the model waited {wait:.0%} of the time"
                      if out["loader_bound"] else
                      f"model-bound: the model waited only {wait:.0%} of the time")
    return out


def advice(summary: Mapping[str, Any], *, cpus: int | None = None) -> list[str]:
    """Which knob to turn, from :func:`summarize`'s figures (most useful first)."""
    cpus = cpus or os.cpu_count() or 1
    tips: list[str] = []
    threads = summary["threads"]
    busy = summary["worker_busy_fraction"]
    rss_cap = summary.get("max_process_rss_bytes") or 0
    if rss_cap and summary["counted_rss_high_water_bytes"] >= 0.9 * rss_cap:
        tips.append(f"memory reached {summary['counted_rss_high_water_bytes'] / rss_cap:.0%} of "
                    "the RSS cap: raise --ram-gb (ram_gb=) or hold fewer batches in the program")
    if summary["ram_wait_fraction"] >= 0.05:
        tips.append(f"workers paused {summary['ram_wait_fraction']:.0%} of the time on the RAM "
                    "cap: raise --ram-gb (ram_gb=) or free memory the program holds")
    if not summary["loader_bound"]:
        tips.append(f"queue full, consumer slow: the loader is not the bottleneck (the model "
                    f"waited {summary['consumer_wait_fraction']:.0%}); fewer --threads or a "
                    "smaller --inflight would free CPU and RAM")
        return tips
    if summary["budget_wait_fraction"] >= 0.25:
        cap = summary.get("max_inflight_bytes") or 0
        tips.append(f"budget wait high ({summary['budget_wait_fraction']:.0%} of the time the "
                    f"next batch waited for bytes under the {cap / 2**20:.0f} MiB cap): raise "
                    "--inflight (inflight=)")
    if busy >= 0.8:
        if threads < cpus:
            tips.append(f"workers busy {busy:.0%}, queue empty: add --threads (threads=, now "
                        f"{threads}, {cpus} cores)")
        else:
            tips.append(f"workers busy {busy:.0%} on all {cpus} cores: the CPU is the limit; "
                        "use cheaper transforms, a faster codec (raw/lz4) or smaller images")
    elif summary["budget_wait_fraction"] < 0.25:
        tips.append(f"workers busy only {busy:.0%} (gathering and transforming; slow reads "
                    "would count as busy) while the consumer waited: the time goes to per-batch "
                    "overhead (dispatch in batch order, Python, the GIL); use a larger --batch "
                    "(batch=) so each batch carries more records")
    return tips
