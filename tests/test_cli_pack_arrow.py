"""``headrace pack-arrow`` and ``headrace pack-webdataset``: real files in, a store out, bars on stderr."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import headrace
from headrace._cli import main as _cli


def _cli_proc(*args: object) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run([sys.executable, "-m", "headrace", *map(str, args)],
                          capture_output=True, text=True, timeout=120, env=env)


def test_pack_arrow_packs_parquet_files_with_a_progress_bar(tmp_path):
    t = pa.table({"x": np.arange(500, dtype=np.int32), "s": [f"r{i}" for i in range(500)]})
    pq.write_table(t.slice(0, 300), tmp_path / "a.parquet", row_group_size=64)
    pq.write_table(t.slice(300), tmp_path / "b.parquet", row_group_size=64)
    out = _cli_proc("pack-arrow", tmp_path / "a.parquet", tmp_path / "b.parquet",
                    tmp_path / "s", "--codec", "s=zstd", "--progress", "--workers", "1")
    assert out.returncode == 0, out.stderr
    assert "packed 500 rows" in out.stdout and "fields x, s" in out.stdout
    assert "pack s" in out.stderr and "100%" in out.stderr  # the tqdm bar
    with headrace.open(tmp_path / "s") as st:
        assert st.fields["s"].codec == "zstd" and st.fields["x"].codec == "raw"
        assert st.gather(np.arange(500))["x"].tolist() == list(range(500))


def test_pack_arrow_reads_a_saved_hf_dataset_and_reports_errors_in_one_line(tmp_path, capsys):
    ds = datasets.Dataset.from_dict({"v": [1, None, 3], "lab": [0, 1, 0]},
                                    features=datasets.Features({
                                        "v": datasets.Value("int64"),
                                        "lab": datasets.ClassLabel(names=["a", "b"])}))
    ds.save_to_disk(str(tmp_path / "saved"))
    rc = _cli.main(["pack-arrow", str(tmp_path / "saved"), str(tmp_path / "e")])
    err = capsys.readouterr().err
    assert rc == 2 and "column 'v' row 1" in err and "Traceback" not in err
    rc = _cli.main(["pack-arrow", str(tmp_path / "saved"), str(tmp_path / "s"), "--nulls",
                    "skip", "--column", "v=value", "--column", "lab", "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0 and "packed 2 rows" in out and "skipped 1 rows" in out
    assert "classes ['a', 'b']" in out
    rc = _cli.main(["pack-arrow", str(tmp_path / "saved")])
    assert rc == 2 and "then OUT" in capsys.readouterr().err
    rc = _cli.main(["pack-arrow", str(tmp_path / "saved"), str(tmp_path / "x"),
                    "--codec", "zstd", "--codec", "v=lz4"])
    assert rc == 2 and "not both" in capsys.readouterr().err


def test_pack_webdataset_packs_a_brace_pattern_of_shards(tmp_path):
    for k in range(3):
        with tarfile.open(tmp_path / f"shard-{k:04d}.tar", "w") as tar:
            for i in range(4):
                for ext, data in (("png", b"P%d" % i), ("cls", b"%d" % (i % 2))):
                    info = tarfile.TarInfo(f"k{k}-{i}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    out = _cli_proc("pack-webdataset", tmp_path / "shard-{0000..0002}.tar", tmp_path / "s",
                    "--progress")
    assert out.returncode == 0, out.stderr
    assert "packed 12 samples from 3 shards" in out.stdout and "100%" in out.stderr
    with headrace.open(tmp_path / "s") as st:
        g = st.gather(np.arange(12))
        assert g["cls"].tolist() == [0, 1, 0, 1] * 3
        assert bytes(g["key"][5]) == b"k1-1"
    out = _cli_proc("pack-webdataset", tmp_path / "shard-0000.tar", tmp_path / "only",
                    "--field", "cls=label")
    assert out.returncode == 0 and "fields key, label" in out.stdout
