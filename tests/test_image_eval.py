"""The eval path gives torchvision's pixels: ``Resize(S)`` + ``CenterCrop(c)`` on PIL images.

torchvision is not installed beside this torch, so the reference is what its transforms do on a
PIL image, written out with Pillow: ``Resize(S)`` keeps the aspect ratio with the longer side
``int(S * long / short)`` and resizes with ``Image.BILINEAR`` (Pillow's antialiased triangle
filter), ``CenterCrop(c)`` cuts at ``int(round((h - c) / 2))``; ``S = floor(c / crop_fraction)``
as timm computes it.
"""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
from PIL import Image

import headrace
from _images import encode, photo, write_tree
from headrace import ConfigError
from headrace._modal.image_augment import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    ImageSpec,
    eval_resized,
    plan_batch,
)
from headrace._modal.image_decode import decode_window

_PHOTOS = ("astronaut", "coffee", "chelsea", "rocket")


def torchvision_eval(buf: bytes, crop: int, crop_fraction: float = 0.875) -> np.ndarray:
    """torchvision's ``Resize(floor(crop / f))`` + ``CenterCrop(crop)`` on the PIL image."""
    im = Image.open(io.BytesIO(buf)).convert("RGB")
    size = math.floor(crop / crop_fraction)
    w, h = im.size
    short, long = min(w, h), max(w, h)
    new_short, new_long = size, int(size * long / short)
    new_w, new_h = (new_short, new_long) if w <= h else (new_long, new_short)
    im = im.resize((new_w, new_h), Image.BILINEAR)
    top = round((new_h - crop) / 2.0)
    left = round((new_w - crop) / 2.0)
    return np.asarray(im.crop((left, top, left + crop, top + crop)))


def _photos() -> list[np.ndarray]:
    """Photographs and rotated crops of them (odd sizes, both orientations)."""
    out = []
    for name in _PHOTOS:
        p = photo(name)
        out.append(p)
        rot = np.asarray(Image.fromarray(p).rotate(17, resample=Image.BICUBIC, expand=True))
        out.append(np.ascontiguousarray(rot[7:-5, 11:]))
        out.append(np.ascontiguousarray(p[: p.shape[0] * 2 // 3, : p.shape[1] // 2]))  # portrait
    return out


def test_eval_geometry_is_torchvisions_rounding():
    spec = ImageSpec(eval_crop=(224, 224))
    assert eval_resized(spec, (300, 400)) == (256, 341)  # int(256 * 400 / 300) = 341
    assert eval_resized(spec, (401, 299)) == (343, 256)  # int(256 * 401 / 299) = 343
    (p,) = plan_batch(spec, 0, 0, np.arange(1), [(300, 400)])
    assert p.window and p.size == (256, 341) and p.post == (16, 58, 224, 224)  # round(58.5) = 58
    spec64 = ImageSpec(eval_crop=(64, 64))
    assert eval_resized(spec64, (480, 640)) == (73, 97)  # floor(64 / 0.875) = 73
    assert eval_resized(ImageSpec(eval_crop=(224, 224), crop_fraction=0.9), (500, 500)) == \
        (248, 248)  # timm: floor(224 / 0.9)


@pytest.mark.parametrize("crop", [64, 112, 224])
def test_eval_crop_matches_torchvision_within_one_grey_level(crop):
    errs = []
    for img in _photos():
        buf = encode(img)
        ref = torchvision_eval(buf, crop).astype(np.int16)
        spec = ImageSpec(eval_crop=(crop, crop))
        (p,) = plan_batch(spec, 0, 0, np.arange(1), [img.shape[:2]])
        assert p.size is not None and p.post is not None
        got = decode_window(buf, resized=p.size, window=p.post).astype(np.int16)
        errs.append(np.abs(got - ref).mean())
        # without DCT scaling the pixels are the reference's exactly
        full = decode_window(buf, resized=p.size, window=p.post, dct_scale=False)
        assert np.abs(full.astype(np.int16) - ref).max() <= 1
    assert np.mean(errs) < 1.0 and max(errs) < 1.0, errs


def test_image_loader_eval_equals_torchvision(tmp_path):
    files, refs = {}, {}
    for i, img in enumerate(_photos()):
        buf = encode(img)
        files[f"c/{i:02d}.jpg"] = buf
        refs[i] = torchvision_eval(buf, 64)
    write_tree(tmp_path, files)
    # the spelling: augment="eval" with center_crop=, and eval_crop= as docs/images.md has it
    for kw in ({"augment": "eval", "center_crop": (64, 64)}, {"eval_crop": (64, 64)}):
        loader = headrace.image(str(tmp_path), batch=4, layout="NHWC", **kw)
        got = []
        with loader:
            for x, _ in loader:
                got.append(np.asarray(x))
        x = np.concatenate(got)
        if "augment" in kw:  # ImageNet mean/std on the 0..1 scale: back to grey levels
            mean = np.asarray(IMAGENET_MEAN, np.float32)
            std = np.asarray(IMAGENET_STD, np.float32)
            x = (x * std + mean) * 255.0
        else:
            x = x * 255.0
        ref = np.stack([refs[i] for i in range(len(refs))]).astype(np.float32)
        assert x.shape == ref.shape
        assert np.abs(x - ref).mean() < 1.0


def test_eval_crop_uint8_and_crop_fraction_keywords(tmp_path):
    img = photo("coffee")
    write_tree(tmp_path, {"a/0.jpg": encode(img)})
    ld = headrace.image(str(tmp_path), eval_crop=(32, 48), crop_fraction=0.5, float_out=False,
                        layout="NHWC")
    with ld:
        (x, _), = list(ld)
    assert x.shape == (1, 32, 48, 3) and x.dtype == np.uint8
    with pytest.raises(ConfigError, match="crop_fraction"):
        headrace.image(str(tmp_path), eval_crop=(32, 32), crop_fraction=1.5)
