"""Seeded image augmentations: a frozen spec, a per-record plan, and the pixel ops that follow decode.

Randomness is a pure function of ``(seed, epoch, record id, stream)``: a counter-based hash
(SplitMix64's finalizer, applied three times to chain the key) turns those integers into uniform
floats, vectorized over a batch. No generator state exists, so the augmentation of a record does not
depend on the thread that decodes it, on the batch it lands in, or on where a resumed run starts.

Each random decision has a fixed *stream* number, so enabling one augmentation never shifts the
draws of another (turning on jitter does not move the crops).

The geometry of every mode reduces to one ``box`` in source pixels plus an output size, picked
*before* decoding, so the decoder can crop first and scale in the DCT domain (``_image_decode``).
The mx8-style "resize to (H, W) then crop" keeps its exact semantics instead: decode + resize to
(H, W), then crop a window of that (``post`` in the plan).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Literal

import cv2
import numpy as np

from headrace._base.errors import ConfigError
from headrace._modal.image_decode import Box, Interpolation

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "ImageSpec", "Plan", "eval_resized", "finish",
           "plan_batch", "scratch", "uniforms"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# Stream numbers of the random draws (fixed, see the module docstring).
_S_FLIP, _S_CROP_Y, _S_CROP_X = 0, 1, 2
_S_BRIGHT, _S_CONTRAST, _S_SAT, _S_HUE = 3, 4, 5, 6
_S_RRC = 8  # 8..27: 10 attempts x (scale, log-ratio); 28, 29: position
_RRC_ATTEMPTS = 10
_N_STREAMS = 30

# Per-thread buffers for the steps between decode and the batch slot (see ``scratch``).
_LOCAL = threading.local()

_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer (a bijection on uint64 with full avalanche), elementwise."""
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def uniforms(seed: int, epoch: int, ids: np.ndarray, n_streams: int = _N_STREAMS) -> np.ndarray:
    """Uniform floats in [0, 1), shape ``(len(ids), n_streams)``, a pure function of the inputs."""
    with np.errstate(over="ignore"):
        key = _mix(np.array([seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64) + _GOLDEN)
        key = _mix(key ^ np.array([epoch & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))
        rid = np.asarray(ids, dtype=np.int64).astype(np.uint64)
        k = _mix(key ^ (rid * _GOLDEN))
        s = np.arange(1, n_streams + 1, dtype=np.uint64) * _GOLDEN
        bits = _mix(k[:, None] + s[None, :])
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def _hw(name: str, v: object) -> tuple[int, int] | None:
    if v is None:
        return None
    if isinstance(v, int) and not isinstance(v, bool):
        v = (v, v)
    if (not isinstance(v, (tuple, list)) or len(v) != 2
            or not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in v)):
        raise ConfigError(f"{name}={v!r} must be (height, width) in pixels, e.g. {name}=(224, 224)")
    h, w = int(v[0]), int(v[1])
    if h <= 0 or w <= 0:
        raise ConfigError(f"{name}={v!r}: height and width must be > 0")
    return h, w


def _triple(name: str, v: object) -> tuple[float, float, float] | None:
    if v is None:
        return None
    if isinstance(v, (int, float)):
        v = (v, v, v)
    if not isinstance(v, tuple | list) or len(v) != 3:
        raise ConfigError(f"{name}={v!r} must have 3 values (one per RGB channel)")
    return float(v[0]), float(v[1]), float(v[2])


@dataclass(frozen=True)
class ImageSpec:
    """What to do to every image after decode. Built by :meth:`from_kwargs` from ``image()``'s kwargs.

    Geometry (at most one of the three families):

    * ``resize=(H, W)``, optionally then ``crop=(h, w)`` (random) or ``center_crop=(h, w)``: mx8's
      semantics (the whole image is resized, aspect ratio not kept, then a window is cut).
      ``crop``/``center_crop`` without ``resize`` cut the window from the source image.
    * ``random_resized_crop=(H, W)`` with ``scale``/``ratio``: torchvision's RandomResizedCrop.
    * ``eval_crop=(H, W)``: the evaluation path, shorter side resized to
      ``floor(size / crop_fraction)`` then centre-cropped, as torchvision's ``Resize(256)`` +
      ``CenterCrop(224)`` on PIL images (same rounding, same filter; see :func:`eval_resized`).

    Pixels: ``flip_p`` (horizontal), ``jitter_*`` (applied in the fixed order brightness, contrast,
    saturation, hue; factors as torchvision's ColorJitter), then ``float_out`` (``/255``),
    ``mean``/``std`` (in the 0..1 scale, so they need ``float_out=True``), ``layout``.
    """

    resize: tuple[int, int] | None = None
    crop: tuple[int, int] | None = None
    center_crop: tuple[int, int] | None = None
    random_resized_crop: tuple[int, int] | None = None
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    eval_crop: tuple[int, int] | None = None
    crop_fraction: float = 0.875
    flip_p: float = 0.0
    jitter_brightness: float = 0.0
    jitter_contrast: float = 0.0
    jitter_saturation: float = 0.0
    jitter_hue: float = 0.0
    mean: tuple[float, float, float] | None = None
    std: tuple[float, float, float] | None = None
    float_out: bool = True
    layout: Literal["NCHW", "NHWC"] = "NCHW"
    interpolation: Interpolation = "auto"
    dct_scale: bool = True
    fast: bool | None = None
    _consts: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False,
                                                           compare=False)

    def __post_init__(self) -> None:
        for name in ("resize", "crop", "center_crop", "random_resized_crop", "eval_crop"):
            object.__setattr__(self, name, _hw(name, getattr(self, name)))
        object.__setattr__(self, "mean", _triple("mean", self.mean))
        object.__setattr__(self, "std", _triple("std", self.std))
        if self.crop is not None and self.center_crop is not None:
            raise ConfigError("crop= (random) and center_crop= are exclusive; pass one of them")
        geometric = [n for n in ("resize", "crop", "center_crop") if getattr(self, n) is not None]
        for special in ("random_resized_crop", "eval_crop"):
            if getattr(self, special) is not None and geometric:
                raise ConfigError(f"{special}= sets the output size itself; drop "
                                  f"{', '.join(g + '=' for g in geometric)}")
        if self.random_resized_crop is not None and self.eval_crop is not None:
            raise ConfigError("random_resized_crop= and eval_crop= are exclusive")
        win = self.crop or self.center_crop
        if self.resize is not None and win is not None and (
                win[0] > self.resize[0] or win[1] > self.resize[1]):
            raise ConfigError(f"crop {win} exceeds resize {self.resize}; the crop is cut from the "
                              "resized image, so it must fit inside it")
        lo, hi = self.scale
        if not 0 < lo <= hi <= 1:
            raise ConfigError(f"scale={self.scale!r} must satisfy 0 < min <= max <= 1")
        if not 0 < self.ratio[0] <= self.ratio[1]:
            raise ConfigError(f"ratio={self.ratio!r} must satisfy 0 < min <= max")
        if not 0 < self.crop_fraction <= 1:
            raise ConfigError(f"crop_fraction={self.crop_fraction!r} must be in (0, 1]")
        if not 0 <= self.flip_p <= 1:
            raise ConfigError(f"flip_p={self.flip_p!r} must be in [0, 1]")
        for name in ("jitter_brightness", "jitter_contrast", "jitter_saturation"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}={getattr(self, name)!r} must be >= 0")
        if not 0 <= self.jitter_hue <= 0.5:
            raise ConfigError(f"jitter_hue={self.jitter_hue!r} must be in [0, 0.5] (a fraction of "
                              "the hue circle)")
        if (self.mean is None) != (self.std is None):
            raise ConfigError("mean= and std= go together; pass both (e.g. the ImageNet values) "
                              "or neither")
        if self.std is not None and min(self.std) <= 0:
            raise ConfigError(f"std={self.std!r} must be > 0")
        if self.mean is not None and not self.float_out:
            raise ConfigError("mean/std normalisation produces float values; keep float_out=True "
                              "(the default) or drop mean/std to get uint8 pixels")
        if self.layout not in ("NCHW", "NHWC"):
            raise ConfigError(f"layout={self.layout!r} must be 'NCHW' or 'NHWC'")
        if self.fast is None:
            # libjpeg-turbo's fast IDCT and chroma upsampling where the image is resampled
            # anyway: 10-15 % less decode CPU, 0.8 grey levels mean after a resize to 224x224
            # (less than DCT scaling moves them). Native-size output keeps the exact decode, and
            # so does the eval path: it promises torchvision's pixels.
            resampled = self.resize is not None or self.random_resized_crop is not None
            object.__setattr__(self, "fast", resampled)
        if self.interpolation not in ("auto", "area", "linear"):
            raise ConfigError(f"interpolation={self.interpolation!r} must be 'auto', 'area' "
                              "or 'linear'")
        mean = np.asarray(self.mean or (0.0, 0.0, 0.0), np.float32)
        std = np.asarray(self.std or (1.0, 1.0, 1.0), np.float32)
        # out = x * scale + bias  ==  (x / 255 - mean) / std
        object.__setattr__(self, "_consts", ((1.0 / (255.0 * std)).astype(np.float32),
                                             (-mean / std).astype(np.float32)))

    @classmethod
    def from_kwargs(cls, *, augment: str | None = None, **kw: object) -> ImageSpec:
        """Resolves the ``augment=`` presets, then validates.

        * ``"imagenet"`` without ``resize``: the ImageNet training recipe, RandomResizedCrop to
          ``random_resized_crop`` (default 224x224), ``flip_p=0.5``, ImageNet mean/std.
        * ``"imagenet"`` with ``resize``, and ``"standard"``: mx8 1.0.7's preset, random 224x224
          crop of the resized image plus ImageNet mean/std (``resize`` must be >= 224).
        * ``"eval"``: shorter side to 256 (``size / crop_fraction``), centre crop 224x224 (or
          ``center_crop``/``eval_crop``), ImageNet mean/std.

        Explicit kwargs win over the preset's values.
        """
        kw = {k: v for k, v in kw.items() if v is not None}
        if augment is None:
            return cls(**kw)  # type: ignore[arg-type]
        if not isinstance(augment, str) or not augment:
            raise ConfigError("augment must be a non-empty string: 'imagenet', 'standard' or "
                              "'eval'")
        norm = {"mean": IMAGENET_MEAN, "std": IMAGENET_STD}
        if augment == "imagenet" and "resize" not in kw:
            base: dict[str, object] = {"random_resized_crop": (224, 224), "flip_p": 0.5, **norm}
        elif augment in ("imagenet", "standard"):
            rs = _hw("resize", kw.get("resize"))
            if rs is None or rs[0] < 224 or rs[1] < 224:
                raise ConfigError(f"augment={augment!r} crops 224x224 from the resized image: "
                                  f"pass resize=(H, W) with H, W >= 224 (got {rs})")
            base = {"crop": (224, 224), **norm}
        elif augment == "eval":
            size = kw.pop("center_crop", None) or kw.get("eval_crop") or (224, 224)
            base = {"eval_crop": size, **norm}
        else:
            raise ConfigError(f"unsupported augment={augment!r} (expected 'imagenet', 'standard' "
                              "or 'eval')")
        if "crop" in kw and "crop" in base:
            base.pop("crop")
        return cls(**{**base, **kw})  # type: ignore[arg-type]

    @property
    def out_hw(self) -> tuple[int, int] | None:
        """Output (H, W), or ``None`` when images keep their decoded size (no geometry given)."""
        return (self.random_resized_crop or self.eval_crop or self.crop or self.center_crop
                or self.resize)

    @property
    def jitter(self) -> bool:
        return bool(self.jitter_brightness or self.jitter_contrast or self.jitter_saturation
                    or self.jitter_hue)


