"""mx8 1.0.7's ``MX8_*`` environment variables: which ``headrace.mx8`` honours and onto what.

:data:`VARIABLES` lists every variable the mx8 wheel (its extension module and coordinator) reads,
each with what headrace does with it: ``honoured`` ones are read here (or by headrace itself,
named), the others say why they do not apply. ``docs/migration-mx8.md`` carries the same table and
a test keeps the two, and the wheel, in step.
"""

from __future__ import annotations

import os
from typing import Any

from headrace._base.errors import ConfigError

__all__ = ["VARIABLES", "coord_url", "decode_threads", "distributed_order", "pack_fetches",
           "s3_label_mode"]

_COORD = "no coordinator process: ranks come from the launcher (torchrun, SLURM, jax.distributed)"
_VIDEO = "video is decoded by PyAV in the loader's threads (no ffmpeg binary, no GPU decode path)"
_NO_CLOUD = "headrace reads local paths and s3:// only"

#: name -> (honoured, what headrace does with it)
VARIABLES: dict[str, tuple[bool, str]] = {
    "MX8_MANIFEST_STORE_ROOT": (True, "manifest store root (store= wins; HEADRACE_MANIFEST_STORE "
                                      "is headrace's own spelling)"),
    "MX8_MAX_PROCESS_RSS_BYTES": (True, "RSS cap (after ram_gb= / Constraints; "
                                        "HEADRACE_MAX_PROCESS_RSS_BYTES first)"),
    "MX8_S3_ENDPOINT_URL": (True, "S3 endpoint (after endpoint= and HEADRACE_S3_ENDPOINT)"),
    "MX8_S3_FORCE_PATH_STYLE": (True, "0/false: virtual-hosted requests (bucket.host/key), "
                                      "1/true or unset: path-style (after path_style=)"),
    "MX8_S3_LABEL_MODE": (True, "label_mode of raw s3:// prefixes (auto|none|imagefolder)"),
    "MX8_MIX_SNAPSHOT": (True, "mix_snapshot log events (logger headrace.mix)"),
    "MX8_MIX_SNAPSHOT_PERIOD_TICKS": (True, "ticks between mix snapshots (default 64)"),
    "MX8_JOB_ID": (True, "job= for run()/load(); any value: the launcher names the job"),
    "MX8_COORD_URL": (True, "coord= for run()/load(): selects this rank's share under the "
                            "launcher"),
    "MX8_CLUSTER_URL": (True, "as MX8_COORD_URL"),
    "MX8_DATASET_LINK": (True, "the dataset of DistributedDataLoader(coord_url=...) when no "
                               "coordinator(data=) was made in this process"),
    "MX8_WORLD_SIZE": (True, "checked against the launcher's world size by coordinator()"),
    "MX8_SHUFFLE": (True, "under a launcher: order='shuffle' (a keyed permutation of the "
                          "records per epoch; mx8 shuffles 65 536-sample blocks)"),
    "MX8_SEED": (True, "seed= of that shuffle"),
    "MX8_EPOCH": (True, "epoch= of that shuffle"),
    "MX8_DECODE_THREADS": (True, "threads= of image() (>= 1)"),
    "MX8_DECODE_BACKEND": (True, "validated (python|rust); headrace has one decoder, its own"),
    "MX8_PACK_PARALLEL_FETCHES": (True, "parallel_fetches of pack() (concurrent S3 requests)"),
    "MX8_DEV_MANIFEST_PATH": (True, "refused with a ConfigError: headrace reads no dev manifests "
                                    "(pack the files, or load the folder itself)"),
    "MX8_RUST_JPEG_CODEC": (False, "JPEG is always libjpeg-turbo (simplejpeg); there is no codec "
                                   "to choose"),
    "MX8_RUST_RESIZE_BACKEND": (False, "resizing is always OpenCV's (see docs/images.md)"),
    "MX8_MIX_AUTOTUNE_PERIOD_TICKS": (False, "the mix does not retune its sources"),
    "MX8_AUTOTUNE_NET_SOURCE": (False, "mx8's autotune network signal; see tune= in "
                                       "docs/migration-mx8.md"),
    "MX8_ZERO_MANIFEST_ENABLED": (False, "raw folders and prefixes are always read directly"),
    "MX8_ZERO_MANIFEST_RESERVOIR": (False, "raw folders and prefixes are always read directly"),
    "MX8_PACK_PART_MB": (False, "store chunks are uploaded whole (chunk_mb= sizes them)"),
    "MX8_S3_SCAN_SHUFFLE_SEED": (False, "S3 listings are sorted, never shuffled"),
    "MX8_SNAPSHOT_S3_EXTERNAL_SORT": (False, "listings are sorted in memory"),
    "MX8_SNAPSHOT_S3_SPILL_KEYS_PER_RUN": (False, "listings are sorted in memory"),
    "MX8_GCS_ENDPOINT_URL": (False, _NO_CLOUD),
    "MX8_GCS_SCAN_SHUFFLE_SEED": (False, _NO_CLOUD),
    "MX8_AZURE_ENDPOINT_URL": (False, _NO_CLOUD),
    "MX8_AZURE_ANONYMOUS": (False, _NO_CLOUD),
    "MX8_HTTP_AUTH_BEARER": (False, _NO_CLOUD),
    "MX8_HTTP_HEADERS": (False, _NO_CLOUD),
    "MX8_SOURCE_RESOLVER_URL": (False, "no remote source resolver"),
    "MX8_SOURCE_RESOLVER_AUTH_BEARER": (False, "no remote source resolver"),
    "MX8_SOURCE_RESOLVER_TIMEOUT_MS": (False, "no remote source resolver"),
    "MX8_SOURCE_RESOLVER_MAX_ATTEMPTS": (False, "no remote source resolver"),
    "MX8_HF_TOKEN": (False, "headrace never downloads a tokenizer: pass a tokenizer.json"),
    "MX8_FFMPEG_BIN": (False, _VIDEO),
    "MX8_VIDEO_DECODE_BACKEND": (False, _VIDEO),
    "MX8_VIDEO_GPU_PRESSURE_RATIO": (False, _VIDEO),
    "MX8_NVIDIA_SMI_BIN": (False, _VIDEO),
    "MX8_VIDEO_AUTOTUNE_PERIOD_BATCHES": (False, _VIDEO),
    "MX8_VIDEO_STAGE1_BYTES_PER_FRAME_ESTIMATE": (False, _VIDEO),
    "MX8_VIDEO_STAGE1_DISABLE_FFPROBES": (False, _VIDEO),
    "MX8_VIDEO_STAGE1_INDEX*": (False, "the clip index is cached by headrace.video's index_dir= "
                                        "(HEADRACE_VIDEO_INDEX_DIR)"),
    "MX8_VIDEO_STAGE2_BYTES_PER_CLIP": (False, "a clip's bytes are its decoded size"),
    "MX8_VIDEO_STAGE2_MAX_CLIPS_IN_MEMORY": (False, "the clip index is two int arrays, never "
                                                    "capped"),
    "MX8_VIDEO_STAGE2D_MAX_RANGES": (False, _VIDEO),
    "MX8_VIDEO_STAGE2D_MERGE_GAP_BYTES": (False, _VIDEO),
    "MX8_VIDEO_EXPERIMENTAL_DEVICE_OUTPUT": (False, _VIDEO),
    "MX8_VIDEO_EXPERIMENTAL_DEVICE_OUTPUT_ENFORCE_STREAM": (False, _VIDEO),
    "MX8_VIDEO_EXPERIMENTAL_DEVICE_DIRECT_WRITE": (False, _VIDEO),
    "MX8_VIDEO_EXPERIMENTAL_DIRECT_DECODE_TO_DESTINATION": (False, _VIDEO),
    "MX8_VIDEO_DIRECT_WRITE_OP_LIBRARY": (False, _VIDEO),
    "MX8_COORDINATOR_BIN": (False, _COORD),
    "MX8_COORD_BIND_ADDR": (False, _COORD),
    "MX8_COORD_HA_ENABLE": (False, _COORD),
    "MX8_COORD_HA_LEASE_PATH": (False, _COORD),
    "MX8_COORD_HA_LEADER_ID": (False, _COORD),
    "MX8_COORD_HA_LEASE_TTL_MS": (False, _COORD),
    "MX8_COORD_HA_RENEW_INTERVAL_MS": (False, _COORD),
    "MX8_COORD_STATE_STORE_ENABLED": (False, _COORD),
    "MX8_COORD_STATE_STORE_PATH": (False, _COORD),
    "MX8_HEARTBEAT_INTERVAL_MS": (False, _COORD),
    "MX8_LEASE_TTL_MS": (False, _COORD),
    "MX8_LEASE_LOG_PATH": (False, _COORD + "; a restart resumes from a checkpoint token"),
    "MX8_MIN_WORLD_SIZE": (False, _COORD),
    "MX8_METRICS_SNAPSHOT_INTERVAL_MS": (False, _COORD),
    "MX8_GRPC_MAX_MESSAGE_BYTES": (False, _COORD),
    "MX8_SNAPSHOT_LOCK_STALE_MS": (False, _COORD),
    "MX8_SNAPSHOT_WAIT_TIMEOUT_MS": (False, _COORD),
    "MX8_MANIFEST_HASH": (False, _COORD + "; pin a snapshot with a link's @sha256: suffix"),
    "MX8_DEV_BLOCK_SIZE": (False, _COORD + "; ranks read round-robin batches"),
    "MX8_DEV_TOTAL_SAMPLES": (False, _COORD),
    "MX8_LOG": (False, "headrace logs through the logging module (logger 'headrace')"),
}


