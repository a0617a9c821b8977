"""Image edges: 16-bit grey keeps its high byte, random crops reach every offset (the last one too)."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from headrace._modal.image_augment import ImageSpec, plan_batch
from headrace._modal.image_decode import decode


def test_16_bit_grey_png_keeps_the_high_byte_of_every_pixel():
    y, x = np.mgrid[0:24, 0:40]
    a = (x * 1601 + y * 97 + 3).astype(np.uint16)  # high and low bytes differ, all values vary
    assert (a >> 8 != a & 0xFF).mean() > 0.9
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, "PNG")
    assert Image.open(io.BytesIO(buf.getvalue())).mode.startswith("I")
    out = decode(buf.getvalue())
    assert out.shape == (24, 40, 3) and out.dtype == np.uint8
    want = (a >> 8).astype(np.uint8)
    for c in range(3):
        np.testing.assert_array_equal(out[:, :, c], want)


def _offsets(spec, hw, n=3000):
    plans = plan_batch(spec, 5, 0, np.arange(n), [hw] * n)
    return np.array([p.box if p.box is not None else p.post for p in plans])


def test_random_crop_reaches_every_offset_including_the_last():
    h, w = 13, 17
    boxes = _offsets(ImageSpec(crop=(8, 8)), (h, w))
    top, left, bh, bw = boxes.T
    assert (bh == 8).all() and (bw == 8).all()
    assert set(top.tolist()) == set(range(h - 8 + 1))
    assert set(left.tolist()) == set(range(w - 8 + 1))
    counts = np.bincount(top, minlength=h - 8 + 1)  # uniform: no offset starved
    assert counts.min() > 0.6 * counts.mean()


def test_random_crop_of_a_resized_image_reaches_the_far_edges():
    plans = plan_batch(ImageSpec(resize=(12, 14), crop=(8, 8)), 5, 0, np.arange(3000),
                       [(50, 60)] * 3000)
    top, left, _h, _w = np.array([p.post for p in plans]).T
    assert top.max() == 12 - 8 and left.max() == 14 - 8 and top.min() == 0 and left.min() == 0


def test_random_resized_crops_touch_every_edge():
    h, w = 40, 50
    top, left, bh, bw = _offsets(ImageSpec(random_resized_crop=(8, 8), scale=(0.05, 0.1)),
                                 (h, w), n=4000).T
    assert (top + bh <= h).all() and (left + bw <= w).all()
    assert (top == 0).any() and (left == 0).any()
    assert (top + bh == h).any() and (left + bw == w).any()  # the largest offsets are reachable
