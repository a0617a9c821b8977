"""``headrace.mx8``: mx8 1.0.7's Python API as thin configurations of headrace's loaders.

Every function takes mx8's keywords with their meaning and builds the matching headrace loader;
the wrappers only translate what is yielded (``PyBatch``/``TextBatch``/``AudioBatch``/
``VideoBatch``), ``stats()`` keys and ``print_stats()``. There is no coordinator: ``coord=``,
``job=`` and ``node=`` select distributed reading, whose rank and world size come from the
launcher the user runs (torchrun, SLURM, ``jax.distributed``); without one the call says how to
launch. Where headrace departs on purpose, see ``docs/migration-mx8.md``.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from typing import Any

from headrace._base.errors import ConfigError
from headrace._compat import mx8_env
from headrace._compat import mx8_token as mx8_tokens
from headrace._compat.mx8_batch import PyBatch
from headrace._engine.config import Constraints, RuntimeConfig
from headrace._engine.launcher import detect
from headrace._modal.image import ImageLoader as _ImageLoader

__all__ = ["CoordinatorHandle", "DataLoader", "DistributedDataLoader", "ImageLoader",
           "coordinator", "image",
           "load", "pack", "pack_dir", "resolve", "resolve_manifest_hash", "run", "stats"]

_LAUNCH_HINT = ("headrace has no coordinator: start one process per rank with a launcher, e.g. "
                "`torchrun --nproc_per_node=N train.py` (it sets RANK/WORLD_SIZE) or call "
                "jax.distributed.initialize() first; each rank then reads its own share")
_COORDINATORS: dict[str, Any] = {}  # CoordinatorHandle.url -> dataset link (this process)


def _tune(tune: bool | None) -> bool:
    """mx8's ``tune=`` / ``autotune=`` as headrace's ``tune`` (unset: off)."""
    return bool(tune)


def _distributed(job: Any, coord: Any, node: Any, where: str) -> dict[str, int]:
    """``rank``/``world_size`` for a call with mx8's coordinator keywords: the launcher's."""
    if coord is None and job is None:
        return {}
    if coord is not None and job is None and not os.environ.get("MX8_JOB_ID"):
        raise ConfigError("distributed mode requires job (or MX8_JOB_ID)")
    if coord is None and not mx8_env.coord_url():
        return {}  # mx8: job without coord stays local
    launch = detect()
    if not launch.distributed:
        raise ConfigError(f"{where} with coord=/job= reads one rank's share, but no launcher was "
                          f"found (WORLD_SIZE unset and jax.distributed not initialized): "
                          f"{_LAUNCH_HINT}")
    # the coordinator's MX8_SHUFFLE/MX8_SEED/MX8_EPOCH, as this rank's order
    return {"rank": launch.rank, "world_size": launch.world_size, **mx8_env.distributed_order()}


def _one_rss_cap(ram_gb: Any, constraints: Any) -> None:
    """mx8 refuses two RSS caps (``ram_gb`` and ``constraints.max_ram_bytes``), in its words."""
    if ram_gb is not None and getattr(constraints, "max_ram_bytes", None) is not None:
        raise ConfigError("pass only one of ram_gb or constraints.max_ram_bytes (both set the "
                          f"RSS cap: ram_gb={ram_gb!r}, max_ram_bytes="
                          f"{constraints.max_ram_bytes!r})")


def _common(store: Any, manifest: Any, recursive: bool, batch: int, inflight: int | None,
            queue: int | None, prefetch: int | None, start: Any, end: Any, resume: Any,
            ram_gb: Any, profile: Any, constraints: Any, runtime: Any) -> dict[str, Any]:
    if manifest is not None or os.environ.get("MX8_DEV_MANIFEST_PATH"):
        raise ConfigError("mx8 dev manifests (manifest=/MX8_DEV_MANIFEST_PATH) are not read by "
                          "headrace: pack the files (headrace.mx8.pack_dir or headrace.pack) or "
                          "point at the folder itself")
    if isinstance(batch, int) and not isinstance(batch, bool) and batch == 0:
        batch = 1  # mx8: batch=0 means 1
    _one_rss_cap(ram_gb, constraints)
    mx8_token = mx8_tokens.parse(resume)  # resumed once the loader is built (resume_at)
    kw: dict[str, Any] = dict(batch=batch, inflight=inflight, queue=queue, prefetch=prefetch,
                              start=start, end=end,
                              resume=None if mx8_token is not None else resume, ram_gb=ram_gb,
                              profile=profile, constraints=constraints, runtime=runtime)
    store = store if store is not None else os.environ.get("MX8_MANIFEST_STORE_ROOT")
    if store is not None:
        kw["store"] = store
    kw["recursive"] = recursive
    kw["mx8_token"] = mx8_token
    return kw


def _resume_mx8(loader: Any, token: dict[str, str] | None, *, epoch: int | None = 0) -> Any:
    """``loader`` moved to where an mx8 ``data_loader`` token stopped (closed if refused)."""
    if token is not None:
        try:
            mx8_tokens.resume_at(loader, token, epoch=epoch)
        except BaseException:
            loader.close()
            raise
    return loader


def _drop_unused_store(data: Any, kw: dict[str, Any]) -> None:
    """mx8's ``store=`` (manifest store root) reaches only dataset links (``s3://``, ``@refresh``
    / ``@sha256:`` suffixes, raw folders): a store folder, an mx8 pack or an image folder is read
    as it is, with no snapshot to keep."""
    from headrace._sources.links import can_open_link

    if "store" in kw and not can_open_link(data):
        del kw["store"]


def _mx8_stats(s: dict[str, Any]) -> dict[str, Any]:
    """headrace's stats with mx8's key names added (measured values only)."""
    out = dict(s)
    out.setdefault("batch_jitter_band_lower_pct", 85)
    out.setdefault("batch_jitter_band_upper_pct", 115)
    if "prefetch_batches" in s:
        out.setdefault("effective_prefetch_batches", s["prefetch_batches"])
    if "max_queue_batches" in s:
        out.setdefault("effective_max_queue_batches", s["max_queue_batches"])
    out["autotune_enabled"] = bool(s.get("autotune_enabled", False))
    return out


def _print_stats(s: dict[str, Any]) -> None:
    """mx8's ``print_stats()`` line, to stderr, with headrace's measured counters."""
    mb = 1 << 20
    print(f"[mx8] batches={s.get('delivered_batches_total', 0)} "
          f"samples={s.get('delivered_samples_total', 0)} "
          f"inflight={s.get('inflight_bytes', 0) / mb:.1f}MB "
          f"rss={s.get('process_rss_bytes', 0) / mb:.1f}MB "
          f"hwm={s.get('ram_high_water_bytes', 0) / mb:.1f}MB", file=sys.stderr)


class _Wrapped:
    """An mx8-shaped loader over a headrace loader ``_inner``."""

    _inner: Any

    def __iter__(self) -> _Wrapped:
        return self

    def __next__(self) -> Any:
        return self._convert(next(self._inner))

    def _convert(self, batch: Any) -> Any:
        return batch

    def __len__(self) -> int:
        return len(self._inner)

    def checkpoint(self) -> bytes:
        return bytes(self._inner.checkpoint())

    def state_dict(self) -> dict[str, Any]:
        return dict(self._inner.state_dict())

    def load_state_dict(self, state: Any) -> None:
        self._inner.load_state_dict(state)

    def set_epoch(self, epoch: int) -> None:
        self._inner.set_epoch(epoch)

    def close(self) -> None:
        self._inner.close()

    def stats(self) -> dict[str, Any]:
        return _mx8_stats(self._inner.stats())

    def print_stats(self) -> None:
        _print_stats(self._inner.stats())

    def __enter__(self) -> _Wrapped:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_MX8_INFLIGHT = 128 << 20  # mx8's DataLoader default max_inflight_bytes


def batch_ceiling(inflight: int | None, batch_bytes: int | None) -> int:
    """mx8's class API batch ceiling: ``max_batch_bytes``, else a quarter of
    ``max_inflight_bytes`` (128 MiB when unset) held between 4 and 64 MiB; never above the
    inflight cap (its wheel cuts 8 and 16 MiB caps to 4 MiB batches, 64 MiB to 16)."""
    cap = _MX8_INFLIGHT if inflight is None else inflight
    derived = min(max(cap // 4, 4 << 20), 64 << 20, cap)
    return max(1, min(derived if batch_bytes is None else batch_bytes, cap))


def _load_capped(data: Any, batch_bytes: int | None, target_bytes: int | None,
                 inflight: int | None, kw: dict[str, Any], *, derived: bool) -> Any:
    """``headrace.load`` with mx8's batch ceiling. ``derived`` (the class API): the ceiling is
    ``batch_ceiling``'s, also when neither cap is given (as in mx8; on one rank); else
    (``load()``) it is
    ``batch_bytes``, or the inflight cap when only that is given (mx8's ``load`` ignores
    ``inflight``; headrace honours it, so batches are cut to fit it). Records of one size
    everywhere (arrays) are not cut without a target."""
    import headrace

    # Under ranks, byte-cut batches are dealt to the ranks in rounds, not records split between
    # them: the default ceiling (which cuts only batches past 28.8 MiB) applies there only when
    # a cap is given, so a small-record dataset is sharded as without byte batching.
    if derived and (inflight is not None or batch_bytes is not None
                    or int(kw.get("world_size") or 1) == 1):
        ceiling = batch_ceiling(inflight, batch_bytes)
    elif batch_bytes is not None or inflight is None:
        return headrace.load(data, batch_bytes=batch_bytes, target_bytes=target_bytes, **kw)
    else:
        ceiling = inflight
    try:
        return headrace.load(data, batch_bytes=ceiling, target_bytes=target_bytes, **kw)
    except ConfigError as e:
        if "need per-record sizes" in str(e) and target_bytes is None and batch_bytes is None:
            return headrace.load(data, target_bytes=None, **kw)
        if batch_bytes is not None:
            raise
        raise _ceiling_error(e, ceiling, inflight) from None


def _ceiling_error(e: ConfigError, ceiling: int, inflight: int | None) -> ConfigError:
    """A record past the ceiling mx8 derived (the user gave no ``max_batch_bytes``), in words
    that name what the user set and what to pass."""
    m = re.match(r"(record \d+ has \d+ bytes) > batch_bytes \d+.*at least (\d+)", str(e))
    if m is None:
        return e
    if ceiling == inflight:
        return ConfigError(f"{m.group(1)} > max_inflight_bytes {inflight}: with max_batch_bytes "
                           "unset a batch's bytes are capped by max_inflight_bytes, as in mx8; "
                           f"raise max_inflight_bytes to at least {m.group(2)} (the largest "
                           "record)")
    return ConfigError(f"{m.group(1)} > max_batch_bytes {ceiling}: with max_batch_bytes unset a "
                       "batch's bytes are capped by a quarter of max_inflight_bytes "
                       f"({inflight if inflight is not None else _MX8_INFLIGHT}), held between "
                       "4 and 64 MiB, as in mx8; pass max_batch_bytes of at least "
                       f"{m.group(2)} (the largest record)")


class DataLoader(_Wrapped):
    """Raw records as ``PyBatch`` (mx8's long-name constructor)."""

    def __init__(self, dataset_link: Any, *, manifest_store: Any = None, manifest_path: Any = None,
                 recursive: bool = True, batch_size_samples: int = 512,
                 max_inflight_bytes: int | None = None, max_queue_batches: int | None = None,
                 prefetch_batches: int | None = None, target_batch_bytes: int | None = None,
                 max_batch_bytes: int | None = None, max_ram_bytes: int | None = None,
                 start_id: int | None = None, end_id: int | None = None,
                 resume_from: bytes | None = None, node_id: Any = None,
                 profile: str | None = None, autotune: bool | None = None,
                 _extra: dict[str, Any] | None = None) -> None:

        tune = _tune(autotune)
        kw = _common(manifest_store, manifest_path, recursive, batch_size_samples,
                     max_inflight_bytes, max_queue_batches, prefetch_batches, start_id, end_id,
                     resume_from, None, profile, None, None)
        if max_ram_bytes is not None:
            kw["constraints"] = Constraints(max_ram_bytes=max_ram_bytes)
        kw.update(_extra or {})
        kw["tune"] = tune
        token = kw.pop("mx8_token")
        top_level = kw.pop("_mx8_load", False)  # load(): its own ceiling rule
        _drop_unused_store(dataset_link, kw)
        label_mode = mx8_env.s3_label_mode(dataset_link)
        if label_mode is not None:
            kw["label_mode"] = label_mode
        self._inner = _load_capped(dataset_link, max_batch_bytes, target_batch_bytes,
                                   max_inflight_bytes, kw, derived=not top_level)
        _resume_mx8(self._inner, token)

    def _convert(self, batch: Any) -> PyBatch:
        return PyBatch.from_batch(batch, self._inner.last_ids)

    @property
    def manifest_hash(self) -> str:
        fp = str(self._inner.source.fingerprint)
        return fp.split(":", 1)[1] if ":" in fp else fp

    @property
    def assigned_rank(self) -> int:
        return int(self._inner.rank)

    @property
    def world_size(self) -> int:
        return int(self._inner.world_size)


class DistributedDataLoader(DataLoader):
    """mx8's coordinator client, as this rank's share under the launcher (no coordinator).

    The dataset is the one given to :func:`coordinator` (``data=``) in this process, or
    ``$MX8_DATASET_LINK`` (the variable mx8's coordinator reads).
    """

    def __init__(self, *, coord_url: str, job_id: str, node_id: str,
                 batch_size_samples: int = 512, max_inflight_bytes: int | None = None,
                 max_queue_batches: int | None = None, prefetch_batches: int | None = None,
                 target_batch_bytes: int | None = None, max_batch_bytes: int | None = None,
                 want: int = 1, max_ram_gb: float | None = None, profile: str | None = None,
                 autotune: bool | None = None, constraints: Any = None, runtime: Any = None,
                 progress_interval_ms: int = 500, grpc_max_message_bytes: int | None = None,
                 resume_from: bytes | None = None, _data: Any = None) -> None:
        del job_id, node_id, progress_interval_ms, grpc_max_message_bytes
        data = _data if _data is not None else _COORDINATORS.get(coord_url,
                                                                 os.environ.get("MX8_DATASET_LINK"))
        if data is None:
            raise ConfigError(f"DistributedDataLoader(coord_url={coord_url!r}) has no dataset: "
                              "create it with mx8.coordinator(data=...) in this process or set "
                              f"MX8_DATASET_LINK. {_LAUNCH_HINT}")
        _one_rss_cap(max_ram_gb, constraints)
        launch = detect()
        if not launch.distributed:
            raise ConfigError(f"DistributedDataLoader found no launcher: {_LAUNCH_HINT}")
        extra: dict[str, Any] = {"rank": launch.rank, "world_size": launch.world_size,
                                 "ram_gb": max_ram_gb, **mx8_env.distributed_order()}
        if constraints is not None:
            extra["constraints"] = constraints
        if runtime is not None:
            extra["runtime"] = runtime
        super().__init__(data, batch_size_samples=batch_size_samples,
                         max_inflight_bytes=max_inflight_bytes,
                         max_queue_batches=max_queue_batches, prefetch_batches=prefetch_batches,
                         target_batch_bytes=target_batch_bytes, max_batch_bytes=max_batch_bytes,
                         resume_from=resume_from, profile=profile, autotune=autotune,
                         _extra=extra)
        self._want = want

    def stats(self) -> dict[str, Any]:
        """As ``DataLoader.stats()`` plus mx8's distributed keys that hold here: this rank,
        the world size and ``want`` as given (the ranks are the launcher's, so mx8's
        ``elastic_*`` membership keys are absent: the world never changes while running)."""
        s = super().stats()
        s.update(assigned_rank=self.assigned_rank, world_size=self.world_size,
                 effective_want=self._want)
        return s


class CoordinatorHandle:
    """What :func:`coordinator` returns: the launcher's world, no server process."""

    def __init__(self, url: str, data: Any) -> None:
        self.url = url
        self._data = data
        if data is not None:
            _COORDINATORS[url] = data

    def stop(self) -> None:
        _COORDINATORS.pop(self.url, None)

    def __enter__(self) -> CoordinatorHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f'mx8.CoordinatorHandle(url="{self.url}")'


def coordinator(*, rank: int | None = None, world_size: int = 1, data: Any = None,
                port: int | None = None, bind_host: str = "127.0.0.1",
                master_addr: str | None = None, timeout_secs: float = 30,
                log: bool = False) -> CoordinatorHandle:
    """mx8's coordinator, mapped onto the launcher: checks the launcher's world matches
    ``world_size`` and returns a handle whose ``url`` ``DistributedDataLoader`` accepts."""
    del port, bind_host, master_addr, timeout_secs, log
    if world_size == 1 and os.environ.get("MX8_WORLD_SIZE"):
        world_size = int(os.environ["MX8_WORLD_SIZE"])  # the coordinator's own variable
    launch = detect(rank=rank) if rank is not None else detect()
    if world_size > 1 and launch.world_size != world_size:
        raise ConfigError(f"coordinator(world_size={world_size}) but the launcher reports "
                          f"world_size={launch.world_size}: {_LAUNCH_HINT}")
    return CoordinatorHandle(f"launcher://{launch.launcher}/{launch.world_size}", data)


def load(data: Any, *, store: Any = None, manifest: Any = None, recursive: bool = True,
         batch: int = 512, inflight: int | None = None, queue: int | None = None,
         prefetch: int | None = None, target_bytes: int | None = None,
         batch_bytes: int | None = None, start: int | None = None, end: int | None = None,
         resume: bytes | None = None, job: str | None = None, coord: str | None = None,
         node: str | None = None, ram_gb: float | None = None, profile: str | None = None,
         tune: bool | None = None, constraints: Constraints | None = None,
         runtime: RuntimeConfig | None = None, autopack: bool = False,
         shard_mb: int = 512) -> DataLoader:
    """mx8's ``load``: ``PyBatch`` per batch. ``inflight``/``queue``/``prefetch`` are honoured;
    ``autopack``/``shard_mb`` change nothing (raw folders and prefixes are read directly)."""
    del autopack, shard_mb
    _one_rss_cap(ram_gb, constraints)
    extra: dict[str, Any] = dict(_distributed(job, coord, node, "load()"), _mx8_load=True)
    if constraints is not None:
        extra["constraints"] = constraints
    if runtime is not None:
        extra["runtime"] = runtime
    if ram_gb is not None:
        extra["ram_gb"] = ram_gb
    return DataLoader(data, manifest_store=store, manifest_path=manifest, recursive=recursive,
                      batch_size_samples=batch, max_inflight_bytes=inflight,
                      max_queue_batches=queue, prefetch_batches=prefetch,
                      target_batch_bytes=target_bytes, max_batch_bytes=batch_bytes,
                      start_id=start, end_id=end, resume_from=resume, profile=profile,
                      autotune=tune, _extra=extra)


def run(data: Any, *, batch: int = 512, ram_gb: float = 8.0, profile: str | None = None,
        job: str | None = None, resume: bytes | None = None, coord: str | None = None,
        node: str | None = None, recursive: bool = True, store: Any = None, manifest: Any = None,
        tune: bool | None = None, constraints: Any = None, runtime: Any = None) -> DataLoader:
    """Local below ``WORLD_SIZE`` 2, this rank's share under a launcher (mx8's ``run``)."""
    launch = detect()
    if launch.distributed:
        job = job or os.environ.get("MX8_JOB_ID") or "headrace"
        coord = coord or mx8_env.coord_url() or "launcher"
    if constraints is not None and getattr(constraints, "max_ram_bytes", None) is not None:
        ram_gb = None  # type: ignore[assignment]
    return load(data, batch=batch, ram_gb=ram_gb, profile=profile, job=job, resume=resume,
                coord=coord, node=node, recursive=recursive, store=store, manifest=manifest,
                tune=tune, constraints=constraints, runtime=runtime)


def stats(loader: Any, *, raw: bool = False) -> str | dict[str, Any]:
    """``loader.stats()`` with ``raw=True``, else headrace's multi-line summary."""
    if not callable(getattr(loader, "stats", None)):
        raise ConfigError("mx8.stats expects a loader object with a .stats() method")
    s = loader.stats()
    if not isinstance(s, dict):
        raise ConfigError("mx8.stats expected loader.stats() to return a dict")
    if raw:
        return s
    from headrace._engine.stats import stats as summary

    return summary(getattr(loader, "_inner", loader))


def image(data: Any, *, batch: int = 32, **kwargs: Any) -> Any:
    """mx8's ``image``: ``(images, labels)`` torch tensors, NCHW (headrace.image with
    ``to_torch=True``; mx8's keywords are headrace.image's own). ``batch_bytes``/
    ``target_bytes`` cut batches by the encoded files' bytes, as mx8 does."""
    kwargs.setdefault("to_torch", True)
    _one_rss_cap(kwargs.get("ram_gb"), kwargs.get("constraints"))
    threads = mx8_env.decode_threads()
    if threads is not None:
        kwargs.setdefault("threads", threads)
    label_mode = mx8_env.s3_label_mode(data)
    if label_mode is not None:
        kwargs.setdefault("label_mode", label_mode)
    kwargs["tune"] = _tune(kwargs.pop("tune", None))
    extra = _distributed(kwargs.pop("job", None), kwargs.pop("coord", None),
                         kwargs.pop("node", None), "image()")
    if kwargs.pop("manifest", None) is not None:
        raise ConfigError("mx8 dev manifests (manifest=) are not read by headrace: pack the "
                          "files or point at the folder itself")

    token = mx8_tokens.parse(kwargs.get("resume"))
    if token is not None:
        del kwargs["resume"]
    from headrace._modal.image import _image_options

    # mx8's image tokens leave the augmentation epoch out (always 0): not checked
    loader = ImageLoader._create(data, _image_options(dict(batch=batch, **extra, **kwargs)))
    return _resume_mx8(loader, token, epoch=None)


class ImageLoader(_ImageLoader):
    """headrace's ``ImageLoader`` as mx8's: what :func:`image` returns and mx8's long-name
    constructor; ``stats()`` has mx8's keys, ``print_stats()`` mx8's line, and an mx8
    ``data_loader`` token given as ``resume_from`` resumes."""

    def __init__(self, dataset_link: Any, *, resume_from: Any = None, epoch: int = 0,
                 **kwargs: Any) -> None:
        token = mx8_tokens.parse(resume_from)
        # mx8's batch ceiling over the encoded files (``batch_ceiling``; on one rank when no cap
        # is given, as for ``DataLoader``)
        inflight = kwargs.get("max_inflight_bytes")
        derived = (kwargs.get("max_batch_bytes") is None and kwargs.get("batch_bytes") is None
                   and (inflight is not None or not detect().distributed))
        if derived:
            kwargs["max_batch_bytes"] = batch_ceiling(inflight, None)
        try:
            super().__init__(dataset_link, resume_from=None if token is not None else resume_from,
                             epoch=epoch, **kwargs)
        except ConfigError as e:
            if not derived:
                raise
            raise _ceiling_error(e, kwargs["max_batch_bytes"], inflight) from None
        _resume_mx8(self, token, epoch=None)

    def stats(self) -> dict[str, Any]:
        """headrace's stats with mx8's key names added (as ``mx8.load``'s)."""
        return _mx8_stats(super().stats())

    def print_stats(self) -> None:
        """mx8's line: ``[mx8] batches=N samples=N inflight=X.XMB rss=X.XMB hwm=X.XMB``."""
        _print_stats(super().stats())


def pack_dir(in_dir: Any, *, out: Any, shard_mb: int = 512, label_mode: str | None = None,
             require_labels: bool = False) -> dict[str, Any]:
    """Packs ``in_dir`` into a headrace store at ``out``; the result has mx8's keys too
    (``manifest_path`` is ``None``: a store has no manifest file; ``manifest_hash`` is what
    ``resolve(out)`` returns)."""
    import headrace

    r = dict(headrace.pack_dir(in_dir, out=out, shard_mb=shard_mb, label_mode=label_mode,
                               require_labels=require_labels, overwrite=True))
    _mx8_keys(r, out)
    return r


def pack(pack_in: Any, *, out: Any, shard_mb: int = 512, label_mode: str | None = None,
         require_labels: bool = False, parallel_fetches: int = 128) -> dict[str, Any]:
    """mx8's ``pack``: the files under ``pack_in`` (an ``s3://`` prefix, or here also a local
    folder) into a headrace store at ``out`` (local or ``s3://``), ``parallel_fetches``
    concurrent S3 requests. The result has mx8's keys; ``manifest_path``/``manifest_key`` are
    ``None`` (a store has no manifest file), ``labels_path``/``labels_key`` name the store's
    labels file (``None`` unlabeled), ``shards`` counts the store's chunks."""
    import headrace

    r = dict(headrace.pack(pack_in, out=out, shard_mb=shard_mb, label_mode=label_mode or "auto",
                           require_labels=require_labels,
                           parallel_fetches=mx8_env.pack_fetches(parallel_fetches)))
    with headrace.open(out) as st:
        labels = st.attrs.get("labels")
        r["shards"] = len(st.meta.chunks)
    r["labels_path"] = f"{os.fspath(out).rstrip('/')}/{labels}" if labels else None
    r["source_manifest_hash"] = r.get("manifest_hash")  # the snapshot of pack_in that was read
    _mx8_keys(r, out)  # labels_hash only for a local out: an s3:// one is not read back
    r["manifest_key"] = None
    r["labels_key"] = r["labels_path"]
    return r


def _mx8_keys(r: dict[str, Any], out: Any) -> None:
    import headrace

    labels = r.get("labels_path")
    r.setdefault("manifest_path", None)
    r["manifest_hash"] = headrace.resolve_manifest_hash(out)  # what mx8.resolve(out) says
    if labels and os.path.isfile(labels):
        with open(labels, "rb") as f:
            r["labels_hash"] = hashlib.sha256(f.read()).hexdigest()
    else:
        r["labels_hash"] = None


def resolve_manifest_hash(data: Any, *, store: Any = None, manifest: Any = None,
                          recursive: bool = True, node: Any = None) -> str:
    """mx8's manifest hash of a dataset link (``node`` names a coordinator node: unused)."""
    del node
    if manifest is not None:
        raise ConfigError("mx8 dev manifests (manifest=) are not read by headrace")
    import headrace
    from headrace._sources.images import is_mx8_pack

    if isinstance(data, str | os.PathLike) and is_mx8_pack(os.fspath(data)):
        # mx8 indexes a pack from its manifest: the hash is that file's (what its tokens and
        # DataLoader.manifest_hash carry)
        with open(os.path.join(os.fspath(data), "_mx8", "manifest.tsv"), "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    return str(headrace.resolve_manifest_hash(data, store=store, recursive=recursive))


resolve = resolve_manifest_hash
