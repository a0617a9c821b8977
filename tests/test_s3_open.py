"""headrace.open("s3://...") (read-only, cached) and mx8 packs on S3, against the loopback moto server."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import mx8
import numpy as np
import pytest

import headrace
from _images import imagefolder
from _s3_server import new_bucket, s3_env, shared_server
from headrace import ConfigError, LinkError, NotAStoreError
from headrace._remote.objstore import ObjectStore, S3Options
from headrace._remote.store import RemoteStore
from headrace._sources.images import Mx8PackImages
from headrace._sources.mx8_s3 import S3Mx8Pack

pytestmark = pytest.mark.timeout(180)

N = 500
X = np.arange(N * 6, dtype=np.int32).reshape(N, 6)
ROWS = [f'{{"id": {i}, "label": "class_{i % 9}", "split": "train"}}'.encode() for i in range(N)]


@pytest.fixture(scope="module")
def server():
    return shared_server()


@pytest.fixture(scope="module")
def env(server):
    with s3_env(server.endpoint):
        yield


def _upload(client: ObjectStore, root: Path, prefix: str) -> None:
    rels = [str(p.relative_to(root)).replace(os.sep, "/") for p in root.rglob("*") if p.is_file()]
    for rel in sorted(rels, key=lambda r: r == "meta.json"):  # meta.json last: the commit point
        if rel != ".lock":
            client.put(f"{prefix}/{rel}", (root / rel).read_bytes())


@pytest.fixture(scope="module")
def s3_store(server, env, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("s3open")
    local = tmp / "local"
    with headrace.create(local, fields={"x": {"dtype": "int32", "shape": [6], "codec": "lz4"},
                                        "meta": {"dtype": "bytes", "codec": "zstd_dict"}},
                         chunk_mb=0.004) as w:
        w.append({"x": X, "meta": ROWS})
    bucket = new_bucket(server, "open")
    client = ObjectStore(bucket, options=S3Options())
    _upload(client, local, "store")
    return {"bucket": bucket, "url": f"s3://{bucket}/store/", "local": local, "tmp": tmp}


def test_open_reads_a_store_on_s3_like_the_local_one(s3_store, tmp_path):
    ids = np.random.default_rng(1).permutation(N)[:200]
    with headrace.open(s3_store["url"], cache_dir=tmp_path / "c") as st:
        assert isinstance(st, RemoteStore) and len(st) == N
        assert st.fields == headrace.open(s3_store["local"]).fields
        got = st.gather(ids)
        np.testing.assert_array_equal(got["x"], X[ids])
        assert [bytes(r) for r in got["meta"].to_list()] == [ROWS[i] for i in ids]
        assert st.requests > 0
    # through the cache: a second reader of the same ranges sends no range request
    with headrace.open(s3_store["url"], cache_dir=tmp_path / "c") as again:
        np.testing.assert_array_equal(again.gather(ids)["x"], X[ids])
        assert again.requests == 0
    # a loader source like any other (epochs, shuffle, resume)
    loader = headrace.load(headrace.open(s3_store["url"], cache_dir=False), batch=64,
                           shuffle=True, seed=2)
    seen = np.concatenate([b["x"][:, 0] // 6 for b in loader])
    assert sorted(seen.tolist()) == list(range(N))


def test_open_on_s3_is_read_only_and_names_what_is_missing(s3_store, tmp_path):
    with pytest.raises(ConfigError, match="opens read-only"):
        headrace.open(s3_store["url"], mode="a")
    with pytest.raises(NotAStoreError, match=r"no meta\.json"):
        headrace.open(f"s3://{s3_store['bucket']}/nothing/", cache_dir=False)
    with pytest.raises(ConfigError, match="apply to s3:// stores"):
        headrace.open(s3_store["local"], cache_dir=tmp_path)


@pytest.fixture(scope="module")
def packs(server, env, tmp_path_factory):
    """One mx8 1.0.7 pack_dir pack, uploaded twice: as it is (local shard paths, found again
    under shards/) and with its manifest rewritten to s3:// shard URLs, as mx8.pack writes."""
    tmp = tmp_path_factory.mktemp("mx8s3")
    tree = tmp / "tree"
    imagefolder(tree, {"ant": 4, "bee": 3, "cow": 5}, h=24, w=30)
    pack = tmp / "pack"
    mx8.pack_dir(str(tree), out=str(pack), shard_mb=1, label_mode="imagefolder")
    bucket = new_bucket(server, "mx8")
    client = ObjectStore(bucket, options=S3Options())
    _upload(client, pack, "uploaded")
    _upload(client, pack, "native")
    text = (pack / "_mx8" / "manifest.tsv").read_text()
    shard_dir = str(pack / "shards")
    client.put("native/_mx8/manifest.tsv",
               text.replace(shard_dir, f"s3://{bucket}/native/shards").encode())
    return {"local": str(pack), "bucket": bucket}