@dataclass(frozen=True)
class Plan:
    """What happens to one record: decode ``box`` to ``size``, cut ``post``, flip, jitter."""

    box: Box | None
    size: tuple[int, int] | None
    post: Box | None
    flip: bool
    jitter: tuple[float, float, float, float] | None
    # True: the whole image is resized to ``size`` with Pillow's antialiased filter and ``post``
    # is that resize's window (``decode_window`` computes only the window's pixels)
    window: bool = False


def eval_resized(spec: ImageSpec, hw: tuple[int, int]) -> tuple[int, int]:
    """The (h, w) the eval path resizes an ``hw`` image to before its centre crop.

    torchvision ``Resize(S)`` with timm's ``S = floor(size / crop_fraction)``: the shorter side
    becomes ``S`` and the longer ``int(S * long / short)`` (truncated, as torchvision does). A
    non-square ``eval_crop`` takes ``S`` from its larger side and keeps the aspect ratio (timm
    would resize to ``floor(h / f) x floor(w / f)``, distorting the image).
    """
    assert spec.eval_crop is not None
    s = math.floor(max(spec.eval_crop) / spec.crop_fraction)
    h, w = hw
    short, long = (h, w) if h <= w else (w, h)
    new_long = int(s * long / short)
    return (s, new_long) if h <= w else (new_long, s)


