"""Decode: formats -> RGB, golden resize/crop against NumPy/Pillow references, DCT scaling, errors.

Tolerances (stated, and why):
* resize vs the NumPy references below (exact area averaging; half-pixel-centre bilinear): max
  abs diff <= 1 grey level (OpenCV rounds, and uses 11-bit fixed-point bilinear weights).
* bilinear upscale vs Pillow ``BILINEAR``, integer-factor area vs Pillow ``BOX``: <= 1.
* DCT-scaled decode vs full decode + the same resize: mean abs diff < 2.5 grey levels on photos
  (libjpeg's scaled IDCT is a different low-pass than area averaging; measured 0.5-2.4), < 5 for
  crop boxes that fall between decoded pixels (bilinear resampling of the scaled image; measured
  0.7-4.2, against 1.4-9.6 when such a box is snapped to the decoded grid).
* lossy formats (JPEG q95) vs the source pixels: mean abs diff < 3.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from _images import cmyk_jpeg, encode, gradient, gray_jpeg, photo
from headrace import DecodeError
from headrace._modal.image_decode import dct_factor, decode, image_size, resize_into, sniff


def _area_weights(n: int, m: int) -> np.ndarray:
    f = n / m
    w = np.zeros((m, n))
    for o in range(m):
        a, b = o * f, (o + 1) * f
        for i in range(int(np.floor(a)), min(n, int(np.ceil(b)))):
            w[o, i] = max(0.0, min(b, i + 1) - max(a, i))
    return w / f


def _linear_weights(n: int, m: int) -> np.ndarray:
    f = n / m
    w = np.zeros((m, n))
    for o in range(m):
        s = min(max((o + 0.5) * f - 0.5, 0.0), n - 1)
        i0 = int(np.floor(s))
        i1 = min(i0 + 1, n - 1)
        w[o, i0] += 1 - (s - i0)
        w[o, i1] += s - i0
    return w


def _ref_resize(img: np.ndarray, out_hw: tuple[int, int], weights) -> np.ndarray:
    wy, wx = weights(img.shape[0], out_hw[0]), weights(img.shape[1], out_hw[1])
    x = img.astype(np.float64)
    rows = np.tensordot(wy, x, axes=(1, 0))  # (oh, w, c)
    return np.tensordot(rows, wx, axes=(1, 1)).transpose(0, 2, 1)  # (oh, ow, c)


@pytest.mark.parametrize("fmt", ["PNG", "WEBP", "BMP", "TIFF"])
def test_lossless_formats_decode_exactly_to_rgb(fmt):
    img = gradient(30, 44)
    out = decode(encode(img, fmt))
    assert out.dtype == np.uint8 and out.shape == (30, 44, 3)
    np.testing.assert_array_equal(out, img)


def test_jpeg_and_gif_decode_close_to_source():
    img = gradient(48, 64)
    assert np.abs(decode(encode(img, "JPEG")).astype(int) - img).mean() < 3
    assert decode(encode(img, "GIF")).shape == (48, 64, 3)  # palette -> RGB


def test_grayscale_cmyk_rgba_palette_and_16bit_come_out_rgb():
    data, grey = gray_jpeg(24, 40)
    out = decode(data)
    assert out.shape == (24, 40, 3)
    assert (out[:, :, 0] == out[:, :, 1]).all() and (out[:, :, 1] == out[:, :, 2]).all()
    assert np.abs(out[:, :, 0].astype(int) - grey).mean() < 2

    img = gradient(32, 48)
    cmyk = cmyk_jpeg(img)
    assert Image.open(io.BytesIO(cmyk)).mode == "CMYK"
    assert np.abs(decode(cmyk).astype(int) - img).mean() < 3
    assert decode(cmyk, size=(8, 12)).shape == (8, 12, 3)

    rgba = np.dstack([img, np.full(img.shape[:2], 7, np.uint8)])
    np.testing.assert_array_equal(decode(encode(rgba, "PNG")), img)

    pal = Image.fromarray(img).convert("P")
    bio = io.BytesIO()
    pal.save(bio, format="PNG", transparency=0)
    assert decode(bio.getvalue()).shape == (32, 48, 3)

    hi = Image.fromarray(img[:, :, 0].astype(np.uint16) * 257)
    bio = io.BytesIO()
    hi.save(bio, format="PNG")
    out = decode(bio.getvalue())
    np.testing.assert_array_equal(out[:, :, 0], img[:, :, 0])


def test_sniff_and_image_size_read_headers():
    img = gradient(21, 34)
    for fmt, name in [("JPEG", "jpeg"), ("PNG", "png"), ("WEBP", "webp"), ("GIF", "gif")]:
        data = encode(img, fmt)
        assert sniff(data) == name
        assert image_size(data) == (21, 34)
    assert sniff(b"hello world") == "unknown"


@pytest.mark.parametrize(("src", "out"), [((120, 160), (60, 80)), ((120, 160), (37, 51)),
                                          ((120, 160), (50, 70)), ((300, 451), (224, 224))])
def test_area_resize_matches_exact_area_average(src, out):
    img = gradient(*src) if src[0] < 300 else photo("chelsea")
    got = resize_into(img, out, interpolation="area").astype(np.float64)
    assert np.abs(got - _ref_resize(img, out, _area_weights)).max() <= 1.0


@pytest.mark.parametrize(("src", "out"), [((120, 160), (90, 100)), ((40, 56), (80, 100)),
                                          ((300, 451), (224, 224))])
def test_linear_resize_matches_bilinear_reference(src, out):
    img = gradient(*src) if src[0] < 300 else photo("chelsea")
    got = resize_into(img, out, interpolation="linear").astype(np.float64)
    assert np.abs(got - _ref_resize(img, out, _linear_weights)).max() <= 1.0


def test_resize_agrees_with_pillow_where_the_filters_coincide():
    img = gradient(120, 160)
    up = resize_into(img, (200, 250), interpolation="auto").astype(int)
    pil_up = np.asarray(Image.fromarray(img).resize((250, 200), Image.BILINEAR)).astype(int)
    assert np.abs(up - pil_up).max() <= 1
    down = resize_into(img, (30, 40), interpolation="auto").astype(int)  # 4x: area
    pil_down = np.asarray(Image.fromarray(img).resize((40, 30), Image.BOX)).astype(int)
    assert np.abs(down - pil_down).max() <= 1


def test_auto_interpolation_picks_linear_below_2x_and_area_from_4x():
    img = photo("coffee")
    got = resize_into(img, (100, 150), interpolation="auto")  # 4x
    np.testing.assert_array_equal(got, resize_into(img, (100, 150), interpolation="area"))
    got = resize_into(img, (300, 450), interpolation="auto")  # 1.33x
    np.testing.assert_array_equal(got, resize_into(img, (300, 450), interpolation="linear"))


@pytest.mark.parametrize(("name", "out"), [("coffee", (160, 224)), ("astronaut", (224, 224)),
                                           ("chelsea", (100, 224)), ("rocket", (150, 240))])
def test_auto_between_2x_and_4x_is_antialiased_like_exact_area(name, out):
    # 2x..4x: bilinear to twice the output, then a 2x2 box. Against a neutral antialiased
    # reference (Lanczos on the same pixels, float) it must be as close as exact area averaging,
    # and much closer than plain bilinear, which aliases at these factors.
    img = photo(name)
    ref = np.asarray(Image.fromarray(img).resize(out[::-1], Image.Resampling.LANCZOS),
                     np.float64)
    auto = resize_into(img, out, interpolation="auto").astype(np.float64)
    area = resize_into(img, out, interpolation="area").astype(np.float64)
    linear = resize_into(img, out, interpolation="linear").astype(np.float64)
    assert 2 <= max(img.shape[0] / out[0], img.shape[1] / out[1]) < 4
    err = {k: np.abs(v - ref).mean() for k, v in (("auto", auto), ("area", area),
                                                  ("linear", linear))}
    assert err["auto"] <= err["area"] + 0.25, err
    assert err["auto"] < err["linear"], err
    assert np.abs(auto - area).mean() < 1.0
    dst = np.zeros((*out, 3), np.uint8)
    assert resize_into(img, out, out=dst, interpolation="auto") is dst
    np.testing.assert_array_equal(dst, auto)


def test_crop_box_is_exact_slicing_without_resize():
    img = gradient(50, 70)
    data = encode(img, "PNG")
    np.testing.assert_array_equal(decode(data, box=(5, 9, 20, 31)), img[5:25, 9:40])
    out = np.zeros((20, 31, 3), np.uint8)
    assert decode(data, box=(5, 9, 20, 31), out=out) is out
    np.testing.assert_array_equal(out, img[5:25, 9:40])


def test_crop_then_resize_equals_reference_on_full_decode():
    img = photo("astronaut")
    data = encode(img, "JPEG")
    full = decode(data, dct_scale=False)
    box = (40, 100, 300, 260)
    got = decode(data, box=box, size=(64, 48), dct_scale=False)
    ref = resize_into(full[40:340, 100:360], (64, 48))
    np.testing.assert_array_equal(got, ref)


def test_out_of_bounds_box_is_an_error():
    data = encode(gradient(20, 20), "PNG")
    with pytest.raises(ValueError, match="does not fit"):
        decode(data, box=(10, 10, 20, 5))


def test_dct_factor_never_undershoots_the_output():
    assert dct_factor((512, 512), (224, 224)) == 2
    assert dct_factor((447, 600), (224, 224)) == 1
    assert dct_factor((2000, 3000), (224, 224)) == 8
    assert dct_factor((900, 3000), (224, 224)) == 4


@pytest.mark.parametrize("name", ["astronaut", "coffee", "retina"])
def test_dct_scaled_decode_is_close_to_full_decode(name):
    img = photo(name)
    data = encode(img, "JPEG", quality=90)
    h, w = img.shape[:2]
    size = (h // 4, w // 4)
    fast = decode(data, size=size).astype(np.float64)
    full = decode(data, size=size, dct_scale=False, interpolation="area").astype(np.float64)
    assert np.abs(fast - full).mean() < 2.5
    # crop-before-decode: a box covering a quarter of the image decodes at a smaller scale too.
    # (The box is snapped to the decoded grid, so it is aligned to 8 px here to compare pixels.)
    box = (h // 32 * 8, w // 32 * 8, h // 16 * 8, w // 16 * 8)
    small = decode(data, box=box, size=(box[2] // 4, box[3] // 4)).astype(np.float64)
    ref = decode(data, box=box, size=(box[2] // 4, box[3] // 4), dct_scale=False,
                 interpolation="area").astype(np.float64)
    assert np.abs(small - ref).mean() < 2.5
    # A box between the decoded pixels is resampled exactly (affine warp), not snapped.
    box = (h // 4 + 3, w // 4 + 5, h // 2 + 1, w // 2 + 2)
    small = decode(data, box=box, size=(h // 8, w // 8)).astype(np.float64)
    ref = decode(data, box=box, size=(h // 8, w // 8), dct_scale=False).astype(np.float64)
    assert np.abs(small - ref).mean() < 5.0


def test_fast_mode_is_close():
    data = encode(photo("coffee"), "JPEG", quality=90)
    a = decode(data, size=(200, 300), fast=True).astype(int)
    b = decode(data, size=(200, 300)).astype(int)
    assert np.abs(a - b).mean() < 1.5


@pytest.mark.parametrize("bad", ["truncated", "garbage", "empty", "header-only", "png-truncated"])
def test_corrupt_payloads_raise_decode_error(bad):
    jpeg = encode(gradient(64, 64), "JPEG")
    png = encode(gradient(64, 64), "PNG")
    data = {"truncated": jpeg[: len(jpeg) // 2], "garbage": b"not an image" * 20, "empty": b"",
            "header-only": jpeg[:3] + b"\0" * 100, "png-truncated": png[: len(png) // 2]}[bad]
    with pytest.raises(DecodeError):
        decode(data, size=(16, 16))
