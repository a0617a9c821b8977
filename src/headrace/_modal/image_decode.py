"""Image decoding: encoded bytes -> RGB ``uint8`` (H, W, 3), cropped and resized in one step.

The expensive part of an image pipeline is the decode, so this module does as little of it as the
output needs:

* JPEG goes through libjpeg-turbo (``simplejpeg``, which releases the GIL). When the output is much
  smaller than the image, the decoder's DCT-domain scaling decodes straight to 1/2, 1/4 or 1/8 of the
  size (only power-of-two factors: libjpeg-turbo's 3/8..7/8 IDCTs are scalar code and slower than a
  full SIMD decode).
* Crop before decode: the caller picks the crop box in *source* coordinates first (see
  ``_image_augment``), and the DCT scale is chosen so that the box, not the whole image, still covers
  the output resolution. A random-resized crop of 30 % of an image therefore decodes at 1/2 or 1/4.
  A box that falls between the pixels of the scaled decode is resampled exactly (affine warp).
* Resize is OpenCV (``cv2.resize``: SIMD, releases the GIL). ``interpolation="auto"`` uses
  ``INTER_LINEAR`` when the remaining factor is below 2, which DCT scaling makes the common case
  (below 2x, bilinear sampling touches every source pixel); from 2x to 4x a bilinear resize to twice
  the output then OpenCV's SIMD 2x2 box (antialiased: as close to a Lanczos reference as exact area
  averaging, which is a scalar path costing more than the decode); from 4x ``INTER_AREA``.
* PNG, WebP, GIF, BMP, TIFF, CMYK/YCCK JPEGs go through Pillow (``draft`` gives DCT scaling for
  CMYK JPEGs too); everything comes out RGB ``uint8`` (grey is replicated, alpha is dropped).

Every failure is a :class:`~headrace.DecodeError`; callers attach the record id and path.
"""

from __future__ import annotations

import io
import math
import warnings
from typing import Any, Literal

import cv2
import numpy as np
import simplejpeg
from PIL import Image

from headrace._base.errors import DecodeError

__all__ = ["Box", "Buffer", "dct_factor", "decode", "decode_window", "image_size", "resize_into",
           "sniff"]

Interpolation = Literal["auto", "area", "linear"]
Box = tuple[int, int, int, int]  # (top, left, height, width) in source pixels
Buffer = Any  # bytes, memoryview or a uint8 ndarray: anything with the buffer protocol

_MAGIC: tuple[tuple[bytes, int, str], ...] = (
    (b"\xff\xd8\xff", 0, "jpeg"),
    (b"\x89PNG\r\n\x1a\n", 0, "png"),
    (b"GIF87a", 0, "gif"),
    (b"GIF89a", 0, "gif"),
    (b"BM", 0, "bmp"),
    (b"II*\x00", 0, "tiff"),
    (b"MM\x00*", 0, "tiff"),
)
_DCT_FACTORS = (8, 4, 2)
# decode_window decodes at 1/k only while Pillow's filter still shrinks the decode by this much
# more: DCT scaling is a different low-pass than Pillow's triangle filter. On photographs (and
# rotated crops of them) the mean difference from a full-size decode is under 0.01 grey levels
# past 5x, up to 1.2 levels at 3-4x and 1-4 levels below.
_WINDOW_MIN_REST = 5.0
# interpolation="auto" area-averages exactly from this shrink factor on; from 2x up to it, a
# bilinear resize to twice the output is followed by OpenCV's exact 2x2 box (see resize_into).
_AREA_FROM = 4.0


def sniff(buf: Buffer) -> str:
    """Names the container format from its magic bytes: ``jpeg``, ``png``, ``webp``, ... or ``unknown``."""
    head = bytes(memoryview(buf)[:16])
    for magic, offset, name in _MAGIC:
        if head[offset:offset + len(magic)] == magic:
            return name
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    return "unknown"


def _jpeg_header(buf: memoryview) -> tuple[int, int, str]:
    try:
        h, w, colorspace, _sub = simplejpeg.decode_jpeg_header(buf)
    except ValueError as exc:
        raise DecodeError(f"not a decodable JPEG: {exc}") from exc
    return int(h), int(w), str(colorspace)


def _open_pil(buf: memoryview) -> Image.Image:
    try:
        return Image.open(io.BytesIO(buf))
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise DecodeError(f"not a decodable image: {exc}") from exc


