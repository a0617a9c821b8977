"""The README's first command: the demo runs with no arguments and prints what it measured."""

import os
import subprocess
import sys

import numpy as np

from headrace import demo


def _run_demo(data_dir, records=3000):
    env = {**os.environ, "HEADRACE_DEMO_DIR": str(data_dir),
           "HEADRACE_DEMO_RECORDS": str(records)}
    return subprocess.run([sys.executable, "-m", "headrace.demo"], capture_output=True, text=True,
                          env=env, timeout=240)


def test_demo_runs_and_reports(tmp_path):
    out = _run_demo(tmp_path / "d")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for prefix in ("[data] made 3000", "[pack] packed 3000 records", "[read] random gathers",
                   "[check] ok", "[memory] peak RSS", "[done]"):
        assert prefix in text, text
    assert "rows/s" in text and "MB/s" in text
    assert "Traceback" not in out.stderr
    # A second run reuses the sample data and repacks the store.
    again = _run_demo(tmp_path / "d")
    assert again.returncode == 0, again.stderr
    assert "[data] reusing 3000" in again.stdout
    assert "[check] ok" in again.stdout


def test_demo_rejects_arguments():
    assert demo.main(["--fast"]) == 2


def test_sample_images_depend_only_on_the_record_id():
    whole = demo.make_images(0, 50)
    np.testing.assert_array_equal(whole[17:23], demo.make_images(17, 23))
    assert whole.shape == (50, 32, 32, 3) and whole.dtype == np.uint8
    assert len(np.unique(whole)) > 100  # not constant, not trivially compressible
    assert [s.name for s in demo.STEPS][:3] == ["data", "pack", "read"]
