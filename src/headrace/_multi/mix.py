"""``headrace.mix``: several loaders composed into one deterministic stream of their batches.

Each batch the mix delivers is one source's batch, unchanged. Which source comes next is decided by
smooth weighted round-robin over whole batches (``_mix_schedule``), mx8 1.0.7's scheduler, so the
same weights, seed and epoch give the same source sequence in both libraries.

What headrace does that mx8 1.0.7 does not:

* ``checkpoint()`` holds every source's own token next to the scheduler state, and ``resume=``
  puts every source back at its exact position (mx8 restores the scheduler only and leaves the
  sources wherever they happen to be);
* a resume with other weights, seed, epoch or source count is refused (mx8 accepts other weights);
* ``mix_normalized_weights`` is normalized (mx8 reports the raw weights under that name);
* the sources really share one byte budget: ``inflight=`` / ``constraints=`` (or the sum of the
  sources' own caps) becomes one ``ByteBudget`` that every source reserves from, so the mix's total
  inflight bytes can never exceed it.

The mix takes ownership of its sources: ``close()`` closes them.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from headrace._base.errors import CheckpointError, ConfigError, LoaderError
from headrace._engine.config import Constraints
from headrace._engine.shared_budget import BudgetShare, SharedBudget
from headrace._engine.timeline import TimelineMixin, timeline_period
from headrace._multi.mix_schedule import SmoothRoundRobin, exact_weights

__all__ = ["MixedLoader", "mix"]

logger = logging.getLogger("headrace.mix")

_POLICIES = {"error": "error", "drop": "drop", "allow": "drop", "restart": "restart"}
_TOKEN_HEADER = "headrace_checkpoint_v1"
_TOKEN_KIND = "mix_loader"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}
DEFAULT_SNAPSHOT_PERIOD_TICKS = 64
# The sources' counters and readings summed into the mix's own stats() (what its timeline and
# headrace.plot show); the cumulative ones are carried over when a source is rebuilt at restart.
_SUMMED_COUNTERS = ("gather_busy_seconds", "transform_busy_seconds", "budget_wait_seconds",
                    "ram_wait_seconds")
_SUMMED_READINGS = ("queue_depth", "batches_in_flight", "threads", "effective_max_queue_batches")
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


def _nbytes(value: Any) -> int:
    """Bytes held by a batch: arrays, Ragged (values + offsets), tensors, and containers of them."""
    if isinstance(value, Mapping):
        return sum(_nbytes(v) for v in value.values())
    if isinstance(value, tuple | list):
        return sum(_nbytes(v) for v in value)
    n = getattr(value, "nbytes", None)
    if isinstance(n, int):
        return n
    if hasattr(value, "element_size") and hasattr(value, "nelement"):  # torch.Tensor
        return int(value.element_size() * value.nelement())
    if isinstance(value, bytes | bytearray | memoryview):
        return len(value)
    return 0


def _nsamples(source: Any, batch: Any) -> int:
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


def _source_inflight(source: Any) -> int:
    try:
        return int(source.stats().get("inflight_bytes", 0))
    except Exception:  # a source without stats() simply reports nothing
        return 0


def _source_cap(source: Any) -> int | None:
    """The source's own inflight cap (``Loader.config.max_inflight_bytes``), if it has one."""
    cap = getattr(getattr(source, "config", None), "max_inflight_bytes", None)
    return cap if isinstance(cap, int) and cap > 0 else None


