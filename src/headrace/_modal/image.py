"""``headrace.image``: (images, labels) batches decoded and augmented in the loader's threads.

Built on :class:`headrace.Loader`: the source hands out encoded bytes (zero-copy ``mmap`` views for
stores and mx8 packs), and a transform running in the worker threads reads each image's header,
plans its augmentation (``_image_augment``, a pure function of ``(seed, epoch, record id)``),
decodes the planned crop at the smallest DCT scale that covers it (``_image_decode``) and writes
the result straight into the batch array (or, when a flip, jitter, crop or float conversion
follows, into the thread's own buffer first). The batch array is counted in the loader's byte
budget (``transform_nbytes = batch x H x W x 3 x itemsize``) and is one the program has dropped
when there is one (``_Job.size_pool``). Once a batch is decoded, the pages of its encoded images
are unmapped from the process (``ImageRecords.release``): page cache, not the loader's memory.

Epochs run one :class:`~headrace.Loader` each, so every batch knows its epoch (the augmentation
key) and the checkpoint of the last delivered batch resumes into the right epoch.

``on_decode_error="skip"`` drops the undecodable image only: that batch comes back shorter by the
number of bad images (a batch where every image failed is not delivered at all). The checkpoint
still counts the bad records as consumed, so a resumed run skips them the same way: exact resume.
"""

from __future__ import annotations

import threading
from functools import partial
from typing import Any

import numpy as np

from headrace._base.errors import ConfigError, DecodeError, LoaderError
from headrace._engine import checkpoint as _checkpoint
from headrace._engine.history import delivered, token_at, tracked
from headrace._engine.keywords import refuse_unknown
from headrace._engine.lifecycle import (
    INNER_LOADER_KEYWORDS,
    YIELD_KEY,
    BorrowedRecords,
    EmptyStreak,
    LoaderWrapper,
    ThenTransform,
    refuse_empty,
)
from headrace._engine.loader import BatchPlan, Loader, resolve_order
from headrace._engine.timeline import timeline_period
from headrace._modal.image_augment import ImageSpec, finish, plan_batch, scratch
from headrace._modal.image_decode import decode, decode_window, image_size
from headrace._order.byte_plan import BytePlan
from headrace._sources.images import ImageRecords, open_image_records
from headrace._store.recycle import Recycler

__all__ = ["ImageLoader", "image"]

_ERROR_POLICIES = ("error", "skip")


class _RecordsSource(BorrowedRecords):
    """``ImageRecords`` as a loader source that gathers payload views, not copies."""

    records: ImageRecords

    def gather(self, ids: np.ndarray) -> dict[str, Any]:
        return {"payloads": self.records.payloads(ids), "label": self.records.labels(ids)}


class _Job:
    """What the decoding transform needs, and its counters. The worker threads hold this, never
    the ``ImageLoader``, so a loader dropped without ``close()`` is collected and its threads
    stopped by the inner loader's finalizer."""

    def __init__(self, *, spec: ImageSpec, seed: int, records: ImageRecords,
                 on_decode_error: str, native_hw: tuple[int, int] | None,
                 item_shape: tuple[int, ...], dtype: np.dtype[Any]) -> None:
        self.spec = spec
        self.seed = seed
        self.records = records
        self.on_decode_error = on_decode_error
        self.native_hw = native_hw
        self.item_shape = item_shape
        self.dtype = dtype
        self.lock = threading.Lock()
        self.decoded = 0
        self.failed = 0
        # batch arrays written again once the program dropped them (see ``size_pool``)
        self.pool = Recycler(max_arrays=0, max_bytes=0)

    def size_pool(self, batches: int, batch: int) -> None:
        """Recycle up to ``batches`` output arrays of ``batch`` images.

        A fresh float32 batch is 38 MB of new pages the kernel faults in and zeroes (a third of
        the default path's CPU per image); a batch the program let go of (no array, view or
        tensor of it left) is rewritten instead. ``batches`` is what can be referenced at once
        anyway: the window, the batch each worker thread still holds until it dispatches its
        next one, the consumer's own inline batch and the two a ``for`` loop holds (the one it
        works on, the one ``next()`` returns). So the idle arrays are never more than the same
        run holds without recycling, and they are dropped when the run ends or the loader
        closes.
        """
        nbytes = batch * int(np.prod(self.item_shape)) * self.dtype.itemsize
        self.pool = Recycler(max_arrays=batches, max_bytes=batches * nbytes,
                             max_array_bytes=nbytes)

    def _count(self, *, decoded: int, failed: int) -> None:
        with self.lock:
            self.decoded += decoded
            self.failed += failed


