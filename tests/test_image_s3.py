"""headrace.image over S3 (loopback moto): a packed store read by byte ranges, a raw prefix of image
files, links with @refresh / @sha256; batches equal the local store's for the same data and seed."""

from __future__ import annotations

import os

import numpy as np
import pytest

import headrace
from _images import encode, gradient, imagefolder
from _s3_server import new_bucket, s3_env, shared_server
from headrace import ConfigError, LinkError
from headrace._remote.objstore import ObjectStore, S3Options

CLASSES = {"cat": 5, "dog": 4, "eel": 3}
KW = {"batch": 5, "shuffle": True, "seed": 3, "resize": (20, 24), "flip_p": 0.5,
      "jitter_brightness": 0.3, "float_out": False}


@pytest.fixture(scope="module")
def server():
    return shared_server()


@pytest.fixture(scope="module")
def env(server):
    with s3_env(server.endpoint):
        yield


@pytest.fixture(scope="module")
def data(server, env, tmp_path_factory):
    """An image tree, its pack_dir store (local and uploaded to S3), the raw tree on S3 and a
    headrace.pack store of it on S3."""
    tmp = tmp_path_factory.mktemp("imgs3")
    tree = tmp / "tree"
    paths = imagefolder(tree, CLASSES, h=30, w=40)
    (tree / "dog" / "x.png").write_bytes(encode(gradient(30, 40, phase=7), "PNG"))
    local = tmp / "store"
    headrace.pack_dir(str(tree), out=str(local), shard_mb=0.02, progress=False)
    bucket = new_bucket(server, "img")
    client = ObjectStore(bucket, options=S3Options())
    rels = []
    for dirpath, _dirs, names in os.walk(local):
        for name in names:
            rels.append(os.path.relpath(os.path.join(dirpath, name), local).replace(os.sep, "/"))
    for rel in sorted(rels, key=lambda r: r == "meta.json"):  # meta.json last: the commit point
        if rel != ".lock":
            client.put(f"packdir/{rel}", (local / rel).read_bytes())
    for dirpath, _dirs, names in os.walk(tree):
        for name in names:
            rel = os.path.relpath(os.path.join(dirpath, name), tree).replace(os.sep, "/")
            client.put(f"raw/{rel}", (tree / rel).read_bytes())
    client.put("raw/README.txt", b"not an image: skipped, as in a local folder")
    client.put("raw/.hidden.jpg", b"hidden: never listed")
    ms = str(tmp / "manifests")
    headrace.pack(str(tree), out=f"s3://{bucket}/packed/", store=ms, chunk_mb=0.02,
                  progress=False)
    return {"tree": tree, "paths": paths, "local": str(local), "bucket": bucket,
            "client": client, "ms": ms}


def _batches(loader):
    out = []
    with loader:
        for images, labels in loader:
            out.append((images.copy(), labels.copy(), loader.last_ids.copy()))
    return out


def _same(a, b):
    assert len(a) == len(b) and len(a) >= 1
    for (xa, la, ia), (xb, lb, ib) in zip(a, b, strict=True):
        np.testing.assert_array_equal(ia, ib)
        np.testing.assert_array_equal(la, lb)
        np.testing.assert_array_equal(xa, xb)


@pytest.fixture(scope="module")
def reference(data):
    return _batches(headrace.image(data["local"], **KW))


@pytest.mark.parametrize("prefix", ["packdir", "raw", "packed"])
def test_s3_batches_equal_the_local_store(data, reference, prefix):
    url = f"s3://{data['bucket']}/{prefix}/"
    ld = headrace.image(url, store=data["ms"], **KW)
    assert ld.classes == ["cat", "dog", "eel"]
    assert len(ld.records) == sum(CLASSES.values()) + 1
    _same(_batches(ld), reference)