def image_size(buf: Buffer) -> tuple[int, int]:
    """(height, width) of an encoded image, read from its header only (no pixel decode)."""
    mv = memoryview(buf).cast("B")
    if sniff(mv) == "jpeg":
        h, w, _ = _jpeg_header(mv)
        return h, w
    with _open_pil(mv) as im:
        w, h = im.size
    return int(h), int(w)


def dct_factor(box_hw: tuple[int, int], out_hw: tuple[int, int]) -> int:
    """The largest libjpeg scale-down factor in (8, 4, 2, 1) whose decode still covers ``out_hw``.

    A box of ``box_hw`` source pixels decoded at 1/k is about ``box_hw / k`` pixels; it must stay at
    least ``out_hw`` in both dimensions, so the final resize never upsamples because of the DCT step.
    """
    bh, bw = box_hw
    oh, ow = out_hw
    for k in _DCT_FACTORS:
        if bh >= oh * k and bw >= ow * k:
            return k
    return 1


def _to_rgb_array(im: Image.Image) -> np.ndarray:
    mode = im.mode
    if mode in ("I;16", "I;16B", "I;16L", "I"):
        # 16-bit grey (PNG): keep the high byte rather than Pillow's clipping conversion to "L".
        a = np.asarray(im, dtype=np.uint32)
        grey = (a >> 8).astype(np.uint8) if a.max(initial=0) > 255 else a.astype(np.uint8)
        return np.ascontiguousarray(np.repeat(grey[:, :, None], 3, axis=2))
    if mode == "P" and "transparency" in im.info:
        im = im.convert("RGBA")  # Pillow warns when a palette with transparency goes straight to RGB
    if im.mode != "RGB":
        im = im.convert("RGB")
    return np.asarray(im)


def _decode_pil(mv: memoryview, box: Box | None, out_hw: tuple[int, int] | None
                ) -> tuple[np.ndarray, Box | None, tuple[int, int]]:
    """Pillow path; returns the decoded array and the box rescaled into its coordinates."""
    with warnings.catch_warnings():
        # A malformed EXIF/metadata block is a warning in Pillow; the pixels are still fine.
        warnings.simplefilter("ignore", UserWarning)
        try:
            with _open_pil(mv) as im:
                w, h = im.size
                if box is not None:
                    _check_box(box, (h, w))
                k = 1
                if im.format == "JPEG" and out_hw is not None:  # CMYK/YCCK JPEGs land here
                    bh, bw = (box[2], box[3]) if box is not None else (h, w)
                    k = dct_factor((bh, bw), out_hw)
                    if k > 1:
                        im.draft(None, (math.ceil(w / k), math.ceil(h / k)))
                im.load()
                arr = _to_rgb_array(im)
        except DecodeError:
            raise
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
            raise DecodeError(f"image decode failed: {exc}") from exc
    return arr, _scale_box(box, (h, w), arr.shape[:2]), (h, w)


def _scale_box(box: Box | None, src_hw: tuple[int, int], got_hw: tuple[int, ...]) -> Box | None:
    if box is None or tuple(got_hw) == tuple(src_hw):
        return box
    sy, sx = got_hw[0] / src_hw[0], got_hw[1] / src_hw[1]
    top, left = round(box[0] * sy), round(box[1] * sx)
    bh = max(1, min(round(box[2] * sy), got_hw[0] - top))
    bw = max(1, min(round(box[3] * sx), got_hw[1] - left))
    return top, left, bh, bw


def _decode_full(mv: memoryview, box: Box | None, out_hw: tuple[int, int] | None,
                 fast: bool) -> tuple[np.ndarray, Box | None, tuple[int, int]]:
    if sniff(mv) != "jpeg":
        return _decode_pil(mv, box, out_hw)
    h, w, colorspace = _jpeg_header(mv)
    if box is not None:
        _check_box(box, (h, w))
    if colorspace not in ("Gray", "YCbCr", "RGB"):  # CMYK / YCCK: Pillow knows Adobe's inversion
        return _decode_pil(mv, box, out_hw)
    k = 1
    if out_hw is not None:
        k = dct_factor((box[2], box[3]) if box is not None else (h, w), out_hw)
    try:
        arr = simplejpeg.decode_jpeg(
            mv, colorspace="RGB", fastdct=fast, fastupsample=fast,
            min_height=math.ceil(h / k), min_width=math.ceil(w / k), min_factor=k)
    except ValueError as exc:
        raise DecodeError(f"JPEG decode failed: {exc}") from exc
    return arr, _scale_box(box, (h, w), arr.shape[:2]), (h, w)


