"""Augmentation plans and pixel ops: determinism, torchvision's RRC rules, golden flip/normalise."""

from __future__ import annotations

import numpy as np
import pytest

from _images import gradient
from headrace import ConfigError
from headrace._modal.image_augment import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    ImageSpec,
    Plan,
    finish,
    plan_batch,
    uniforms,
)


def test_uniforms_are_a_pure_function_of_seed_epoch_id():
    ids = np.arange(100, 164)
    a = uniforms(3, 1, ids)
    np.testing.assert_array_equal(a[10:20], uniforms(3, 1, ids[10:20]))
    assert not np.array_equal(a, uniforms(4, 1, ids))
    assert not np.array_equal(a, uniforms(3, 2, ids))
    assert ((a >= 0) & (a < 1)).all()
    big = uniforms(0, 0, np.arange(50_000), 2)
    assert abs(big.mean() - 0.5) < 0.01 and abs(big.std() - 0.2887) < 0.01


def test_random_resized_crop_follows_torchvision_bounds():
    spec = ImageSpec(random_resized_crop=(64, 64))
    ids = np.arange(2000)
    sizes = [(300, 451)] * len(ids)
    plans = plan_batch(spec, 0, 0, ids, sizes)
    boxes = np.array([p.box for p in plans])
    top, left, bh, bw = boxes.T
    assert (top >= 0).all() and (left >= 0).all()
    assert (top + bh <= 300).all() and (left + bw <= 451).all()
    frac = bh * bw / (300 * 451)
    assert frac.min() >= 0.07 and frac.max() <= 1.0
    r = bw / bh
    assert r.min() >= 0.74 and r.max() <= 1.35
    assert all(p.size == (64, 64) for p in plans)
    # an impossible ratio range falls back to torchvision's centred crop
    tall = plan_batch(ImageSpec(random_resized_crop=(8, 8), scale=(1.0, 1.0),
                                ratio=(4.0, 4.0)), 0, 0, np.arange(3), [(100, 100)] * 3)
    assert tall[0].box == (37, 0, 25, 100)


def test_eval_crop_is_resize_256_then_centre_224():
    spec = ImageSpec.from_kwargs(augment="eval")
    assert spec.eval_crop == (224, 224) and spec.mean == IMAGENET_MEAN
    (p,) = plan_batch(spec, 0, 0, np.arange(1), [(300, 400)])
    assert p.window and p.box is None  # the whole image resized, then the window cut
    assert p.size == (256, 341) and p.post == (16, 58, 224, 224) and not p.flip


def test_resize_then_crop_keeps_mx8_semantics():
    spec = ImageSpec(resize=(40, 50), crop=(30, 32))
    plans = plan_batch(spec, 1, 0, np.arange(50), [(123, 77)] * 50)
    for p in plans:
        assert p.box is None and p.size == (40, 50)
        t, le, h, w = p.post
        assert (h, w) == (30, 32) and 0 <= t <= 10 and 0 <= le <= 18
    assert len({p.post for p in plans}) > 10
    centre = plan_batch(ImageSpec(resize=(40, 50), center_crop=(30, 32)), 0, 0, np.arange(2),
                        [(5, 5)] * 2)
    assert centre[0].post == (5, 9, 30, 32)


def test_streams_are_independent_of_other_options():
    ids = np.arange(30)
    a = plan_batch(ImageSpec(resize=(40, 50), crop=(30, 32), flip_p=0.5), 7, 0, ids,
                   [(60, 60)] * 30)
    b = plan_batch(ImageSpec(resize=(40, 50), crop=(30, 32), flip_p=0.5, jitter_hue=0.1), 7, 0,
                   ids, [(60, 60)] * 30)
    assert [(p.post, p.flip) for p in a] == [(p.post, p.flip) for p in b]


def test_flip_probability_and_exact_flip():
    ids = np.arange(4000)
    flips = [p.flip for p in plan_batch(ImageSpec(flip_p=0.3), 0, 0, ids, [(4, 4)] * len(ids))]
    assert 0.27 < np.mean(flips) < 0.33
    img = gradient(20, 30)
    spec = ImageSpec(float_out=False, layout="NHWC")
    out = np.empty_like(img)
    finish(spec, img, Plan(None, None, None, True, None), out)
    np.testing.assert_array_equal(out, img[:, ::-1])