def _rrc_boxes(spec: ImageSpec, hw: np.ndarray, u: np.ndarray) -> np.ndarray:
    """torchvision's RandomResizedCrop.get_params, vectorized; returns (n, 4) boxes."""
    h, w = hw[:, 0].astype(np.float64), hw[:, 1].astype(np.float64)
    area = (h * w)[:, None]
    a_u = u[:, _S_RRC:_S_RRC + 2 * _RRC_ATTEMPTS:2]
    r_u = u[:, _S_RRC + 1:_S_RRC + 2 * _RRC_ATTEMPTS:2]
    lo, hi = spec.scale
    lr0, lr1 = math.log(spec.ratio[0]), math.log(spec.ratio[1])
    target = area * (lo + (hi - lo) * a_u)
    aspect = np.exp(lr0 + (lr1 - lr0) * r_u)
    cw = np.round(np.sqrt(target * aspect)).astype(np.int64)
    ch = np.round(np.sqrt(target / aspect)).astype(np.int64)
    ok = (cw > 0) & (ch > 0) & (cw <= hw[:, 1:2]) & (ch <= hw[:, 0:1])
    first = np.argmax(ok, axis=1)
    rows = np.arange(len(hw))
    bh, bw = ch[rows, first], cw[rows, first]
    top = np.floor(u[:, _S_RRC + 20] * (hw[:, 0] - bh + 1)).astype(np.int64)
    left = np.floor(u[:, _S_RRC + 21] * (hw[:, 1] - bw + 1)).astype(np.int64)
    # No attempt fit: torchvision's fallback, a centred crop clamped to the ratio range.
    none = ~ok.any(axis=1)
    if none.any():
        for i in np.flatnonzero(none):
            H, W = int(hw[i, 0]), int(hw[i, 1])
            in_ratio = W / H
            if in_ratio < spec.ratio[0]:
                fw, fh = W, round(W / spec.ratio[0])
            elif in_ratio > spec.ratio[1]:
                fh, fw = H, round(H * spec.ratio[1])
            else:
                fw, fh = W, H
            bh[i], bw[i], top[i], left[i] = fh, fw, (H - fh) // 2, (W - fw) // 2
    return np.stack([top, left, bh, bw], axis=1)


