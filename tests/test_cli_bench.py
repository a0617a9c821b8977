"""`headrace bench` on real small datasets: exit codes, the table, suggestions, plot and timeline."""

import json
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

import headrace
from headrace import demo
from headrace._cli.bench import parse_size
from headrace._cli.main import main


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "arrays.hr"
    rng = np.random.default_rng(0)
    headrace.pack_arrays(path, x=rng.integers(0, 255, (2000, 64), dtype=np.uint8),
                         y=np.arange(2000))
    return str(path)


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    root = tmp_path_factory.mktemp("photos") / "folder"
    demo.make_photo_folder(root, 24)
    return root


def test_bench_a_store_prints_the_table_and_writes_plot_and_timeline(store, tmp_path, capsys):
    png, saved = tmp_path / "b.png", tmp_path / "b.json"
    rc = main(["bench", store, "--seconds", "0.4", "--batch", "100", "--threads", "2",
               "--inflight", "4MiB", "--plot", str(png), "--timeline", str(saved)])
    out = capsys.readouterr().out
    assert rc == 0
    for text in ("headrace.Loader(batch=100, order='shuffle'), 2 threads", "samples/s", "MB/s",
                 "in flight, high water", "of 4 MiB cap", "RSS, high water", "consumer waited",
                 "workers busy", "budget wait", "verdict", "suggestions:", "  - ",
                 f"plot written to {png}", f"timeline saved to {saved}"):
        assert text in out, out
    with Image.open(png) as im:
        assert im.format == "PNG" and im.size == (1000, 900)
    tl = headrace._engine.timeline.load_timeline(saved)
    assert tl["max_inflight_bytes"] == 4 << 20 and tl["threads"] == 2
    assert tl["samples"][-1]["delivered_samples_total"] > 0


def test_bench_json_and_a_simulated_model_step(store, capsys):
    rc = main(["bench", store, "--seconds", "0.3", "--step-ms", "2", "--order", "sequential",
               "--json"])
    assert rc == 0
    s = json.loads(capsys.readouterr().out)
    assert s["batches"] >= 1 and s["samples"] == s["batches"] * 256  # endless: full batches
    assert s["suggestions"] and s["verdict"].split(":")[0] in ("loader-bound", "model-bound")
    assert 0 <= s["consumer_wait_fraction"] <= 1 and 0 <= s["worker_busy_fraction"] <= 1


def test_bench_an_image_folder_and_an_image_store(photos, tmp_path, capsys):
    rc = main(["bench", str(photos), "--seconds", "0.3", "--batch", "8", "--resize", "32"])
    out = capsys.readouterr().out
    assert rc == 0 and "headrace.image(batch=8, order='shuffle', resize=(32, 32))" in out
    assert "transform/decode" in out
    packed = tmp_path / "photos.hr"
    headrace.pack_dir(photos, out=packed)
    assert main(["bench", str(packed), "--seconds", "0.2", "--resize", "16,24"]) == 0
    assert "headrace.image(batch=64" in capsys.readouterr().out
    assert main(["bench", str(packed), "--seconds", "0.2", "--raw"]) == 0  # bytes, not decoded
    assert "headrace.Loader(batch=256" in capsys.readouterr().out


def test_bench_errors_exit_2_with_one_line(store, tmp_path, capsys):
    assert main(["bench", str(tmp_path / "missing")]) == 2
    assert "no such dataset" in capsys.readouterr().err
    assert main(["bench", store, "--inflight", "1kB", "--seconds", "0.2"]) == 2
    err = capsys.readouterr().err
    assert "raise inflight to at least" in err and "Traceback" not in err
    assert main(["bench", store, "--seconds", "0"]) == 2
    assert main(["bench", store, "--resize", "32", "--seconds", "0.1"]) == 2
    assert "images only" in capsys.readouterr().err
    for bad, says in ((["--inflight", "12zz"], "must be a number of bytes"),
                      (["--resize", "a,b"], "must be SIZE or H,W")):
        with pytest.raises(SystemExit) as e:
            main(["bench", store, *bad])
        assert e.value.code == 2
        assert says in capsys.readouterr().err


def test_bench_console_entry_with_a_progress_bar(store):
    out = subprocess.run([sys.executable, "-m", "headrace", "bench", store, "--seconds", "0.3",
                          "--progress"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "bench:" in out.stderr and "samples/s" in out.stderr  # the tqdm bar and its postfix
    assert "verdict" in out.stdout


@pytest.mark.parametrize(("text", "value"), [("268435456", 268435456), ("256MiB", 256 << 20),
                                             ("512MB", 512_000_000), ("2GiB", 2 << 30),
                                             ("1.5 kb", 1500), ("64k", 64_000)])
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "MiB", "12zz", "-5MB", "1e3"])
def test_parse_size_rejects(text):
    with pytest.raises(headrace.ConfigError, match="256MiB"):
        parse_size(text)


def test_pack_dir_command_then_bench_the_store(photos, tmp_path, capsys):
    out = tmp_path / "packed.hr"
    assert main(["pack-dir", str(photos), str(out), "--progress"]) == 0
    captured = capsys.readouterr()
    assert "packed 24 images into" in captured.out and "4 classes" in captured.out
    assert "dataset hash " in captured.out
    assert "pack_dir" in captured.err  # the progress bar
    assert main(["pack-dir", str(photos), str(out)]) == 2  # exists: refused, one line
    assert "overwrite" in capsys.readouterr().err
    assert main(["pack-dir", str(photos), str(out), "--overwrite", "--no-progress"]) == 0
    assert main(["info", str(out)]) == 0
    assert "records      24" in capsys.readouterr().out
    assert main(["bench", str(out), "--seconds", "0.2", "--batch", "4"]) == 0
