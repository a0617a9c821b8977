"""``DistributedDataLoader``: this rank's disjoint slice of one global stream, on the job's launcher.

There is no coordinator and no lease: order is a pure function of ``(seed, epoch, position)``, so
every rank computes its own share. With world size ``W`` and batch ``B``, rank ``r``'s ``k``-th batch
holds global positions ``base + (k*W + r)*B .. + B`` (``docs/internals.md``); together the ranks
cover each record of an epoch exactly once. The incomplete last global step is padded (``tail="pad"``,
default: every rank reads ``ceil(N / W)`` samples and the same number of batches, the few samples
short wrap to the epoch's first records, as torch's ``DistributedSampler``; so DDP never waits on
a rank that ran out) or dropped (``tail="drop"``: full batches only).

Before reading, the ranks agree on the snapshot fingerprint, length, seed, order, batch size, epoch
and resume position through the launcher's own engine (``_agree``), so a rank on another snapshot
or seed fails at once on every rank instead of silently breaking the epoch.

Elastic resume: all ranks advance together, so after ``k`` steps every rank's checkpoint holds the
same global position. A token taken with world size 4 resumes with 2 or 8 and continues the same
global stream; nothing is lost or read twice.
"""

from __future__ import annotations

import secrets
import warnings
from typing import Any

from headrace._base.errors import ConfigError
from headrace._engine.launcher import Launch, detect
from headrace._engine.lifecycle import InnerState
from headrace._engine.timeline import TimelineMixin, timeline_period

__all__ = ["DistributedDataLoader"]

_MX8_IGNORED = ("coord_url", "job_id", "node_id", "progress_interval_ms",
                "grpc_max_message_bytes", "want")


def _one(name: str, value: Any, mx8_name: str, mx8_value: Any) -> Any:
    if value is not None and mx8_value is not None and value != mx8_value:
        raise ConfigError(f"{name}={value!r} conflicts with {mx8_name}={mx8_value!r}; pass one")
    return mx8_value if value is None else value


def _resume_position(token: bytes | None) -> int | None:
    if token is None:
        return None
    from headrace._engine import checkpoint as _checkpoint

    return _checkpoint.decode(token).position