class _Decoder:
    """The transform: payload views -> one (images, labels) batch. Thread-safe."""

    def __init__(self, job: _Job, epoch: int) -> None:
        self.ld = job
        self.epoch = epoch

    def __call__(self, batch: dict[str, Any], ids: np.ndarray) -> dict[str, Any]:
        ld = self.ld
        spec = ld.spec
        payloads = batch["payloads"]
        n = len(ids)
        sizes: list[tuple[int, int]] = []
        bad: dict[int, DecodeError] = {}
        for j, buf in enumerate(payloads):
            try:
                sizes.append(image_size(buf))
            except DecodeError as e:
                bad[j] = e
                sizes.append((1, 1))
        plans = plan_batch(spec, ld.seed, self.epoch, ids, sizes)
        out = ld.pool.empty((n, *ld.item_shape), ld.dtype)
        direct = spec.layout == "NHWC" and not spec.float_out
        keep = np.empty(n, np.int64)
        k = 0
        for j, (buf, plan) in enumerate(zip(payloads, plans, strict=True)):
            try:
                if j in bad:
                    raise bad[j]
                if ld.native_hw is not None and sizes[j] != ld.native_hw:
                    raise ConfigError(
                        f"record {int(ids[j])} ({ld.records.path(int(ids[j]))}) is "
                        f"{sizes[j][0]}x{sizes[j][1]} but the batch shape is "
                        f"{ld.native_hw[0]}x{ld.native_hw[1]}; pass resize=(H, W) (or a crop) so "
                        "every image comes out the same size")
                simple = direct and (plan.post is None or plan.window) and not plan.flip \
                    and plan.jitter is None
                # the decode goes straight into the batch slot, else into this thread's buffer
                # when its shape is known (finish() then reads it into the slot)
                dst = out[k] if simple else None
                if plan.window:
                    assert plan.size is not None and plan.post is not None
                    if dst is None:
                        dst = scratch("image", (plan.post[2], plan.post[3], 3))
                    img = decode_window(buf, resized=plan.size, window=plan.post, out=dst,
                                        dct_scale=spec.dct_scale, fast=bool(spec.fast))
                else:
                    if dst is None and plan.size is not None:
                        dst = scratch("image", (*plan.size, 3))
                    img = decode(buf, box=plan.box, size=plan.size, out=dst,
                                 interpolation=spec.interpolation, dct_scale=spec.dct_scale,
                                 fast=bool(spec.fast))
                if not simple:
                    finish(spec, img, plan, out[k])
            except DecodeError as e:
                rid = int(ids[j])
                path = ld.records.path(rid)
                if ld.on_decode_error == "error":
                    raise DecodeError(f"record {rid} ({path}): {e}", record_id=rid,
                                      path=path) from e
                continue
            keep[k] = j
            k += 1
        ld.records.release(payloads)
        ld._count(decoded=k, failed=n - k)
        labels = np.asarray(batch["label"], np.int64)
        if k == n:
            return {"images": out, "labels": labels, "ids": ids}
        sel = keep[:k]
        return {"images": out[:k], "labels": labels[sel], "ids": ids[sel]}


def _finish(to_torch: bool, b: dict[str, Any]) -> tuple[Any, Any]:
    """A decoded batch as the loader yields it: ``(images, labels)``."""
    if to_torch:
        import torch

        return torch.from_numpy(b["images"]), torch.from_numpy(b["labels"])
    return b["images"], b["labels"]


