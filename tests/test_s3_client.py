"""The object-store client against a real S3 server on loopback (moto), through a fault proxy."""

import multiprocessing
import os
import pickle

import pytest

from _s3_server import FaultProxy, new_bucket, shared_server
from headrace import ConfigError, RemoteError
from headrace._remote.cache import ByteCache
from headrace._remote.objstore import ObjectNotFoundError, ObjectStore, S3Options

KEYS = {"access_key_id": "testing", "secret_access_key": "testing"}


@pytest.fixture(scope="module")
def server():
    return shared_server()


@pytest.fixture
def bucket(server):
    return new_bucket(server)


def _client(endpoint, bucket, **kw):
    return ObjectStore(bucket, options=S3Options(endpoint=endpoint, **KEYS, **kw))


def test_put_get_head_list_range_delete(server, bucket):
    c = _client(server.endpoint, bucket)
    blobs = {f"p/{c_}/{i}.bin": os.urandom(1000 + i) for c_ in "ab" for i in range(3)}
    for k, v in blobs.items():
        c.put(k, v)
    c.put("other/x", b"x")
    listed = list(c.list("p/"))
    assert [i.key for i in listed] == sorted(blobs)
    assert all(i.size == len(blobs[i.key]) and i.etag and i.mtime_ns > 0 for i in listed)
    data, info = c.get("p/a/1.bin")
    assert data == blobs["p/a/1.bin"] and info.size == 1001
    assert c.head("p/a/1.bin") == info
    assert c.get_range("p/b/2.bin", 10, 500) == blobs["p/b/2.bin"][10:500]
    c.delete(["p/a/0.bin"])
    with pytest.raises(ObjectNotFoundError, match="no such key") as ei:
        c.get("p/a/0.bin")
    assert ei.value.key == "p/a/0.bin" and c.retries == 0  # 404 is not retried


def test_client_pickles_without_its_connection(server, bucket):
    c = _client(server.endpoint, bucket)
    c.put("k", b"v")
    c2 = pickle.loads(pickle.dumps(c))
    assert c2.get("k")[0] == b"v"


def test_retries_through_resets_503_stalls_and_truncation(server, bucket):
    c = _client(server.endpoint, bucket)
    blobs = {f"k{i}": os.urandom(20_000) for i in range(20)}
    for k, v in blobs.items():
        c.put(k, v)
    proxy = FaultProxy(server.port, rate=0.3, seed=7, stall_s=0.6)
    try:
        flaky = _client(proxy.endpoint, bucket, timeout_s=0.3, max_attempts=12,
                        backoff_base_s=0.01, backoff_max_s=0.05)
        for k, v in blobs.items():
            assert flaky.get(k)[0] == v
            assert flaky.get_range(k, 100, 9000) == v[100:9000]
        assert [i.key for i in flaky.list("")] == sorted(blobs)
        assert flaky.retries >= 1 and sum(proxy.injected.values()) >= 1
        assert set(proxy.injected) == set(FaultProxy.FAULTS), proxy.injected
    finally:
        proxy.close()


def test_retry_budget_spent_names_the_key(server, bucket):
    _client(server.endpoint, bucket).put("a/b.bin", b"x")
    proxy = FaultProxy(server.port, rate=1.0, faults=("503",))
    try:
        c = _client(proxy.endpoint, bucket, max_attempts=3, backoff_base_s=0.0)
        with pytest.raises(RemoteError, match=r"s3://.*/a/b\.bin failed after 3 attempts.*503") as e:
            c.get("a/b.bin")
        assert e.value.key == "a/b.bin" and c.retries == 2
    finally:
        proxy.close()


def test_config_from_environment_and_profile_files(tmp_path, monkeypatch, server, bucket):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3",
                "HEADRACE_S3_ENDPOINT", "MX8_S3_ENDPOINT_URL"):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "config").write_text(
        f"[profile dev]\nregion = eu-west-3\nendpoint_url = {server.endpoint}\n")
    (tmp_path / "credentials").write_text(
        "[dev]\naws_access_key_id = testing\naws_secret_access_key = testing\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    c = ObjectStore(bucket, options=S3Options(profile="dev"))
    assert c._config["region"] == "eu-west-3" and c.endpoint == server.endpoint
    c.put("x", b"1")
    assert c.get("x")[0] == b"1"
    with pytest.raises(ConfigError, match="profile 'nope' not found"):
        ObjectStore(bucket, options=S3Options(profile="nope"))
    # Environment variables: keys, region and the endpoint (mx8's variable is accepted too).
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_REGION", "ap-south-1")
    monkeypatch.setenv("MX8_S3_ENDPOINT_URL", server.endpoint)
    c = ObjectStore(bucket)
    assert c._config["region"] == "ap-south-1" and c.get("x")[0] == b"1"
    with pytest.raises(ConfigError, match="allow_http=True"):
        ObjectStore(bucket, options=S3Options(endpoint="http://minio.internal:9000"))
    assert ObjectStore(bucket, options=S3Options(endpoint="http://minio.internal:9000",
                                                 allow_http=True)).endpoint
    with pytest.raises(ConfigError, match="max_attempts"):
        S3Options(max_attempts=0)


# -- the byte cache ---------------------------------------------------------------------------------


def test_cache_hard_limit_and_lru(tmp_path):
    c = ByteCache(tmp_path, max_bytes=1000)
    for i in range(4):
        assert c.put(f"k{i}", bytes([i]) * 300)
    assert c.usage_bytes() <= 1000 and c.get("k0") is None  # oldest evicted
    assert c.get("k1") is not None  # now most recently used
    c.put("k4", b"x" * 300)
    assert c.get("k1") is not None and c.get("k2") is None
    assert not c.put("big", b"x" * 1001)
    on_disk = sum(f.stat().st_size for f in tmp_path.rglob("*") if f.is_file()
                  and len(f.name) == 64)
    assert on_disk == c.usage_bytes() <= 1000


def _hammer(args):
    root, seed = args
    c = ByteCache(root, max_bytes=5000)
    for i in range(60):
        key = f"k{(seed * 7 + i) % 25}"
        c.put(key, bytes([i % 251]) * (100 + (i * 37) % 400))
        c.get(f"k{i % 25}")
    return True


def test_cache_is_safe_across_processes(tmp_path):
    with multiprocessing.get_context("spawn").Pool(3) as pool:
        assert all(pool.map(_hammer, [(str(tmp_path), s) for s in range(3)]))
    c = ByteCache(tmp_path, max_bytes=5000)
    on_disk = sum(f.stat().st_size for f in tmp_path.rglob("*") if f.is_file()
                  and len(f.name) == 64)
    assert on_disk == c.usage_bytes() <= 5000