@pytest.mark.parametrize("prefix", ["uploaded", "native"])
def test_mx8_pack_on_s3_loads_like_the_local_pack(packs, prefix, tmp_path):
    url = f"s3://{packs['bucket']}/{prefix}/"
    local = headrace.load(packs["local"], batch=5, shuffle=True, seed=4)
    remote = headrace.load(url, batch=5, shuffle=True, seed=4, cache_dir=str(tmp_path / "c"))
    assert isinstance(remote.source, S3Mx8Pack)
    n = 0
    for a, b in zip(local, remote, strict=True):
        assert a["image"].to_list().__len__() == len(b["image"])
        for x, y in zip(a["image"].to_list(), b["image"].to_list(), strict=True):
            assert bytes(x) == bytes(y)
        np.testing.assert_array_equal(a["label"], b["label"])
        n += len(b["label"])
    assert n == 12
    # decoded images as well, and the classes from labels.tsv
    kw = {"batch": 4, "resize": (12, 16), "float_out": False, "shuffle": True, "seed": 1}
    li, ri = headrace.image(packs["local"], **kw), headrace.image(url, **kw)
    assert ri.classes == li.classes == ["ant", "bee", "cow"]
    for (xa, ya), (xb, yb) in zip(li, ri, strict=True):
        np.testing.assert_array_equal(np.asarray(xa), np.asarray(xb))
        np.testing.assert_array_equal(np.asarray(ya), np.asarray(yb))
    # mx8's manifest hash is the fingerprint: the uploaded copy shares the local pack's, so one
    # checkpoint serves both (the rewritten manifest is another manifest)
    src = remote.source
    same = src.fingerprint == Mx8PackImages(packs["local"]).fingerprint
    assert same == (prefix == "uploaded")
    again = pickle.loads(pickle.dumps(src))
    assert bytes(again.payloads(np.array([3]))[0]) == bytes(src.payloads(np.array([3]))[0])


def test_a_pinned_s3_pack_must_match_its_manifest_hash(packs):
    url = f"s3://{packs['bucket']}/uploaded/"
    good = Mx8PackImages(packs["local"]).manifest_hash
    assert len(headrace.load(f"{url}@sha256:{good}", batch=4).source) == 12
    with pytest.raises(LinkError, match="the pack changed since the link was pinned"):
        headrace.load(f"{url}@sha256:{'0' * 64}", batch=4)


def test_a_checkpoint_of_the_local_pack_resumes_on_its_s3_copy(packs):
    url = f"s3://{packs['bucket']}/uploaded/"
    full = [b["label"].copy() for b in headrace.load(packs["local"], batch=3, shuffle=True,
                                                      seed=6)]
    local = headrace.load(packs["local"], batch=3, shuffle=True, seed=6)
    it = iter(local)
    head = [next(it)["label"].copy() for _ in range(2)]
    token = local.checkpoint()
    local.close()
    rest = [b["label"].copy() for b in headrace.load(url, batch=3, shuffle=True, seed=6,
                                                      resume=token)]
    assert len(head + rest) == len(full)
    for got, want in zip(head + rest, full, strict=True):
        np.testing.assert_array_equal(got, want)


def test_pack_to_s3_with_zstd_dict_ships_the_dictionary(server, env, tmp_path):
    src = tmp_path / "rows"
    src.mkdir()
    for i, r in enumerate(ROWS[:200]):
        (src / f"{i:04d}.json").write_bytes(r)
    bucket = new_bucket(server, "zd")
    headrace.pack(str(src), out=f"s3://{bucket}/zd/", codec="zstd_dict", progress=False,
                  store=str(tmp_path / "ms"))
    with headrace.open(f"s3://{bucket}/zd/", cache_dir=False) as st:
        assert st.fields["bytes"].codec == "zstd_dict"
        got = st.gather(np.arange(len(st)))["bytes"].to_list()
    assert sorted(bytes(r) for r in got) == sorted(ROWS[:200])