class DistributedDataLoader(InnerState, TimelineMixin):
    """This rank's share of a dataset, read in lockstep with the other ranks.

    Example (``torchrun --nproc_per_node=4 train.py``)::

        loader = headrace.DistributedDataLoader("train.hr", batch=256, order="shuffle", seed=1)
        for batch in loader:           # same number of batches on every rank
            ...
        token = loader.checkpoint()    # same on every rank; resumes with any world size

    Args:
        data: a store path, ``Store``, source, or anything ``headrace.Loader`` accepts.
        batch: records per batch on each rank (``batch_size_samples`` is mx8's name).
        order, seed, epoch, epochs: as ``headrace.Loader``. ``seed=None`` lets rank 0 draw a seed
            that every rank then uses.
        tail: ``"pad"`` (default; ``"drop"`` with ``drop_last=True`` or byte-aware batches,
            ``batch_bytes``/``target_bytes``) or ``"drop"``;
            ``"partial"`` is allowed but ranks may then get
            different batch counts.
        rank, world_size, local_rank: override what the launcher says (torchrun, SLURM,
            ``jax.distributed``; see ``headrace._engine.launcher``).
        resume, resume_from: a checkpoint token (any rank's, any world size).
        check: compare snapshot and seed across ranks before reading (default True).
        max_inflight_bytes, max_queue_batches, prefetch_batches, max_ram_gb, profile, constraints,
            runtime: memory knobs, mx8 spelling (``inflight``, ``queue``, ``prefetch``,
            ``ram_gb``: the same, as every loader spells them).
        autotune: mx8's spelling of ``tune``: threads and prefetch move inside the caps
            (``docs/autotune.md``).
        coord_url, job_id, node_id, want, progress_interval_ms, grpc_max_message_bytes: mx8's
            coordinator settings; accepted and ignored (headrace needs no coordinator).
        timeline: record a stats timeline (``True``: a snapshot every 0.5 s; a number: the
            period in seconds) for ``stats_timeline()`` and ``headrace.plot``.
        **loader_kwargs: passed to ``headrace.Loader`` (``threads``, ``transform``, ``start``...).

    Raises:
        ConfigError: bad arguments, ranks that disagree, or no engine to check agreement with.
        CheckpointError: the resume token does not fit this dataset, seed or batch size.
    """

    _timeline_kind = "distributed"

    def __init__(self, data: Any = None, *, batch: int | None = None,
                 batch_size_samples: int | None = None, order: Any = "sequential",
                 seed: int | None = 0, epoch: int = 0, epochs: int | None = 1,
                 tail: str | None = None,
                 rank: int | None = None, world_size: int | None = None,
                 local_rank: int | None = None, resume: bytes | None = None,
                 resume_from: bytes | None = None, check: bool = True,
                 max_inflight_bytes: int | None = None, max_queue_batches: int | None = None,
                 prefetch_batches: int | None = None, max_ram_gb: float | None = None,
                 profile: str | None = None, constraints: Any = None, runtime: Any = None,
                 autotune: bool | None = None, timeline: bool | float = False,
                 **loader_kwargs: Any) -> None:
        timeline_s = timeline_period(timeline)
        ignored = {k: loader_kwargs.pop(k) for k in _MX8_IGNORED if k in loader_kwargs}
        if {k for k, v in ignored.items() if v is not None} & {"coord_url", "job_id", "node_id"}:
            warnings.warn("DistributedDataLoader: coord_url/job_id/node_id are ignored; headrace "
                          "needs no coordinator (rank and world size come from the launcher)",
                          UserWarning, stacklevel=2)
        if data is None:
            raise ConfigError("DistributedDataLoader needs the dataset: pass data= (a store path, "
                              "Store or source); headrace has no coordinator to hand it out")
        if batch is not None and batch_size_samples is not None and batch != batch_size_samples:
            raise ConfigError(f"batch={batch} conflicts with batch_size_samples="
                              f"{batch_size_samples}; pass one")
        batch = batch if batch is not None else (
            batch_size_samples if batch_size_samples is not None else 512)
        if resume is not None and resume_from is not None and resume != resume_from:
            raise ConfigError("resume= and resume_from= differ; pass one token")
        token = resume if resume is not None else resume_from
        # headrace's core names of the mx8 memory knobs (every loader takes them): one of each
        max_inflight_bytes = _one("inflight", loader_kwargs.pop("inflight", None),
                                  "max_inflight_bytes", max_inflight_bytes)
        max_queue_batches = _one("queue", loader_kwargs.pop("queue", None),
                                 "max_queue_batches", max_queue_batches)
        prefetch_batches = _one("prefetch", loader_kwargs.pop("prefetch", None),
                                "prefetch_batches", prefetch_batches)
        max_ram_gb = _one("ram_gb", loader_kwargs.pop("ram_gb", None), "max_ram_gb", max_ram_gb)
        if tail is None:  # byte-cut batches have no fixed share to pad to (Loader's rule)
            by_bytes = any(loader_kwargs.get(k) is not None
                           for k in ("batch_bytes", "target_bytes"))
            tail = "drop" if loader_kwargs.get("drop_last") or by_bytes else "pad"
        tune = _one("tune", loader_kwargs.pop("tune", None), "autotune", autotune)
        self.launch: Launch = detect(rank=rank, world_size=world_size, local_rank=local_rank)
        from headrace._engine.loader import Loader
        from headrace._sources.base import is_source
        from headrace._sources.shared_store import open_data

        owned = not is_source(data)
        source = open_data(data) if owned else data
        try:
            if seed is None:
                seed_proposal: int | None = secrets.randbits(63)
            else:
                seed_proposal = None
            payload = {
                "fingerprint": source.fingerprint, "length": len(source),
                "order": str(order).lower(), "batch": batch, "epoch": epoch, "epochs": epochs,
                "tail": tail, "seed": seed, "seed_proposal": seed_proposal,
                "resume_position": _resume_position(token), "world_size": self.launch.world_size,
            }
            if check:
                from headrace._engine.agree import agree

                everyone = agree(self.launch, payload, what="the dataset snapshot and seed")
                if seed is None:
                    seed = int(everyone[0]["seed_proposal"])
            elif seed is None:
                if self.launch.distributed:
                    raise ConfigError("seed=None needs check=True: rank 0's seed is shared through "
                                      "the agreement step")
                seed = int(seed_proposal or 0)
            self.snapshot = str(source.fingerprint)
            self._transitions = 0
            self._transition_reason = "none"
            self._note_world_of(token)
            self._loader = Loader(
                source, batch=batch, order=order, seed=seed, epoch=epoch, epochs=epochs,
                rank=self.launch.rank, world_size=self.launch.world_size, tail=tail,
                check=False, resume=token, inflight=max_inflight_bytes, queue=max_queue_batches,
                prefetch=prefetch_batches, ram_gb=max_ram_gb, profile=profile,
                constraints=constraints, runtime=runtime, tune=bool(tune), **loader_kwargs)
        except BaseException:
            if owned:
                source.close()
            raise
        self._source = source
        self._owned = owned
        self.seed = seed
        self._start_timeline(timeline_s)

    # -- delegation ----------------------------------------------------------------------------

    def _state_loader(self) -> Any:
        return self._loader

    def _note_world_of(self, state: Any) -> None:
        """Count an elastic transition when ``state`` was taken on another world size (measured
        from the token, for ``stats()``; headrace needs no coordinator to make one)."""
        if state is None:
            return
        from headrace._engine import checkpoint as _checkpoint

        prior = _checkpoint.decode(state).world_size
        if prior != self.launch.world_size:
            self._transitions += 1
            self._transition_reason = (f"resumed a world_size={prior} checkpoint on "
                                       f"world_size={self.launch.world_size}")

    def load_state_dict(self, state: Any) -> None:
        """Continue from ``state`` in place (see ``Loader.load_state_dict``); a state taken on
        another world size counts in ``stats()["elastic_transitions_total"]``."""
        self._loader.load_state_dict(state)
        self._note_world_of(state)

    def __next__(self) -> Any:
        try:
            batch = next(self._loader)
        except StopIteration:
            self._end_timeline()
            raise
        self._tick_timeline()
        return batch

    def __len__(self) -> int:
        """Batches this rank yields (the same on every rank with ``tail="pad"`` or ``"drop"``)."""
        return len(self._loader)

    @property
    def loader(self) -> Any:
        """The underlying ``headrace.Loader`` of this rank."""
        return self._loader

    @property
    def manifest_hash(self) -> str:
        """The dataset snapshot every rank agreed on (mx8's name)."""
        return self.snapshot

    @property
    def assigned_rank(self) -> int:
        return self.launch.rank

    @property
    def rank(self) -> int:
        return self.launch.rank

    @property
    def world_size(self) -> int:
        return self.launch.world_size

    @property
    def local_rank(self) -> int:
        return self.launch.local_rank

    @property
    def batch_size(self) -> int:
        return int(self._loader.batch_size)

    @property
    def epoch(self) -> int:
        return int(self._loader.epoch)

    @property
    def last_ids(self) -> Any:
        return self._loader.last_ids

    @property
    def source(self) -> Any:
        return self._source

    @property
    def config(self) -> Any:
        """The loader's resolved memory/queue knobs."""
        return self._loader.config

    def checkpoint(self) -> bytes:
        """The global position after this rank's last delivered batch.

        Taken on every rank at the same step it is the same position, and it resumes with any
        world size. Local: no collective, so calling it on rank 0 only is fine.
        """
        return bytes(self._loader.checkpoint())

    def stats(self) -> dict[str, Any]:
        """The loader's stats plus the distributed keys mx8 reports that headrace measures."""
        s = dict(self._loader.stats())
        s.update({
            "mode": "distributed", "assigned_rank": self.launch.rank,
            "world_size": self.launch.world_size, "local_rank": self.launch.local_rank,
            "launcher": self.launch.launcher, "manifest_hash": self.snapshot,
            # world-size changes happen only between runs (a resume), so there is never a
            # pending transition or a target apart from the current world: mx8's lease keys for
            # those (effective_want, elastic_transition_pending, elastic_target_world_size) would
            # be constants and are left out
            "elastic_transitions_total": self._transitions,
            "elastic_last_transition_reason": self._transition_reason,
            "elastic_current_world_size": self.launch.world_size,
        })
        return s

    def print_stats(self) -> None:
        self._loader.print_stats()

    def close(self) -> None:
        """Stop the loader's threads and close the source if this object opened it (idempotent)."""
        self._loader.close()
        if self._owned:
            self._owned = False
            self._source.close()

    def __enter__(self) -> DistributedDataLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