def _check_box(box: Box, hw: tuple[int, int]) -> None:
    top, left, bh, bw = box
    if bh < 1 or bw < 1 or top < 0 or left < 0 or top + bh > hw[0] or left + bw > hw[1]:
        raise ValueError(f"crop box {box} (top, left, height, width) does not fit an image of "
                         f"{hw[0]}x{hw[1]}")


def resize_into(src: np.ndarray, out_hw: tuple[int, int], *, out: np.ndarray | None = None,
                interpolation: Interpolation = "auto") -> np.ndarray:
    """Resizes an (h, w, 3) ``uint8`` array (a view is fine) to ``out_hw`` with OpenCV.

    ``auto``: ``INTER_LINEAR`` below a 2x shrink; from 2x to 4x (in the dimension that shrinks
    most), bilinear to twice the output then a 2x2 box average; from 4x, ``INTER_AREA``. ``area``
    always area-averages when shrinking; ``linear`` is always bilinear.
    """
    oh, ow = out_hw
    sh, sw = src.shape[:2]
    if (sh, sw) == (oh, ow):
        if out is None:
            return np.ascontiguousarray(src)
        out[...] = src
        return out
    shrink = max(sh / oh, sw / ow)
    if interpolation == "linear":
        flag = cv2.INTER_LINEAR
    elif interpolation == "area":
        flag = cv2.INTER_AREA if shrink > 1 else cv2.INTER_LINEAR
    elif shrink >= _AREA_FROM:
        flag = cv2.INTER_AREA
    elif shrink >= 2:
        # OpenCV's INTER_AREA at a fractional factor is a scalar path that costs ~7x a bilinear
        # resize (2 ms for a 400x500 image); its exact 2x2 box path is SIMD. Bilinear to twice the
        # output (a shrink below 2, so it touches every source pixel) then the 2x2 box is as close
        # to a Lanczos reference as exact area averaging, at a third of its cost (docs/images.md).
        src = cv2.resize(src, (2 * ow, 2 * oh), interpolation=cv2.INTER_LINEAR)
        flag = cv2.INTER_AREA
    else:
        flag = cv2.INTER_LINEAR
    if out is None:
        return cv2.resize(src, (ow, oh), interpolation=flag)
    res = cv2.resize(src, (ow, oh), dst=out, interpolation=flag)
    if res is not out and not np.shares_memory(res, out):  # cv2 may reallocate a non-contiguous dst
        out[...] = res
    return out


def _warp_fractional(arr: np.ndarray, box: Box, src_hw: tuple[int, int],
                     size: tuple[int, int], out: np.ndarray | None,
                     interpolation: Interpolation) -> np.ndarray | None:
    """Bilinear resample of a box that falls between the pixels of a DCT-scaled decode.

    Snapping such a box to the decoded grid would shift the crop by up to half a decoded pixel
    (``k/2`` source pixels at scale 1/k); an affine warp samples the exact box instead, with
    ``cv2.resize``'s half-pixel-centre convention. Returns ``None`` when the box is on the grid or
    the filter policy wants area averaging (then the snapped box is resized).
    """
    fy, fx = arr.shape[0] / src_hw[0], arr.shape[1] / src_hw[1]
    top, left, bh, bw = box[0] * fy, box[1] * fx, box[2] * fy, box[3] * fx
    if all(abs(v - round(v)) < 1e-6 for v in (top, left, bh, bw)):
        return None
    oh, ow = size
    shrink = max(bh / oh, bw / ow)
    if (interpolation == "area" and shrink > 1) or (interpolation == "auto" and shrink >= 2):
        return None
    sy, sx = bh / oh, bw / ow
    m = np.array([[sx, 0.0, left + 0.5 * sx - 0.5], [0.0, sy, top + 0.5 * sy - 0.5]])
    dst = out if out is not None else np.empty((oh, ow, 3), np.uint8)
    res = cv2.warpAffine(arr, m, (ow, oh), dst=dst,
                         flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
                         borderMode=cv2.BORDER_REPLICATE)
    if res is not dst and not np.shares_memory(res, dst):
        dst[...] = res
    return dst


