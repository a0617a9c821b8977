"""Bad input and surprising no-ops: errors from the hierarchy that name the fix, and no silent work.

Appending ragged nested lists to a fixed-shape field, appending zero records, ``bench --batch 0``,
a compact with nothing to reclaim, a parallel pack from a script without a ``__main__`` guard, and
pack() keywords an S3 pack cannot use.
"""

import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import headrace
from headrace._cli import main as _cli

sys.path.insert(0, os.path.dirname(__file__))


def _writer(path):
    return headrace.create(path, fields={"x": {"dtype": "float32", "shape": [2]}, "b": "bytes",
                                         "y": "int64",
                                         "z": {"dtype": "float32", "shape": [2], "codec": "zstd"}})


def test_records_of_different_shapes_are_a_schema_error(tmp_path):
    with _writer(tmp_path / "s") as w:
        with pytest.raises(headrace.SchemaError, match=r"field 'x'.*different shapes.*\(n, 2\)"):
            w.append({"x": [[1.0, 2.0], [1.0]]})
        with pytest.raises(headrace.SchemaError, match=r"field 'b' is ragged"):
            w.append({"b": [[1, [2]]]})
        w.append({"x": [[1.0, 2.0]]})  # nothing was written by the failed appends
        assert len(w) == 1


def test_appending_zero_records_is_a_no_op(tmp_path):
    path = tmp_path / "s"
    with _writer(path) as w:
        w.append({"x": np.ones((2, 2), np.float32), "y": np.arange(2)})
    commit = headrace.open(path).commit_id
    with headrace.open(path, mode="a") as w:
        for empty in ({"x": np.zeros((0, 2), np.float32)}, {"y": []}, {"y": np.array([], np.int64)},
                      {"b": []}, {"z": np.zeros((0, 2), np.float32)},
                      {"x": np.zeros((0, 2), np.float32), "y": [], "b": []}):
            w.append(empty)
            assert len(w) == 2
        with pytest.raises(headrace.SchemaError, match="field 'y'"):
            w.append({"x": np.zeros((0, 2), np.float32), "y": [1]})  # lengths still checked
    with headrace.open(path) as st:
        assert st.commit_id == commit and len(st) == 2


def test_bench_batch_zero_is_refused(tmp_path, capsys):
    path = tmp_path / "s"
    headrace.pack_arrays(path, x=np.arange(10))
    rc = _cli.main(["bench", str(path), "--batch", "0", "--seconds", "0.1"])
    err = capsys.readouterr().err
    assert rc == 2 and "--batch must be a positive" in err


def test_a_compact_with_nothing_to_reclaim_keeps_the_generation(tmp_path, capsys):
    path = tmp_path / "s"
    headrace.pack_arrays(path, x=np.arange(100), b=[bytes(i % 9) for i in range(100)])
    with headrace.open(path) as st:
        gen, commit, fp = st.generation, st.commit_id, headrace.load(st).source.fingerprint
    with headrace.open(path, mode="a") as w:
        assert w.compact() == (1.0, 1.0)
    assert _cli.main(["compact", str(path)]) == 0
    assert "nothing to reclaim" in capsys.readouterr().out
    with headrace.open(path) as st:
        assert (st.generation, st.commit_id) == (gen, commit)
        assert headrace.load(st).source.fingerprint == fp  # checkpoints still resume
    with headrace.open(path, mode="a") as w:  # with dead bytes it still compacts
        w.delete(0)
        before, after = w.compact()
    assert before < 1.0 and after == 1.0
    with headrace.open(path) as st:
        assert st.generation == gen + 1 and len(st) == 99


def test_parallel_pack_from_a_script_without_a_main_guard(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""\
        import jax  # a runtime that makes fork unsafe: workers start with forkserver
        import numpy as np
        import headrace

        headrace.pack_arrays("out", x=np.zeros((1000, 64), np.uint8), workers=2)
        """))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [os.path.join(os.path.dirname(os.path.dirname(__file__)), "src"),
         os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                         text=True, timeout=240, env=env)
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert "PackWorkerError" in last and 'if __name__ == "__main__":' in last, last
    # Each worker re-running the script refuses before it makes a pool or a staging folder:
    # nothing for the resource tracker to clean up ("leaked semaphore objects"), nothing left.
    assert "a pack started while this worker process was starting" in out.stderr
    assert "resource_tracker" not in out.stderr, out.stderr[-2000:]
    assert sorted(os.listdir(tmp_path)) == ["train.py"]
    assert str(script) in last and "out of memory" not in last
    assert not os.path.exists(tmp_path / "out")


def test_s3_pack_names_the_keywords_it_ignores(tmp_path):
    from _s3_server import new_bucket, s3_env, shared_server

    server = shared_server()
    src = tmp_path / "raw"
    src.mkdir()
    for i in range(3):
        (src / f"{i}.bin").write_bytes(bytes([i]) * 10)
    with s3_env(server.endpoint):
        bucket = new_bucket(server)
        with pytest.warns(UserWarning, match=r"workers= and executor= ignored.*s3:// out"):
            from concurrent.futures import ThreadPoolExecutor
            with ThreadPoolExecutor(1) as ex:
                headrace.pack(str(src), out=f"s3://{bucket}/a/", store=str(tmp_path / "ms"),
                              workers=2, executor=ex)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the defaults say nothing
            headrace.pack(str(src), out=f"s3://{bucket}/b/", store=str(tmp_path / "ms"))