class MixedLoader(TimelineMixin):
    """Batches of several loaders in a smooth weighted round-robin order. Build with :func:`mix`.

    Attributes:
        sources: the source loaders (the mix owns them; ``close()`` closes them).
        weights: the requested weights, as given.
        seed, epoch: define the tie break of the schedule.
        budget: the byte budget every source reserves from (``None`` when the sources could not be
            rebound to one; ``stats()`` then reports the summed inflight bytes against the cap).
    """

    _timeline_kind = "mix"

    def __init__(self, sources: Sequence[Any], *, weights: Sequence[float] | None = None,
                 seed: int = 0, epoch: int = 0, starvation: int = 10000,
                 on_source_exhausted: str = "error", resume: bytes | None = None,
                 inflight: int | None = None, constraints: Constraints | None = None,
                 snapshot: bool | None = None, snapshot_period_ticks: int | None = None,
                 timeline: bool | float = False) -> None:
        timeline_s = timeline_period(timeline)
        sources = list(sources)
        if not sources:
            raise ConfigError("mix requires at least one loader instance")
        for i, s in enumerate(sources):
            if not hasattr(s, "__next__") or not callable(getattr(s, "checkpoint", None)):
                raise ConfigError(
                    f"mix source at index {i} is a {type(s).__name__}; mix requires loaders "
                    "(headrace.Loader / headrace.load / headrace.image ...) that have "
                    "__next__ and checkpoint()")
        if weights is None:
            weights = [1] * len(sources)
        self._int_weights = exact_weights(weights, count=len(sources))
        self.weights = [float(w) for w in weights]
        for name, value in (("seed", seed), ("epoch", epoch)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"mix {name} must be an int >= 0, got {value!r}")
        if isinstance(starvation, bool) or not isinstance(starvation, int) or starvation < 1:
            raise ConfigError(f"mix starvation must be an int >= 1 (scheduler ticks), got "
                              f"{starvation!r}")
        policy = _POLICIES.get(on_source_exhausted) if isinstance(on_source_exhausted, str) else None
        if policy is None:
            raise ConfigError(f"invalid on_source_exhausted={on_source_exhausted!r} "
                              "(expected: error|drop|restart; mx8's 'allow' means drop)")
        sizes = {getattr(s, "batch_size", None) for s in sources} - {None}
        if len(sizes) > 1:
            raise ConfigError(f"mix requires all loaders to have identical batch sizes, got "
                              f"{[getattr(s, 'batch_size', None) for s in sources]}; weights count "
                              "batches, so equal batch sizes keep them sample proportions")
        self.batch_size = sizes.pop() if sizes else None
        self.seed, self.epoch, self.starvation, self.policy = seed, epoch, starvation, policy
        env_enabled, env_period = snapshot_settings()
        self.snapshot_enabled = env_enabled if snapshot is None else bool(snapshot)
        self.snapshot_period_ticks = env_period if snapshot_period_ticks is None \
            else int(snapshot_period_ticks)
        if self.snapshot_period_ticks < 1:
            raise ConfigError(f"snapshot_period_ticks must be >= 1, got {snapshot_period_ticks}")
        n = len(sources)
        self._sched = SmoothRoundRobin(self._int_weights, tie_break_offset=(seed + epoch) % n)
        self._lock = threading.Lock()
        self._closed = False
        self._finished = False
        self._started = time.monotonic()
        self.delivered_batches = [0] * n
        self.delivered_samples = [0] * n
        self.delivered_bytes = [0] * n
        self.starvation_total = [0] * n
        self.exhausted_total = [0] * n
        self.restarts = [0] * n
        self.wait_seconds = [0.0] * n
        self.steps_since_emit = [0] * n
        self.snapshot_emitted_total = 0
        self.violation_total = 0
        self.inflight_high_water_bytes = 0
        self.last_source: int | None = None
        self._retired = dict.fromkeys(_SUMMED_COUNTERS, 0.0)  # of sources rebuilt at restart

        # One budget for all: an explicit cap, else the sum of the sources' own caps.
        cap = inflight if inflight is not None else (
            constraints.max_inflight_bytes if constraints is not None else None)
        if cap is None:
            caps = [_source_cap(s) for s in sources]
            cap = sum(c for c in caps if c is not None) if all(c is not None for c in caps) else None
        self.shared_max_inflight_bytes = cap
        self.budget: SharedBudget | None = None
        self._shares: list[BudgetShare | None] = [None] * n
        self.source_epochs: list[int | None] = [None] * n  # set once a source restarts
        if cap is not None and all(callable(getattr(s, "_reopen", None)) for s in sources):
            sources = self._share_budget(sources, int(cap))
        self.sources: list[Any] = sources
        if resume is not None:
            self._restore(resume)
        self._start_timeline(timeline_s)

    def _share_budget(self, sources: list[Any], cap: int) -> list[Any]:
        """Rebuild every source on a share of one ``SharedBudget`` of ``cap`` bytes.

        Each share reserves at least one batch of its source (so every source can always deliver
        its next batch, whatever the others hold) and normally ``cap / (2 n)``; the rest is pooled.
        """
        n = len(sources)
        unique: dict[int, Any] = {id(s): s for s in sources}
        needs = {key: _first_batch_bytes(s) for key, s in unique.items()}
        floor = cap // (2 * len(unique))
        reserves = {key: max(need, floor) for key, need in needs.items()}
        if sum(reserves.values()) > cap:
            reserves = dict(needs)
        if sum(reserves.values()) > cap:
            raise ConfigError(
                f"mix shared inflight cap {cap} bytes is smaller than one batch of every source "
                f"together ({sum(needs.values())} bytes: {list(needs.values())}); raise inflight "
                f"to at least {sum(needs.values())} bytes (better {2 * sum(needs.values())})")
        shared = SharedBudget(cap)
        rebuilt: dict[int, Any] = {}
        shares: dict[int, BudgetShare] = {}
        for key in unique:  # every reserve first: the pool must not shrink under a running loader
            shares[key] = shared.share(reserves[key])
        for key, s in unique.items():
            rebuilt[key] = s._reopen(budget=shares[key])
        self.budget = shared
        self._shares = [shares[id(s)] for s in sources]
        out = [rebuilt[id(s)] for s in sources]
        assert len(out) == n
        return out

    def _reopen(self, idx: int, **overrides: Any) -> None:
        """Rebuild source ``idx`` (and any other slot holding the same loader object)."""
        old = self.sources[idx]
        hook = getattr(old, "_reopen", None)
        if not callable(hook):
            raise ConfigError(f"mix cannot rebuild a {type(old).__name__} source (it has no "
                              "_reopen); use headrace.Loader / headrace.load sources")
        share = self._shares[idx]
        if share is not None:
            overrides["budget"] = share.renew()
        new = hook(**overrides)
        for j, s in enumerate(self.sources):
            if s is old:
                self.sources[j] = new
                if share is not None:
                    self._shares[j] = overrides["budget"]

    # -- iteration -----------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        with self._lock:
            if self._closed or self._finished:
                raise StopIteration
            while True:
                if not self._sched.any_active:
                    self._finished = True
                    self._end_timeline()
                    raise StopIteration
                idx = self._sched.pick()
                source = self.sources[idx]
                t0 = time.monotonic()
                try:
                    batch = next(source)
                except StopIteration:
                    self.wait_seconds[idx] += time.monotonic() - t0
                    self._exhausted(idx)
                    continue
                self.wait_seconds[idx] += time.monotonic() - t0
                self._deliver(idx, source, batch)
                self._tick_timeline()
                return batch

    def _exhausted(self, idx: int) -> None:
        self.exhausted_total[idx] += 1
        if self.policy == "error":
            self._finished = True
            raise LoaderError(
                f"mix source exhausted (source_idx={idx}, policy=error, "
                f"schedule_ticks={self._sched.ticks}, delivered_samples={sum(self.delivered_samples)})"
                "; pass on_source_exhausted='drop' to continue with the other sources or "
                "'restart' to start the source's next epoch")
        if self.policy == "drop":
            self._sched.deactivate(idx)
            logger.info("mix source %d exhausted after %d batches; dropped (%d still active)",
                        idx, self.delivered_batches[idx], sum(self._sched.active))
            return
        old = self.sources[idx]
        next_epoch = int(getattr(old, "epoch", 0))
        try:
            done = old.stats()
        except Exception:  # a stats-less source reports nothing
            done = {}
        for key in _SUMMED_COUNTERS:  # the rebuilt source counts from zero again
            value = done.get(key)
            self._retired[key] += float(value) if isinstance(value, int | float) else 0.0
        try:
            self._reopen(idx, epoch=next_epoch, resume=None)
        except ConfigError as e:
            self._finished = True
            e.add_note("on_source_exhausted='restart' rebuilds the source at its next epoch; use "
                       "an endless loader (epochs=None) or on_source_exhausted='drop' instead")
            raise
        self.restarts[idx] += 1
        for j, s in enumerate(self.sources):
            if s is self.sources[idx]:
                self.source_epochs[j] = next_epoch
        logger.info("mix source %d exhausted; restarted at epoch %d", idx, next_epoch)
        try:
            empty = len(self.sources[idx]) == 0
        except TypeError:
            empty = False
        if empty:  # restarting an empty source would spin forever
            self._finished = True
            raise LoaderError(f"mix source {idx} has no batches even after a restart; "
                              "use on_source_exhausted='drop'")

    def _deliver(self, idx: int, source: Any, batch: Any) -> None:
        self._sched.commit(idx)
        self.last_source = idx
        self.delivered_batches[idx] += 1
        self.delivered_samples[idx] += _nsamples(source, batch)
        self.delivered_bytes[idx] += _nbytes(batch)
        for i in range(len(self.sources)):
            if i == idx or not self._sched.active[i]:
                self.steps_since_emit[i] = 0 if i == idx else self.steps_since_emit[i]
                continue
            self.steps_since_emit[i] += 1
            if self.steps_since_emit[i] % self.starvation == 0:
                self.starvation_total[i] += 1
        # With a shared budget this is one read; without one it asks every source's stats(), so
        # sample it every 16 ticks only.
        if self.budget is not None or self._sched.ticks % 16 == 0:
            total = self.total_inflight_bytes()
            self.inflight_high_water_bytes = max(self.inflight_high_water_bytes, total)
            cap = self.shared_max_inflight_bytes
            if cap is not None and total > cap:
                self.violation_total += 1
        if self.snapshot_enabled and self._sched.ticks % self.snapshot_period_ticks == 0:
            self.snapshot_emitted_total += 1
            logger.info("mix_snapshot %s", json.dumps(self._snapshot(), sort_keys=True))

    # -- state ---------------------------------------------------------------------------------

    @property
    def last_ids(self) -> Any:
        """Record ids of the batch last delivered (from its source)."""
        if self.last_source is None:
            return None
        return getattr(self.sources[self.last_source], "last_ids", None)

    def total_inflight_bytes(self) -> int:
        """Bytes reserved right now by all sources together."""
        if self.budget is not None:
            return self.budget.used_bytes
        seen: set[int] = set()
        total = 0
        for s in self.sources:
            if id(s) not in seen:
                seen.add(id(s))
                total += _source_inflight(s)
        return total

    def _snapshot(self) -> dict[str, Any]:
        return {"event": "mix_snapshot", "schedule_ticks": self._sched.ticks,
                "active": [int(a) for a in self._sched.active],
                "delivered_batches": list(self.delivered_batches),
                "delivered_samples": list(self.delivered_samples),
                "realized_ratio": self._realized(), "normalized_weights": self._normalized(),
                "starvation_total": list(self.starvation_total),
                "total_inflight_bytes": self.total_inflight_bytes()}

    def _normalized(self) -> list[float]:
        total = sum(self._int_weights)
        return [w / total for w in self._int_weights]

    def _realized(self) -> list[float]:
        total = sum(self.delivered_batches)
        return [b / total if total else 0.0 for b in self.delivered_batches]

    def stats(self) -> dict[str, Any]:
        """Counters, with mx8 1.0.7's key names where they mean the same thing.

        ``mix_realized_ratio`` (per source, by batches) against ``mix_normalized_weights`` says
        whether the schedule is being followed; ``mix_source_wait_seconds_total`` says which source
        the mix waits on (a slow source: give it more threads); ``mix_source_starvation_total``
        counts a source going ``starvation`` ticks without being picked (a tiny weight).
        """
        from headrace._engine.stats import sample_memory

        normalized, realized = self._normalized(), self._realized()
        per_source = []
        unique: dict[int, Mapping[str, Any]] = {}  # a loader in several slots counts once
        for i, s in enumerate(self.sources):
            try:
                metrics = s.stats()
            except Exception:  # a closed or stats-less source reports nothing
                metrics = {}
            unique.setdefault(id(s), metrics)
            per_source.append({
                "source_idx": i, "active": self._sched.active[i],
                "source_weight": self.weights[i],
                "source_weight_normalized": normalized[i],
                "source_realized_ratio": realized[i],
                "source_delivered_batches_total": self.delivered_batches[i],
                "source_delivered_samples_total": self.delivered_samples[i],
                "source_delivered_bytes_total": self.delivered_bytes[i],
                "source_starvation_total": self.starvation_total[i],
                "source_exhausted_total": self.exhausted_total[i],
                "source_restarts_total": self.restarts[i],
                "source_wait_seconds_total": self.wait_seconds[i],
                "batch_size_samples": getattr(s, "batch_size", None),
                "max_inflight_bytes": _source_cap(s),
                "metrics": metrics,
            })
        elapsed = time.monotonic() - self._started
        caps = [m.get("max_process_rss_bytes") for m in (p["metrics"] for p in per_source)]
        status = ("CLOSED" if self._closed else "DONE" if self._finished
                  else "RUNNING" if self._sched.ticks else "WARMING")
        mem = sample_memory()
        inflight = self.total_inflight_bytes()
        high = max(self.inflight_high_water_bytes,
                   self.budget.high_water_bytes if self.budget is not None else 0, inflight)
        summed = {key: self._retired.get(key, 0) + sum(_number(m.get(key)) for m in unique.values())
                  for key in (*_SUMMED_COUNTERS, *_SUMMED_READINGS)}
        for key in ("threads", "queue_depth", "batches_in_flight", "effective_max_queue_batches"):
            summed[key] = int(summed[key])
        return {
            "status": status, "mode": "mixed",
            "seed": self.seed, "epoch": self.epoch,
            "samples_per_second": sum(self.delivered_samples) / elapsed if elapsed else 0.0,
            "bytes_per_second": sum(self.delivered_bytes) / elapsed if elapsed else 0.0,
            "consumer_wait_seconds": sum(self.wait_seconds),
            "max_process_rss_bytes": max((c for c in caps if isinstance(c, int)), default=0),
            "delivered_batches_total": sum(self.delivered_batches),
            "delivered_samples_total": sum(self.delivered_samples),
            "delivered_bytes_total": sum(self.delivered_bytes),
            "mix_schedule_ticks": self._sched.ticks,
            "mix_snapshot_enabled": self.snapshot_enabled,
            "mix_snapshot_period_ticks": self.snapshot_period_ticks,
            "mix_snapshot_emitted_total": self.snapshot_emitted_total,
            "active_sources": sum(self._sched.active),
            "mix_source_delivered_batches_total": list(self.delivered_batches),
            "mix_source_delivered_samples_total": list(self.delivered_samples),
            "mix_source_delivered_bytes_total": list(self.delivered_bytes),
            "mix_source_starvation_total": list(self.starvation_total),
            "mix_source_exhausted_total": list(self.exhausted_total),
            "mix_source_restarts_total": list(self.restarts),
            "mix_source_wait_seconds_total": list(self.wait_seconds),
            "mix_requested_weights": list(self.weights),
            "mix_normalized_weights": normalized,
            "mix_realized_ratio": realized,
            "mix_source_exhaustion_policy": self.policy,
            "mix_starvation_threshold_ticks": self.starvation,
            "mix_total_inflight_bytes": inflight,
            "mix_inflight_high_water_bytes": max(
                self.inflight_high_water_bytes,
                self.budget.high_water_bytes if self.budget is not None else 0),
            "mix_shared_max_inflight_bytes": self.shared_max_inflight_bytes,
            "mix_shared_budget": self.budget is not None,
            "mix_shared_inflight_violation_total": self.violation_total,
            "mix_resume_source_checkpoint_mismatch_total": 0,
            "process_rss_bytes": mem.rss_bytes,
            # The sources together, under a single loader's key names (the timeline, the plot).
            **summed,
            "inflight_bytes": inflight,
            "inflight_high_water_bytes": high,
            "max_inflight_bytes": self.shared_max_inflight_bytes,
            "batch_size_samples": self.batch_size,
            "page_cache_resident_bytes": mem.page_cache_bytes,
            "counted_rss_bytes": mem.counted_bytes,
            **{key: max((_number(m.get(key)) for m in unique.values()), default=0)
               for key in _MAX_READINGS},
            "elapsed_seconds": elapsed,
            "mix_sources": per_source,
        }

    def print_stats(self) -> None:
        """One line on stderr: batches and realized proportions per source."""
        import sys

        parts = " ".join(f"{i}:{b}({r:.3f}/{w:.3f})" for i, (b, r, w) in enumerate(
            zip(self.delivered_batches, self._realized(), self._normalized(), strict=True)))
        print(f"[headrace.mix] ticks={self._sched.ticks} sources {parts}", file=sys.stderr)

    def checkpoint(self) -> bytes:
        """A token that restores the scheduler and every source's exact position."""
        with self._lock:
            tokens = []
            for s in self.sources:
                tok = s.checkpoint()
                if not isinstance(tok, bytes | bytearray):
                    raise CheckpointError(f"mix source {type(s).__name__}.checkpoint() returned "
                                          f"{type(tok).__name__}, expected bytes")
                tokens.append(bytes(tok).hex())
            sched = self._sched

            def ints(values: Sequence[int]) -> str:
                return ",".join(str(int(v)) for v in values)

            lines = [
                _TOKEN_HEADER, f"kind={_TOKEN_KIND}", f"seed={self.seed}", f"epoch={self.epoch}",
                f"source_count={len(self.sources)}", f"weights={ints(self._int_weights)}",
                f"policy={self.policy}", f"schedule_ticks={sched.ticks}",
                f"snapshot_emitted_total={self.snapshot_emitted_total}",
                f"active={ints(sched.active)}",
                f"delivered_batches={ints(self.delivered_batches)}",
                f"delivered_samples={ints(self.delivered_samples)}",
                f"delivered_bytes={ints(self.delivered_bytes)}",
                f"starvation_total={ints(self.starvation_total)}",
                f"source_exhausted_total={ints(self.exhausted_total)}",
                f"source_restarts={ints(self.restarts)}",
                "source_epochs=" + ",".join("-" if e is None else str(e)
                                            for e in self.source_epochs),
                f"steps_since_emit={ints(self.steps_since_emit)}",
                f"scheduler_current={ints(sched.current)}",
                f"scheduler_tie_break_offset={sched.tie_break_offset}",
                f"source_checkpoints={';'.join(tokens)}",
            ]
            return ("\n".join(lines) + "\n").encode("ascii")

    def _restore(self, token: bytes) -> None:
        fields = parse_token(token)
        n = len(self.sources)

        def need(key: str, current: Any) -> None:
            if fields.get(key) != str(current):
                raise CheckpointError(f"resume {key} mismatch: token={fields.get(key)} "
                                      f"current={current}; build the mix with the same {key}")

        need("seed", self.seed)
        need("epoch", self.epoch)
        need("source_count", n)
        weights = ",".join(str(w) for w in self._int_weights)
        if fields.get("weights") != weights:
            raise CheckpointError(
                f"resume weights mismatch: token={fields.get('weights')} current={weights} "
                "(as exact integer ratios); a changed weight would silently skew the schedule, "
                "so resume with the weights the checkpoint was taken with")

        def ints(key: str) -> list[int]:
            try:
                values = [int(v) for v in fields[key].split(",")]
            except (KeyError, ValueError):
                raise CheckpointError(f"mix checkpoint field {key!r} is missing or malformed") \
                    from None
            if len(values) != n:
                raise CheckpointError(f"mix checkpoint field {key!r} has {len(values)} values "
                                      f"for {n} sources")
            return values

        tokens = fields.get("source_checkpoints", "").split(";")
        if len(tokens) != n:
            raise CheckpointError(f"mix checkpoint holds {len(tokens)} source tokens for {n} "
                                  "sources")
        restarts = ints("source_restarts")
        epochs_raw = fields.get("source_epochs", ",".join("-" * n)).split(",")
        if len(epochs_raw) != n:
            raise CheckpointError(f"mix checkpoint field 'source_epochs' has {len(epochs_raw)} "
                                  f"values for {n} sources")
        done: set[int] = set()
        for i in range(n):
            try:
                raw = bytes.fromhex(tokens[i])
                source_epoch = None if epochs_raw[i] == "-" else int(epochs_raw[i])
            except ValueError:
                raise CheckpointError(f"mix checkpoint source {i} is malformed") from None
            if id(self.sources[i]) in done:
                continue
            overrides: dict[str, Any] = {"resume": raw}
            if source_epoch is not None:
                overrides["epoch"] = source_epoch
            try:
                self._reopen(i, **overrides)
            except ConfigError as e:
                raise CheckpointError(f"mix cannot put source {i} back at its checkpoint: {e}") \
                    from e
            done.add(id(self.sources[i]))
            self.source_epochs[i] = source_epoch
        sched = self._sched
        sched.current = ints("scheduler_current")
        sched.active = [bool(v) for v in ints("active")]
        sched.ticks = int(fields.get("schedule_ticks", "0"))
        self.delivered_batches = ints("delivered_batches")
        self.delivered_samples = ints("delivered_samples")
        self.delivered_bytes = ints("delivered_bytes")
        self.starvation_total = ints("starvation_total")
        self.exhausted_total = ints("source_exhausted_total")
        self.restarts = restarts
        self.steps_since_emit = ints("steps_since_emit")
        self.snapshot_emitted_total = int(fields.get("snapshot_emitted_total", "0"))

    # -- lifecycle -----------------------------------------------------------------------------

    def close(self) -> None:
        """Close every source (idempotent)."""
        if self._closed:
            return
        self._closed = True
        seen: set[int] = set()
        for s in self.sources:
            if id(s) in seen:
                continue
            seen.add(id(s))
            close = getattr(s, "close", None)
            if callable(close):
                close()

    def __enter__(self) -> MixedLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def parse_token(token: bytes) -> dict[str, str]:
    """Split a mix checkpoint token into its ``key=value`` fields (validates header and kind)."""
    if isinstance(token, str):
        raise CheckpointError("resume must be the bytes returned by checkpoint(), got str; "
                              "pass token.encode() if you stored it as text")
    if not isinstance(token, bytes | bytearray) or not token:
        raise CheckpointError("empty checkpoint token" if not token else
                              f"resume must be bytes, got {type(token).__name__}")
    try:
        lines = bytes(token).decode("ascii").splitlines()
    except UnicodeDecodeError:
        raise CheckpointError("unsupported checkpoint token format (not a headrace mix token)") \
            from None
    if not lines or lines[0] != _TOKEN_HEADER:
        raise CheckpointError("unsupported checkpoint token format (not a headrace mix token)")
    fields = dict(line.split("=", 1) for line in lines[1:] if "=" in line)
    if fields.get("kind") != _TOKEN_KIND:
        raise CheckpointError(f"unsupported checkpoint kind {fields.get('kind')} "
                              f"(this is a {_TOKEN_KIND})")
    return fields


