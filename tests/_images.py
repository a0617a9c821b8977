"""Test image makers: smooth gradients and shapes (never noise), encoded with real codecs.

Smooth content keeps JPEG error small and makes resize/crop/flip differences measurable, so golden
checks can use tight tolerances. ``photo()`` cuts from scikit-image's bundled photographs.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
from PIL import Image


def gradient(h: int, w: int, *, phase: int = 0) -> np.ndarray:
    """An (h, w, 3) uint8 image: horizontal red ramp, vertical green ramp, a blue disc; asymmetric
    left/right and top/bottom, so flips and crops are visible."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    r = 255 * x / max(w - 1, 1)
    g = 255 * y / max(h - 1, 1)
    cy, cx = h * 0.4, w * 0.3 + phase % max(w // 4, 1)
    rad = min(h, w) * 0.25
    b = np.where((y - cy) ** 2 + (x - cx) ** 2 < rad ** 2, 200.0, 40.0 + 0.2 * x)
    return np.clip(np.stack([r, g, b], axis=-1) + 0.5, 0, 255).astype(np.uint8)


def photo(name: str = "astronaut", *, size: tuple[int, int] | None = None) -> np.ndarray:
    """A bundled scikit-image photograph as RGB uint8, optionally resized to ``size`` (h, w)."""
    import skimage.data

    img = getattr(skimage.data, name)()
    if img.ndim == 2:
        img = np.repeat(img[:, :, None], 3, axis=2)
    img = img[:, :, :3]
    if size is not None:
        img = np.asarray(Image.fromarray(img).resize((size[1], size[0]), Image.BICUBIC))
    return np.ascontiguousarray(img)


def encode(img: np.ndarray, fmt: str = "JPEG", **kw: object) -> bytes:
    """Encodes with Pillow; ``fmt`` is a Pillow format name (JPEG, PNG, WEBP, GIF, BMP)."""
    bio = io.BytesIO()
    im = Image.fromarray(img)
    if fmt == "JPEG":
        kw.setdefault("quality", 95)
    if fmt == "WEBP":
        kw.setdefault("lossless", True)
    im.save(bio, format=fmt, **kw)  # type: ignore[arg-type]
    return bio.getvalue()


def gray_jpeg(h: int, w: int) -> tuple[bytes, np.ndarray]:
    """A single-channel JPEG and the grey image it encodes."""
    g = gradient(h, w)[:, :, 1]
    bio = io.BytesIO()
    Image.fromarray(g, mode="L").save(bio, format="JPEG", quality=95)
    return bio.getvalue(), g


def cmyk_jpeg(img: np.ndarray) -> bytes:
    """A CMYK JPEG (as Photoshop writes them: Adobe marker, inverted) of an RGB image."""
    bio = io.BytesIO()
    Image.fromarray(img).convert("CMYK").save(bio, format="JPEG", quality=95)
    return bio.getvalue()


def write_tree(root: Path, files: dict[str, bytes]) -> None:
    """Writes ``{relative path: bytes}`` under ``root``."""
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)


def imagefolder(root: Path, classes: dict[str, int], *, h: int = 40, w: int = 56,
                fmt: str = "JPEG") -> list[str]:
    """Writes an ImageFolder tree ``root/<class>/<i>.jpg`` of distinct gradients; returns the
    relative paths in byte-wise sorted order."""
    ext = {"JPEG": "jpg", "PNG": "png", "WEBP": "webp"}[fmt]
    files = {}
    k = 0
    for cls, n in classes.items():
        for i in range(n):
            files[f"{cls}/{i}.{ext}"] = encode(gradient(h, w, phase=k * 3), fmt)
            k += 1
    write_tree(root, files)
    return sorted(files, key=os.fsencode)