def decode(buf: Buffer, *, box: Box | None = None,
           size: tuple[int, int] | None = None, out: np.ndarray | None = None,
           interpolation: Interpolation = "auto", dct_scale: bool = True,
           fast: bool = False) -> np.ndarray:
    """Decodes an encoded image to RGB ``uint8`` (H, W, 3), cropping ``box`` and resizing to ``size``.

    Args:
        buf: the encoded bytes (JPEG, PNG, WebP, GIF, BMP, TIFF, ...).
        box: ``(top, left, height, width)`` in source pixels; ``None`` keeps the whole image.
        size: output ``(height, width)``; ``None`` returns the box at source resolution.
        out: optional ``(H, W, 3)`` ``uint8`` array to write into (requires ``size``).
        interpolation: resize filter policy, see :func:`resize_into`.
        dct_scale: let the JPEG decoder scale down by 1/2, 1/4, 1/8 in the DCT domain when the box
            still covers ``size`` (off = decode at full size; the golden tests compare against that).
        fast: libjpeg-turbo's fast integer IDCT and box chroma upsampling (about 5-10 % faster,
            slightly less accurate; invisible after a downscale).

    Raises:
        DecodeError: the bytes are not a decodable image (corrupt, truncated, unknown format).
        ValueError: ``box`` does not fit inside the image.
    """
    mv = memoryview(buf).cast("B") if not isinstance(buf, memoryview) or buf.format != "B" \
        else buf
    if len(mv) == 0:
        raise DecodeError("empty image payload (0 bytes)")
    arr, dbox, src_hw = _decode_full(mv, box, size if dct_scale else None, fast)
    if arr.ndim == 2:
        arr = np.repeat(arr[:, :, None], 3, axis=2)
    if box is not None and size is not None and arr.shape[:2] != src_hw:
        warped = _warp_fractional(arr, box, src_hw, size, out, interpolation)
        if warped is not None:
            return warped
    view = arr if dbox is None else arr[dbox[0]:dbox[0] + dbox[2], dbox[1]:dbox[1] + dbox[3]]
    if size is None:
        if out is not None:
            out[...] = view
            return out
        return np.ascontiguousarray(view)
    return resize_into(view, size, out=out, interpolation=interpolation)


def decode_window(buf: Buffer, *, resized: tuple[int, int], window: Box,
                  out: np.ndarray | None = None, dct_scale: bool = True,
                  fast: bool = False) -> np.ndarray:
    """The ``window`` (top, left, h, w) of the image resized to ``resized`` (h, w) with Pillow's
    antialiased bilinear filter: what torchvision's ``Resize`` + ``CenterCrop`` give on a PIL
    image, pixel for pixel, computing only the window's pixels.

    Pillow's ``resize(box=...)`` places each output pixel's filter exactly where the whole-image
    resize would (and clamps it at the image's edges, not the box's), so resizing the matching
    source box equals resizing everything and cropping. A JPEG is decoded at 1/2, 1/4 or 1/8 only
    when the filter still shrinks that decode by ``_WINDOW_MIN_REST`` or more.
    """
    mv = memoryview(buf).cast("B") if not isinstance(buf, memoryview) or buf.format != "B" \
        else buf
    if len(mv) == 0:
        raise DecodeError("empty image payload (0 bytes)")
    top, left, wh, ww = window
    rh, rw = resized
    if top < 0 or left < 0 or top + wh > rh or left + ww > rw:
        raise ValueError(f"window {window} does not fit the resized {rh}x{rw} image")
    hint = (math.ceil(rh * _WINDOW_MIN_REST), math.ceil(rw * _WINDOW_MIN_REST)) \
        if dct_scale else None
    arr, _, _ = _decode_full(mv, None, hint, fast)
    if arr.ndim == 2:
        arr = np.repeat(arr[:, :, None], 3, axis=2)
    dh, dw = arr.shape[:2]
    if (dh, dw) == (rh, rw):
        img = arr[top:top + wh, left:left + ww]
    else:
        sy, sx = dh / rh, dw / rw
        box = (left * sx, top * sy, (left + ww) * sx, (top + wh) * sy)
        img = np.asarray(Image.fromarray(np.ascontiguousarray(arr)).resize(
            (ww, wh), Image.Resampling.BILINEAR, box=box))
    if out is None:
        return np.ascontiguousarray(img)
    out[...] = img
    return out
