"""pack() into local and S3 stores, and reading a store on S3 by coalesced byte ranges."""

import json
import os
import pickle
import re

import numpy as np
import pytest

import headrace
from _s3_server import FaultProxy, new_bucket, s3_env, shared_server
from headrace import CorruptionError, LinkError, StoreExistsError
from headrace._remote.objstore import ObjectStore, S3Options
from headrace._remote.store import RemoteStore
from headrace._sources.links import open_link
from headrace._store.format import meta_bytes

RNG = np.random.default_rng(0)
FILES = {f"c{c}/{i:03d}.bin": RNG.integers(0, 256, int(RNG.integers(0, 3000)), np.uint8).tobytes()
         for c in range(3) for i in range(40)}
KEYS = sorted(FILES)


@pytest.fixture(scope="module")
def server():
    return shared_server()


@pytest.fixture(scope="module")
def env(server):
    with s3_env(server.endpoint):
        yield


@pytest.fixture(scope="module")
def raw_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("src") / "raw"
    for rel, data in FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


@pytest.fixture(scope="module")
def packed(server, env, raw_folder, tmp_path_factory):
    """The same files packed into a local store and into a store on S3 (zstd, small chunks)."""
    tmp = tmp_path_factory.mktemp("packed")
    bucket = new_bucket(server)
    client = ObjectStore(bucket, options=S3Options())
    for rel, data in FILES.items():
        client.put(f"raw/{rel}", data)
    ms = str(tmp / "ms")
    local = str(tmp / "local-store")
    res_local = headrace.pack(raw_folder, out=local, store=ms, codec="zstd", chunk_mb=0.05)
    res_s3 = headrace.pack(f"s3://{bucket}/raw/", out=f"s3://{bucket}/store/", store=ms,
                           codec="zstd", chunk_mb=0.05, progress=False)
    return {"bucket": bucket, "client": client, "local": local, "url": f"s3://{bucket}/store",
            "ms": ms, "res_local": res_local, "res_s3": res_s3}


def test_pack_results(packed):
    for key in ("res_local", "res_s3"):
        res = packed[key]
        assert res["samples"] == len(FILES) and res["classes"] == ["c0", "c1", "c2"]
        assert res["bytes"] == sum(map(len, FILES.values())) and len(res["manifest_hash"]) == 64
    # Same files, same relative keys: the local folder and the S3 prefix have the same content,
    # but different mtimes, so their manifests differ; both stores hold the same records.
    st = headrace.open(packed["local"])
    assert len(st) == len(FILES) and st.attrs["classes"] == ["c0", "c1", "c2"]
    got = st.gather(np.arange(len(st)))
    assert [bytes(k.tobytes()).decode() for k in got["key"].to_list()] == KEYS
    assert [r.tobytes() for r in got["bytes"].to_list()] == [FILES[k] for k in KEYS]
    assert got["label"].tolist() == [int(k[1]) for k in KEYS]
    assert not [n for n in os.listdir(os.path.dirname(packed["local"])) if ".partial-" in n]


def test_remote_store_matches_local(packed):
    local = headrace.open(packed["local"])
    with RemoteStore(packed["url"], objstore=packed["client"]) as rs:
        assert len(rs) == len(local) and rs.fields == local.fields
        assert rs.fingerprint.split(":")[0] == "store"
        for ids in (np.arange(len(rs)), RNG.permutation(len(rs))[:37], np.array([5, 5, 0]),
                    np.array([], np.int64)):
            a, b = rs.gather(ids), local.gather(ids)
            assert a.keys() == b.keys()
            for f in a:
                if isinstance(a[f], np.ndarray):
                    np.testing.assert_array_equal(a[f], b[f])
                else:
                    np.testing.assert_array_equal(a[f].values, b[f].values)
                    np.testing.assert_array_equal(a[f].offsets, b[f].offsets)
            assert rs.nbytes(ids) >= local.nbytes(ids)


def test_remote_store_checks_ids_and_fields_as_the_local_store_does(packed):
    # one rule for both: integer ids in [0, N), named fields; the same errors and messages
    local = headrace.open(packed["local"])
    with RemoteStore(packed["url"], objstore=packed["client"]) as rs:
        n = len(rs)
        for bad, match in (([n], f"record id {n} is out of range for a store of N={n}"),
                           ([-1, 0], "record id -1 is out of range"),
                           ([1.5], "indices must be integers, got dtype float64"),
                           ([[0, 1], [2, 3]], "indices must be 1-D")):
            for store in (rs, local):
                with pytest.raises(headrace.RecordIndexError, match=re.escape(match)):
                    store.gather(bad)
        with pytest.raises(headrace.SchemaError, match="unknown field 'nope'; s3://"):
            rs.gather([0], fields="nope")


