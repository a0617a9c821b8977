"""The `headrace` command line, run in a subprocess on real small stores."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import headrace
from headrace._cli import main as _cli

N = 40
X = (np.arange(N * 16, dtype=np.int64).reshape(N, 16) % 200).astype(np.uint8)
Y = np.arange(N, dtype=np.int64)


def run(*args, check_rc=None):
    out = subprocess.run([sys.executable, "-m", "headrace", *map(str, args)],
                         capture_output=True, text=True, timeout=120)
    if check_rc is not None:
        assert out.returncode == check_rc, (out.stdout, out.stderr)
    assert "Traceback" not in out.stderr, out.stderr
    return out


def run_here(capsys, *args, check_rc):
    """The same CLI in this process (no interpreter start-up): for the many error cases."""
    rc = _cli.main([str(a) for a in args])
    out = capsys.readouterr()
    assert rc == check_rc, (out.out, out.err)
    return out


@pytest.fixture
def store(tmp_path):
    path = tmp_path / "s"
    headrace.pack_arrays(path, x=X, y=Y, blob=[bytes(i % 5) for i in range(N)],
                         codec={"x": "raw", "y": "zstd"})
    return path


def test_info_prints_the_store_summary(store):
    out = run("info", store, check_rc=0).stdout
    assert f"records      {N}" in out
    assert "generation   0" in out
    assert "utilization  100.0%" in out
    lines = {line.split()[0]: line.split() for line in out.splitlines() if line.strip()}
    assert lines["x"][1:4] == ["uint8", "(16,)", "raw"]
    assert lines["y"][1:4] == ["int64", "()", "zstd"]
    assert lines["blob"][1:4] == ["uint8", "ragged", "raw"]
    summary = json.loads(run("info", "--json", store, check_rc=0).stdout)
    assert summary["records"] == N
    assert {f["name"] for f in summary["fields"]} == {"x", "y", "blob"}
    assert summary["bytes_on_disk"] >= summary["chunk_bytes"] > 0


def test_console_script_is_installed(store):
    script = Path(sys.executable).parent / "headrace"
    out = subprocess.run([str(script), "info", str(store)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and "records" in out.stdout


def _chunk_of(store, field):
    meta = json.loads((store / "meta.json").read_text())
    (chunk,) = [c for c in meta["chunks"] if c["field"] == field]
    return store / "chunks" / f"{chunk['id']}.zr"


def test_verify_ok_then_corrupt_lists_bad_ids(store):
    out = run("verify", store, check_rc=0)
    assert out.stdout.startswith("ok")
    chunk = _chunk_of(store, "x")
    data = bytearray(chunk.read_bytes())
    for rec in (5, 17):
        data[rec * 16 + 3] ^= 0x40  # raw fixed records sit at i * record_bytes
    chunk.write_bytes(bytes(data))
    out = run("verify", store, check_rc=1)
    assert "CORRUPT" in out.stdout
    (line,) = [ln for ln in out.stdout.splitlines() if "field x" in ln]
    assert "5" in line.split(":")[-1] and "17" in line.split(":")[-1]
    assert "field y" not in out.stdout


def test_verify_and_info_on_non_stores_exit_2(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    out = run("verify", tmp_path / "empty", check_rc=2)
    assert "not a headrace store" in out.stderr
    for cmd in ("verify", "info", "compact"):
        out = run_here(capsys, cmd, tmp_path / "empty", check_rc=2)
        assert "not a headrace store" in out.err
        out = run_here(capsys, cmd, tmp_path / "missing", check_rc=2)
        assert "missing" in out.err


def test_verify_of_garbage_meta_is_corrupt(store):
    (store / "meta.json").write_text("{not json")
    out = run("verify", store, check_rc=1)
    assert "meta.json" in out.stdout


def test_info_on_a_store_missing_an_index_file(store, capsys):
    (store / "y.index").unlink()
    out = run("info", store, check_rc=1)  # a damaged store: 1, like verify
    assert "'y'" in out.stderr and "verify" in out.stderr
    out = run_here(capsys, "verify", store, "--max-ids", "3", check_rc=1)
    assert "CORRUPT" in out.out


def test_compact_reports_utilization_before_and_after(store):
    with headrace.open(store, mode="a") as w:
        w.delete(0)
        w.delete(3)
    before = json.loads(run("info", "--json", store, check_rc=0).stdout)
    assert before["utilization"] < 1.0
    out = run("compact", store, check_rc=0).stdout
    assert "utilization" in out and "-> 100.0%" in out
    after = json.loads(run("info", "--json", store, check_rc=0).stdout)
    assert after["utilization"] == 1.0 and after["records"] == N - 2
    assert after["generation"] != before["generation"]
    run("verify", store, check_rc=0)


def test_compact_while_another_writer_holds_the_lock(store):
    with headrace.open(store, mode="a"):
        out = run("compact", store, check_rc=2)
    assert "error" in out.stderr


def test_pack_arrays_from_npy_files(tmp_path):
    np.save(tmp_path / "x.npy", X)
    np.save(tmp_path / "y.npy", Y)
    out = run("pack-arrays", tmp_path / "s", "--field", f"x={tmp_path / 'x.npy'}",
              "--field", f"y={tmp_path / 'y.npy'}", "--codec", "zstd", "--codec", "y=lz4",
              "--chunk-mb", "1", "--progress", check_rc=0)
    assert f"packed {N} records" in out.stdout
    assert "pack s" in out.stderr  # the progress bar, forced on
    with headrace.open(tmp_path / "s") as st:
        assert st.fields["x"].codec == "zstd" and st.fields["y"].codec == "lz4"
        got = st.gather([3, 1])
        np.testing.assert_array_equal(got["x"], X[[3, 1]])
        np.testing.assert_array_equal(got["y"], Y[[3, 1]])


def test_pack_arrays_errors_are_one_line(tmp_path, capsys):
    np.save(tmp_path / "x.npy", X)
    xs = f"x={tmp_path / 'x.npy'}"
    out = run("pack-arrays", tmp_path / "a", "--field", "x", check_rc=2)
    assert "NAME=VALUE" in out.stderr
    out = run_here(capsys, "pack-arrays", tmp_path / "b", "--field", xs, "--codec", "brotli",
                   check_rc=2)
    assert "brotli" in out.err and "zstd" in out.err
    out = run_here(capsys, "pack-arrays", tmp_path / "c", "--field", f"x={tmp_path / 'nope.npy'}",
                   check_rc=2)
    assert "nope.npy" in out.err
    out = run_here(capsys, "pack-arrays", tmp_path / "d", "--field", xs, "--codec", "q=zstd",
                   check_rc=2)
    assert "'q'" in out.err
    np.save(tmp_path / "short.npy", Y[:5])
    out = run_here(capsys, "pack-arrays", tmp_path / "e", "--field", xs, "--field",
                   f"y={tmp_path / 'short.npy'}", check_rc=2)
    assert f"x={N}, y=5" in out.err
    out = run("pack-arrays", tmp_path / "f", check_rc=2)  # argparse: --field is required
    assert "--field" in out.stderr
    assert not any(os.path.exists(tmp_path / d) for d in "abcdef")


def test_usage_errors_exit_2():
    out = run(check_rc=2)
    assert "COMMAND" in out.stderr
    out = run("--version", check_rc=0)
    assert headrace.__version__ in out.stdout


def test_commands_are_registered_from_a_list(monkeypatch, capsys, tmp_path):
    seen = {}

    def configure(p):
        p.add_argument("word")

    def run_cmd(args):
        seen["word"] = args.word
        raise headrace.ConfigError(f"bad word {args.word!r}")

    # Lazily referenced functions ("module:function") are resolved only when invoked.
    lazy = _cli.Command("lazy", "never imported", "no_such_module:configure", "no_such_module:run")
    monkeypatch.setattr(_cli, "COMMANDS",
                        [*_cli.COMMANDS, _cli.Command("echo", "test", configure, run_cmd), lazy])
    assert _cli.main(["echo", "hi"]) == 2
    assert seen == {"word": "hi"}
    assert "headrace echo: error: bad word 'hi'" in capsys.readouterr().err
    assert _cli.main(["info", str(tmp_path / "missing")]) == 2