def _first_batch_bytes(source: Any) -> int:
    """Bytes of one batch of a loader's source (its first ``batch_size`` records)."""
    import numpy as np

    src = getattr(source, "source", None)
    batch = int(getattr(source, "batch_size", 1))
    try:
        count = min(batch, len(src))  # type: ignore[arg-type]
        return max(1, int(src.nbytes(np.arange(count, dtype=np.int64))))  # type: ignore[union-attr]
    except Exception:  # no sized source to ask: the share floor applies
        return 1


def mix(sources: Sequence[Any], *, weights: Sequence[float] | None = None, seed: int = 0,
        epoch: int = 0, starvation: int = 10000, on_source_exhausted: str = "error",
        resume: bytes | None = None, inflight: int | None = None, ram_gb: float | None = None,
        constraints: Constraints | None = None, snapshot: bool | None = None,
        snapshot_period_ticks: int | None = None, job: str | None = None,
        coord: str | None = None, profile: str | None = None, tune: bool | None = None,
        runtime: Any = None, timeline: bool | float = False) -> MixedLoader:
    """Compose loaders into one deterministic stream of their batches.

    Args:
        sources: loaders (``headrace.Loader``, ``headrace.load(...)``, ...) with one batch size.
        weights: sampling proportions per source, positive and finite; only ratios matter
            (``[0.7, 0.3]`` is ``[7, 3]``). Default: equal.
        seed, epoch: the schedule's tie break starts at ``(seed + epoch) mod len(sources)``.
        starvation: ticks a source may go unpicked before ``mix_source_starvation_total`` counts it.
        on_source_exhausted: ``"error"`` (raise ``LoaderError`` when any source ends), ``"drop"``
            (mx8's ``"allow"``: continue with the others until all end) or ``"restart"`` (start that
            source's next epoch and continue; the mix then never ends).
        resume: a token from ``MixedLoader.checkpoint()``; every source is put back where it was.
        inflight: the shared cap in bytes on batches being built or waiting in all sources
            together (default: the sum of the sources' own caps). ``constraints.max_inflight_bytes``
            is the same knob. ``ram_gb`` caps the shared budget to that many GiB too.
        snapshot, snapshot_period_ticks: log a ``mix_snapshot`` event on logger ``headrace.mix``
            every that many ticks (default from ``HEADRACE_MIX_SNAPSHOT`` /
            ``HEADRACE_MIX_SNAPSHOT_PERIOD_TICKS``, or the ``MX8_`` spellings; period 64).
        job, coord, profile, tune, runtime: accepted for mx8 compatibility. headrace needs no
            coordinator; the sources keep their own profiles and tuning.
        timeline: record a stats timeline of the mix (``True``: a snapshot every 0.5 s; a
            number: the period in seconds) for ``stats_timeline()`` and ``headrace.plot``: the
            sources' queues, bytes in flight against the shared cap, busy and wait time, summed.

    Returns:
        A :class:`MixedLoader`.
    """
    if job is not None or coord is not None:
        warnings.warn("mix(job=, coord=) are ignored: headrace needs no coordinator (rank and "
                      "world size come from the launcher)", UserWarning, stacklevel=2)
    if runtime is not None and getattr(runtime, "want", None) not in (None, 1):
        raise ConfigError("mix runtime.want is unsupported (the mix reads its sources' batches)")
    del profile, tune  # the sources already carry their own profile and tuning
    if ram_gb is not None:
        from headrace._engine.config import ram_gb_to_bytes

        ram_cap = ram_gb_to_bytes(ram_gb)
        inflight = ram_cap if inflight is None else min(inflight, ram_cap)
    return MixedLoader(sources, weights=weights, seed=seed, epoch=epoch, starvation=starvation,
                       on_source_exhausted=on_source_exhausted, resume=resume, inflight=inflight,
                       constraints=constraints, snapshot=snapshot,
                       snapshot_period_ticks=snapshot_period_ticks, timeline=timeline)