def test_ranges_are_coalesced(packed):
    rs = RemoteStore(packed["url"], objstore=packed["client"], fields=["bytes"])
    n = len(rs)
    rs.gather(np.arange(n))
    chunks = {c.id for c in rs.meta.chunks if c.field == "bytes"}
    assert rs.requests == len(chunks) < n  # one request per chunk, not per record
    rs2 = RemoteStore(packed["url"], objstore=packed["client"], fields=["bytes"],
                      coalesce_gap_bytes=0, max_range_bytes=1)
    rs2.gather(np.arange(0, n, 2))
    assert rs2.requests == n // 2  # no coalescing: one request per record
    # A sparse shuffled batch is not read as whole chunks: at most 1 / min_fill amplification.
    rs3 = RemoteStore(packed["url"], objstore=packed["client"], fields=["bytes"], min_fill=0.5,
                      small_gap_bytes=0)
    ids = RNG.permutation(n)[:12]
    rs3.gather(ids)
    wanted = int(rs3._fields["bytes"].index[ids]["length"].sum())
    assert wanted <= rs3.bytes_fetched <= 2 * wanted
    # Tiny records (labels) with small gaps: one request per chunk touched.
    rs4 = RemoteStore(packed["url"], objstore=packed["client"], fields=["label"])
    rs4.gather(ids)
    assert rs4.requests == len({int(c) for c in rs4._fields["label"].index[ids]["chunk"]})


def test_load_packed_store_from_s3_through_fault_proxy(packed, server):
    proxy = FaultProxy(server.port, rate=0.2, seed=5, stall_s=0.6)
    try:
        with headrace.load(packed["url"], batch=16, shuffle=True, seed=1, store=packed["ms"],
                           endpoint=proxy.endpoint, timeout_s=0.3, max_attempts=12,
                           backoff_base_s=0.01, max_inflight=4) as loader:
            seen = []
            for batch in loader:
                keys = [bytes(k.tobytes()).decode() for k in batch["key"].to_list()]
                for k, data in zip(keys, batch["bytes"].to_list(), strict=True):
                    assert data.tobytes() == FILES[k]
                seen += keys
        assert sorted(seen) == KEYS and len(seen) == len(set(seen))
        assert sum(proxy.injected.values()) >= 1
    finally:
        proxy.close()


def test_bytes_flipped_in_transit_are_fetched_again(packed, server):
    # Opening (meta.json + 3 index + 3 aux GETs) goes through; then every third response has one
    # bit of its body flipped: a checksum mismatch on a remote read is transient, so the epoch
    # completes with every record exact, each mismatch fetched again within the retry budget.
    proxy = FaultProxy(server.port, rate=0.0, faults=("flip",), fail_requests=range(7, 10**9, 3))
    try:
        with headrace.load(
                packed["url"] + "@sha256:" + headrace.resolve(packed["url"], store=packed["ms"]),
                batch=8, shuffle=True, seed=3, store=packed["ms"], endpoint=proxy.endpoint,
                max_attempts=6, backoff_base_s=0.0, max_inflight=2) as loader:
            seen = []
            for batch in loader:
                keys = [bytes(k.tobytes()).decode() for k in batch["key"].to_list()]
                for k, data in zip(keys, batch["bytes"].to_list(), strict=True):
                    assert data.tobytes() == FILES[k]
                seen += keys
        assert sorted(seen) == KEYS
        assert proxy.injected["flip"] >= 3 and loader.source.refetches >= 1
    finally:
        proxy.close()


