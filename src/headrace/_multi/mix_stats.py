"""A mix's ``stats()``: its own counters (mx8's key names) and its sources' figures together.

Every key is measured: the mix's counters are counted as batches are delivered, and the sources'
figures are read from their own ``stats()`` (summed, or the maximum, under a single loader's key
names, which is what the mix's timeline and ``headrace.plot`` show).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

from headrace._base.errors import ConfigError

__all__ = ["SUMMED_COUNTERS", "batch_nbytes", "batch_samples", "mix_stats", "snapshot_settings",
           "source_cap"]

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}
DEFAULT_SNAPSHOT_PERIOD_TICKS = 64
#: the sources' cumulative counters summed into the mix's stats; a restart of a source's engine
#: (``set_epoch``, ``load_state_dict``) starts them over, so the mix keeps what they had
SUMMED_COUNTERS = ("gather_busy_seconds", "transform_busy_seconds", "budget_wait_seconds",
                   "ram_wait_seconds")
_SUMMED_READINGS = ("queue_depth", "batches_in_flight", "threads", "prefetch_batches",
                    "effective_max_queue_batches")
_MAX_READINGS = ("ram_high_water_bytes", "counted_rss_high_water_bytes")


def _env_first(env: Mapping[str, str], *names: str) -> tuple[str, str] | None:
    for name in names:
        value = env.get(name)
        if value is not None:
            return name, value
    return None


def snapshot_settings(env: Mapping[str, str] | None = None) -> tuple[bool, int]:
    """``(enabled, period_ticks)`` from ``HEADRACE_MIX_SNAPSHOT[_PERIOD_TICKS]`` (or ``MX8_``)."""
    env = os.environ if env is None else env
    enabled = False
    found = _env_first(env, "HEADRACE_MIX_SNAPSHOT", "MX8_MIX_SNAPSHOT")
    if found is not None:
        name, raw = found
        text = raw.strip().lower()
        if text not in _TRUE | _FALSE:
            raise ConfigError(f"{name}={raw!r} must be 1 or 0")
        enabled = text in _TRUE
    period = DEFAULT_SNAPSHOT_PERIOD_TICKS
    found = _env_first(env, "HEADRACE_MIX_SNAPSHOT_PERIOD_TICKS", "MX8_MIX_SNAPSHOT_PERIOD_TICKS")
    if found is not None:
        name, raw = found
        try:
            period = int(raw.strip())
        except ValueError:
            period = 0
        if period < 1:
            raise ConfigError(f"{name}={raw!r} must be an integer >= 1 (ticks between snapshots)")
    return enabled, period


def batch_nbytes(value: Any) -> int:
    """Bytes held by a batch: arrays, Ragged (values + offsets), tensors, and containers of them."""
    if isinstance(value, Mapping):
        return sum(batch_nbytes(v) for v in value.values())
    if isinstance(value, tuple | list):
        return sum(batch_nbytes(v) for v in value)
    n = getattr(value, "nbytes", None)
    if isinstance(n, int):
        return n
    if hasattr(value, "element_size") and hasattr(value, "nelement"):  # torch.Tensor
        return int(value.element_size() * value.nelement())
    if isinstance(value, bytes | bytearray | memoryview):
        return len(value)
    return 0


def batch_samples(source: Any, batch: Any) -> int:
    """Samples in a batch: its record ids when the source says, else its first array's length."""
    ids = getattr(source, "last_ids", None)
    if ids is not None:
        return len(ids)
    first = batch
    if isinstance(batch, Mapping) and batch:
        first = next(iter(batch.values()))
    elif isinstance(batch, tuple | list) and batch:
        first = batch[0]
    try:
        return len(first)
    except TypeError:
        return 1


def _number(value: Any) -> float | int:
    """A stats value as a number (a missing or non-numeric one counts 0)."""
    return value if isinstance(value, int | float) and not isinstance(value, bool) else 0


def _metrics(source: Any) -> Mapping[str, Any]:
    try:
        return source.stats()
    except Exception:  # a closed source reports nothing
        return {}


def source_cap(source: Any) -> int | None:
    """The source's own inflight cap (``stats()["max_inflight_bytes"]``), if it reports one."""
    cap = _metrics(source).get("max_inflight_bytes")
    return cap if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0 else None


