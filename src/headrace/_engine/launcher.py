"""Rank, world size and local rank, read from the launcher the job already uses.

headrace runs no coordinator of its own: a multi-process job is started by torchrun, SLURM or
``jax.distributed``, and each of them already tells every process who it is. Precedence, first match
wins, per value:

1. explicit arguments (``rank=``, ``world_size=``, ``local_rank=``);
2. torchrun / ``torch.distributed`` env (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``);
3. SLURM (``SLURM_PROCID``, ``SLURM_STEP_NUM_TASKS`` or ``SLURM_NTASKS``, ``SLURM_LOCALID``), only
   inside a job step (``SLURM_PROCID`` set): a batch script that runs ``python`` directly is one process
   even when the allocation has many tasks, so ``SLURM_STEP_NUM_TASKS`` wins over ``SLURM_NTASKS``;
4. ``jax.distributed`` (``jax.process_index()`` / ``jax.process_count()``) when it is initialized. jax is
   only consulted when it is already imported (or ``use_jax=True``), so reading the launcher never
   imports a framework on its own;
5. a single process: rank 0 of 1.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from headrace._base.errors import ConfigError

__all__ = ["Launch", "detect", "resolve"]

_TORCHRUN = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


@dataclass(frozen=True)
class Launch:
    """Who this process is in a multi-process job.

    Attributes:
        rank: this process's index in ``[0, world_size)``.
        world_size: number of processes that read the data together.
        local_rank: index of this process on its host (picks the GPU).
        launcher: where the values came from: ``"explicit"``, ``"torchrun"``, ``"slurm"``, ``"jax"``
            or ``"single"`` (the first non-explicit source consulted when arguments were mixed).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    launcher: str = "single"

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ConfigError(f"world_size={self.world_size} must be >= 1")
        if not 0 <= self.rank < self.world_size:
            raise ConfigError(
                f"rank={self.rank} is outside [0, world_size={self.world_size}); pass a rank below "
                "the world size (or fix the launcher's RANK/WORLD_SIZE)")
        if self.local_rank < 0:
            raise ConfigError(f"local_rank={self.local_rank} must be >= 0")

    @property
    def distributed(self) -> bool:
        """True when more than one process reads the data."""
        return self.world_size > 1


def _env_int(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw.strip())
    except ValueError:
        raise ConfigError(f"environment variable {name}={raw!r} is not an integer; "
                          f"unset it or set it to the value the launcher meant") from None


def _jax_values(use_jax: bool | None) -> tuple[int, int] | None:
    """``(process_index, process_count)`` when jax.distributed is initialized, else None."""
    if use_jax is False or (use_jax is None and "jax" not in sys.modules):
        return None
    import jax  # only here: imported already, or the caller asked for it

    if not jax.distributed.is_initialized():
        return None
    return int(jax.process_index()), int(jax.process_count())


def detect(*, rank: int | None = None, world_size: int | None = None,
           local_rank: int | None = None, environ: Mapping[str, str] | None = None,
           use_jax: bool | None = None) -> Launch:
    """Reads rank, world size and local rank from the launcher; explicit arguments win.

    Args:
        rank: this process's rank; ``None`` reads it from the launcher.
        world_size: number of processes; ``None`` reads it from the launcher.
        local_rank: index on this host; ``None`` reads ``LOCAL_RANK`` / ``SLURM_LOCALID``, else 0.
        environ: the environment to read (default ``os.environ``).
        use_jax: ``True`` imports jax and asks ``jax.distributed``; ``False`` never asks; ``None``
            (default) asks only when jax is already imported.

    Returns:
        A validated :class:`Launch`.

    Raises:
        ConfigError: a launcher variable is not an integer, or rank is outside ``[0, world_size)``.
    """
    env = os.environ if environ is None else environ
    found: list[tuple[str, int | None, int | None, int | None]] = []
    if env.get("WORLD_SIZE") is not None or env.get("RANK") is not None:
        found.append(("torchrun", _env_int(env, "RANK"), _env_int(env, "WORLD_SIZE"),
                      _env_int(env, "LOCAL_RANK")))
    if env.get("SLURM_PROCID") is not None:
        tasks = _env_int(env, "SLURM_STEP_NUM_TASKS")
        found.append(("slurm", _env_int(env, "SLURM_PROCID"),
                      tasks if tasks is not None else _env_int(env, "SLURM_NTASKS"),
                      _env_int(env, "SLURM_LOCALID")))
    if rank is None or world_size is None:
        jax_values = _jax_values(use_jax)
        if jax_values is not None:
            found.append(("jax", jax_values[0], jax_values[1], None))
    elif use_jax:
        _jax_values(use_jax)  # asked explicitly: still import, so a broken jax surfaces here
    explicit = rank is not None or world_size is not None or local_rank is not None
    launcher = "explicit" if explicit and rank is not None and world_size is not None else "single"
    for name, r, w, lr in found:
        if launcher == "single":
            launcher = name
        rank = r if rank is None else rank
        world_size = w if world_size is None else world_size
        local_rank = lr if local_rank is None else local_rank
    if world_size is None:
        if rank not in (None, 0):
            raise ConfigError(f"rank={rank} was given but no world size: pass world_size= or run "
                              "under a launcher that sets WORLD_SIZE")
        world_size = 1
    return Launch(rank=0 if rank is None else int(rank), world_size=int(world_size),
                  local_rank=0 if local_rank is None else int(local_rank), launcher=launcher)


def resolve(*, rank: int | None, world_size: int | None,
            check: bool | None = None) -> tuple[Launch, bool]:
    """What a loader reads: ``(launch, run_the_agreement_check)``.

    ``check=None`` (a loader's default) checks only when the world came from a launcher: explicit
    ``rank=``/``world_size=`` may describe a data-parallel group that is not the launcher's world
    (or ranks simulated in one process), and a loader rebuilt with the values it already agreed
    on must not exchange again. ``check=True`` always checks a multi-process world.
    """
    launch = detect(rank=rank, world_size=world_size)
    if check is None:
        check = rank is None and world_size is None
    return launch, bool(check) and launch.distributed
