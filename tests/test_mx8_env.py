"""mx8 1.0.7's ``MX8_*`` environment variables under ``headrace.mx8``: the table of what each does
matches the real wheel's list and the migration guide, and the honoured ones act."""

from __future__ import annotations

import re
from pathlib import Path

import mx8 as real
import pytest
from tests._images import encode, gradient, imagefolder

import headrace
import headrace.mx8 as mx8
from _s3_server import new_bucket, shared_server
from headrace import ConfigError
from headrace._compat.mx8_env import VARIABLES
from headrace._remote.objstore import ObjectStore, S3Options

ROOT = Path(__file__).resolve().parent.parent
_LAUNCH = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS", "MX8_JOB_ID",
           "MX8_COORD_URL", "MX8_CLUSTER_URL", "MX8_SHUFFLE", "MX8_SEED", "MX8_EPOCH",
           "MX8_WORLD_SIZE")


def _wheel_bytes() -> bytes:
    d = Path(real.__file__).parent
    return b"".join((d / f).read_bytes() for f in ("mx8.abi3.so", "mx8d-coordinator",
                                                   "__init__.py"))


def test_the_table_covers_every_variable_of_the_wheel_and_the_guide():
    wheel = _wheel_bytes()
    names = [n.rstrip("*") for n in VARIABLES]
    for name in names:
        assert name.encode() in wheel, name  # each entry is one the wheel reads
    # the wheel's strings run together ("MX8_SEEDMX8_EPOCH..."): each hit starts with a listed name
    for hit in set(re.findall(rb"MX8_[A-Z0-9_]+", wheel)):
        assert any(hit.decode().startswith(n) for n in names), hit
    guide = (ROOT / "docs" / "migration-mx8.md").read_text()
    for name in VARIABLES:
        assert f"`{name}`" in guide, name


@pytest.fixture
def pack(tmp_path):
    for i in range(24):
        d = tmp_path / "in" / ("cat" if i % 2 else "dog")
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{i:02d}.bin").write_bytes(bytes([i]) * (20 + i))
    real.pack_dir(str(tmp_path / "in"), out=str(tmp_path / "pk"))
    return str(tmp_path / "pk")


@pytest.fixture
def clean_env(monkeypatch):
    for var in _LAUNCH:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_cluster_url_selects_the_ranks_share(pack, clean_env):
    clean_env.setenv("MX8_CLUSTER_URL", "http://c:50051")
    assert mx8.load(pack).world_size == 1  # no job: local, as mx8
    with pytest.raises(ConfigError, match="torchrun --nproc_per_node"):
        mx8.load(pack, job="j")
    clean_env.setenv("WORLD_SIZE", "2")
    clean_env.setenv("RANK", "1")
    ld = mx8.load(pack, job="j", batch=4)
    assert (ld.assigned_rank, ld.world_size) == (1, 2)
    assert [b.sample_ids for b in ld] == _ids(headrace.load(pack, batch=4, rank=1,
                                                           world_size=2))


def _ids(loader):
    out = []
    for _ in loader:
        out.append(loader.last_ids.tolist())
    return out


def test_shuffle_seed_epoch_order_a_ranks_share(pack, clean_env):
    clean_env.setenv("WORLD_SIZE", "2")
    clean_env.setenv("RANK", "0")
    clean_env.setenv("MX8_SHUFFLE", "1")
    clean_env.setenv("MX8_SEED", "3")
    clean_env.setenv("MX8_EPOCH", "2")
    got = [b.sample_ids for b in mx8.run(pack, batch=4, coord="http://c", job="j")]
    want = _ids(headrace.load(pack, batch=4, order="shuffle", seed=3, epoch=2, rank=0,
                              world_size=2))
    flat = [i for ids in got for i in ids]
    assert got == want and sorted(flat) != flat
    clean_env.setenv("MX8_SHUFFLE", "maybe")
    with pytest.raises(ConfigError, match="invalid MX8_SHUFFLE='maybe'"):
        mx8.load(pack, coord="http://c", job="j")
    clean_env.delenv("MX8_SHUFFLE")
    unshuffled = [b.sample_ids for b in mx8.load(pack, batch=4, coord="c", job="j")]
    assert unshuffled == _ids(headrace.load(pack, batch=4, rank=0, world_size=2))


def test_world_size_is_checked_against_the_launcher(clean_env):
    clean_env.setenv("MX8_WORLD_SIZE", "4")
    with pytest.raises(ConfigError, match="coordinator\\(world_size=4\\) but the launcher reports"):
        mx8.coordinator()
    clean_env.setenv("WORLD_SIZE", "4")
    clean_env.setenv("RANK", "0")
    assert mx8.coordinator().url.endswith("/4")


def test_decode_threads_and_backend(tmp_path, clean_env):
    imagefolder(tmp_path / "imgs", {"a": 3, "b": 3})
    clean_env.setenv("MX8_DECODE_THREADS", "0")
    with pytest.raises(ConfigError, match="invalid MX8_DECODE_THREADS='0'"):
        mx8.image(str(tmp_path / "imgs"), batch=2)
    clean_env.setenv("MX8_DECODE_THREADS", "3")
    with mx8.image(str(tmp_path / "imgs"), batch=2) as ld:
        assert ld.stats()["threads"] == 3
        assert len(list(ld)) == 3
    clean_env.setenv("MX8_DECODE_BACKEND", "bogus")
    with pytest.raises(ConfigError, match='invalid MX8_DECODE_BACKEND="bogus" '
                                          r"\(expected: python\|rust\)"):
        mx8.image(str(tmp_path / "imgs"), batch=2)