def test_store_on_s3_is_read_by_byte_ranges(data):
    url = f"s3://{data['bucket']}/packdir/"
    with headrace.image(url, store=data["ms"], batch=13, resize=(8, 8)) as ld:
        remote = ld.records.store
        assert type(remote).__name__ == "RemoteStore"
        next(ld)
        # 13 sequential images live in a few 20 KB chunks: a handful of coalesced range GETs
        assert 1 <= remote.requests <= 6
        assert ld.records.path(3) == data["paths"][3]


def test_links_refresh_and_sha256(data, reference):
    base = f"s3://{data['bucket']}/raw/"
    h = headrace.resolve(base, store=data["ms"])
    _same(_batches(headrace.image(f"{base}@sha256:{h}", store=data["ms"], **KW)), reference)
    _same(_batches(headrace.image(f"{base}@refresh", store=data["ms"], **KW)), reference)
    with pytest.raises(LinkError):
        headrace.image(f"{base}@sha256:{'0' * 64}", store=data["ms"], **KW)
    store_link = f"s3://{data['bucket']}/packdir"
    hs = headrace.resolve(store_link, store=data["ms"])
    _same(_batches(headrace.image(f"{store_link}@sha256:{hs}", store=data["ms"], **KW)),
          reference)


def test_local_store_pinned_by_sha256(data, reference):
    h = headrace.resolve(data["local"], store=data["ms"])
    _same(_batches(headrace.image(f"{data['local']}@sha256:{h}", store=data["ms"], **KW)),
          reference)


def test_checkpoint_from_local_resumes_on_s3(data, reference):
    with headrace.image(data["local"], **KW) as ld:
        next(ld)
        next(ld)
        token = ld.checkpoint()
    ld = headrace.image(f"s3://{data['bucket']}/packdir/", store=data["ms"], resume=token, **KW)
    _same(_batches(ld), reference[2:])


def test_raw_prefix_label_modes_and_options(data):
    base = f"s3://{data['bucket']}/raw/"
    with headrace.image(base, store=data["ms"], label_mode="none", batch=50,
                        resize=(8, 8)) as ld:
        assert ld.classes is None
        _, labels = next(ld)
        assert (labels == -1).all()
    with pytest.raises(ConfigError, match="unknown image"):
        headrace.image(base, store=data["ms"], endpont="http://x")
    with pytest.raises(ConfigError, match="no image files"):  # only README.txt at the top
        headrace.image(base, store=data["ms"], recursive=False, resize=(8, 8))


def test_local_folder_pinned_by_sha256_and_file_url(data, reference):
    tree = str(data["tree"])
    h = headrace.resolve(tree, store=data["ms"])
    ld = headrace.image(f"{tree}@sha256:{h}", store=data["ms"], **KW)
    assert type(ld.records).__name__ == "RawImages"
    _same(_batches(ld), reference)
    _same(_batches(headrace.image(f"file://{tree}", store=data["ms"], **KW)), reference)


def test_changed_object_is_refused_not_decoded(data, server, tmp_path):
    bucket = new_bucket(server, "img")
    client = ObjectStore(bucket, options=S3Options())
    for rel in data["paths"][:4]:
        client.put(f"raw/{rel}", (data["tree"] / rel).read_bytes())
    base = f"s3://{bucket}/raw/"
    ms = str(tmp_path / "ms")
    headrace.resolve(base, store=ms)  # pin the snapshot
    client.put(f"raw/{data['paths'][2]}", (data["tree"] / data["paths"][0]).read_bytes())
    with headrace.image(base, store=ms, batch=4, resize=(8, 8)) as ld, \
            pytest.raises(headrace.HeadraceError) as info:
        next(ld)
    assert data["paths"][2] in str(info.value) + str(info.value.__cause__)
    assert "@refresh" in str(info.value) + str(info.value.__cause__)
    with headrace.image(f"{base}@refresh", store=ms, batch=4, resize=(8, 8)) as ld:
        assert len(next(ld)[0]) == 4
