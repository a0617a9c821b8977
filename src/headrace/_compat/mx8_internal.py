"""``headrace.mx8._internal``: mx8 1.0.7's video clip-index probes over headrace's clip index.

``video_index_build`` returns mx8's dict (``manifest_hash``, ``video_schema_version``,
``clip_count``, ``tail_clips_dropped_total``, ``clip_index_hash``, ``clip_ids_head``,
``failure_counts``); ``video_index_replay_check`` builds the index twice and adds
``deterministic``.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from headrace._base.errors import ConfigError

__all__ = ["video_index_build", "video_index_replay_check"]


def video_index_build(dataset_link: Any, *, manifest_store: Any = None, manifest_path: Any = None,
                      recursive: bool = True, clip_len: int = 16, stride: int = 8,
                      fps_policy: Any = "fixed_fps:8", seed: int = 0, epoch: int = 0,
                      max_clips_in_memory: int = 1000000, node_id: Any = None) -> dict[str, Any]:
    """The clip index of the videos at ``dataset_link``: ``clip_len`` frames every ``stride``
    frames of each video resampled to ``fps_policy`` frames per second: mx8's string
    ``"fixed_fps:<rate>"`` (its default ``"fixed_fps:8"``), or the rate itself (a number or its
    string). ``seed``/``epoch`` do not change the index (clip order is the loader's)."""
    from headrace._modal.video_index import build_index, fps_fraction
    from headrace._sources.media import open_media

    del manifest_store, seed, epoch, node_id
    if manifest_path is not None:
        raise ConfigError("mx8 dev manifests (manifest_path=) are not read by headrace: point at "
                          "the folder of videos itself")
    for name, value in (("clip_len", clip_len), ("stride", stride),
                        ("max_clips_in_memory", max_clips_in_memory)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigError(f"{name} must be > 0, got {value!r}")
    fps_policy = _fps(fps_policy)
    files = open_media(dataset_link, kind="video", recursive=recursive)
    try:
        idx, info = build_index(files, clip=clip_len, stride=stride, fps=fps_fraction(fps_policy))
    finally:
        files.close()
    if len(idx) > max_clips_in_memory:
        raise ConfigError(f"the clip index holds {len(idx)} clips > max_clips_in_memory="
                          f"{max_clips_in_memory}; raise it")
    return info


_FIXED = "fixed_fps:"


def _fps(policy: Any) -> Any:
    """The frame rate an ``fps_policy`` names (mx8 writes ``"fixed_fps:<rate>"``)."""
    if not isinstance(policy, str):
        return policy
    text = policy.strip()
    if not text:
        raise ConfigError("fps_policy must be non-empty")
    rate = text[len(_FIXED):] if text.startswith(_FIXED) else text
    try:
        Fraction(rate)
    except (ValueError, ZeroDivisionError):
        raise ConfigError(f"fps_policy={policy!r} names no frame rate: use mx8's "
                          f"'fixed_fps:<rate>' (e.g. 'fixed_fps:8') or the rate itself") from None
    return rate


def video_index_replay_check(dataset_link: Any, **kwargs: Any) -> dict[str, Any]:
    """:func:`video_index_build` twice, plus ``deterministic``: both built the same index."""
    first = video_index_build(dataset_link, **kwargs)
    second = video_index_build(dataset_link, **kwargs)
    out = dict(second)
    out["deterministic"] = first["clip_index_hash"] == second["clip_index_hash"]
    return out
