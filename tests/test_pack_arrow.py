"""pack_arrow: real pyarrow tables, Parquet files and HF datasets (made here, no network) -> stores.

Every column type maps to the field the module documents, values round-trip exactly, nulls follow
the policy (the error names column and row), empty records stay empty, an Image + ClassLabel
dataset decodes through image() like the original bytes, S3 sources come from the moto server,
and a Dask cluster packs the same store (content hash) as one process.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import headrace
from headrace import ConfigError, SchemaError, StoreExistsError
from headrace._pack.parallel import content_hash


def _records(path: Any) -> dict[str, Any]:
    with headrace.open(path, verify="always") as st:
        got = st.gather(np.arange(len(st)))
        return {k: ([np.asarray(r).tolist() for r in v.to_list()] if hasattr(v, "to_list")
                    else np.asarray(v).tolist()) for k, v in got.items()}


def _png(a: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(a).save(buf, format="PNG")
    return buf.getvalue()


def _table() -> Any:
    return pa.table({
        "i8": pa.array([1, -2, 3], pa.int8()),
        "u64": pa.array([0, 2**63, 5], pa.uint64()),
        "f16": pa.array(np.array([0.5, 1.5, -2], np.float16)),
        "f32": pa.array([1.25, 2.5, 3.75], pa.float32()),
        "f64": [0.1, 0.2, 0.3],
        "flag": [True, False, True],
        "day": pa.array([1, 2, 19000], pa.date32()),
        "ts": pa.array([10, 20, 30], pa.timestamp("us")),
        "vec": pa.array([[1, 2, 3], [4, 5, 6], [7, 8, 9]], pa.list_(pa.float32(), 3)),
        "mat": pa.array([[[1, 2], [3, 4]], [[5, 6], [7, 8]], [[0, 0], [1, 1]]],
                        pa.list_(pa.list_(pa.int16(), 2), 2)),
        "fsb": pa.array([b"ab", b"cd", b"ef"], pa.binary(2)),
        "tokens": pa.array([[1, 2], [3], [4, 5, 6]], pa.list_(pa.int32())),
        "big": pa.array([[1.0], [2.0, 3.0], [4.0]], pa.large_list(pa.float64())),
        "text": ["héllo", "b", "ccc"],
        "ltext": pa.array(["x", "yy", "zzz"], pa.large_string()),
        "blob": [b"\x00\x01", b"\xff", b"abc"],
        "cat": pa.array(["a", "b", "a"]).dictionary_encode(),
        "view": pa.array([[1, 2], [], [3]], pa.list_view(pa.int16())),
        "sview": pa.array(["p", "", "qq"], pa.string_view()),
        "pts": pa.array([[[1, 2, 3]], [[4, 5, 6], [7, 8, 9]], [[0, 0, 0]]],
                        pa.list_(pa.list_(pa.int32(), 3))),
        "tensor": pa.array([{"values": [1, 2, 3, 4], "shape": [2, 2]},
                            {"values": [5, 6, 7], "shape": [1, 3]},
                            {"values": [8], "shape": [1, 1]}],
                           pa.struct([("values", pa.list_(pa.float32())),
                                      ("shape", pa.list_(pa.uint32(), 2))])),
    })


def test_every_column_type_maps_to_its_field_and_round_trips(tmp_path):
    info = headrace.pack_arrow(_table(), tmp_path / "s")
    f = info["fields"]
    assert f["i8"] == {"dtype": "|i1", "shape": [], "codec": "raw"}
    assert f["u64"]["dtype"] == "<u8" and f["f16"]["dtype"] == "<f2"
    assert f["flag"]["dtype"] == "|b1" and f["day"]["dtype"] == "<i4" and f["ts"]["dtype"] == "<i8"
    assert f["vec"]["shape"] == [3] and f["mat"] == {"dtype": "<i2", "shape": [2, 2],
                                                     "codec": "raw"}
    assert f["fsb"] == {"dtype": "|u1", "shape": [2], "codec": "raw"}
    for name in ("tokens", "big", "text", "ltext", "blob", "cat", "view", "sview", "pts",
                 "tensor"):
        assert f[name]["shape"] is None, name
    assert f["pts-shape"] == {"dtype": "<u4", "shape": [2], "codec": "raw"}
    assert info["columns"]["pts"]["kind"] == "tensor"
    r = _records(tmp_path / "s")
    assert r["i8"] == [1, -2, 3] and r["u64"] == [0, 2**63, 5]
    assert r["f16"] == [0.5, 1.5, -2.0] and r["f32"] == [1.25, 2.5, 3.75]
    assert r["f64"] == [0.1, 0.2, 0.3] and r["flag"] == [True, False, True]
    assert r["day"] == [1, 2, 19000] and r["ts"] == [10, 20, 30]
    assert r["vec"] == [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert r["mat"][1] == [[5, 6], [7, 8]]
    assert r["fsb"] == [list(b"ab"), list(b"cd"), list(b"ef")]
    assert r["tokens"] == [[1, 2], [3], [4, 5, 6]] and r["big"] == [[1.0], [2.0, 3.0], [4.0]]
    assert [bytes(x) for x in r["text"]] == ["héllo".encode(), b"b", b"ccc"]
    assert [bytes(x) for x in r["ltext"]] == [b"x", b"yy", b"zzz"]
    assert [bytes(x) for x in r["blob"]] == [b"\x00\x01", b"\xff", b"abc"]
    assert [bytes(x) for x in r["cat"]] == [b"a", b"b", b"a"]
    assert r["view"] == [[1, 2], [], [3]] and [bytes(x) for x in r["sview"]] == [b"p", b"", b"qq"]
    assert r["pts"] == [[1, 2, 3], [4, 5, 6, 7, 8, 9], [0, 0, 0]]
    assert r["pts-shape"] == [[1, 3], [2, 3], [1, 3]]
    assert r["tensor"] == [[1, 2, 3, 4], [5, 6, 7], [8]]
    assert r["tensor-shape"] == [[2, 2], [1, 3], [1, 1]]


def test_parquet_file_folder_glob_and_list_give_the_same_store(tmp_path):
    t = pa.table({"x": np.arange(1000, dtype=np.int64), "s": [str(i) * (i % 4) for i in range(1000)]})
    (tmp_path / "pq").mkdir()
    pq.write_table(t.slice(0, 600), tmp_path / "pq" / "a.parquet", row_group_size=128)
    pq.write_table(t.slice(600), tmp_path / "pq" / "b.parquet", row_group_size=100)
    headrace.pack_arrow(t, tmp_path / "table")
    want = content_hash(tmp_path / "table")
    for i, src in enumerate([tmp_path / "pq", str(tmp_path / "pq" / "*.parquet"),
                             [tmp_path / "pq" / "a.parquet", tmp_path / "pq" / "b.parquet"]]):
        info = headrace.pack_arrow(src, tmp_path / f"s{i}", batch_mb=0.001)
        assert info["samples"] == 1000
        assert content_hash(tmp_path / f"s{i}") == want
    one = headrace.pack_arrow(tmp_path / "pq" / "b.parquet", tmp_path / "one")
    assert one["samples"] == 400 and _records(tmp_path / "one")["x"] == list(range(600, 1000))


def test_nulls_error_by_default_naming_column_and_row_then_skip_and_fill(tmp_path):
    t = pa.table({"x": pa.array([1, 2, 3, 4, 5, 6], pa.int32()),
                  "y": [[1], [2], [3, None], [4], [5], [6]],
                  "s": ["a", "b", "c", "d", None, "f"]})
    pq.write_table(t, tmp_path / "n.parquet", row_group_size=2)  # the nulls sit in groups 2 and 3
    with pytest.raises(SchemaError, match=r"column 'y' row 2 .*n\.parquet.*nulls='skip'"):
        headrace.pack_arrow(tmp_path / "n.parquet", tmp_path / "err")
    assert not (tmp_path / "err").exists()
    with pytest.raises(SchemaError, match="column 's' row 4"):
        headrace.pack_arrow(tmp_path / "n.parquet", tmp_path / "err", columns=["x", "s"])
    info = headrace.pack_arrow(tmp_path / "n.parquet", tmp_path / "skip", nulls="skip")
    assert info["samples"] == 4 and info["skipped_rows"] == 2
    assert _records(tmp_path / "skip")["x"] == [1, 2, 4, 6]
    headrace.pack_arrow(tmp_path / "n.parquet", tmp_path / "fill", nulls="fill")
    r = _records(tmp_path / "fill")
    assert r["y"][2] == [3, 0] and bytes(r["s"][4]) == b"" and r["x"] == [1, 2, 3, 4, 5, 6]
    with pytest.raises(ConfigError, match="nulls="):
        headrace.pack_arrow(t, tmp_path / "bad", nulls="drop")


def test_a_null_fixed_size_list_fills_with_zeros(tmp_path):
    t = pa.table({"v": pa.array([[1, 2], None], pa.list_(pa.float32(), 2)),
                  "f": pa.array([None, 1.5], pa.float64())})
    headrace.pack_arrow(t, tmp_path / "s", nulls="fill")
    assert _records(tmp_path / "s") == {"v": [[1, 2], [0, 0]], "f": [0.0, 1.5]}


def test_empty_records_and_an_empty_table(tmp_path):
    t = pa.table({"s": ["", "a", ""], "b": [b"", b"", b"z"], "l": [[], [1], []]})
    headrace.pack_arrow(t, tmp_path / "s")
    r = _records(tmp_path / "s")
    assert [bytes(x) for x in r["s"]] == [b"", b"a", b""]
    assert [bytes(x) for x in r["b"]] == [b"", b"", b"z"] and r["l"] == [[], [1], []]
    info = headrace.pack_arrow(t.slice(0, 0), tmp_path / "empty")
    assert info["samples"] == 0
    with headrace.open(tmp_path / "empty") as st:
        assert len(st) == 0 and set(st.fields) == {"s", "b", "l"}


def test_rejects_what_has_no_field_layout_with_the_fix(tmp_path):
    cases = {
        "nested": pa.table({"c": [[[1], [2, 3]]]}),
        "struct": pa.table({"c": [{"a": 1, "b": "x"}]}),
        "map": pa.table({"c": pa.array([[("k", 1)]], pa.map_(pa.string(), pa.int32()))}),
        "decimal": pa.table({"c": pa.array([1], pa.decimal128(5, 2))}),
        "null": pa.table({"c": pa.nulls(2)}),
        "strings": pa.table({"c": [["a", "b"]]}),
    }
    for what, t in cases.items():
        with pytest.raises(SchemaError, match=r"column 'c'.*columns=") as e:
            headrace.pack_arrow(t, tmp_path / what)
        assert "Arrow type" in str(e.value), what
        assert not (tmp_path / what).exists()
    t = pa.table({"my col": [1], "ok": [2]})
    with pytest.raises(ConfigError, match=r"columns=\{'my col': 'my_col'"):
        headrace.pack_arrow(t, tmp_path / "x")
    info = headrace.pack_arrow(t, tmp_path / "x", columns={"my col": "my_col"})
    assert list(info["fields"]) == ["my_col"]
    with pytest.raises(ConfigError, match=r"unknown columns \['nope'\]"):
        headrace.pack_arrow(t, tmp_path / "y", columns=["nope"])
    with pytest.raises(ConfigError, match="cannot read a dict"):
        headrace.pack_arrow({"a": [1]}, tmp_path / "y")
    with pytest.raises(ConfigError, match="no such Parquet"):
        headrace.pack_arrow(tmp_path / "missing.parquet", tmp_path / "y")
    (tmp_path / "junk.parquet").write_bytes(b"not parquet")
    with pytest.raises(ConfigError, match="not a readable Parquet"):
        headrace.pack_arrow(tmp_path / "junk.parquet", tmp_path / "y")


def test_parquet_files_with_different_schemas_are_refused(tmp_path):
    pq.write_table(pa.table({"x": [1, 2]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"x": [1.5]}), tmp_path / "b.parquet")
    with pytest.raises(ConfigError, match=r"b\.parquet: column 'x' is double.*same columns"):
        headrace.pack_arrow(tmp_path, tmp_path / "s")


def test_overwrite_replaces_only_a_store(tmp_path):
    t = pa.table({"x": [1, 2]})
    headrace.pack_arrow(t, tmp_path / "s")
    with pytest.raises(StoreExistsError, match="overwrite=True"):
        headrace.pack_arrow(t, tmp_path / "s")
    headrace.pack_arrow(pa.table({"x": [7]}), tmp_path / "s", overwrite=True)
    assert _records(tmp_path / "s") == {"x": [7]}
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "keep.txt").write_text("mine")
    with pytest.raises(StoreExistsError, match="not a headrace store"):
        headrace.pack_arrow(t, tmp_path / "d", overwrite=True)
    assert (tmp_path / "d" / "keep.txt").exists()
    assert [p for p in os.listdir(tmp_path) if p.startswith(".")] == []


# -- Hugging Face datasets ---------------------------------------------------------------------------


def _image_dataset(n: int = 12) -> tuple[Any, list[np.ndarray], list[int]]:
    rng = np.random.default_rng(3)
    arrays = [rng.integers(0, 256, (12, 16, 3), dtype=np.uint8) for _ in range(n)]
    labels = [i % 3 for i in range(n)]
    feats = datasets.Features({"img": datasets.Image(), "fine": datasets.ClassLabel(
        names=["cat", "dog", "emu"]), "caption": datasets.Value("string")})
    ds = datasets.Dataset.from_dict(
        {"img": [{"bytes": _png(a), "path": None} for a in arrays], "fine": labels,
         "caption": [f"picture {i}" for i in range(n)]}, features=feats)
    return ds, arrays, labels


def test_image_and_classlabel_dataset_reads_through_image_like_the_original_bytes(tmp_path):
    from PIL import Image

    ds, arrays, labels = _image_dataset()
    info = headrace.pack_arrow(ds, tmp_path / "s")
    assert info["classes"] == ["cat", "dog", "emu"] and info["samples"] == len(arrays)
    assert info["columns"]["img"]["feature"] == "Image"
    with headrace.open(tmp_path / "s") as st:
        stored = [bytes(st.record(i, "img")) for i in range(len(st))]
        assert st.attrs["image_field"] == "img" and st.attrs["label_field"] == "fine"
    originals = [ds.data.table.column("img")[i]["bytes"].as_py() for i in range(len(arrays))]
    assert stored == originals
    loader = headrace.image(tmp_path / "s", batch=5, float_out=False, layout="NHWC")
    assert loader.classes == ["cat", "dog", "emu"]
    got_x, got_y = [], []
    with loader:
        for x, y in loader:
            got_x.extend(np.asarray(x))
            got_y.extend(np.asarray(y).tolist())
    decoded = [np.asarray(Image.open(io.BytesIO(b)).convert("RGB")) for b in originals]
    assert got_y == labels
    assert len(got_x) == len(decoded)
    for a, b in zip(got_x, decoded, strict=True):
        np.testing.assert_array_equal(a, b)


def test_audio_column_decodes_through_audio(tmp_path):
    import soundfile as sf
    rng = np.random.default_rng(0)
    waves = [rng.uniform(-0.5, 0.5, 800).astype(np.float32) for _ in range(4)]
    blobs = []
    for w in waves:
        buf = io.BytesIO()
        sf.write(buf, w, 8000, format="WAV", subtype="FLOAT")
        blobs.append(buf.getvalue())
    t = pa.table({"speech": pa.array([{"bytes": b, "path": None} for b in blobs],
                                     datasets.Audio().pa_type),
                  "spk": [0, 1, 1, 0]})
    ds = datasets.Dataset(t).cast(datasets.Features({
        "speech": datasets.Audio(decode=False), "spk": datasets.ClassLabel(names=["a", "b"])}))
    headrace.pack_arrow(ds, tmp_path / "s")
    loader = headrace.audio(tmp_path / "s", batch=4, samples=800, as_dict=True)
    with loader:
        (batch,) = list(loader)
    np.testing.assert_array_equal(np.asarray(batch["samples"])[:, 0], np.stack(waves))
    assert np.asarray(batch["labels"]).tolist() == [0, 1, 1, 0]


def test_dataset_dict_needs_a_split_and_iterable_datasets_are_refused(tmp_path):
    ds, _, _ = _image_dataset(4)
    dd = datasets.DatasetDict(train=ds, test=ds.select(range(2)))
    with pytest.raises(ConfigError, match=r"splits \['train', 'test'\].*split="):
        headrace.pack_arrow(dd, tmp_path / "s")
    info = headrace.pack_arrow(dd, tmp_path / "s", split="test", columns=["fine", "caption"])
    assert info["samples"] == 2 and list(info["fields"]) == ["fine", "caption"]
    with pytest.raises(ConfigError, match="streaming"):
        headrace.pack_arrow(ds.to_iterable_dataset(), tmp_path / "it")


def test_hf_array_features_and_parquet_written_by_datasets(tmp_path):
    feats = datasets.Features({"a": datasets.Array2D((2, 3), "float32"),
                               "d": datasets.Array2D((None, 2), "int32"),
                               "seq": datasets.List(datasets.Value("int64")),
                               "lab": datasets.ClassLabel(names=["n", "p"])})
    ds = datasets.Dataset.from_dict({
        "a": [np.full((2, 3), i, np.float32) for i in range(3)],
        "d": [np.arange(2 * (i + 1), dtype=np.int32).reshape(-1, 2) for i in range(3)],
        "seq": [[1], [], [2, 3]], "lab": [1, 0, 1]}, features=feats)
    info = headrace.pack_arrow(ds, tmp_path / "ds")
    assert info["fields"]["a"]["shape"] == [2, 3] and info["fields"]["d-shape"]["shape"] == [2]
    r = _records(tmp_path / "ds")
    assert r["a"][2] == np.full((2, 3), 2).tolist() and r["d-shape"] == [[1, 2], [2, 2], [3, 2]]
    assert r["d"][1] == [0, 1, 2, 3] and r["seq"] == [[1], [], [2, 3]]
    ds.to_parquet(str(tmp_path / "hf.parquet"))  # keeps the features in the schema metadata
    pinfo = headrace.pack_arrow(tmp_path / "hf.parquet", tmp_path / "pq")
    assert pinfo["classes"] == ["n", "p"]
    assert content_hash(tmp_path / "pq") == content_hash(tmp_path / "ds")


def test_a_memory_mapped_dataset_packs_in_parallel_like_one_process(tmp_path):
    ds = datasets.Dataset.from_dict({"x": np.arange(3000), "t": [str(i) for i in range(3000)]})
    ds.save_to_disk(str(tmp_path / "saved"), max_shard_size="20KB")
    mm = datasets.load_from_disk(str(tmp_path / "saved"))
    headrace.pack_arrow(mm, tmp_path / "one", workers=1)
    headrace.pack_arrow(mm, tmp_path / "two", workers=2, batch_mb=0.01)
    assert content_hash(tmp_path / "one") == content_hash(tmp_path / "two")
    assert _records(tmp_path / "two")["x"] == list(range(3000))


# -- parallel, S3, memory ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def parquet_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pq")
    rng = np.random.default_rng(1)
    for k in range(3):
        n = 400 + 50 * k
        t = pa.table({"x": rng.normal(size=(n,)).astype(np.float32),
                      "v": pa.array(list(rng.integers(0, 9, (n, 4))), pa.list_(pa.int64(), 4)),
                      "tok": [list(range(i % 7)) for i in range(n)],
                      "s": [f"row {k}-{i}" for i in range(n)]})
        pq.write_table(t, root / f"part-{k}.parquet", row_group_size=97)
    return root


def test_local_process_pool_packs_row_groups_like_one_process(parquet_dir, tmp_path):
    headrace.pack_arrow(parquet_dir, tmp_path / "one", workers=1)
    headrace.pack_arrow(parquet_dir, tmp_path / "many", workers=2, codec={"s": "zstd"})
    headrace.pack_arrow(parquet_dir, tmp_path / "many2", workers=2)
    assert content_hash(tmp_path / "one") == content_hash(tmp_path / "many2")
    assert _records(tmp_path / "one") == _records(tmp_path / "many")


def test_dask_cluster_packs_the_same_store_hash_as_one_process(parquet_dir, tmp_path):
    import dask
    from distributed import Client, LocalCluster

    headrace.pack_arrow(parquet_dir, tmp_path / "one", workers=1)
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}), LocalCluster(
            processes=True, n_workers=2, threads_per_worker=1, host="127.0.0.1",
            dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as client:
        info = headrace.pack_arrow(parquet_dir, tmp_path / "dask", workers=5,
                                   executor=client.get_executor())
    assert info["samples"] == 400 + 450 + 500
    assert content_hash(tmp_path / "dask") == content_hash(tmp_path / "one")
    headrace.verify(tmp_path / "dask")


def test_parquet_on_s3_packs_like_the_local_files(parquet_dir, tmp_path):
    from _s3_server import new_bucket, s3_env, shared_server
    from headrace._remote.objstore import ObjectStore, S3Options

    server = shared_server()
    bucket = new_bucket(server)
    client = ObjectStore(bucket, options=S3Options(endpoint=server.endpoint,
                                                   access_key_id="testing",
                                                   secret_access_key="testing"))
    for p in sorted(parquet_dir.glob("*.parquet")):
        client.put(f"data/{p.name}", p.read_bytes())
    client.put("data/README.md", b"not parquet")
    headrace.pack_arrow(parquet_dir, tmp_path / "local", workers=1)
    want = content_hash(tmp_path / "local")
    with s3_env(server.endpoint):
        a = headrace.pack_arrow(f"s3://{bucket}/data/", tmp_path / "prefix", workers=1)
        headrace.pack_arrow(f"s3://{bucket}/data/part-*.parquet", tmp_path / "glob", workers=2)
        headrace.pack_arrow(f"s3://{bucket}/data/part-{{0..2}}.parquet", tmp_path / "brace",
                            workers=1, batch_mb=0.001)
        with pytest.raises(ConfigError, match="matches no Parquet"):
            headrace.pack_arrow(f"s3://{bucket}/data/*.pq", tmp_path / "none")
    assert a["source"].startswith(f"s3://{bucket}/data/part-0.parquet")
    for name in ("prefix", "glob", "brace"):
        assert content_hash(tmp_path / name) == want, name


def test_packing_a_parquet_file_holds_one_row_group_not_the_file(tmp_path):
    # 8 row groups of ~6 MB each (48 MB of values); the child measures its own peak RSS.
    path = tmp_path / "big.parquet"
    rng = np.random.default_rng(0)
    with pq.ParquetWriter(path, pa.schema([("v", pa.list_(pa.float32(), 1536))]),
                          compression="none") as w:
        for _ in range(8):
            vals = rng.random((1000, 1536), dtype=np.float32)
            w.write_table(pa.table({"v": pa.FixedSizeListArray.from_arrays(
                vals.reshape(-1), 1536)}))
    code = textwrap.dedent(f"""
        import resource, headrace, pyarrow.parquet
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        info = headrace.pack_arrow({str(path)!r}, {str(tmp_path / 's')!r}, batch_mb=4, workers=1)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(info["samples"], (peak - base) // 1024)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         check=True).stdout.split()
    samples, grew_mb = int(out[0]), int(out[1])
    assert samples == 8000
    assert grew_mb < 40, f"packing a 48 MB file grew the peak RSS by {grew_mb} MB"


def test_the_packing_guide_demo_packs_a_generated_image_dataset_and_trains_on_it(tmp_path):
    import re

    text = (Path(__file__).resolve().parent.parent / "docs" / "packing.md").read_text()
    section = text[text.index("## From Hugging Face datasets"):]
    (block,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)[:1]
    out = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True,
                         cwd=tmp_path, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 0, out.stderr
    assert "64 ['dark', 'bright']" in out.stdout
    assert re.search(r"accuracy (0\.9\d|1\.00)", out.stdout), out.stdout
