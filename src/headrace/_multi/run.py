"""``headrace.run``: the one call that does the right thing alone or under a launcher.

One process (``WORLD_SIZE`` unset or 1, no SLURM step, no ``jax.distributed``): ``headrace.load``.
Several: ``DistributedDataLoader`` on this rank's slice. mx8 1.0.7 also needs a coordinator URL and
a job id for the second case; headrace needs neither, and says so when they are passed.
"""

from __future__ import annotations

import warnings
from typing import Any

from headrace._base.errors import ConfigError
from headrace._engine.launcher import detect

__all__ = ["run"]


def run(data: Any, *, batch: int = 512, ram_gb: float | None = 8.0, profile: str | None = None,
        resume: bytes | None = None, job: str | None = None, coord: str | None = None,
        node: str | None = None, recursive: bool | None = None, store: Any = None,
        manifest: Any = None, tune: bool | None = None, constraints: Any = None,
        runtime: Any = None, rank: int | None = None, world_size: int | None = None,
        **kwargs: Any) -> Any:
    """A loader over ``data``: local in one process, this rank's shard under a launcher.

    Args:
        data: a store path, ``Store``, dataset link or source.
        batch: records per batch (per rank when sharded).
        ram_gb: process RSS cap in GiB (8 GiB by default, as mx8); ``None`` uses the profile's.
        profile, resume, constraints, runtime: as ``headrace.load``.
        rank, world_size: override the launcher (torchrun, SLURM, ``jax.distributed``).
        job, coord, node: mx8's coordinator settings. headrace has no coordinator, so they are
            ignored with a warning that says so.
        recursive: folders and links: list subfolders too (default, as mx8); ``False``: only
            the files directly in the folder (one process only).
        store, manifest: accepted for mx8 compatibility (must be None: headrace resolves
            links itself).
        tune: autotune threads and prefetch inside the caps (``docs/autotune.md``).
        **kwargs: passed on (``order``, ``seed``, ``epoch``, ``epochs``, ``tail``, ``threads``, ...).

    Returns:
        A ``headrace.Loader`` (one process) or a ``headrace.DistributedDataLoader``.
    """
    if job is not None or coord is not None or node is not None:
        warnings.warn(
            "headrace.run(job=, coord=, node=) are ignored: headrace needs no coordinator. Rank and "
            "world size come from the launcher (torchrun, SLURM or jax.distributed) and each rank "
            "reads its own slice; drop these arguments", UserWarning, stacklevel=2)
    if store is not None or manifest is not None:
        raise ConfigError("run(store=, manifest=) are mx8 manifest-store options; headrace reads "
                          "the dataset link itself: pass it as data ('path@sha256:...')")
    if getattr(constraints, "max_ram_bytes", None) is not None:
        ram_gb = None  # the explicit Constraints cap wins over run()'s 8 GiB default
    launch = detect(rank=rank, world_size=world_size)
    if not launch.distributed:
        import headrace

        for key in ("check", "local_rank"):  # the agreement check and device: several ranks only
            kwargs.pop(key, None)
        if recursive is not None:  # folders and links: list subfolders too (mx8's default)
            kwargs["recursive"] = recursive
        return headrace.load(data, batch=batch, ram_gb=ram_gb, profile=profile, resume=resume,
                             constraints=constraints, runtime=runtime, tune=bool(tune),
                             **kwargs)
    if recursive is False:
        raise ConfigError("run(recursive=False) applies to one-process loading; under a launcher "
                          "each rank opens the dataset as it is listed recursively: pack the "
                          "top-level files into a store (headrace.pack) to read only those")
    from headrace._multi.dist import DistributedDataLoader

    return DistributedDataLoader(data, batch=batch, max_ram_gb=ram_gb, profile=profile,
                                 resume=resume, constraints=constraints, runtime=runtime,
                                 rank=launch.rank, world_size=launch.world_size,
                                 local_rank=launch.local_rank, autotune=tune, **kwargs)
