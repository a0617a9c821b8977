"""Loader knobs: ``Constraints``, ``RuntimeConfig``, the three profiles, and how they combine.

A loader's memory and queueing limits come from four places. Resolution, highest first:

1. explicit loader kwargs (``inflight=``, ``ram_gb=``, ``queue=``, ``prefetch=``, ``threads=``);
2. ``constraints=Constraints(...)`` and ``runtime=RuntimeConfig(...)``;
3. the environment: ``HEADRACE_MAX_PROCESS_RSS_BYTES`` (mx8's ``MX8_MAX_PROCESS_RSS_BYTES`` is
   accepted too) for the RSS cap only;
4. the profile (``"balanced"`` when none is named), with mx8 1.0.7's numbers.

mx8 silently ignores ``inflight/queue/prefetch`` on its top-level helpers and silently maps an
unknown profile to ``balanced``; headrace honours the kwargs and rejects unknown profiles.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

from headrace._base.errors import ConfigError

__all__ = ["PROFILES", "Constraints", "Profile", "ResolvedConfig", "RuntimeConfig",
           "default_threads", "memory_total_bytes", "resolve_config", "usable_cores"]

MIB = 1 << 20
GIB = 1 << 30
# Above this, a byte count no longer fits the int64 counters everything downstream uses.
_MAX_BYTES = (1 << 63) - 1
RSS_ENV_VARS = ("HEADRACE_MAX_PROCESS_RSS_BYTES", "MX8_MAX_PROCESS_RSS_BYTES")


@dataclass(frozen=True)
class Profile:
    """A named set of defaults (mx8 1.0.7's table, A.9 of the behaviour reference)."""

    name: str
    max_inflight_bytes: int
    max_queue_batches: int
    prefetch_batches: int
    rss_fraction: float  # default RSS cap = rss_fraction x MemTotal - 1 GiB


PROFILES: dict[str, Profile] = {
    "safe": Profile("safe", 128 * MIB, 32, 1, 0.60),
    "balanced": Profile("balanced", 256 * MIB, 64, 2, 0.75),
    "throughput": Profile("throughput", 512 * MIB, 128, 4, 0.85),
}
DEFAULT_PROFILE = "balanced"


def _check_count(name: str, value: int | None, *, minimum: int) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {value}")
    if value > _MAX_BYTES:
        raise ConfigError(f"{name} is too large: {value}")


@dataclass(frozen=True)
class Constraints:
    """Hard memory caps (mx8 spelling).

    Attributes:
        max_inflight_bytes: bytes of batches being built or waiting inside the loader. Producers
            block before allocating once this is reached. Must hold at least one batch.
        max_ram_bytes: cap on the process's counted RSS (anonymous memory; mapped file pages are
            page cache and are not counted). Producers pause while the process is over it; see
            ``docs/memory.md``. Also readable as ``max_process_rss_bytes``.
    """

    max_inflight_bytes: int | None = None
    max_ram_bytes: int | None = None

    def __post_init__(self) -> None:
        _check_count("max_inflight_bytes", self.max_inflight_bytes, minimum=1)
        _check_count("max_ram_bytes", self.max_ram_bytes, minimum=1)

    @property
    def max_process_rss_bytes(self) -> int | None:
        """Alias of ``max_ram_bytes`` (mx8's read-only attribute)."""
        return self.max_ram_bytes


@dataclass(frozen=True)
class RuntimeConfig:
    """Queueing knobs (mx8 spelling).

    Attributes:
        prefetch_batches: ready batches the loader tries to keep beyond one per worker thread;
            raise it when the consumer is bursty and ``consumer_wait_seconds`` grows.
        max_queue_batches: hard cap on batches held by the loader (being built plus ready).
            It bounds the number of batches; ``max_inflight_bytes`` bounds their bytes.
        want: accepted for mx8 compatibility; it is the number of leases a distributed mx8 loader
            asks for and has no effect on a local loader (reported in ``stats()``).
    """

    prefetch_batches: int | None = None
    max_queue_batches: int | None = None
    want: int | None = None

    def __post_init__(self) -> None:
        _check_count("prefetch_batches", self.prefetch_batches, minimum=0)
        _check_count("max_queue_batches", self.max_queue_batches, minimum=1)
        _check_count("want", self.want, minimum=1)


@dataclass(frozen=True)
class ResolvedConfig:
    """The knobs a loader runs with, after resolution. ``sources`` says where each came from."""

    profile: str
    max_inflight_bytes: int
    max_ram_bytes: int
    max_queue_batches: int
    prefetch_batches: int
    threads: int
    want: int
    sources: Mapping[str, str]

    @property
    def window_batches(self) -> int:
        """Batches dispatched but not yet delivered, capped by the queue: one per worker thread,
        one the consumer gathers itself while it would wait (see ``default_threads``), and the
        prefetch."""
        return max(1, min(self.max_queue_batches, self.threads + 1 + self.prefetch_batches))


def memory_total_bytes() -> int:
    """Physical memory available to this process: MemTotal, lowered by a cgroup v2/v1 limit."""
    total = 0
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    total = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    if total <= 0:
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            total = 8 * GIB
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path, encoding="ascii") as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < total:
            total = int(text)
    return total


