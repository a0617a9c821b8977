"""headrace.plot writes a real PNG of the expected size, with content, from every kind of input."""

import json

import numpy as np
import pytest
from PIL import Image

import headrace


def _loader(**kw):
    data = {"x": np.arange(3000 * 32, dtype=np.uint8).reshape(3000, 32), "y": np.arange(3000)}
    return headrace.Loader(data, batch=50, epochs=2, **kw)


def _check_png(path, size):
    with Image.open(path) as im:
        assert im.format == "PNG"
        assert im.size == size
        rgb = np.asarray(im.convert("RGB"))
    colours = np.unique(rgb.reshape(-1, 3), axis=0)
    assert len(colours) > 20  # lines, text, legends: not a blank canvas
    assert (rgb.min(axis=2) < 200).mean() > 0.01  # more than 1% of pixels are drawn on


def test_plot_from_a_loader(tmp_path):
    with _loader(timeline=1e-6) as ld:
        list(ld)
        out = headrace.plot(ld, tmp_path / "t.png", dpi=50, width_in=12, height_in=10)
    assert out == tmp_path / "t.png"
    _check_png(out, (600, 500))


def test_plot_from_a_saved_timeline_and_a_dict(tmp_path):
    with _loader() as ld:
        ld.enable_timeline(period_s=1e-6)
        list(ld)
        tl = ld.stats_timeline()
    saved = tmp_path / "t.json"
    saved.write_text(json.dumps(tl))
    headrace.plot(str(saved), tmp_path / "a.png", title="saved")
    headrace.plot(tl, tmp_path / "b.png")
    _check_png(tmp_path / "a.png", (1000, 900))
    _check_png(tmp_path / "b.png", (1000, 900))


def test_plot_needs_snapshots_and_a_timeline(tmp_path):
    with _loader(timeline=3600.0) as ld:  # nothing recorded yet: no batch, no end of run
        tl = ld.stats_timeline()
    empty = {**tl, "samples": []}
    with pytest.raises(headrace.ConfigError, match="no snapshot"):
        headrace.plot(empty, tmp_path / "x.png")
    with _loader() as ld, pytest.raises(headrace.ConfigError, match="timeline=True"):
        headrace.plot(ld, tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()