def _env(name: str) -> str | None:
    v = os.environ.get(name)
    return v if v not in (None, "") else None


def coord_url() -> str | None:
    """``$MX8_COORD_URL``, else ``$MX8_CLUSTER_URL``."""
    return _env("MX8_COORD_URL") or _env("MX8_CLUSTER_URL")


def _int(name: str, minimum: int) -> int | None:
    raw = _env(name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise ConfigError(f"invalid {name}={raw!r} (expected an integer >= {minimum})")
    return value


def decode_threads() -> int | None:
    """``$MX8_DECODE_THREADS`` (>= 1), after validating ``$MX8_DECODE_BACKEND``."""
    backend = _env("MX8_DECODE_BACKEND")
    if backend is not None and backend not in ("python", "rust"):
        raise ConfigError(f'invalid MX8_DECODE_BACKEND="{backend}" (expected: python|rust)')
    return _int("MX8_DECODE_THREADS", 1)


def pack_fetches(given: int) -> int:
    """``parallel_fetches`` for ``pack()``: ``$MX8_PACK_PARALLEL_FETCHES`` when the keyword is
    left at mx8's default."""
    env = _int("MX8_PACK_PARALLEL_FETCHES", 1)
    return env if env is not None and given == 128 else given


def s3_label_mode(data: Any) -> str | None:
    """``$MX8_S3_LABEL_MODE`` for a raw ``s3://`` link, validated with mx8's message."""
    mode = _env("MX8_S3_LABEL_MODE")
    if mode is None or not (isinstance(data, str) and data.startswith("s3://")):
        return None
    if mode not in ("auto", "none", "imagefolder"):
        raise ConfigError(f'invalid MX8_S3_LABEL_MODE="{mode}" (expected: '
                          "auto|none|imagefolder)")
    return mode


def distributed_order() -> dict[str, Any]:
    """``order``/``seed``/``epoch`` from ``$MX8_SHUFFLE``/``$MX8_SEED``/``$MX8_EPOCH`` (the
    coordinator's block shuffle), for a loader reading a rank's share."""
    shuffle = (_env("MX8_SHUFFLE") or "").lower()
    if shuffle in ("", "0", "false", "no", "off"):
        return {}
    if shuffle not in ("1", "true", "yes", "on"):
        raise ConfigError(f"invalid MX8_SHUFFLE={shuffle!r} (expected 1/true or 0/false)")
    out: dict[str, Any] = {"order": "shuffle"}
    for key in ("seed", "epoch"):
        value = _int(f"MX8_{key.upper()}", 0)
        if value is not None:
            out[key] = value
    return out