def default_rss_cap(profile: Profile, *, total_bytes: int | None = None) -> int:
    """``fraction x MemTotal - 1 GiB`` as mx8, but never below half of ``fraction x MemTotal``."""
    total = memory_total_bytes() if total_bytes is None else total_bytes
    share = int(profile.rss_fraction * total)
    return max(share - GIB, share // 2, 1)


def usable_cores() -> int:
    """The CPUs this process may run on: its affinity, and a cgroup v2 CPU quota when set
    (a container limited to 2 CPUs of a 64-core host runs 2 threads' worth of work at a time)."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # not on every platform
        n = os.cpu_count() or 1
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            n = min(n, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):  # no cgroup v2, or no quota
        pass
    return max(1, n)


def default_threads() -> int:
    """Worker threads when none are asked for: one fewer than the usable cores (at least 1, at
    most 8). The consumer's thread is the last gatherer: whenever it would wait for a batch it
    gathers the next one itself, so workers plus consumer fill the cores; one more worker than
    that only time-slices with them, and a batch delivered in order then waits for the slowest."""
    return max(1, min(8, usable_cores() - 1))


def ram_gb_to_bytes(ram_gb: float) -> int:
    """Validate ``ram_gb`` (GiB, as mx8) and convert it to bytes."""
    if isinstance(ram_gb, bool) or not isinstance(ram_gb, int | float):
        raise ConfigError(f"ram_gb must be a number of GiB, got {ram_gb!r}")
    if not math.isfinite(ram_gb) or ram_gb <= 0:
        raise ConfigError(f"ram_gb must be a finite value > 0, got {ram_gb!r}")
    value = ram_gb * GIB
    if value >= _MAX_BYTES:
        raise ConfigError(f"ram_gb is too large: {ram_gb!r} GiB does not fit in 63 bits")
    return max(1, int(value))


def _env_rss_cap(env: Mapping[str, str]) -> tuple[int, str] | None:
    for name in RSS_ENV_VARS:
        text = env.get(name)
        if text is None or text.strip() == "":
            continue
        try:
            value = int(text.strip())
        except ValueError:
            raise ConfigError(f"${name} must be a positive integer number of bytes, "
                              f"got {text!r}") from None
        if value <= 0:
            raise ConfigError(f"${name} must be > 0, got {value}")
        return value, f"env {name}"
    return None


def _pick(name: str, *candidates: tuple[int | None, str]) -> tuple[int, str]:
    for value, origin in candidates:
        if value is not None:
            return value, origin
    raise AssertionError(f"no value for {name}")  # the profile always supplies one


def resolve_config(*, profile: str | None = None, inflight: int | None = None,
                   ram_gb: float | None = None, queue: int | None = None,
                   prefetch: int | None = None, threads: int | None = None,
                   constraints: Constraints | None = None, runtime: RuntimeConfig | None = None,
                   env: Mapping[str, str] | None = None,
                   memory_total: int | None = None) -> ResolvedConfig:
    """Combine kwargs, config objects, the environment and a profile (see the module docstring).

    Raises:
        ConfigError: an unknown profile, a bad value, or a config object of the wrong type.
    """
    name = DEFAULT_PROFILE if profile is None else profile
    if not isinstance(name, str) or name not in PROFILES:
        raise ConfigError(f"unknown profile {profile!r}; valid profiles: "
                          f"{', '.join(PROFILES)}")
    prof = PROFILES[name]
    if constraints is not None and not isinstance(constraints, Constraints):
        raise ConfigError(f"constraints must be a headrace.Constraints, got {constraints!r}")
    if runtime is not None and not isinstance(runtime, RuntimeConfig):
        raise ConfigError(f"runtime must be a headrace.RuntimeConfig, got {runtime!r}")
    cons = constraints or Constraints()
    rt = runtime or RuntimeConfig()
    _check_count("inflight", inflight, minimum=1)
    _check_count("queue", queue, minimum=1)
    _check_count("prefetch", prefetch, minimum=0)
    _check_count("threads", threads, minimum=1)
    ram_bytes = None if ram_gb is None else ram_gb_to_bytes(ram_gb)
    env_cap = _env_rss_cap(os.environ if env is None else env)

    inflight_v, inflight_o = _pick("inflight", (inflight, "inflight="),
                                   (cons.max_inflight_bytes, "constraints"),
                                   (prof.max_inflight_bytes, f"profile {name}"))
    ram_v, ram_o = _pick("ram", (ram_bytes, "ram_gb="), (cons.max_ram_bytes, "constraints"),
                         env_cap or (None, ""),
                         (default_rss_cap(prof, total_bytes=memory_total), f"profile {name}"))
    queue_v, queue_o = _pick("queue", (queue, "queue="), (rt.max_queue_batches, "runtime"),
                             (prof.max_queue_batches, f"profile {name}"))
    prefetch_v, prefetch_o = _pick("prefetch", (prefetch, "prefetch="),
                                   (rt.prefetch_batches, "runtime"),
                                   (prof.prefetch_batches, f"profile {name}"))
    threads_v, threads_o = _pick("threads", (threads, "threads="),
                                 (default_threads(), "default"))
    if inflight_v > ram_v:
        # As mx8: batches in the loader can never be allowed more memory than the process.
        inflight_v, inflight_o = ram_v, f"clamped to max_ram_bytes ({ram_o})"
    return ResolvedConfig(
        profile=name, max_inflight_bytes=inflight_v, max_ram_bytes=ram_v,
        max_queue_batches=queue_v, prefetch_batches=prefetch_v, threads=threads_v,
        want=rt.want or 1,
        sources={"max_inflight_bytes": inflight_o, "max_ram_bytes": ram_o,
                 "max_queue_batches": queue_o, "prefetch_batches": prefetch_o,
                 "threads": threads_o})
