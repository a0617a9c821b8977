"""Constraints, RuntimeConfig, profiles, and resolution: kwargs > objects > env > profile."""

from __future__ import annotations

import numpy as np
import pytest

import headrace
from headrace import ConfigError, Constraints, RuntimeConfig
from headrace._engine.config import GIB, MIB, PROFILES, resolve_config

TOTAL = 25_276_510_208  # the MemTotal of the box mx8's table was measured on


def test_profiles_carry_mx8s_numbers():
    expected = {"safe": (128, 32, 1, 14_092_164_300), "balanced": (256, 64, 2, 17_883_640_832),
                "throughput": (512, 128, 4, 20_411_291_852)}
    for name, (inflight_mib, queue, prefetch, rss) in expected.items():
        cfg = resolve_config(profile=name, env={}, memory_total=TOTAL)
        assert cfg.max_inflight_bytes == inflight_mib * MIB
        assert cfg.max_queue_batches == queue
        assert cfg.prefetch_batches == prefetch
        assert abs(cfg.max_ram_bytes - rss) <= 1  # 0.60/0.75/0.85 x MemTotal - 1 GiB
    assert resolve_config(env={}).profile == "balanced"
    assert set(PROFILES) == {"safe", "balanced", "throughput"}


def test_unknown_profile_lists_the_valid_ones():
    with pytest.raises(ConfigError, match="unknown profile 'fast'; valid profiles: safe, "
                                          "balanced, throughput"):
        resolve_config(profile="fast")


def test_kwargs_win_over_objects_env_and_profile():
    cons = Constraints(max_inflight_bytes=64 * MIB, max_ram_bytes=4 * GIB)
    rt = RuntimeConfig(prefetch_batches=7, max_queue_batches=9, want=3)
    env = {"HEADRACE_MAX_PROCESS_RSS_BYTES": str(3 * GIB)}
    cfg = resolve_config(profile="safe", inflight=10 * MIB, ram_gb=2, queue=5, prefetch=1,
                         threads=3, constraints=cons, runtime=rt, env=env)
    assert (cfg.max_inflight_bytes, cfg.max_ram_bytes, cfg.max_queue_batches,
            cfg.prefetch_batches, cfg.threads, cfg.want) == (10 * MIB, 2 * GIB, 5, 1, 3, 3)
    assert cfg.sources["max_inflight_bytes"] == "inflight="
    # Without kwargs the objects win over env and profile.
    cfg = resolve_config(profile="safe", constraints=cons, runtime=rt, env=env)
    assert (cfg.max_inflight_bytes, cfg.max_ram_bytes, cfg.max_queue_batches,
            cfg.prefetch_batches) == (64 * MIB, 4 * GIB, 9, 7)
    # Without those, the environment sets the RSS cap (either spelling).
    assert resolve_config(env=env).max_ram_bytes == 3 * GIB
    assert resolve_config(env={"MX8_MAX_PROCESS_RSS_BYTES": "123456789"}).max_ram_bytes \
        == 123456789
    with pytest.raises(ConfigError, match="HEADRACE_MAX_PROCESS_RSS_BYTES must be a positive"):
        resolve_config(env={"HEADRACE_MAX_PROCESS_RSS_BYTES": "lots"})


def test_inflight_is_clamped_to_the_ram_cap():
    cfg = resolve_config(inflight=8 * GIB, ram_gb=1, env={})
    assert cfg.max_inflight_bytes == GIB
    assert cfg.sources["max_inflight_bytes"].startswith("clamped")


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "1", True])
def test_ram_gb_validation(bad):
    with pytest.raises(ConfigError, match="ram_gb must be"):
        resolve_config(ram_gb=bad)


def test_ram_gb_too_large():
    with pytest.raises(ConfigError, match="ram_gb is too large"):
        resolve_config(ram_gb=1e12)


def test_config_objects_validate_themselves():
    with pytest.raises(ConfigError, match="max_inflight_bytes must be >= 1"):
        Constraints(max_inflight_bytes=0)
    with pytest.raises(ConfigError, match="max_queue_batches must be an int"):
        RuntimeConfig(max_queue_batches=2.5)  # type: ignore[arg-type]
    assert Constraints(max_ram_bytes=5).max_process_rss_bytes == 5
    with pytest.raises(ConfigError, match=r"constraints must be a headrace\.Constraints"):
        resolve_config(constraints={"max_ram_bytes": 5})  # type: ignore[arg-type]


def test_loader_honours_kwargs_over_profile():
    cols = {"v": np.arange(10)}
    with headrace.Loader(cols, profile="throughput", inflight=4096, queue=3, prefetch=1,
                         threads=2) as ld:
        s = ld.stats()
    assert (s["max_inflight_bytes"], s["max_queue_batches"], s["prefetch_batches"],
            s["threads"], s["profile"]) == (4096, 3, 1, 2, "throughput")
    assert ld.config.window_batches == 3  # min(queue, threads + prefetch)
    with headrace.Loader(cols, profile="safe",
                         runtime=RuntimeConfig(prefetch_batches=5, max_queue_batches=40)) as ld:
        s = ld.stats()
    assert (s["max_inflight_bytes"], s["max_queue_batches"], s["prefetch_batches"]) == (
        128 * MIB, 40, 5)
    with pytest.raises(ConfigError, match="unknown profile"):
        headrace.Loader(cols, profile="fast")
