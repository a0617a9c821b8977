"""``headrace.mix``: several loaders composed into one deterministic stream of their batches.

Each batch the mix delivers is one source's batch, unchanged. Which source comes next is decided by
smooth weighted round-robin over whole batches (``_mix_schedule``), mx8 1.0.7's scheduler, so the
same weights, seed and epoch give the same source sequence in both libraries. A source is any
headrace loader (``Loader``, ``load``, ``image``, ``text``, ``audio``, ``video``, the loaderx-style
``DataLoader``, ``DistributedDataLoader``, another mix): the mix uses only the contract they all
share (``next``, ``state_dict`` / ``load_state_dict``, ``set_epoch``, ``stats``, ``close``).

What headrace does that mx8 1.0.7 does not:

* ``checkpoint()`` holds every source's own state next to the scheduler state (one token format
  for loaders and mixes, ``_multi.mix_state``), and ``resume=`` / ``load_state_dict`` put every
  source back at its exact position, in place (mx8 restores the scheduler only and leaves the
  sources wherever they happen to be);
* a resume with other weights, seed or source count is refused (mx8 accepts other weights);
* ``mix_normalized_weights`` is normalized (mx8 reports the raw weights under that name);
* the sources really share one byte budget: ``inflight=`` / ``constraints=`` (or the sum of the
  sources' own caps) becomes one ``SharedBudget`` that every source reserves from, in place of its
  own cap, so the mix's total inflight bytes can never exceed it.

The mix takes ownership of its sources: ``close()`` closes them.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from headrace._base.errors import CheckpointError, ConfigError, LoaderError
from headrace._engine import checkpoint as _checkpoint
from headrace._engine.config import Constraints
from headrace._engine.keywords import checked
from headrace._engine.shared_budget import SharedBudget, split
from headrace._engine.timeline import TimelineMixin, timeline_period
from headrace._multi import mix_state
from headrace._multi.mix_schedule import SmoothRoundRobin, exact_weights
from headrace._multi.mix_stats import (
    SUMMED_COUNTERS,
    batch_nbytes,
    batch_samples,
    mix_stats,
    snapshot_settings,
    source_cap,
)

__all__ = ["MixedLoader", "mix", "snapshot_settings"]

logger = logging.getLogger("headrace.mix")

_POLICIES = {"error": "error", "drop": "drop", "allow": "drop", "restart": "restart"}
_CONTRACT = ("__next__", "state_dict", "load_state_dict", "stats")


class MixedLoader(TimelineMixin):
    """Batches of several loaders in a smooth weighted round-robin order. Build with :func:`mix`.

    Attributes:
        sources: the source loaders, one per slot (the mix owns them; ``close()`` closes them).
        weights: the requested weights, as given.
        seed, epoch: define the tie break of the schedule.
        budget: the byte budget every source reserves from (``None`` without a cap: each source
            keeps its own, and ``stats()`` reports their inflight bytes summed).
    """

    _timeline_kind = "mix"

    def __init__(self, sources: Sequence[Any], *, weights: Sequence[float] | None = None,
                 seed: int = 0, epoch: int = 0, starvation: int = 10000,
                 on_source_exhausted: str = "error", resume: Any = None,
                 inflight: int | None = None, constraints: Constraints | None = None,
                 snapshot: bool | None = None, snapshot_period_ticks: int | None = None,
                 timeline: bool | float = False) -> None:
        timeline_s = timeline_period(timeline)
        sources = list(sources)
        if not sources:
            raise ConfigError("mix requires at least one loader instance")
        policy = _POLICIES.get(on_source_exhausted) if isinstance(on_source_exhausted, str) else None
        if policy is None:
            raise ConfigError(f"invalid on_source_exhausted={on_source_exhausted!r} "
                              "(expected: error|drop|restart; mx8's 'allow' means drop)")
        contract = _CONTRACT + (("set_epoch",) if policy == "restart" else ())
        for i, s in enumerate(sources):
            missing = [m for m in contract if not callable(getattr(s, m, None))]
            if missing:
                raise ConfigError(
                    f"mix source at index {i} is a {type(s).__name__} without {missing}; mix "
                    "reads headrace loaders (headrace.Loader, load, image, text, audio, video, "
                    "DataLoader, DistributedDataLoader, mix)")
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
        sizes = {getattr(s, "batch_size", None) for s in sources} - {None}
        if len(sizes) > 1:
            raise ConfigError(f"mix requires all loaders to have identical batch sizes, got "
                              f"{[getattr(s, 'batch_size', None) for s in sources]}; weights count "
                              "batches, so equal batch sizes keep them sample proportions")
        self.batch_size = sizes.pop() if sizes else None
        self.seed, self._epoch, self.starvation, self.policy = seed, epoch, starvation, policy
        env_enabled, env_period = snapshot_settings()
        self.snapshot_enabled = env_enabled if snapshot is None else bool(snapshot)
        self.snapshot_period_ticks = env_period if snapshot_period_ticks is None \
            else int(snapshot_period_ticks)
        if self.snapshot_period_ticks < 1:
            raise ConfigError(f"snapshot_period_ticks must be >= 1, got {snapshot_period_ticks}")
        n = len(sources)
        self.sources: list[Any] = sources
        # A loader given in several slots is one loader: restored, restarted and closed once.
        index: dict[int, int] = {}
        self._slot = [index.setdefault(id(s), len(index)) for s in sources]
        self._unique: list[Any] = list({id(s): s for s in sources}.values())
        self._sched = SmoothRoundRobin(self._int_weights, tie_break_offset=(seed + epoch) % n)
        self._lock = threading.Lock()
        self._closed = False
        self._finished = False
        self._failed: str | None = None
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
        # counters of the sources that restart dropped (a restarted engine counts from zero)
        self.retired = dict.fromkeys(SUMMED_COUNTERS, 0.0)
        self._restarted_empty = [False] * len(self._unique)  # restarted, nothing delivered since
        self._upstream: tuple[Any, int] | None = None  # (outer mix's share, bytes held), see below
        # The epoch the mix last rewound each source to (None: never). A token at the very end
        # of an epoch reads "finished that epoch" or "at the start of the next" depending on the
        # epochs the source was set to read, so a restore first puts the source at this epoch.
        self._source_epochs: list[int | None] = [None] * len(self._unique)

        cap = inflight if inflight is not None else (
            constraints.max_inflight_bytes if constraints is not None else None)
        explicit = cap is not None
        if cap is None:  # the sources' own caps together
            caps = [source_cap(s) for s in self._unique]
            cap = sum(c for c in caps if c is not None) if None not in caps else None
        self.shared_max_inflight_bytes = cap
        self.budget: SharedBudget | None = None
        if cap is not None:
            self._share_budget(int(cap), explicit=explicit)
        if resume is not None:
            self.load_state_dict(resume)
        self._start_timeline(timeline_s)

    def _share_budget(self, cap: int, *, explicit: bool) -> None:
        """Move every source onto its share of one ``SharedBudget`` of ``cap`` bytes, in place."""
        unable = [i for i, s in enumerate(self.sources)
                  if not callable(getattr(s, "_use_budget", None))
                  or not callable(getattr(s, "_batch_need", None))]
        if unable:
            if explicit:
                i = unable[0]
                raise ConfigError(
                    f"mix inflight={cap} cannot cap source {i} (a "
                    f"{type(self.sources[i]).__name__}): it cannot reserve from a shared byte "
                    "budget; leave inflight unset (each source keeps its own cap) or mix "
                    "headrace loaders")
            return
        shares = split(cap, [int(s._batch_need()) for s in self._unique])
        for s, share in zip(self._unique, shares, strict=True):
            s._use_budget(share)
        self.budget = shares[0].parent

    def _enable_tune(self) -> None:
        """Autotune every source (this mix is the source of an outer ``mix(tune=True)``)."""
        _tune_sources(self._unique)

    def _batch_need(self) -> int:
        """Bytes one batch of every source reserves together: what this mix, as a source of
        another mix, needs guaranteed so that each of its sources can deliver its next batch."""
        missing = [i for i, s in enumerate(self.sources)
                   if not callable(getattr(s, "_batch_need", None))]
        if missing:
            return 0  # _use_budget names the source that cannot share
        return sum(int(s._batch_need()) for s in self._unique)

    def _use_budget(self, budget: Any) -> None:
        """Reserve from ``budget`` (this mix's share of an outer mix's budget), in place.

        The share's guaranteed reserve is taken as one block, held until ``close()``, and split
        among this mix's own sources as its shared budget: every source keeps a guaranteed part
        of it (so the inner schedule cannot deadlock either), and the outer budget counts the
        whole block as in use.
        """
        cap = int(getattr(budget, "reserve_bytes", budget.cap_bytes))
        if not budget.acquire(cap, timeout_s=0.0):
            raise ConfigError(f"a mix used as a source could not take its {cap}-byte share of "
                              "the outer mix's budget; give the outer mix a larger inflight cap")
        try:
            self._share_budget(cap, explicit=True)
        except BaseException:
            budget.release(cap)
            raise
        self._release_upstream()
        self._upstream = (budget, cap)
        self.shared_max_inflight_bytes = cap

    def _release_upstream(self) -> None:
        upstream, self._upstream = getattr(self, "_upstream", None), None
        if upstream is not None:
            upstream[0].release(upstream[1])

    @property
    def epoch(self) -> int:
        """The epoch of the next batch: the mix's ``epoch``, and the one after it once every
        source was read to its end (as a loader's), so a mix restarted as a source of another
        mix reads its next epoch."""
        return self._epoch + 1 if self._finished and self._failed is None else self._epoch

    # -- iteration -----------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        """The mix itself; once it has ended a new pass raises ``LoaderError`` (never an empty
        one): ``set_epoch(e)`` rewinds it. A ``for`` over a mix part-way through continues."""
        if self._closed or self._finished or self._failed is not None:
            raise LoaderError(self._why_over())
        return self

    def _why_over(self) -> str:
        if self._closed:
            return ("this mix is closed; build a new one (resume=mixed.checkpoint() continues "
                    "after the last delivered batch)")
        if self._failed is not None:
            return (f"this mix stopped at an error ({self._failed}); call mixed.set_epoch(E) to "
                    "read from epoch E again, or build a new one (resume=mixed.checkpoint() "
                    "continues after the last delivered batch)")
        return (f"this mix has delivered every batch of its sources (epoch {self._epoch}); call "
                "mixed.set_epoch(E) to read epoch E again, or pass "
                "on_source_exhausted='restart' for a mix that never ends")

    def __next__(self) -> Any:
        with self._lock:
            if self._closed or self._finished or self._failed is not None:
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
                except BaseException as e:
                    self._failed = f"{type(e).__name__} from source {idx}"
                    raise
                self.wait_seconds[idx] += time.monotonic() - t0
                self._restarted_empty[self._slot[idx]] = False
                self._deliver(idx, source, batch)
                self._tick_timeline()
                return batch

    def _exhausted(self, idx: int) -> None:
        self.exhausted_total[idx] += 1
        if self.policy == "error":
            if self._all_ended_with(idx):
                return  # every source read to its end: the mix's natural end, not an error
            self._failed = f"source {idx} exhausted"
            raise LoaderError(
                f"mix source exhausted (source_idx={idx}, policy=error, "
                f"schedule_ticks={self._sched.ticks}, delivered_samples={self.delivered_samples[idx]})"
                "; pass on_source_exhausted='drop' to continue with the other sources or "
                "'restart' to start the source's next epoch")
        if self.policy == "drop":
            # mx8 credits the tick that found the source exhausted before dropping it, so the
            # others' credits (and the rest of the schedule) are mx8's
            self._sched.commit(idx, count=False)
            self._sched.deactivate(idx)
            logger.info("mix source %d exhausted after %d batches; dropped (%d still active)",
                        idx, self.delivered_batches[idx], sum(self._sched.active))
            return
        u = self._slot[idx]
        source = self._unique[u]
        # the epoch after those the finished source read: its token's (a finished loader's
        # ``epoch`` names the last epoch it read; a mix's names the one after)
        epoch = int(source.epoch) if isinstance(source, MixedLoader) else \
            int(source.state_dict()["epoch"])
        if self._restarted_empty[u]:  # restarting it again would spin forever
            self._failed = f"source {idx} has nothing to yield"
            raise LoaderError(
                f"mix source {idx} ({type(source).__name__}) has no batch to yield even after a "
                f"restart at epoch {epoch} (no records, or every record failed to decode); fix "
                "that source or use on_source_exhausted='drop'")
        self._restart(u, lambda: source.set_epoch(epoch))
        self._source_epochs[u] = epoch
        self._restarted_empty[u] = True
        self.restarts[idx] += 1
        logger.info("mix source %d exhausted; restarted at epoch %d", idx, epoch)

    def _all_ended_with(self, idx: int) -> bool:
        """Under ``"error"``: whether every other active source has ended too (each is asked
        for one more batch; one that still has a batch means the mixture would have run on
        without ``idx``, the error's case). If all have ended, all are deactivated."""
        seen = {self._slot[idx]}
        for j, source in enumerate(self.sources):
            if not self._sched.active[j] or self._slot[j] in seen:
                continue
            seen.add(self._slot[j])
            try:
                next(source)
            except StopIteration:
                self.exhausted_total[j] += 1
                continue
            return False
        for j in range(len(self.sources)):
            self._sched.deactivate(j)
        return True

    def _restart(self, u: int, how: Callable[[], None]) -> None:
        """Run ``how`` (a ``set_epoch`` / ``load_state_dict`` of unique source ``u``), keeping
        the counters its restarted engine drops in ``retired`` (the mix's stats keep counting)."""
        before = _counters(self._unique[u])
        how()
        after = _counters(self._unique[u])
        for key in SUMMED_COUNTERS:
            self.retired[key] += max(0.0, before[key] - after[key])

    def _deliver(self, idx: int, source: Any, batch: Any) -> None:
        self._sched.commit(idx)
        self.last_source = idx
        self.delivered_batches[idx] += 1
        self.delivered_samples[idx] += batch_samples(source, batch)
        self.delivered_bytes[idx] += batch_nbytes(batch)
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
        total = 0
        for s in self._unique:
            try:
                total += int(s.stats().get("inflight_bytes", 0))
            except Exception:  # a closed source reports nothing
                pass
        return total

    def _snapshot(self) -> dict[str, Any]:
        return {"event": "mix_snapshot", "schedule_ticks": self._sched.ticks,
                "active": [int(a) for a in self._sched.active],
                "delivered_batches": list(self.delivered_batches),
                "delivered_samples": list(self.delivered_samples),
                "realized_ratio": self.realized(), "normalized_weights": self.normalized(),
                "starvation_total": list(self.starvation_total),
                "total_inflight_bytes": self.total_inflight_bytes()}

    def normalized(self) -> list[float]:
        total = sum(self._int_weights)
        return [w / total for w in self._int_weights]

    def realized(self) -> list[float]:
        total = sum(self.delivered_batches)
        return [b / total if total else 0.0 for b in self.delivered_batches]

    @property
    def schedule(self) -> SmoothRoundRobin:
        return self._sched

    @property
    def status(self) -> str:
        return ("CLOSED" if self._closed else "DONE" if self._finished or self._failed
                else "RUNNING" if self._sched.ticks else "WARMING")

    def stats(self) -> dict[str, Any]:
        """Counters, with mx8 1.0.7's key names where they mean the same thing.

        ``mix_realized_ratio`` (per source, by batches) against ``mix_normalized_weights`` says
        whether the schedule is being followed; ``mix_source_wait_seconds_total`` says which source
        the mix waits on (a slow source: give it more threads); ``mix_source_starvation_total``
        counts a source going ``starvation`` ticks without being picked (a tiny weight).
        """
        return mix_stats(self)

    def print_stats(self) -> None:
        """One line on stderr: batches and realized proportions per source."""
        import sys

        parts = " ".join(f"{i}:{b}({r:.3f}/{w:.3f})" for i, (b, r, w) in enumerate(
            zip(self.delivered_batches, self.realized(), self.normalized(), strict=True)))
        print(f"[headrace.mix] ticks={self._sched.ticks} sources {parts}", file=sys.stderr)

    def checkpoint(self) -> bytes:
        """A token that restores the scheduler and every source's exact position (the loaders'
        JSON format, kind ``"mix"``, each source's ``state_dict()`` nested in it)."""
        with self._lock:
            states = [s.state_dict() for s in self._unique]
            sched = self._sched
            return mix_state.encode(mix_state.MixState(
                seed=self.seed, epoch=self._epoch, weights=list(self._int_weights),
                policy=self.policy, ticks=sched.ticks, current=list(sched.current),
                active=list(sched.active),
                counters={"delivered_batches": self.delivered_batches,
                          "delivered_samples": self.delivered_samples,
                          "delivered_bytes": self.delivered_bytes,
                          "starvation_total": self.starvation_total,
                          "exhausted_total": self.exhausted_total,
                          "restarts": self.restarts, "steps_since_emit": self.steps_since_emit},
                snapshot_emitted_total=self.snapshot_emitted_total,
                sources=[states[u] for u in self._slot],
                source_epochs=[self._source_epochs[u] for u in self._slot]))

    def state_dict(self) -> dict[str, Any]:
        """``checkpoint()`` as a JSON-able dict (the torchdata ``StatefulDataLoader`` convention)."""
        return _checkpoint.as_state(self.checkpoint())

    def load_state_dict(self, state: Any) -> None:
        """Continue from ``state`` (a ``state_dict()`` or ``checkpoint()`` token), in place.

        Every source is restored in place by its own ``load_state_dict``, and the schedule and
        counters are the token's; the token's epoch is adopted. The mix's settings are checked
        before any source is touched.

        Raises:
            CheckpointError: the token is not a mix's, was taken with another seed, other
                weights or another number of sources, or a source refuses its state (the
                message names the source).
            LoaderError: the mix is closed.
        """
        if self._closed:
            raise LoaderError(self._why_over())
        n = len(self.sources)
        st = mix_state.decode(state, seed=self.seed, weights=self._int_weights, count=n)
        with self._lock:
            done: set[int] = set()
            for i, u in enumerate(self._slot):
                if u in done:
                    continue
                source = self._unique[u]
                epoch = st.source_epochs[i]

                def restore(s: Any = source, sd: Any = st.sources[i], e: int | None = epoch) -> None:
                    if e is not None:
                        s.set_epoch(e)
                    s.load_state_dict(sd)

                try:
                    self._restart(u, restore)
                except CheckpointError as e:
                    self._failed = f"source {i} refused its checkpoint"
                    e.add_note(f"raised restoring mix source {i} (a {type(source).__name__}): "
                               "build the mix from the same sources, in the same order")
                    raise
                done.add(u)
                self._source_epochs[u] = epoch
            self._epoch = st.epoch
            self._sched = sched = SmoothRoundRobin(self._int_weights,
                                                   tie_break_offset=(self.seed + st.epoch) % n)
            sched.current, sched.active, sched.ticks = st.current, st.active, st.ticks
            for key, values in st.counters.items():
                setattr(self, key, list(values))
            self.snapshot_emitted_total = st.snapshot_emitted_total
            self._restarted_empty = [False] * len(self._unique)
            self._finished = not sched.any_active
            self._failed = None

    def set_epoch(self, epoch: int) -> None:
        """Rewind the mix and every source to the start of ``epoch`` (``set_epoch`` of each
        source; every source active again, the schedule's tie break at ``(seed + epoch) mod n``).
        The counters in ``stats()`` keep counting."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ConfigError(f"epoch must be an int >= 0, got {epoch!r}")
        if self._closed:
            raise LoaderError(self._why_over())
        missing = [i for i, s in enumerate(self.sources)
                   if not callable(getattr(s, "set_epoch", None))]
        if missing:
            raise ConfigError(f"mix source {missing[0]} (a {type(self.sources[missing[0]]).__name__}"
                              ") has no set_epoch(); the mix cannot rewind it")
        with self._lock:
            for u, source in enumerate(self._unique):
                self._restart(u, functools.partial(source.set_epoch, epoch))
                self._source_epochs[u] = epoch
            n = len(self.sources)
            self._epoch = epoch
            self._sched = SmoothRoundRobin(self._int_weights,
                                           tie_break_offset=(self.seed + epoch) % n)
            self.steps_since_emit = [0] * n
            self._restarted_empty = [False] * len(self._unique)
            self._finished = False
            self._failed = None

    # -- lifecycle -----------------------------------------------------------------------------

    def close(self) -> None:
        """Close every source (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for s in self._unique:
            close = getattr(s, "close", None)
            if callable(close):
                close()
        self._release_upstream()  # the block of an outer mix's budget this mix held

    def __enter__(self) -> MixedLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _tune_sources(sources: list[Any]) -> None:
    """``tune=True``: every source autotunes from now on, in place."""
    for i, s in enumerate(sources):
        if not callable(getattr(s, "_enable_tune", None)):
            raise ConfigError(f"mix(tune=True) cannot tune source {i} (a {type(s).__name__}); "
                              "pass tune=True to that loader itself, or mix headrace loaders")
    for s in {id(s): s for s in sources}.values():
        s._enable_tune()


def _counters(source: Any) -> dict[str, float]:
    try:
        s = source.stats()
    except Exception:  # a closed source reports nothing
        s = {}
    out = {}
    for key in SUMMED_COUNTERS:
        v = s.get(key)
        out[key] = float(v) if isinstance(v, int | float) and not isinstance(v, bool) else 0.0
    return out


#: why each core keyword that is a source's business does not apply to a mix
_SOURCE_KEYWORDS = {
    "order": "the mix picks among its sources by weights (seed= breaks ties); a source's "
             "order is its own",
    "shuffle": "the mix picks among its sources by weights (seed= breaks ties); a source's "
               "order is its own",
    "epochs": "a mix ends as its sources do (on_source_exhausted= says what happens when one "
              "ends)",
    "drop_last": "a mix yields its sources' batches unchanged, short ones too",
    "tail": "a mix yields its sources' batches unchanged, short ones too",
    "rank": "each source reads its own rank's share",
    "world_size": "each source reads its own rank's share",
    "threads": "each source builds its own batches (tune=True tunes them all inside the "
               "shared budget)",
    "queue": "each source queues its own batches (tune=True tunes them all inside the shared "
             "budget)",
    "prefetch": "each source prefetches its own batches (tune=True tunes them all inside the "
                "shared budget)",
    "transform": "a transform's ids and seeds are one source's records",
}


def _refuse_source_keywords(given: dict[str, Any]) -> None:
    for name, value in given.items():
        if value is not None:
            raise ConfigError(f"mix({name}={value!r}) does not apply to a mix: "
                              f"{_SOURCE_KEYWORDS[name]}; set {name}= on each source instead")


@checked("mix()")
def mix(sources: Sequence[Any], *, weights: Sequence[float] | None = None, seed: int = 0,
        epoch: int = 0, starvation: int = 10000, on_source_exhausted: str = "error",
        resume: Any = None, inflight: int | None = None, ram_gb: float | None = None,
        constraints: Constraints | None = None, snapshot: bool | None = None,
        snapshot_period_ticks: int | None = None, job: str | None = None,
        coord: str | None = None, profile: str | None = None, tune: bool | None = None,
        runtime: Any = None, timeline: bool | float = False, batch: int | None = None,
        order: str | None = None, shuffle: bool | None = None, epochs: int | None = None,
        drop_last: bool | None = None, tail: str | None = None, rank: int | None = None,
        world_size: int | None = None, threads: int | None = None, queue: int | None = None,
        prefetch: int | None = None, transform: Any = None) -> MixedLoader:
    """Compose loaders into one deterministic stream of their batches.

    Args:
        sources: headrace loaders of any kind (``Loader``, ``load``, ``image``, ``text``,
            ``audio``, ``video``, ``DataLoader``, ``DistributedDataLoader``, ``mix``) with one
            batch size.
        weights: sampling proportions per source, positive and finite; only ratios matter
            (``[0.7, 0.3]`` is ``[7, 3]``). Default: equal.
        seed, epoch: the schedule's tie break starts at ``(seed + epoch) mod len(sources)``.
        starvation: ticks a source may go unpicked before ``mix_source_starvation_total`` counts it.
        on_source_exhausted: ``"error"`` (raise ``LoaderError`` when a source ends while another
            still has batches; sources that all end together just end the mix), ``"drop"``
            (mx8's ``"allow"``: continue with the others until all end) or ``"restart"`` (start that
            source's next epoch and continue; the mix then never ends).
        resume: a token from ``MixedLoader.checkpoint()`` (or its ``state_dict()``); every source
            is put back where it was.
        inflight: the shared cap in bytes on batches being built or waiting in all sources
            together (default: the sum of the sources' own caps); every source reserves from it
            instead of its own cap. ``constraints.max_inflight_bytes`` is the same knob.
            ``ram_gb`` caps the shared budget to that many GiB too.
        snapshot, snapshot_period_ticks: log a ``mix_snapshot`` event on logger ``headrace.mix``
            every that many ticks (default from ``HEADRACE_MIX_SNAPSHOT`` /
            ``HEADRACE_MIX_SNAPSHOT_PERIOD_TICKS``, or the ``MX8_`` spellings; period 64).
        job, coord, profile, runtime: accepted for mx8 compatibility. headrace needs no
            coordinator; the sources keep their own profiles.
        tune: autotune every source's threads and prefetch, each inside its share of the
            one byte budget (``docs/autotune.md``).
        timeline: record a stats timeline of the mix (``True``: a snapshot every 0.5 s; a
            number: the period in seconds) for ``stats_timeline()`` and ``headrace.plot``: the
            sources' queues, bytes in flight against the shared cap, busy and wait time, summed.
        batch: the sources' batch size, checked (``ConfigError`` when they have another).
        order, shuffle, epochs, drop_last, tail, rank, world_size, threads, queue, prefetch,
            transform: the other core keywords are each source's: set on a mix, each is a
            ``ConfigError`` saying why and to set it on the sources (``None``: not given).

    Returns:
        A :class:`MixedLoader`.
    """
    _refuse_source_keywords({
        "order": order, "shuffle": shuffle, "epochs": epochs, "drop_last": drop_last,
        "tail": tail, "rank": rank, "world_size": world_size, "threads": threads, "queue": queue,
        "prefetch": prefetch, "transform": transform})
    if batch is not None:
        sizes = sorted({int(b) for b in (getattr(s, "batch_size", None) for s in sources)
                        if b is not None})
        if sizes and sizes != [batch]:
            raise ConfigError(f"mix(batch={batch!r}): the sources' batch size is "
                              f"{sizes[0] if len(sizes) == 1 else sizes}; a mix yields its "
                              "sources' batches unchanged: set batch= on each source")
    if job is not None or coord is not None:
        warnings.warn("mix(job=, coord=) are ignored: headrace needs no coordinator (rank and "
                      "world size come from the launcher)", UserWarning, stacklevel=2)
    if runtime is not None and getattr(runtime, "want", None) not in (None, 1):
        raise ConfigError("mix runtime.want is unsupported (the mix reads its sources' batches)")
    del profile  # the sources already carry their own profile
    if tune:
        _tune_sources(list(sources))
    if ram_gb is not None:
        from headrace._engine.config import ram_gb_to_bytes

        ram_cap = ram_gb_to_bytes(ram_gb)
        inflight = ram_cap if inflight is None else min(inflight, ram_cap)
    return MixedLoader(sources, weights=weights, seed=seed, epoch=epoch, starvation=starvation,
                       on_source_exhausted=on_source_exhausted, resume=resume, inflight=inflight,
                       constraints=constraints, snapshot=snapshot,
                       snapshot_period_ticks=snapshot_period_ticks, timeline=timeline)