def _window(u_y: float, u_x: float, hw: tuple[int, int], win: tuple[int, int],
            centred: bool) -> Box:
    """A (top, left, h, w) window of size ``win`` (clamped to ``hw``) inside ``hw``."""
    bh, bw = min(win[0], hw[0]), min(win[1], hw[1])
    if centred:  # torchvision CenterCrop rounding
        return round((hw[0] - bh) / 2.0), round((hw[1] - bw) / 2.0), bh, bw
    return (int(u_y * (hw[0] - bh + 1)), int(u_x * (hw[1] - bw + 1)), bh, bw)


def plan_batch(spec: ImageSpec, seed: int, epoch: int, ids: np.ndarray,
               sizes: list[tuple[int, int]]) -> list[Plan]:
    """The per-record plans of a batch; ``sizes`` are the source (height, width) of each image."""
    n = len(ids)
    u = uniforms(seed, epoch, ids)
    hw = np.asarray(sizes, dtype=np.int64).reshape(n, 2)
    flips = u[:, _S_FLIP] < spec.flip_p
    boxes: list[Box | None] = [None] * n
    posts: list[Box | None] = [None] * n
    resized: list[tuple[int, int]] = []
    size: tuple[int, int] | None = spec.out_hw
    win = spec.crop or spec.center_crop
    if spec.random_resized_crop is not None:
        rrc = _rrc_boxes(spec, hw, u)
        boxes = [tuple(int(x) for x in b) for b in rrc]  # type: ignore[misc]
    elif spec.eval_crop is not None:
        resized = [eval_resized(spec, (h, w)) for h, w in hw.tolist()]
        posts = [_window(0.5, 0.5, rs, spec.eval_crop, True) for rs in resized]
    elif win is not None and spec.resize is not None:
        size = spec.resize
        for i in range(n):
            posts[i] = _window(u[i, _S_CROP_Y], u[i, _S_CROP_X], spec.resize, win,
                               spec.center_crop is not None)
    elif win is not None:
        for i, (h, w) in enumerate(hw.tolist()):
            boxes[i] = _window(u[i, _S_CROP_Y], u[i, _S_CROP_X], (h, w), win,
                               spec.center_crop is not None)
    jit: list[tuple[float, float, float, float] | None] = [None] * n
    if spec.jitter:
        def factor(col: int, amount: float) -> np.ndarray:
            lo = max(0.0, 1.0 - amount)
            return lo + (1.0 + amount - lo) * u[:, col]
        b = factor(_S_BRIGHT, spec.jitter_brightness)
        c = factor(_S_CONTRAST, spec.jitter_contrast)
        s = factor(_S_SAT, spec.jitter_saturation)
        hh = (2.0 * u[:, _S_HUE] - 1.0) * spec.jitter_hue
        jit = [(float(b[i]), float(c[i]), float(s[i]), float(hh[i])) for i in range(n)]
    if spec.eval_crop is not None:
        return [Plan(None, resized[i], posts[i], bool(flips[i]), jit[i], window=True)
                for i in range(n)]
    return [Plan(boxes[i], size, posts[i], bool(flips[i]), jit[i]) for i in range(n)]


