"""pack_webdataset: tar shards written here with tarfile -> one record per sample, field per extension.

Three shards compare record for record with the samples written; keys and extensions split as
WebDataset splits them; missing files follow the policy; brace patterns, S3 shards (moto), local
pools and a Dask cluster give the same store (content hash) as one process.
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import headrace
from headrace import ConfigError, SchemaError
from headrace._pack.inputs import expand_braces
from headrace._pack.parallel import content_hash
from headrace._pack.webdataset import split_name


def _jpeg(seed: int) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (12, 16, 3), dtype=np.uint8)).save(buf, format="JPEG")
    return buf.getvalue()


def _write_tar(path: Path, members: list[tuple[str, bytes]], mode: str = "w") -> None:
    with tarfile.open(path, mode) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _samples(shard: int, n: int) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        k = shard * 1000 + i
        out.append({"key": f"s{k:06d}", "jpg": _jpeg(k), "cls": k % 5,
                    "json": json.dumps({"id": k, "tags": ["a"] * (i % 3)}).encode(),
                    "txt": f"caption {k} ünïcode".encode()})
    return out


def _members(samples: list[dict[str, Any]]) -> list[tuple[str, bytes]]:
    out = []
    for s in samples:
        out += [(f"{s['key']}.jpg", s["jpg"]), (f"{s['key']}.cls", str(s["cls"]).encode()),
                (f"{s['key']}.json", s["json"]), (f"{s['key']}.txt", s["txt"])]
    return out


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    root = tmp_path_factory.mktemp("wds")
    every = []
    for k, n in enumerate((7, 11, 5)):
        samples = _samples(k, n)
        _write_tar(root / f"shard-{k:06d}.tar", _members(samples))
        every += samples
    return root, every


def _records(path: Any) -> list[dict[str, Any]]:
    with headrace.open(path, verify="always") as st:
        got = st.gather(np.arange(len(st)))
    out = []
    for i in range(len(got["key"])):
        out.append({"key": bytes(got["key"][i]).decode(), "jpg": bytes(got["jpg"][i]),
                    "cls": int(got["cls"][i]), "json": bytes(got["json"][i]),
                    "txt": bytes(got["txt"][i])})
    return out


def test_three_shards_pack_record_for_record(shards, tmp_path):
    root, samples = shards
    info = headrace.pack_webdataset(str(root / "shard-{000000..000002}.tar"), tmp_path / "s")
    assert info["samples"] == len(samples) == 23 and info["shards"] == 3
    assert info["fields"]["cls"] == {"dtype": "<i8", "shape": [], "codec": "raw"}
    assert info["fields"]["jpg"]["shape"] is None
    assert _records(tmp_path / "s") == samples
    with headrace.open(tmp_path / "s") as st:
        assert st.attrs["image_field"] == "jpg" and st.attrs["label_field"] == "cls"
    loader = headrace.image(tmp_path / "s", batch=8, float_out=False, layout="NHWC")
    labels, n = [], 0
    with loader:
        for x, y in loader:
            assert np.asarray(x).shape[1:] == (12, 16, 3)
            labels += np.asarray(y).tolist()
            n += len(y)
    assert n == 23 and labels == [s["cls"] for s in samples]


def test_a_folder_a_glob_a_list_and_gzip_shards_pack_the_same(shards, tmp_path):
    root, _samples_written = shards
    headrace.pack_webdataset(root, tmp_path / "dir")
    want = content_hash(tmp_path / "dir")
    headrace.pack_webdataset(str(root / "shard-*.tar"), tmp_path / "glob", batch_mb=0.001)
    headrace.pack_webdataset(sorted(root.glob("*.tar")), tmp_path / "list")
    gz = tmp_path / "gz"
    gz.mkdir()
    for k, n in enumerate((7, 11, 5)):
        _write_tar(gz / f"shard-{k}.tar.gz", _members(_samples(k, n)), mode="w:gz")
    headrace.pack_webdataset(gz, tmp_path / "gzs")
    for name in ("glob", "list", "gzs"):
        assert content_hash(tmp_path / name) == want, name


def test_keys_and_extensions_split_as_webdataset_does(tmp_path):
    assert split_name("dir/abc.seg.png") == ("dir/abc", "seg.png")
    assert split_name("a.b/c.JPG") == ("a.b/c", "jpg")
    assert split_name("noext") is None
    assert expand_braces("x-{08..10}-{a,b}.tar") == ["x-08-a.tar", "x-08-b.tar", "x-09-a.tar",
                                                      "x-09-b.tar", "x-10-a.tar", "x-10-b.tar"]
    assert expand_braces("p{1..3}") == ["p1", "p2", "p3"]
    _write_tar(tmp_path / "t.tar", [
        ("__meta__", b"skipped"), ("README", b"no extension: skipped"),
        ("d/one.seg.png", b"S1"), ("d/one.txt", b"first"),
        ("d/two.seg.png", b"S2"), ("d/two.txt", b"second"),
        ("d/one.seg.png", b"S3"), ("d/one.txt", b"again"),  # not adjacent: a new sample
    ])
    info = headrace.pack_webdataset(tmp_path / "t.tar", tmp_path / "s")
    assert set(info["fields"]) == {"key", "seg_png", "txt"}
    with headrace.open(tmp_path / "s") as st:
        g = st.gather(np.arange(len(st)))
    assert [bytes(k).decode() for k in g["key"].to_list()] == ["d/one", "d/two", "d/one"]
    assert [bytes(v) for v in g["seg_png"].to_list()] == [b"S1", b"S2", b"S3"]
    _write_tar(tmp_path / "dup.tar", [("a.txt", b"1"), ("a.txt", b"2")])
    with pytest.raises(ConfigError, match=r"sample 'a' holds extension 'txt' twice"):
        headrace.pack_webdataset(tmp_path / "dup.tar", tmp_path / "dup")
    (tmp_path / "bad.tar").write_bytes(b"definitely not a tar archive" * 40)
    with pytest.raises(ConfigError, match="not a readable tar"):
        headrace.pack_webdataset(tmp_path / "bad.tar", tmp_path / "bad")
    assert not (tmp_path / "bad").exists() and not (tmp_path / "dup").exists()


def test_missing_files_follow_the_policy_and_fields_select(tmp_path):
    _write_tar(tmp_path / "m.tar", [
        ("a.jpg", b"A"), ("a.cls", b"1"), ("b.jpg", b"B"), ("c.jpg", b"C"), ("c.cls", b" 2\n"),
    ])
    with pytest.raises(SchemaError, match=r"m\.tar: sample 'b' has no \['cls'\].*missing="):
        headrace.pack_webdataset(tmp_path / "m.tar", tmp_path / "e")
    info = headrace.pack_webdataset(tmp_path / "m.tar", tmp_path / "skip", missing="skip")
    assert info["samples"] == 2
    headrace.pack_webdataset(tmp_path / "m.tar", tmp_path / "fill", missing="fill")
    with headrace.open(tmp_path / "fill") as st:
        assert st.gather(np.arange(3))["cls"].tolist() == [1, -1, 2]
    info = headrace.pack_webdataset(tmp_path / "m.tar", tmp_path / "only",
                                    fields={"jpg": "image"})
    assert set(info["fields"]) == {"key", "image"} and info["samples"] == 3
    _write_tar(tmp_path / "x.tar", [("a.jpg", b"A"), ("b.jpg", b"B"), ("b.png", b"P")])
    with pytest.raises(ConfigError, match=r"sample 'b' has extensions \['png'\].*fields="):
        headrace.pack_webdataset(tmp_path / "x.tar", tmp_path / "x")
    _write_tar(tmp_path / "n.tar", [("a.cls", b"seven")])
    with pytest.raises(SchemaError, match="not an integer"):
        headrace.pack_webdataset(tmp_path / "n.tar", tmp_path / "n")
    with pytest.raises(ConfigError, match="matches no WebDataset"):
        headrace.pack_webdataset(str(tmp_path / "none-*.tar"), tmp_path / "n")


def test_local_pool_and_dask_pack_shards_like_one_process(shards, tmp_path):
    import dask
    from distributed import Client, LocalCluster

    root, samples = shards
    headrace.pack_webdataset(root, tmp_path / "one", workers=1)
    headrace.pack_webdataset(root, tmp_path / "pool", workers=2)
    want = content_hash(tmp_path / "one")
    assert content_hash(tmp_path / "pool") == want
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}), LocalCluster(
            processes=True, n_workers=2, threads_per_worker=1, host="127.0.0.1",
            dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as client:
        headrace.pack_webdataset(root, tmp_path / "dask", workers=3,
                                 executor=client.get_executor())
    assert content_hash(tmp_path / "dask") == want
    assert _records(tmp_path / "dask") == samples


def test_shards_on_s3_with_a_brace_pattern(shards, tmp_path):
    from _s3_server import new_bucket, s3_env, shared_server
    from headrace._remote.objstore import ObjectStore, S3Options

    root, samples = shards
    server = shared_server()
    bucket = new_bucket(server)
    client = ObjectStore(bucket, options=S3Options(endpoint=server.endpoint,
                                                   access_key_id="testing",
                                                   secret_access_key="testing"))
    for p in sorted(root.glob("*.tar")):
        client.put(f"wds/{p.name}", p.read_bytes())
    with s3_env(server.endpoint):
        headrace.pack_webdataset(f"s3://{bucket}/wds/shard-{{000000..000002}}.tar",
                                 tmp_path / "s3", workers=1)
        headrace.pack_webdataset(f"s3://{bucket}/wds/", tmp_path / "prefix", workers=2)
    assert _records(tmp_path / "s3") == samples
    assert content_hash(tmp_path / "prefix") == content_hash(tmp_path / "s3")


def test_audio_shards_decode_through_audio_and_each_kind_finds_its_field(tmp_path):
    import soundfile as sf

    from headrace._sources.media import open_media

    rng = np.random.default_rng(5)
    waves = [rng.uniform(-0.5, 0.5, 400).astype(np.float32) for _ in range(3)]
    members = []
    for i, w in enumerate(waves):
        buf = io.BytesIO()
        sf.write(buf, w, 8000, format="WAV", subtype="FLOAT")
        members += [(f"u{i}.wav", buf.getvalue()), (f"u{i}.cls", b"%d" % (2 - i)),
                    (f"u{i}.mp4", b"not decoded here")]
    _write_tar(tmp_path / "a.tar", members)
    headrace.pack_webdataset(tmp_path / "a.tar", tmp_path / "s")
    with headrace.audio(tmp_path / "s", batch=3, samples=400, as_dict=True) as loader:
        (batch,) = list(loader)
    np.testing.assert_array_equal(np.asarray(batch["samples"])[:, 0], np.stack(waves))
    assert np.asarray(batch["labels"]).tolist() == [2, 1, 0]
    for kind, field in (("audio", "wav"), ("video", "mp4")):
        media = open_media(str(tmp_path / "s"), kind=kind)
        try:
            assert media.field == field
        finally:
            media.close()