def test_normalise_and_layout_golden():
    img = gradient(16, 24)
    spec = ImageSpec(mean=IMAGENET_MEAN, std=IMAGENET_STD)
    out = np.empty((3, 16, 24), np.float32)
    finish(spec, img, Plan(None, None, (2, 3, 16 - 2, 24 - 3), False, None), out[:, :14, :21])
    ref = (img[2:, 3:] / 255.0 - np.array(IMAGENET_MEAN)) / np.array(IMAGENET_STD)
    np.testing.assert_allclose(out[:, :14, :21], ref.transpose(2, 0, 1), atol=1e-5)
    plain = ImageSpec(layout="NHWC")
    out2 = np.empty((16, 24, 3), np.float32)
    finish(plain, img, Plan(None, None, None, False, None), out2)
    np.testing.assert_allclose(out2, img / 255.0, atol=1e-6)


def test_jitter_brightness_contrast_saturation_match_numpy_reference():
    img = gradient(12, 18)
    x = img.astype(np.float64)
    grey = np.array([0.299, 0.587, 0.114])
    b, c, s = 1.2, 0.7, 1.4
    ref = np.clip(x * b, 0, 255)
    ref = np.clip(ref * c + (ref @ grey).mean() * (1 - c), 0, 255)
    ref = np.clip(ref * s + (ref @ grey)[:, :, None] * (1 - s), 0, 255)
    spec = ImageSpec(layout="NHWC", jitter_brightness=0.5)
    out = np.empty((12, 18, 3), np.float32)
    finish(spec, img, Plan(None, None, None, False, (b, c, s, 0.0)), out)
    np.testing.assert_allclose(out * 255, ref, atol=1e-2)


def test_hue_shift_rotates_and_full_turn_is_identity():
    img = gradient(10, 14)
    spec = ImageSpec(layout="NHWC", float_out=False, jitter_hue=0.5)
    same = np.empty_like(img)
    finish(spec, img, Plan(None, None, None, False, (1.0, 1.0, 1.0, 0.0)), same)
    np.testing.assert_array_equal(same, img)
    red = np.zeros((2, 2, 3), np.uint8)
    red[..., 0] = 255
    out = np.empty_like(red)
    finish(spec, red, Plan(None, None, None, False, (1.0, 1.0, 1.0, 1 / 3)), out)
    assert (out[..., 1] == 255).all() and (out[..., 0] == 0).all()  # red -> green


@pytest.mark.parametrize(("kw", "match"), [
    ({"mean": IMAGENET_MEAN, "std": IMAGENET_STD, "float_out": False}, "float_out"),
    ({"mean": IMAGENET_MEAN}, "together"),
    ({"resize": (32, 32), "crop": (40, 40)}, "exceeds"),
    ({"crop": (8, 8), "center_crop": (8, 8)}, "exclusive"),
    ({"random_resized_crop": (8, 8), "resize": (9, 9)}, "drop"),
    ({"flip_p": 1.5}, "flip_p"),
    ({"jitter_hue": 0.7}, "jitter_hue"),
    ({"resize": (0, 4)}, "> 0"),
    ({"resize": "224"}, "height, width"),
    ({"layout": "CHW"}, "layout"),
])
def test_bad_specs_are_config_errors(kw, match):
    with pytest.raises(ConfigError, match=match):
        ImageSpec(**kw)


def test_augment_presets():
    train = ImageSpec.from_kwargs(augment="imagenet")
    assert train.random_resized_crop == (224, 224) and train.flip_p == 0.5
    mx8 = ImageSpec.from_kwargs(augment="imagenet", resize=(256, 256))
    assert mx8.crop == (224, 224) and mx8.resize == (256, 256) and mx8.flip_p == 0
    assert ImageSpec.from_kwargs(augment="standard", resize=(256, 256)) == mx8
    with pytest.raises(ConfigError, match="resize"):
        ImageSpec.from_kwargs(augment="standard")
    with pytest.raises(ConfigError, match="unsupported augment"):
        ImageSpec.from_kwargs(augment="bogus")
    assert ImageSpec.from_kwargs(augment="imagenet", flip_p=0.0).flip_p == 0.0