def test_remote_cache_and_verify(packed, tmp_path):
    src = open_link(packed["url"], store=packed["ms"], cache_dir=str(tmp_path / "c"),
                    cache_bytes=1 << 22, verify="always")
    ids = np.arange(len(src))
    a = src.gather(ids)
    before = src.requests
    b = src.gather(ids)
    assert src.requests == before and src._cache.hits > 0  # served from the local cache
    np.testing.assert_array_equal(a["bytes"].values, b["bytes"].values)
    # A damaged cache entry is noticed by the checksum and fetched again from S3.
    for f in (tmp_path / "c").rglob("*"):
        if f.is_file() and len(f.name) == 64:
            data = bytearray(f.read_bytes())
            data[len(data) // 2] ^= 0xFF
            f.write_bytes(bytes(data))
    c = src.gather(ids)
    np.testing.assert_array_equal(a["bytes"].values, c["bytes"].values)
    # Sources travel to worker processes: the client and cache rebuild their locks there.
    d = pickle.loads(pickle.dumps(src)).gather(ids)
    np.testing.assert_array_equal(a["bytes"].values, d["bytes"].values)


def test_corrupt_chunk_on_s3_is_reported(packed, server):
    bucket = new_bucket(server)
    client = packed["client"].__class__(bucket, options=S3Options())
    src = packed["client"]
    for info in src.list("store/"):
        client.put(info.key, src.get(info.key)[0])
    key = "store/chunks/0.zr"
    data = bytearray(client.get(key)[0])
    data[10] ^= 0xFF
    client.put(key, bytes(data))
    rs = RemoteStore(f"s3://{bucket}/store", objstore=client)
    with pytest.raises(CorruptionError, match="crc32c") as e:
        rs.gather(np.arange(len(rs)))
    assert e.value.record_ids


def test_snapshot_of_a_remote_store(packed, server):
    bucket = new_bucket(server)
    client = ObjectStore(bucket, options=S3Options())
    for info in packed["client"].list("store/"):
        client.put(info.key, packed["client"].get(info.key)[0])
    url = f"s3://{bucket}/store/"
    h = headrace.resolve(url, store=packed["ms"])
    meta = json.loads(client.get("store/meta.json")[0])
    meta["generation"] += 1
    client.put("store/meta.json", meta_bytes(meta))  # re-signed, as a writer's commit would
    with pytest.raises(LinkError, match=r"rewritten after its snapshot.*@refresh"):
        open_link(url, store=packed["ms"])
    assert headrace.resolve(url + "@refresh", store=packed["ms"]) != h
    assert len(open_link(url, store=packed["ms"])) == len(FILES)


def test_local_store_snapshot_hides_later_appends(packed, tmp_path):
    import shutil

    path = str(tmp_path / "st")
    shutil.copytree(packed["local"], path)
    src = open_link(path + "@refresh", store=packed["ms"])
    assert len(src) == len(FILES)
    with headrace.open(path, mode="a") as w:
        w.append({"bytes": [b"more"], "key": [b"extra"], "label": np.array([0])})
    assert len(open_link(path + "@sha256:" + headrace.resolve(path, store=packed["ms"]),
                         store=packed["ms"])) == len(FILES)
    assert len(open_link(path + "@refresh", store=packed["ms"])) == len(FILES) + 1


def test_pack_refuses_existing_outputs(packed, raw_folder, tmp_path):
    with pytest.raises(StoreExistsError):
        headrace.pack(raw_folder, out=packed["local"], store=packed["ms"])
    with pytest.raises(StoreExistsError):
        headrace.pack(raw_folder, out=packed["url"], store=packed["ms"])


def test_failed_local_pack_leaves_nothing(raw_folder, tmp_path):
    import shutil

    src = tmp_path / "src"
    shutil.copytree(raw_folder, src)
    ms = str(tmp_path / "ms")
    headrace.resolve(src, store=ms)  # pin, then change a file: the pack must refuse it
    (src / "c2" / "039.bin").write_bytes(b"changed")
    out = tmp_path / "out"
    with pytest.raises(LinkError, match="changed after snapshot"):
        headrace.pack(src, out=out, store=ms)
    assert sorted(os.listdir(tmp_path)) == ["ms", "src"]


def test_failed_s3_pack_commits_nothing(raw_folder, server, tmp_path):
    bucket = new_bucket(server)
    ms = str(tmp_path / "ms")
    # Requests 0 (HEAD meta.json) and 1 go through; 2..5 fail, with no retries: the upload
    # breaks half-way, and the clean-up that follows deletes what went up.
    proxy = FaultProxy(server.port, rate=0.0, faults=("503",), fail_requests=range(2, 6))
    try:
        with pytest.raises(headrace.RemoteError):
            headrace.pack(raw_folder, out=f"s3://{bucket}/store/", store=ms, chunk_mb=0.02,
                          endpoint=proxy.endpoint, max_attempts=1, tmp_dir=str(tmp_path))
    finally:
        proxy.close()
    client = ObjectStore(bucket, options=S3Options())
    assert [i.key for i in client.list("store/")] == []
    assert os.listdir(tmp_path) == ["ms"]  # the scratch folder is gone too


def test_spent_retry_budget_surfaces_from_the_loader(packed, server):
    # Opening (meta.json + 3 index + 3 aux GETs) goes through; every request after fails.
    proxy = FaultProxy(server.port, rate=0.0, faults=("503",), fail_requests=range(7, 10**9))
    try:
        with pytest.raises(headrace.LoaderError) as e, headrace.load(
                packed["url"] + "@sha256:" + headrace.resolve(packed["url"], store=packed["ms"]),
                batch=8, store=packed["ms"], endpoint=proxy.endpoint, max_attempts=2,
                backoff_base_s=0.0) as loader:
            next(iter(loader))
        assert isinstance(e.value.__cause__, headrace.RemoteError)
        assert "store/chunks/" in str(e.value) and "after 2 attempts" in str(e.value)
        assert e.value.record_ids == list(range(8))
    finally:
        proxy.close()