def mix_stats(m: Any) -> dict[str, Any]:
    """The dict ``MixedLoader.stats()`` returns (see its docstring and docs/distributed.md)."""
    from headrace._engine.stats import sample_memory

    normalized, realized = m.normalized(), m.realized()
    unique = {id(s): _metrics(s) for s in m.sources}  # a loader in several slots counts once
    per_source = []
    for i, s in enumerate(m.sources):
        metrics = unique[id(s)]
        per_source.append({
            "source_idx": i, "active": m.schedule.active[i],
            "source_weight": m.weights[i],
            "source_weight_normalized": normalized[i],
            "source_realized_ratio": realized[i],
            "source_delivered_batches_total": m.delivered_batches[i],
            "source_delivered_samples_total": m.delivered_samples[i],
            "source_delivered_bytes_total": m.delivered_bytes[i],
            "source_starvation_total": m.starvation_total[i],
            "source_exhausted_total": m.exhausted_total[i],
            "source_restarts_total": m.restarts[i],
            "source_wait_seconds_total": m.wait_seconds[i],
            "batch_size_samples": getattr(s, "batch_size", None),
            "max_inflight_bytes": metrics.get("max_inflight_bytes"),
            "metrics": metrics,
        })
    elapsed = time.monotonic() - m._started
    caps = [p["metrics"].get("max_process_rss_bytes") for p in per_source]
    mem = sample_memory()
    inflight = m.total_inflight_bytes()
    budget_high = m.budget.high_water_bytes if m.budget is not None else 0
    summed = {key: m.retired.get(key, 0) + sum(_number(x.get(key)) for x in unique.values())
              for key in (*SUMMED_COUNTERS, *_SUMMED_READINGS)}
    for key in _SUMMED_READINGS:
        summed[key] = int(summed[key])
    return {
        "status": m.status, "mode": "mixed",
        "seed": m.seed, "epoch": m.epoch,
        "samples_per_second": sum(m.delivered_samples) / elapsed if elapsed else 0.0,
        "bytes_per_second": sum(m.delivered_bytes) / elapsed if elapsed else 0.0,
        "consumer_wait_seconds": sum(m.wait_seconds),
        "max_process_rss_bytes": max((c for c in caps if isinstance(c, int)), default=0),
        "delivered_batches_total": sum(m.delivered_batches),
        "delivered_samples_total": sum(m.delivered_samples),
        "delivered_bytes_total": sum(m.delivered_bytes),
        "mix_schedule_ticks": m.schedule.ticks,
        "mix_snapshot_enabled": m.snapshot_enabled,
        "mix_snapshot_period_ticks": m.snapshot_period_ticks,
        "mix_snapshot_emitted_total": m.snapshot_emitted_total,
        "active_sources": sum(m.schedule.active),
        "mix_source_delivered_batches_total": list(m.delivered_batches),
        "mix_source_delivered_samples_total": list(m.delivered_samples),
        "mix_source_delivered_bytes_total": list(m.delivered_bytes),
        "mix_source_starvation_total": list(m.starvation_total),
        "mix_source_exhausted_total": list(m.exhausted_total),
        "mix_source_restarts_total": list(m.restarts),
        "mix_source_wait_seconds_total": list(m.wait_seconds),
        "mix_requested_weights": list(m.weights),
        "mix_normalized_weights": normalized,
        "mix_realized_ratio": realized,
        "mix_source_exhaustion_policy": m.policy,
        "mix_starvation_threshold_ticks": m.starvation,
        "mix_total_inflight_bytes": inflight,
        "mix_inflight_high_water_bytes": max(m.inflight_high_water_bytes, budget_high),
        "mix_shared_max_inflight_bytes": m.shared_max_inflight_bytes,
        "mix_shared_budget": m.budget is not None,
        "mix_shared_inflight_violation_total": m.violation_total,
        "process_rss_bytes": mem.rss_bytes,
        # The sources together, under a single loader's key names (the timeline, the plot).
        **summed,
        "inflight_bytes": inflight,
        "inflight_high_water_bytes": max(m.inflight_high_water_bytes, budget_high, inflight),
        "max_inflight_bytes": m.shared_max_inflight_bytes,
        "batch_size_samples": m.batch_size,
        "page_cache_resident_bytes": mem.page_cache_bytes,
        "counted_rss_bytes": mem.counted_bytes,
        **{key: max((_number(x.get(key)) for x in unique.values()), default=0)
           for key in _MAX_READINGS},
        "elapsed_seconds": elapsed,
        "mix_sources": per_source,
        # present only when the sources autotune (mix(tune=True)): their settings, summed above
        **({"autotune_enabled": True}
           if any(x.get("autotune_enabled") for x in unique.values()) else {}),
    }