_GREY = np.array([0.299, 0.587, 0.114], np.float32)


def _jitter(img: np.ndarray, f: tuple[float, float, float, float]) -> np.ndarray:
    """torchvision ColorJitter on 0..255 float32 (clamped after each op); returns float32 HWC."""
    b, c, s, h = f
    x = img.astype(np.float32)
    if b != 1.0:
        x *= b
        np.clip(x, 0, 255, out=x)
    if c != 1.0:
        m = float((x @ _GREY).mean())
        x = x * c + m * (1.0 - c)
        np.clip(x, 0, 255, out=x)
    if s != 1.0:
        grey = (x @ _GREY)[:, :, None]
        x = x * s + grey * (1.0 - s)
        np.clip(x, 0, 255, out=x)
    if h != 0.0:
        hsv = cv2.cvtColor(x * (1.0 / 255.0), cv2.COLOR_RGB2HSV)  # H in [0, 360)
        hsv[:, :, 0] = np.mod(hsv[:, :, 0] + h * 360.0, 360.0)
        x = cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB) * 255.0
        np.clip(x, 0, 255, out=x)
    return x


def scratch(name: str, shape: tuple[int, ...]) -> np.ndarray:
    """This thread's ``uint8`` buffer ``name`` of ``shape`` (reallocated when the shape changes).

    An image decoded or split into a fresh 150 KB array costs more than the work done in it: glibc
    serves that size with a new mapping (``mmap``'s threshold is 128 KiB) that the kernel faults in
    and zeroes, 33-47 page faults and 0.1-0.25 ms of kernel time per image on the default path,
    a fifth of its CPU. Each worker thread writes its images into the same buffers instead; the
    result is copied into the batch before the next image reuses them.
    """
    a: np.ndarray | None = getattr(_LOCAL, name, None)
    if a is None or a.shape != shape:
        a = np.empty(shape, np.uint8)
        setattr(_LOCAL, name, a)
    return a


def _planes_to_float(spec: ImageSpec, src: np.ndarray, out: np.ndarray) -> None:
    """HWC ``uint8`` -> CHW ``float32`` ``x * scale + bias``, one channel plane at a time.

    The default layout's conversion. NumPy's ``multiply`` over the transposed view reads with a
    3-byte stride and costs 0.17 ms per 224x224 image; splitting the planes (SIMD, into this
    thread's buffers) and scaling each contiguous plane straight into its slot of the batch costs
    0.07-0.1 ms.
    """
    assert spec._consts is not None
    scale, bias = spec._consts
    if not src.flags.c_contiguous:  # a flipped or cropped view
        src = np.ascontiguousarray(src)
    h, w = src.shape[:2]
    planes = [scratch(f"plane{c}", (h, w)) for c in range(3)]
    for c, plane in enumerate(cv2.split(src, planes)):
        dst = out[c]
        res = cv2.addWeighted(plane, float(scale[c]), plane, 0.0, float(bias[c]), dst=dst,
                              dtype=cv2.CV_32F)
        if res is not dst and not np.shares_memory(res, dst):
            dst[...] = res


def finish(spec: ImageSpec, img: np.ndarray, plan: Plan, out: np.ndarray) -> None:
    """Cuts ``plan.post``, flips, jitters, scales and lays out ``img`` (HWC uint8) into ``out``
    (one slot of the batch: HWC or CHW, uint8 or float32)."""
    if plan.post is not None and not plan.window:
        t, le, ph, pw = plan.post
        img = img[t:t + ph, le:le + pw]
    if plan.flip:
        img = img[:, ::-1]
    src: np.ndarray = img if plan.jitter is None else _jitter(img, plan.jitter)
    if spec.layout == "NCHW" and spec.float_out and src.dtype == np.uint8:
        _planes_to_float(spec, src, out)
        return
    if spec.layout == "NCHW":
        src = src.transpose(2, 0, 1)
        shape: tuple[int, ...] = (3, 1, 1)
    else:
        shape = (1, 1, 3)
    if not spec.float_out:
        np.copyto(out, src if src.dtype == np.uint8 else np.rint(src), casting="unsafe")
        return
    assert spec._consts is not None
    scale, bias = spec._consts
    np.multiply(src, scale.reshape(shape), out=out, casting="unsafe")
    if spec.mean is not None:
        np.add(out, bias.reshape(shape), out=out)
