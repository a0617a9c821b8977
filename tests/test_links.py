"""Link grammar: base, base@refresh, base@sha256:<64 hex>; local paths, file://, s3://."""

import hashlib
import os

import pytest

from headrace import LinkError
from headrace._remote.links import parse_link

H = "ab" * 32


def test_plain_refresh_and_pinned_modes(tmp_path):
    base = str(tmp_path)
    assert parse_link(base).mode == "plain"
    ref = parse_link(base + "@refresh")
    assert (ref.mode, ref.base, ref.pinned_hash) == ("refresh", base, None)
    pin = parse_link(f"{base}@sha256:{H}")
    assert (pin.mode, pin.base, pin.pinned_hash) == ("pinned", base, H)
    assert pin.with_hash(H) == f"{base}@sha256:{H}"


@pytest.mark.parametrize("text", ["s3://bkt/imgs/", "s3://bkt/imgs", "s3://bkt//imgs//"])
def test_s3_base_is_canonical(text):
    link = parse_link(text)
    assert link.is_s3 and link.base == "s3://bkt/imgs"
    assert (link.bucket, link.prefix) == ("bkt", "imgs/")


def test_whole_bucket_has_empty_prefix():
    link = parse_link("s3://bkt@refresh")
    assert (link.base, link.bucket, link.prefix, link.mode) == ("s3://bkt", "bkt", "", "refresh")


def test_local_spellings_share_one_base(tmp_path, monkeypatch):
    d = tmp_path / "data"
    d.mkdir()
    monkeypatch.chdir(tmp_path)
    spellings = [str(d), str(d) + "/", f"{tmp_path}/./data", f"file://{d}", "data", "data/"]
    bases = {parse_link(s).base for s in spellings}
    assert bases == {str(d)}
    key = parse_link("data").intent_key()
    assert key == "sha256_" + hashlib.sha256(str(d).encode()).hexdigest()
    assert parse_link("data").intent_key(variant="?recursive=0") != key


@pytest.mark.parametrize("text, match", [
    ("", "empty dataset link"),
    ("   ", "empty dataset link"),
    ("/data/x@foo", "unknown dataset link suffix '@foo'"),
    ("/data/x@", "unknown dataset link suffix '@'"),
    ("/data/x@sha256:abc", "64 lowercase hex"),
    (f"/data/x@sha256:{H.upper()}", "64 lowercase hex"),
    ("@refresh", "no base"),
    ("s3:///prefix", "no bucket"),
    ("gs://bkt/x", "unsupported dataset link scheme"),
    ("file://host/x", "names a host"),
])
def test_bad_links_raise_link_error(text, match):
    with pytest.raises(LinkError, match=match):
        parse_link(text)


def test_at_sign_inside_a_path_is_not_a_suffix(tmp_path):
    d = tmp_path / "user@host" / "data"
    assert parse_link(str(d)).base == str(d)
    e = tmp_path / "v@2"
    e.mkdir()
    assert parse_link(str(e)).base == str(e)  # an existing path wins over suffix parsing


def test_pathlike_accepted(tmp_path):
    assert parse_link(tmp_path).base == os.fspath(tmp_path)