class ImageLoader(LoaderWrapper):
    """Iterates ``(images, labels)`` batches; built by :func:`image` (see it for the arguments)
    or with mx8's long-name constructor (``ImageLoader(dataset_link, batch_size_samples=...)``).

    ``images`` is ``(B, 3, H, W)`` (``layout="NCHW"``) or ``(B, H, W, 3)``, ``float32`` (``/255``,
    then ``mean``/``std``) or ``uint8`` (``float_out=False``); ``labels`` is ``int64[B]`` (``-1``
    for unlabeled records). NumPy arrays, or torch tensors with ``to_torch=True``.
    """

    _timeline_kind = "image"
    _stats_summary = "images decoded {images_decoded_total}, decode errors {decode_errors_total}"

    def __init__(self, dataset_link: Any, *, manifest_store: str | None = None,
                 manifest_path: str | None = None, recursive: bool = True,
                 batch_size_samples: int = 32, max_inflight_bytes: int | None = None,
                 max_queue_batches: int | None = None, prefetch_batches: int | None = None,
                 target_batch_bytes: int | None = None, max_batch_bytes: int | None = None,
                 max_ram_bytes: int | None = None, start_id: int | None = None,
                 end_id: int | None = None, resume_from: bytes | None = None,
                 node_id: str | None = None, profile: str | None = None,
                 autotune: bool | None = None, resize_hw: tuple[int, int] | None = None,
                 crop_hw: tuple[int, int] | None = None, horizontal_flip_p: float = 0.0,
                 color_jitter_brightness: float = 0.0, color_jitter_contrast: float = 0.0,
                 color_jitter_saturation: float = 0.0, color_jitter_hue: float = 0.0,
                 normalize_mean: tuple[float, float, float] | None = None,
                 normalize_std: tuple[float, float, float] | None = None, seed: int = 0,
                 epoch: int = 0, to_float: bool = True, **kwargs: Any) -> None:
        """mx8's long-name constructor (``mx8.ImageLoader``), mapped onto :func:`image`.

        Every mx8 name maps to an :func:`image` keyword (``batch_size_samples`` -> ``batch``,
        ``max_inflight_bytes`` -> ``inflight``, ``resize_hw`` -> ``resize``, ``start_id``/``end_id``
        -> ``start``/``end``, ``resume_from`` -> ``resume``, ``manifest_store`` -> ``store``,
        ``max_ram_bytes`` -> ``constraints.max_ram_bytes``, ...); any other :func:`image` keyword
        (``shuffle``, ``layout``, ``to_torch``, ``on_decode_error``, ...) may be passed too.
        ``node_id`` is accepted and ignored (no coordinator); ``autotune`` is ``tune``. ``manifest_path`` (mx8's hand-written dev manifest) and the byte-aware
        batch knobs ``target_batch_bytes``/``max_batch_bytes`` are ``target_bytes``/
        ``batch_bytes`` (counted over the encoded files, as mx8 does); ``manifest_path`` (mx8's
        hand-written dev manifest) is refused.
        """
        if manifest_path is not None:
            raise ConfigError("manifest_path= (an mx8 dev manifest) is not supported; point "
                              "ImageLoader at the data (a store, folder, mx8 pack or s3:// link)")
        del node_id  # no coordinator
        constraints = kwargs.pop("constraints", None)
        if max_ram_bytes is not None:
            from headrace._engine.config import Constraints

            if constraints is not None:
                raise ConfigError("pass max_ram_bytes= or constraints=, not both")
            constraints = Constraints(max_ram_bytes=max_ram_bytes)
        mapped = {
            "store": manifest_store, "recursive": recursive, "batch": batch_size_samples,
            "inflight": max_inflight_bytes, "queue": max_queue_batches,
            "prefetch": prefetch_batches, "start": start_id, "end": end_id,
            "resume": resume_from, "profile": profile, "resize": resize_hw, "crop": crop_hw,
            "flip_p": horizontal_flip_p, "jitter_brightness": color_jitter_brightness,
            "jitter_contrast": color_jitter_contrast,
            "jitter_saturation": color_jitter_saturation, "jitter_hue": color_jitter_hue,
            "mean": normalize_mean, "std": normalize_std, "seed": seed, "epoch": epoch,
            "float_out": to_float, "constraints": constraints, "tune": autotune,
            "target_bytes": target_batch_bytes, "batch_bytes": max_batch_bytes,
        }
        both = sorted(set(kwargs) & set(mapped))
        if both:
            raise ConfigError(f"{both} are image() names of ImageLoader arguments already given "
                              "by their mx8 names; pass each setting once")
        self._construct(dataset_link, _image_options({**mapped, **kwargs}))

    @classmethod
    def _create(cls, data: Any, opts: dict[str, Any]) -> ImageLoader:
        self = cls.__new__(cls)
        self._construct(data, opts)
        return self

    def _construct(self, data: Any, opts: dict[str, Any],
                   records: ImageRecords | None = None) -> None:
        """Builds the loader from :func:`image`'s options (``records``: reuse already open ones)."""
        self._closed = True  # until the records are open: close()/__del__ have nothing to do
        self._inner: Loader | None = None
        o = dict(opts)
        if o["on_decode_error"] not in _ERROR_POLICIES:
            raise ConfigError(f"on_decode_error={o['on_decode_error']!r} must be 'error' or "
                              "'skip'")
        timeline_s = timeline_period(o["timeline"])
        start, end = _check_range(o["start"], o["end"])
        spec = ImageSpec.from_kwargs(
            augment=o["augment"], resize=o["resize"], crop=o["crop"],
            center_crop=o["center_crop"], random_resized_crop=o["random_resized_crop"],
            eval_crop=o["eval_crop"], crop_fraction=o["crop_fraction"],
            scale=o["scale"], ratio=o["ratio"], flip_p=o["flip_p"],
            jitter_brightness=o["jitter_brightness"], jitter_contrast=o["jitter_contrast"],
            jitter_saturation=o["jitter_saturation"], jitter_hue=o["jitter_hue"],
            mean=o["mean"], std=o["std"], float_out=o["float_out"], layout=o["layout"],
            interpolation=o["interpolation"], dct_scale=o["dct_scale"], fast=o["fast_decode"])
        order = resolve_order(o["order"], o["shuffle"])
        self._user_transform = o["transform"]
        loader_kw = {k: o[k] for k in INNER_LOADER_KEYWORDS}
        budget = o.get("budget")
        if budget is not None:  # a mix's share: outlives each epoch's Loader (see _EpochBudget)
            loader_kw["budget"] = _EpochBudget(budget)
        self._budget = budget
        if records is None:
            records = open_image_records(data, label_mode=o["label_mode"], **o["link_options"])
        self.records = records
        self._closed = False
        try:
            refuse_empty(len(records), "images", data)
            if end is not None and end > len(records):
                raise ConfigError(f"end out of range: end={end} > N={len(records)}")
            self._init(spec, o["batch"], order, o["seed"], o["epoch"], o["epochs"],
                       o["drop_last"], o["on_decode_error"], o["to_torch"],
                       dict(loader_kw, start=start, end=end), o["resume"])
        except BaseException:
            self._closed = True
            self.records.close()
            raise
        self._start_timeline(timeline_s)  # one recorder for every epoch's Loader

    def _init(self, spec: ImageSpec, batch: int, order: str, seed: int, epoch: int,
              epochs: int | None, drop_last: bool, on_decode_error: str, to_torch: bool,
              loader_kw: dict[str, Any], resume: bytes | None) -> None:
        self.spec = spec
        self.on_decode_error = on_decode_error
        self.to_torch = bool(to_torch)
        self.seed = seed
        self.batch_size = batch
        n = len(self.records)
        self.native_hw: tuple[int, int] | None = None
        hw = spec.out_hw
        first = int(loader_kw.get("start") or 0)
        if hw is None:
            if first >= (n if loader_kw.get("end") is None else int(loader_kw["end"])):
                hw = (1, 1)
            else:
                hw = image_size(self.records.payloads(np.full(1, first, np.int64))[0])
                self.native_hw = hw
        self.out_hw = hw
        self.dtype = np.dtype(np.float32 if spec.float_out else np.uint8)
        self.item_shape = (3, *hw) if spec.layout == "NCHW" else (*hw, 3)
        per_item = int(np.prod(self.item_shape)) * self.dtype.itemsize + 16
        self._transform_nbytes = lambda k: k * per_item
        self._per_item = per_item
        self._source = _RecordsSource(self.records)
        self._kw = dict(loader_kw, batch=batch, order=order, seed=seed, drop_last=drop_last,
                        close_source=False, transform_nbytes=self._transform_nbytes)
        self._job = _Job(spec=spec, seed=seed, records=self.records,
                         on_decode_error=on_decode_error, native_hw=self.native_hw,
                         item_shape=self.item_shape, dtype=self.dtype)
        self._done_totals: dict[str, float] = {}  # counters of the retired epoch loaders
        self._done_highs: dict[str, float] = {}
        self.last_ids = np.empty(0, np.int64)
        self._first_epoch = epoch
        self._epochs = epochs
        self._end_epoch = None if epochs is None else epoch + epochs
        start_epoch, token = epoch, None
        if resume is not None:  # run the epoch the token is in, resumed at its position
            token = _checkpoint.as_token(resume)
            start_epoch = self._adopt(token)
        self._epoch = start_epoch
        self._ended = False  # the end of the stream was delivered (StopIteration raised)
        self._last: Loader = self._open_epoch(start_epoch, token)
        cfg = self._last.config
        self._job.size_pool(cfg.window_batches + cfg.threads + 3, batch)
        self._streak = EmptyStreak(self._last, f"on_decode_error={on_decode_error!r}")

    def _adopt(self, token: bytes) -> int:
        """The epoch ``token`` resumes in; adopts the token's epochs (``Loader.load_state_dict``).

        The epoch's own loader validates data, seed, order and batch when it opens.
        """
        tok = _checkpoint.decode(token)
        lo, hi = self._kw.get("start"), self._kw.get("end")
        n = len(self.records)
        span = n if lo is None or hi is None else hi - lo  # the Loader's N: [start, end)
        self._first_epoch, self._end_epoch = _checkpoint.adopt_epochs(
            tok, first_epoch=self._first_epoch, epochs=self._epochs)
        if span and tok.length == span:
            return int(tok.position // span)
        return self._first_epoch

    def _transform(self, e: int) -> Any:
        """Epoch ``e``'s decoding transform, then the user's ``transform`` if one was given."""
        decoder = _Decoder(self._job, e)
        if self._user_transform is None:
            return decoder
        return ThenTransform(decoder, partial(_finish, self.to_torch), self._user_transform,
                             "ids", seed=self.seed)

    def _open_epoch(self, e: int, token: bytes | None) -> Loader:
        ld = Loader(self._source, epoch=e, epochs=1, transform=self._transform(e), resume=token,
                    **self._kw)
        # the first epoch's loader resolved the ranks (and agreed on them): later epochs read
        # the same ranks, without another exchange
        self._kw.update(rank=ld.rank, world_size=ld.world_size)
        self._inner = ld if self._end_epoch is None or e < self._end_epoch else None
        if self._inner is None:
            ld.close()
        return ld

    # -- iteration -----------------------------------------------------------------------------

    @tracked
    def __next__(self) -> tuple[Any, Any]:
        while True:
            inner = self._inner
            if inner is None:
                self._ended = not self._closed
                raise StopIteration
            try:
                b = next(inner)
            except StopIteration:
                self._retire(inner)
                self._epoch += 1
                if self._closed or (self._end_epoch is not None and self._epoch >= self._end_epoch):
                    self._inner = None
                    self._ended = not self._closed
                    self._job.pool.clear()  # the run is over: the program keeps only its own
                    self._end_timeline()
                    self._streak.end()
                    raise StopIteration from None
                self._last = self._open_epoch(self._epoch, None)
                continue
            except LoaderError as e:
                cause = e.__cause__
                if isinstance(cause, DecodeError | ConfigError):
                    raise cause.with_traceback(None) from e
                raise
            if len(b["ids"]) == 0:  # every image of the batch failed to decode (skip policy)
                self._streak.empty(len(inner.last_ids))
                continue
            self._streak.full()
            self.last_ids = b["ids"]
            self._tick_timeline()
            if YIELD_KEY in b:
                return b[YIELD_KEY]
            return _finish(self.to_torch, b)

    def _retire(self, inner: Loader) -> None:
        """Adds a finished epoch loader's totals to the run's and closes it (once)."""
        if inner._closed:
            return
        s = inner.stats()
        for key, v in s.items():
            if isinstance(v, int | float) and _summed(key):
                self._done_totals[key] = self._done_totals.get(key, 0) + v
            elif isinstance(v, int | float) and "high_water" in key:
                self._done_highs[key] = max(self._done_highs.get(key, 0), v)
        inner.close()

    def __iter__(self) -> ImageLoader:
        """The loader itself; once every epoch was delivered a new pass raises ``LoaderError``
        (``set_epoch(e)`` rewinds), as ``headrace.Loader``."""
        inner = self._inner
        if inner is not None:
            inner.__iter__()  # raises when failed or closed
        elif self._closed:
            self._last.__iter__()  # the closed loader's own message
        elif self._ended:
            last = self._end_epoch - 1 if self._end_epoch is not None else self._epoch
            raise LoaderError(f"this image loader has delivered all its epochs (last: {last}); "
                              "call loader.set_epoch(E) to read epoch E again, or build it "
                              "with epochs=None (endless) or epochs=N")
        return self

    def state_dict(self) -> dict[str, Any]:
        """Where the delivered stream ends, as a JSON-able dict (see ``Loader.state_dict``)."""
        return _checkpoint.as_state(self.checkpoint())

    def load_state_dict(self, state: Any) -> None:
        """Continue from ``state`` (a ``state_dict()`` or ``checkpoint()`` token), in place;
        the token's epoch is adopted (see ``Loader.load_state_dict``)."""
        if self._closed:
            self._last.__iter__()  # raises: closed
        token = _checkpoint.as_token(state)
        first, end = self._first_epoch, self._end_epoch
        try:
            e = self._adopt(token)
            self._switch(e, token)
        except BaseException:
            self._first_epoch, self._end_epoch = first, end
            raise

    def set_epoch(self, epoch: int) -> None:
        """Rewind to the start of ``epoch``: the next ``for`` reads epochs ``epoch`` ..
        ``epoch + epochs - 1`` (see ``Loader.set_epoch``)."""
        if isinstance(epoch, bool) or not isinstance(epoch, int | np.integer) or epoch < 0:
            raise ConfigError(f"epoch must be an int >= 0, got {epoch!r}")
        if self._closed:
            self._last.__iter__()  # raises: closed
        e = int(epoch)
        self._first_epoch = e
        self._end_epoch = None if self._epochs is None else e + self._epochs
        inner = self._inner
        if (inner is not None and self._epoch == e and inner._fresh
                and inner.position == inner.length * e and inner._failed is None):
            return  # nothing delivered yet from the start of that epoch: keep its prefetch
        self._switch(e, None)

    def _switch(self, e: int, token: bytes | None) -> None:
        """Stop the running epoch's loader and open epoch ``e`` (at ``token`` if given)."""
        ld = Loader(self._source, epoch=e, epochs=1, transform=self._transform(e),
                    resume=token, **self._kw)  # validates the token before anything stops
        for old in {id(x): x for x in (self._inner, self._last) if x is not None}.values():
            self._retire(old)
        self._epoch = e
        self._last = ld
        self._ended = False
        self._inner = ld if self._end_epoch is None or e < self._end_epoch else None
        if self._inner is None:
            ld.close()

    def __len__(self) -> int:
        """Batches left to yield (counting the current epoch from where it is)."""
        if self._end_epoch is None:
            raise TypeError("an endless image loader (epochs=None) has no length")
        if self._inner is None:
            return 0
        ld = self._inner
        if ld.batch_bytes is not None or ld.target_bytes is not None:
            # byte-cut batches: each later epoch's count follows its own order of sizes
            n = ld.length
            return len(ld) + sum(BytePlan(
                length=n, batch=ld.batch_size, rank=ld.rank, world_size=ld.world_size,
                tail=ld.tail, start_position=e * n, end_position=(e + 1) * n,
                sizes=ld._epoch_sizes, batch_bytes=ld.batch_bytes,
                target_bytes=ld.target_bytes).count()
                for e in range(self._epoch + 1, self._end_epoch))
        per_epoch = BatchPlan(length=ld.length, batch=ld.batch_size, rank=ld.rank,
                              world_size=ld.world_size, tail=ld.tail, start_position=0,
                              end_position=ld.length).count()
        return len(ld) + per_epoch * (self._end_epoch - self._epoch - 1)

    # -- state -----------------------------------------------------------------------------------

    @property
    def classes(self) -> list[str] | None:
        """Class names by label id (from ``_labels.tsv``/``labels.tsv``/folders), or ``None``."""
        return self.records.classes

    @property
    def epoch(self) -> int:
        """The epoch of the next batch; once every epoch was delivered, the last one."""
        if self._end_epoch is not None and self._epoch >= self._end_epoch:
            return max(self._first_epoch, self._end_epoch - 1)
        return self._epoch

    def checkpoint(self, at: int | None = None) -> bytes:
        """A token for ``resume=``: continues after the last delivered batch, same augmentations.

        ``at=i``: the token that resumes at delivered batch ``i`` (0-based, counted since this
        loader was built; ``delivered`` is how many it has delivered), for loops that fetch
        ahead: ``checkpoint(at=loader.delivered - 1)`` resumes at the batch fetched but not yet
        trained on. The last 256 batches' tokens are kept.
        """
        return self._current_loader().checkpoint() if at is None else token_at(self, at)

    @property
    def delivered(self) -> int:
        """Batches this loader has delivered (the index ``checkpoint(at=)`` counts)."""
        return delivered(self)

    def stats(self) -> dict[str, Any]:
        """The loader's stats plus ``images_decoded_total`` and ``decode_errors_total`` (images
        dropped by ``on_decode_error="skip"``)."""
        if self._inner is not None:
            s = self._inner.stats()
            for key, v in self._done_totals.items():
                s[key] = s.get(key, 0) + v
        else:  # exhausted or closed: the retired epochs' totals are the whole story
            s = self._last.stats()
            s.update(self._done_totals)
        for key, v in self._done_highs.items():  # the whole run's, not the epoch's
            s[key] = max(s.get(key, 0), v)
        with self._job.lock:
            s["images_decoded_total"] = self._job.decoded
            s["decode_errors_total"] = self._job.failed
        s["images_skipped_total"] = s["decode_errors_total"]
        s["epoch"] = self._epoch
        return s

    def _current_loader(self) -> Loader:
        """The running epoch's loader, or the last one once the run is over or closed."""
        return self._inner or self._last

    def _release_data(self) -> None:
        self.records.close()

    def _stop(self) -> None:
        """Stops the threads; the records stay open (``_release_data`` closes them)."""
        self._closed = True
        if self._budget is not None:
            self._budget.close()  # wake workers waiting on the mix's share (_EpochBudget won't)
        for ld in (self._inner, getattr(self, "_last", None)):
            if ld is not None:
                ld.close()
        self._inner = None
        job = getattr(self, "_job", None)
        if job is not None:
            job.pool.clear()

    def _use_budget(self, budget: Any) -> None:
        """Reserve from ``budget`` (a ``headrace.mix`` share) from now on, in place: the running
        epoch's loader restarts at its delivered position, and every later epoch uses it."""
        self._budget = budget
        self._kw["budget"] = _EpochBudget(budget)
        if self._inner is not None:
            self._inner._use_budget(self._kw["budget"])

    def _enable_tune(self) -> None:
        """Autotune the running epoch's loader and every later one (``mix(tune=True)``)."""
        self._kw["tune"] = True
        if self._inner is not None:
            self._inner._enable_tune()

    def _batch_need(self) -> int:
        """Bytes one batch reserves: payloads plus decoded images (``headrace.mix``'s share)."""
        return self._inner._batch_need() if self._inner is not None else 0

    @property
    def source(self) -> _Footprint:
        """The records as a sized source; ``nbytes(ids)`` counts the payloads *and* the decoded
        images of those records (what one batch holds in the loader: ``headrace.mix`` reserves
        that much per source)."""
        return _Footprint(self.records, self._per_item)

    @property
    def config(self) -> Any:
        """The resolved memory settings (``max_inflight_bytes``, ...) of the running epoch."""
        return self._current_loader().config

    def __repr__(self) -> str:
        return (f"ImageLoader({self.records!r}, batch={self.batch_size}, out={self.item_shape}, "
                f"dtype={self.dtype}, epoch={self._epoch})")


class _Footprint(BorrowedRecords):
    """``len`` and ``nbytes`` of an image loader's batches (payloads + decoded output)."""

    def __init__(self, records: ImageRecords, per_item: int) -> None:
        super().__init__(records)
        self._per_item = per_item

    def nbytes(self, ids: np.ndarray) -> int:
        return int(super().nbytes(ids)) + self._per_item * len(ids)


class _EpochBudget:
    """A mix's budget share as seen by one epoch's :class:`Loader`: everything but ``close``.

    An image loader runs one ``Loader`` per epoch on the same share; a finished epoch closing it
    would starve the next. The ``ImageLoader`` closes the share itself when it stops.
    """

    def __init__(self, budget: Any) -> None:
        self._budget = budget

    def __getattr__(self, name: str) -> Any:
        return getattr(self._budget, name)

    def close(self) -> None:
        pass


def _summed(key: str) -> bool:
    """A per-epoch loader's counter that adds up over the run (not a rate or a clock)."""
    return key.endswith("_total") or (key.endswith("_seconds") and key != "elapsed_seconds")


def _check_range(start: Any, end: Any) -> tuple[int | None, int | None]:
    """mx8's ``start``/``end`` (``start_id``/``end_id``) rules, with ``headrace.load``'s wording."""
    if start is None and end is None:
        return None, None
    if start is None or end is None:
        raise ConfigError("start and end must be set together")
    for name, v in (("start", start), ("end", end)):
        if isinstance(v, bool) or not isinstance(v, int | np.integer):
            raise ConfigError(f"{name} must be an int record id, got {v!r}")
        if v < 0:
            raise ConfigError(f"{name} must be >= 0, got {v}")
    if start > end:
        raise ConfigError(f"invalid range (start > end): start={start} end={end}")
    return int(start), int(end)


def image(data: Any, *, batch: int = 64, shuffle: bool = False, order: str | None = None,
          seed: int = 0, epoch: int = 0, epochs: int | None = 1, drop_last: bool = False,
          augment: str | None = None, resize: tuple[int, int] | None = None,
          crop: tuple[int, int] | None = None, center_crop: tuple[int, int] | None = None,
          random_resized_crop: tuple[int, int] | None = None,
          eval_crop: tuple[int, int] | None = None, crop_fraction: float | None = None,
          scale: tuple[float, float] = (0.08, 1.0),
          ratio: tuple[float, float] = (3 / 4, 4 / 3), flip_p: float | None = None,
          jitter_brightness: float | None = None, jitter_contrast: float | None = None,
          jitter_saturation: float | None = None, jitter_hue: float | None = None,
          mean: tuple[float, float, float] | None = None,
          std: tuple[float, float, float] | None = None, float_out: bool = True,
          layout: str = "NCHW", interpolation: str = "auto", dct_scale: bool = True,
          fast_decode: bool | None = None, on_decode_error: str = "error", to_torch: bool = False,
          label_mode: str | None = "auto", threads: int | None = None,
          inflight: int | None = None, ram_gb: float | None = None, queue: int | None = None,
          prefetch: int | None = None, profile: str | None = None, constraints: Any = None,
          runtime: Any = None, rank: int | None = None, world_size: int | None = None,
          tail: str | None = None, batch_bytes: int | None = None,
          target_bytes: int | None = None,
          resume: bytes | None = None, start: int | None = None, end: int | None = None,
          store: str | None = None, recursive: bool = True, autopack: bool = False,
          shard_mb: float = 512, tune: bool | None = None, timeline: bool | float = False,
          transform: Any = None, **options: Any) -> ImageLoader:
    """Decoded, augmented image batches from a store, an mx8 pack or a raw image folder.

    Example (mx8's README, unchanged)::

        loader = headrace.image("/data/packed@refresh", batch=64, inflight=256 << 20,
                                resize=(224, 224))
        print(loader.classes)
        for images, labels in loader: ...

    Args:
        data: a store made by :func:`headrace.pack_dir` or :func:`headrace.pack` (path or
            ``Store``; ``@refresh`` is accepted: a local store is always read at its latest
            commit), an mx8 1.0.7 pack directory, a local image folder (labels by first-level
            folder, see ``label_mode``), or a dataset link: ``s3://bucket/prefix/`` holding a
            store (byte-range reads) or image files (ImageFolder layout), ``file://``, and
            ``@refresh`` / ``@sha256:<hash>`` pins (``docs/s3.md``).
        batch: images per batch.
        shuffle: shuffle each epoch (``order="shuffle"``); ``order`` may name any loader order.
        seed: order and augmentation seed. Augmentations are a pure function of
            ``(seed, epoch, record id)``: independent of threads, batch size and resume.
        epoch, epochs: the first epoch and how many to read (``None`` = endless).
        augment: presets ``"imagenet"`` (RandomResizedCrop 224 + flip + ImageNet mean/std; with
            ``resize`` it is mx8's random 224 crop of the resized image), ``"standard"`` (mx8's),
            ``"eval"`` (shorter side 256, centre crop 224, mean/std). Explicit kwargs win.
        resize: ``(H, W)``, aspect ratio not kept. ``crop``: random ``(h, w)`` window (of the
            resized image when ``resize`` is given, else of the source). ``center_crop``: the
            same, centred.
        random_resized_crop, scale, ratio: torchvision's RandomResizedCrop to ``(H, W)``.
        eval_crop, crop_fraction: the evaluation path (what ``augment="eval"`` sets): shorter
            side to ``floor(size / crop_fraction)`` (default 0.875: 224 -> 256), centre crop
            ``(H, W)``; torchvision's ``Resize`` + ``CenterCrop`` on PIL images, same pixels.
        flip_p: horizontal flip probability.
        jitter_brightness, jitter_contrast, jitter_saturation, jitter_hue: ColorJitter amounts
            (hue in [0, 0.5]).
        mean, std: per-channel normalisation on the 0..1 scale (needs ``float_out=True``).
        float_out: ``float32`` in [0, 1] (then normalised) or ``uint8``.
        layout: ``"NCHW"`` (mx8's) or ``"NHWC"``.
        interpolation: ``"auto"`` (area when shrinking >= 2x after DCT scaling, else bilinear),
            ``"area"`` or ``"linear"``.
        dct_scale: let libjpeg-turbo decode at 1/2, 1/4, 1/8 when that still covers the output.
        fast_decode: libjpeg-turbo's fast IDCT and chroma upsampling (10-15 % less decode CPU,
            under 1 grey level mean after a downscale). ``None`` (default): on with ``resize``
            or ``random_resized_crop``; off otherwise (native-size pixels, and the eval path,
            which decodes exactly as Pillow does).
        on_decode_error: ``"error"`` raises :class:`~headrace.DecodeError` naming the record id
            and path; ``"skip"`` drops that image (the batch is shorter) and counts it in
            ``stats()["decode_errors_total"]``.
        to_torch: yield torch tensors (torch is imported only then).
        label_mode: for raw folders, as in :func:`headrace.pack_dir`.
        threads, inflight, ram_gb, queue, prefetch, profile, constraints, runtime, rank,
            world_size, tail, resume: as in :class:`headrace.Loader` (rank and world size from
            the launcher unless given; ``tail="pad"`` pads samples, as ``DistributedSampler``).
        batch_bytes, target_bytes: byte-aware batches (as :class:`headrace.Loader`), counted
            over the encoded files as mx8 does: ``batch_bytes`` is a hard ceiling per batch (a
            larger file is a ``ConfigError``), ``target_bytes`` a soft target with mx8's
            rule (``headrace.Loader``); ``batch`` stays the most images per batch.
        start, end: read only records ``[start, end)`` (set together; mx8's ``start``/``end``).
            Augmentations stay keyed by the record id, so a sub-range decodes its records
            exactly as the full range does.
        store, recursive: links only: the manifest store root, and whether a raw prefix is
            listed recursively.
        autopack, shard_mb: mx8's; accepted and ignored (raw folders and prefixes are
            decoded without packing).
        tune: autotune threads and prefetch inside the caps (``docs/autotune.md``); each
            epoch's loader starts tuning afresh.
        timeline: record a stats timeline over all epochs (``True``: a snapshot every 0.5 s; a
            number: the period in seconds) for ``stats_timeline()`` and ``headrace.plot``.
        transform: ``fn(batch, ids) -> batch``, run in the loader's threads on each
            ``(images, labels)`` batch as it would be yielded (``ids``: its record ids); the
            loader yields what it returns.
        **options: links only: S3 settings (``endpoint``, ``region``, ``profile``, ...,
            ``s3=S3Options(...)``), ``cache_dir``/``cache_bytes``, ``max_inflight``, ``verify``.
    """
    given = {k: v for k, v in locals().items() if k not in ("data", "options")}
    return ImageLoader._create(data, _image_options({**given, **options}))


_LINK_OPTIONS = frozenset({"cache_dir", "cache_bytes", "max_inflight", "verify", "s3"})
_IGNORED = ("autopack", "shard_mb")  # mx8 knobs without a meaning here (docs/images.md)


def _image_options(given: dict[str, Any]) -> dict[str, Any]:
    """:func:`image`'s keywords with defaults filled in; S3/link settings under ``link_options``."""
    import dataclasses
    import inspect

    from headrace._remote.objstore import S3Options

    params = {name: p.default for name, p in inspect.signature(image).parameters.items()
              if p.kind is inspect.Parameter.KEYWORD_ONLY}
    link_names = _LINK_OPTIONS | {f.name for f in dataclasses.fields(S3Options)}
    opts = dict(params)
    link: dict[str, Any] = {}
    for key, value in given.items():
        if key in params:
            opts[key] = value
        elif key in link_names:
            link[key] = value
        else:
            refuse_unknown([key], set(params) | link_names, "image()")
    for key in _IGNORED:
        del opts[key]
    if opts["store"] is not None:
        link["store"] = opts["store"]
    link["recursive"] = opts.pop("recursive")
    del opts["store"]
    opts["link_options"] = link
    return opts
