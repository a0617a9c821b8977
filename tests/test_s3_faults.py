"""The client retries throttling (429), request timeouts (408), 500s and bodies shorter than announced
(or cut short together with their Content-Length: only Content-Range then tells).

Each fault comes from the fault proxy in front of a real S3 server (moto on loopback): the first
requests through it get the fault, then it forwards; the client must return the right bytes.
"""

from __future__ import annotations

import os

import pytest

from _s3_server import FaultProxy, new_bucket, shared_server
from headrace import RemoteError
from headrace._remote.objstore import ObjectStore, S3Options

KEYS = {"access_key_id": "testing", "secret_access_key": "testing"}
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server():
    return shared_server()


@pytest.fixture
def bucket(server):
    return new_bucket(server)


def _client(endpoint, bucket, **kw):
    kw = {"max_attempts": 5, "backoff_base_s": 0.0, "backoff_max_s": 0.01, **kw}
    return ObjectStore(bucket, options=S3Options(endpoint=endpoint, **KEYS, **kw))


@pytest.mark.parametrize("fault", ["429", "408", "500", "length", "short"])
def test_each_fault_is_retried_and_the_bytes_are_right(server, bucket, fault):
    blob = os.urandom(30_000)
    _client(server.endpoint, bucket).put("o/k.bin", blob)
    for op in ("get", "range", "head"):
        if op == "head" and fault in ("length", "short"):
            continue  # a HEAD answer has no body
        proxy = FaultProxy(server.port, rate=0.0, faults=(fault,), fail_requests=range(2))
        try:
            c = _client(proxy.endpoint, bucket)
            if op == "get":
                assert c.get("o/k.bin")[0] == blob
            elif op == "range":
                assert c.get_range("o/k.bin", 1000, 25_000) == blob[1000:25_000]
            else:
                assert c.head("o/k.bin").size == len(blob)
            assert proxy.injected[fault] == 2, op
            assert c.retries == 2, op
        finally:
            proxy.close()


def test_an_empty_object_reads_as_empty(server, bucket):
    c = _client(server.endpoint, bucket)
    c.put("empty", b"")
    data, info = c.get("empty")
    assert data == b"" and info.size == 0 and c.retries == 0


@pytest.mark.parametrize("fault", ["429", "408"])
def test_throttling_that_never_ends_spends_the_retry_budget(server, bucket, fault):
    _client(server.endpoint, bucket).put("a.bin", b"x")
    proxy = FaultProxy(server.port, rate=1.0, faults=(fault,))
    try:
        c = _client(proxy.endpoint, bucket, max_attempts=3)
        with pytest.raises(RemoteError, match=rf"a\.bin failed after 3 attempts.*{fault}"):
            c.get("a.bin")
        assert c.retries == 2
    finally:
        proxy.close()


def test_a_mixed_storm_of_every_fault_still_reads_everything(server, bucket):
    blobs = {f"k{i}": os.urandom(5000 + 300 * i) for i in range(12)}
    c0 = _client(server.endpoint, bucket)
    for k, v in blobs.items():
        c0.put(k, v)
    proxy = FaultProxy(server.port, rate=0.4, seed=3, stall_s=0.5)
    try:
        c = _client(proxy.endpoint, bucket, timeout_s=0.3, max_attempts=20)
        for _ in range(3):
            for k, v in blobs.items():
                assert c.get(k)[0] == v
                assert c.get_range(k, 7, 4000) == v[7:4000]
        assert set(proxy.injected) == set(FaultProxy.FAULTS)
    finally:
        proxy.close()
