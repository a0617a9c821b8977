"""Zero-manifest loading: every file of a local folder / object of an S3 prefix is a record."""

import os

import numpy as np
import pytest

import headrace
from _s3_server import FaultProxy, new_bucket, s3_env, shared_server
from headrace import ConfigError, LinkError, LoaderError
from headrace._remote.objstore import ObjectStore, S3Options
from headrace._sources.links import open_link
from headrace._sources.raw import RawSource

FILES = {f"{c}/{i:02d}.bin": bytes([ord(c[0]) + i]) * (10 + 7 * i) for c in ("cat", "dog")
         for i in range(9)}


@pytest.fixture(scope="module")
def server():
    return shared_server()


@pytest.fixture
def ms(tmp_path):
    return str(tmp_path / "manifests")


@pytest.fixture
def folder(tmp_path):
    root = tmp_path / "raw"
    for rel, data in FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


@pytest.fixture
def prefix(server):
    bucket = new_bucket(server)
    c = ObjectStore(bucket, options=S3Options(endpoint=server.endpoint, access_key_id="testing",
                                              secret_access_key="testing"))
    for rel, data in FILES.items():
        c.put(f"raw/{rel}", data)
    c.put("raw/.hidden", b"skip me")
    c.put("raw-sibling/x", b"not under raw/")
    with s3_env(server.endpoint):
        yield f"s3://{bucket}/raw/", c


def _read_all(loader):
    seen = {}
    with loader:
        for b in loader:
            keys = b["key"].tolist()
            for j, k in enumerate(keys):
                assert k not in seen, f"{k} delivered twice"
                seen[k] = (b["bytes"][j].tobytes(), int(b["label"][j]) if "label" in b else None)
    return seen


def _check(seen, labelled=True):
    assert sorted(seen) == sorted(FILES)
    for k, (data, label) in seen.items():
        assert data == FILES[k]
        if labelled:
            assert label == ["cat", "dog"].index(k.split("/")[0])


def test_load_local_folder_like_mx8_should(folder, ms):
    loader = headrace.load(str(folder), recursive=True, profile="balanced", batch=5, store=ms,
                           labels=True)
    _check(_read_all(loader))


def test_load_local_folder_shuffled_unlabelled(folder, ms):
    loader = headrace.load(f"file://{folder}", batch=4, shuffle=True, seed=3, store=ms)
    seen = _read_all(loader)
    _check(seen, labelled=False)
    assert all(label is None for _, label in seen.values())


def test_load_s3_prefix(prefix, ms):
    url, _ = prefix
    loader = headrace.load(url, recursive=True, profile="balanced", batch=6, store=ms,
                           label_mode="auto")
    _check(_read_all(loader))


def test_s3_prefix_through_fault_proxy(prefix, ms, server):
    url, _ = prefix
    proxy = FaultProxy(server.port, rate=0.15, seed=11, stall_s=0.6)
    try:
        loader = headrace.load(url, batch=7, shuffle=True, store=ms, labels=True,
                               endpoint=proxy.endpoint, timeout_s=0.3, max_attempts=12,
                               backoff_base_s=0.01)
        _check(_read_all(loader))
        assert sum(proxy.injected.values()) >= 1
    finally:
        proxy.close()


def test_non_recursive_and_label_errors(folder, ms):
    (folder / "top.bin").write_bytes(b"top")
    src = open_link(str(folder), store=ms, recursive=False)
    assert len(src) == 1 and src.gather(np.array([0]))["key"].tolist() == ["top.bin"]
    with pytest.raises(ConfigError, match=r"'top\.bin' is not inside a class folder"):
        open_link(str(folder), store=ms, labels=True)
    auto = open_link(str(folder), store=ms, label_mode="auto")
    assert auto.classes is None and auto.fields == ["bytes", "key"]
    with pytest.raises(ConfigError, match="invalid label mode"):
        open_link(str(folder), store=ms, label_mode="folders")


def test_nbytes_covers_the_batch(folder, ms):
    src = open_link(str(folder), store=ms, labels=True)
    ids = np.array([3, 0, 17])
    out = src.gather(ids)
    held = out["bytes"].values.nbytes + out["bytes"].offsets.nbytes + out["key"].nbytes + \
        out["label"].nbytes
    assert src.nbytes(ids) >= held
    assert isinstance(src, RawSource) and src.fingerprint.startswith("manifest:")


def test_changed_local_file_is_refused(folder, ms):
    src = open_link(str(folder), store=ms)
    (folder / "cat" / "01.bin").write_bytes(b"different bytes, same name")
    with pytest.raises(LinkError, match=r"cat/01\.bin changed after snapshot.*@refresh"):
        src.gather(np.array([1]))
    # The plain link still pins the old snapshot, so a new loader refuses too (in the worker).
    with pytest.raises(LoaderError) as e:
        _read_all(headrace.load(str(folder), batch=18, store=ms))
    assert "changed after snapshot" in str(e.value)
    # @refresh lists again and reads the new bytes.
    fresh = open_link(f"{folder}@refresh", store=ms)
    assert fresh.gather(np.array([1]))["bytes"][0].tobytes() == b"different bytes, same name"
    os.unlink(folder / "dog" / "00.bin")
    with pytest.raises(LinkError, match="file is gone"):
        fresh.gather(np.array([9]))


def test_changed_s3_object_is_refused(prefix, ms):
    url, client = prefix
    src = open_link(url, store=ms)
    client.put("raw/dog/03.bin", b"new content")
    with pytest.raises(LinkError, match=r"dog/03\.bin changed after snapshot.*etag"):
        src.gather(np.array([12]))
    client.delete(["raw/dog/04.bin"])
    with pytest.raises(LinkError, match="object is gone"):
        src.gather(np.array([13]))


def test_unknown_pinned_snapshot_and_empty_prefix(prefix, ms, server):
    url, _ = prefix
    with pytest.raises(LinkError, match="manifest not found"):
        open_link(f"{url}@sha256:{'1' * 64}", store=ms)
    with pytest.raises(LinkError, match="zero objects"):
        open_link(url.replace("/raw/", "/nothing-here/"), store=ms)
    h = headrace.resolve(url, store=ms)
    assert open_link(f"{url}@sha256:{h}", store=ms).fingerprint == f"manifest:{h}"


def test_s3_cache_serves_second_read(prefix, ms, tmp_path):
    url, _ = prefix
    src = open_link(url, store=ms, cache_dir=str(tmp_path / "cache"), cache_bytes=1 << 20)
    ids = np.arange(len(src))
    first = src.gather(ids)
    assert src._cache.misses == len(ids)
    second = src.gather(ids)
    assert src._cache.hits == len(ids)
    np.testing.assert_array_equal(first["bytes"].values, second["bytes"].values)


def test_load_finds_the_link_source_by_itself(folder, ms):
    import subprocess
    import sys

    code = ("import sys, headrace\n"
            "from headrace._sources.base import open_source\n"
            "assert 'headrace._sources.links' not in sys.modules\n"
            f"print(type(open_source({str(folder)!r}, store={ms!r})).__name__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "RawSource"
