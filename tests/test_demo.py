"""The README's first command: the demo runs with no arguments and prints what it measured."""

import json
import os
import subprocess
import sys

import numpy as np
from PIL import Image

from headrace import demo


def _run_demo(data_dir, records=3000):
    env = {**os.environ, "HEADRACE_DEMO_DIR": str(data_dir),
           "HEADRACE_DEMO_RECORDS": str(records), "HEADRACE_DEMO_IMAGES": "120",
           "HEADRACE_DEMO_STEPS": "12"}
    return subprocess.run([sys.executable, "-m", "headrace.demo"], capture_output=True, text=True,
                          env=env, timeout=240)


def test_demo_runs_and_reports(tmp_path):
    out = _run_demo(tmp_path / "d")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for prefix in ("[data] made 3000", "[pack] packed 3000 records", "[read] random gathers",
                   "[check] ok", "[memory] peak RSS", "[photos] made 120 64x64 JPEGs",
                   "[pack-photos] packed 120 JPEGs (4 classes)", "[train] JAX + optax (CPU)",
                   "[train] step  10  loss", "[train] step  12  loss",
                   "[plot] timeline plot written to", "[done]"):
        assert prefix in text, text
    assert "rows/s" in text and "MB/s" in text and "img/s" in text and "in flight" in text
    assert "Traceback" not in out.stderr
    png = tmp_path / "d" / "timeline.png"
    with Image.open(png) as im:
        assert im.format == "PNG" and im.size == (1000, 900)
    timeline = json.loads((tmp_path / "d" / "timeline.json").read_text())
    assert timeline["format"] == "headrace-timeline" and timeline["samples"]
    # A second run reuses the sample data and repacks the store.
    again = _run_demo(tmp_path / "d")
    assert again.returncode == 0, again.stderr
    assert "[data] reusing 3000" in again.stdout
    assert "[photos] reusing 120" in again.stdout
    assert "[check] ok" in again.stdout


def test_demo_rejects_arguments():
    assert demo.main(["--fast"]) == 2


def test_sample_images_depend_only_on_the_record_id():
    whole = demo.make_images(0, 50)
    np.testing.assert_array_equal(whole[17:23], demo.make_images(17, 23))
    assert whole.shape == (50, 32, 32, 3) and whole.dtype == np.uint8
    assert len(np.unique(whole)) > 100  # not constant, not trivially compressible
    assert [s.name for s in demo.STEPS][:3] == ["data", "pack", "read"]


def test_sample_photos_are_deterministic_and_labelled_by_shape():
    a, label = demo.make_photo(5)
    b, again = demo.make_photo(5)
    np.testing.assert_array_equal(a, b)
    assert label == again == 5 % len(demo.SHAPES)
    assert a.shape == (demo.PHOTO_SIZE, demo.PHOTO_SIZE, 3) and a.dtype == np.uint8
    assert a.std() > 10  # a picture, not a flat colour
    assert not np.array_equal(a, demo.make_photo(9)[0])