def test_rss_cap_and_manifest_store_root(tmp_path, clean_env):
    raw = tmp_path / "raw"
    raw.mkdir()
    for i in range(5):
        (raw / f"{i}.dat").write_bytes(b"x" * (i + 1))
    clean_env.setenv("MX8_MAX_PROCESS_RSS_BYTES", str(12 << 30))
    clean_env.setenv("MX8_MANIFEST_STORE_ROOT", str(tmp_path / "ms"))
    clean_env.delenv("HEADRACE_MANIFEST_STORE", raising=False)
    clean_env.delenv("HEADRACE_MAX_PROCESS_RSS_BYTES", raising=False)
    ld = mx8.load(str(raw), batch=5)
    assert ld.stats()["max_process_rss_bytes"] == 12 << 30
    assert next(ld).offsets == [0, 1, 3, 6, 10, 15]
    assert any((tmp_path / "ms").rglob("*"))  # the raw folder's snapshot went there


def test_s3_label_mode_and_pack_fetches(tmp_path, clean_env):
    server = shared_server()
    bucket = new_bucket(server)
    s3 = ObjectStore(bucket, options=S3Options(endpoint=server.endpoint, access_key_id="testing",
                                               secret_access_key="testing"))
    for i in range(4):
        s3.put(f"p/{'cat' if i % 2 else 'dog'}/{i}.jpg", encode(gradient(8, 8, phase=i)))
    for var, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                       ("AWS_DEFAULT_REGION", "us-east-1"), ("MX8_S3_ENDPOINT_URL", server.endpoint),
                       ("MX8_MANIFEST_STORE_ROOT", str(tmp_path / "ms"))):
        clean_env.setenv(var, value)
    for var in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "HEADRACE_S3_ENDPOINT", "AWS_PROFILE",
                "HEADRACE_MANIFEST_STORE"):
        clean_env.delenv(var, raising=False)
    link = f"s3://{bucket}/p/@refresh"
    clean_env.setenv("MX8_S3_LABEL_MODE", "imagefolder")
    assert next(mx8.load(link, batch=4)).label_ids == [0, 0, 1, 1]  # cat/1, cat/3, dog/0, dog/2
    clean_env.setenv("MX8_S3_LABEL_MODE", "none")
    assert next(mx8.load(link, batch=4)).label_ids is None
    clean_env.setenv("MX8_S3_LABEL_MODE", "folders")
    with pytest.raises(ConfigError, match='invalid MX8_S3_LABEL_MODE="folders"'):
        mx8.load(link, batch=4)
    clean_env.delenv("MX8_S3_LABEL_MODE")
    clean_env.setenv("MX8_PACK_PARALLEL_FETCHES", "0")
    with pytest.raises(ConfigError, match="invalid MX8_PACK_PARALLEL_FETCHES='0'"):
        mx8.pack(f"s3://{bucket}/p/", out=str(tmp_path / "st"))
    clean_env.setenv("MX8_PACK_PARALLEL_FETCHES", "2")
    assert mx8.pack(f"s3://{bucket}/p/", out=str(tmp_path / "st"))["samples"] == 4


def test_force_path_style_0_sends_virtual_hosted_requests(tmp_path, clean_env):
    """``MX8_S3_FORCE_PATH_STYLE=0``: requests go to ``<bucket>.<endpoint host>/<key>``. The
    loopback moto server is reached through the standard ``http_proxy`` variable (the proxy, not
    DNS, resolves ``<bucket>.localhost``); moto takes the bucket from the Host header, so a read
    that works was addressed virtual-hosted, and the same host with path-style addressing (the
    bucket a path segment of another host's name) does not reach the bucket."""
    server = shared_server()
    bucket = new_bucket(server, stem="vh")
    keys = {"access_key_id": "testing", "secret_access_key": "testing"}
    ObjectStore(bucket, options=S3Options(endpoint=server.endpoint, **keys)).put(
        "p/a.bin", b"virtual")
    for var in ("http_proxy", "HTTP_PROXY"):
        clean_env.setenv(var, server.endpoint)
    for var in ("no_proxy", "NO_PROXY", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3",
                "HEADRACE_S3_ENDPOINT", "AWS_PROFILE", "HEADRACE_MANIFEST_STORE"):
        clean_env.delenv(var, raising=False)
    local = f"http://localhost:{server.port}"
    clean_env.setenv("MX8_S3_FORCE_PATH_STYLE", "0")
    vh = ObjectStore(bucket, options=S3Options(endpoint=local, **keys))
    assert vh.endpoint == f"http://{bucket}.localhost:{server.port}"
    assert vh.get("p/a.bin")[0] == b"virtual" and [i.key for i in vh.list("p/")] == ["p/a.bin"]
    # path_style= wins over the variable; so does MX8_S3_FORCE_PATH_STYLE=1 (the default)
    assert ObjectStore(bucket, options=S3Options(endpoint=local, path_style=True,
                                                 **keys)).get("p/a.bin")[0] == b"virtual"
    wrong = ObjectStore(bucket, options=S3Options(endpoint=f"http://other.localhost:"
                                                           f"{server.port}", path_style=True, allow_http=True,
                                                  max_attempts=1, **keys))
    with pytest.raises(headrace.RemoteError):
        wrong.get("p/a.bin")
    for var, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                       ("AWS_DEFAULT_REGION", "us-east-1"), ("MX8_S3_ENDPOINT_URL", local),
                       ("MX8_MANIFEST_STORE_ROOT", str(tmp_path / "ms"))):
        clean_env.setenv(var, value)
    assert next(mx8.load(f"s3://{bucket}/p/", batch=4)).payload == b"virtual"
    clean_env.setenv("MX8_S3_FORCE_PATH_STYLE", "maybe")
    with pytest.raises(ConfigError, match="invalid MX8_S3_FORCE_PATH_STYLE='maybe'"):
        ObjectStore(bucket, options=S3Options(endpoint=local, **keys))
