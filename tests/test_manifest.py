"""Manifests, the content-addressed manifest store, and resolve()/resolve_manifest_hash() on folders."""

import hashlib
import multiprocessing
import os
import time

import numpy as np
import pytest

import headrace
from headrace import LinkError
from headrace._remote.manifest import Manifest, ManifestStore, manifest_store_root
from headrace._remote.resolve import snapshot


def _tree(root, files):
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return root


@pytest.fixture
def folder(tmp_path):
    return _tree(tmp_path / "data", {"cat/1.jpg": b"c1", "cat/2.jpg": b"c22", "dog/1.jpg": b"d1",
                                     "top.bin": b"t", ".hidden": b"h", "dog/.DS_Store": b"x"})


def test_canonical_bytes_round_trip_and_hash():
    m = Manifest.from_objects([("b/x\ty", 3, '"e1"', 5), ("a.bin", 1, "", 7), ("100%", 0, "", 0)])
    assert m.keys == ("100%", "a.bin", "b/x\ty")  # sorted
    assert m.labels == ("", "", "b")
    data = m.canonical_bytes()
    assert data.startswith(b"headrace-manifest\tversion=1\tkind=objects\n")
    back = Manifest.parse(data)
    assert back.keys == m.keys and back.etags == m.etags and back.labels == m.labels
    np.testing.assert_array_equal(back.sizes, m.sizes)
    assert m.sha256() == hashlib.sha256(data).hexdigest() == back.sha256()
    store = Manifest.for_store(length=10, generation=2, commit=5)
    assert Manifest.parse(store.canonical_bytes()).store == store.store
    assert len(store) == 10


@pytest.mark.parametrize("data, match", [
    (b"nope\n", "bad header"),
    (b"headrace-manifest\tversion=9\tkind=objects\n", "unsupported manifest version=9"),
    (b"headrace-manifest\tversion=1\tkind=objects\n1\ta\t1\t\t0\t\n", "line 2"),
    (b"headrace-manifest\tversion=1\tkind=objects\n0\ta\t1\n", "6 columns"),
])
def test_malformed_manifest(data, match):
    with pytest.raises(LinkError, match=match):
        Manifest.parse(data)


def test_store_root_precedence(tmp_path, monkeypatch):
    monkeypatch.delenv("HEADRACE_MANIFEST_STORE", raising=False)
    monkeypatch.setenv("MX8_MANIFEST_STORE_ROOT", str(tmp_path / "mx8"))
    assert manifest_store_root() == str(tmp_path / "mx8")
    monkeypatch.setenv("HEADRACE_MANIFEST_STORE", str(tmp_path / "hr"))
    assert manifest_store_root() == str(tmp_path / "hr")
    assert manifest_store_root(tmp_path / "kw") == str(tmp_path / "kw")
    monkeypatch.delenv("HEADRACE_MANIFEST_STORE")
    monkeypatch.delenv("MX8_MANIFEST_STORE_ROOT")
    assert manifest_store_root().endswith(os.path.join("headrace", "manifests"))


def test_resolve_pins_layout_and_refresh(folder, tmp_path):
    ms = tmp_path / "ms"
    h = headrace.resolve(folder, store=ms)
    assert len(h) == 64 and h == headrace.resolve_manifest_hash(str(folder) + "/", store=ms)
    snap = snapshot(folder, store=ms)
    assert snap.manifest.keys == ("cat/1.jpg", "cat/2.jpg", "dog/1.jpg", "top.bin")
    assert snap.manifest.class_names == ["cat", "dog"]
    by_hash = ms / "by-hash" / h
    assert hashlib.sha256(by_hash.read_bytes()).hexdigest() == h
    intent = "sha256_" + hashlib.sha256(str(folder).encode()).hexdigest()
    assert (ms / "intent" / intent / "current").read_text() == h
    # A plain link keeps the pinned snapshot after the data changes; @refresh repins.
    (folder / "cat" / "3.jpg").write_bytes(b"new")
    assert headrace.resolve(folder, store=ms) == h
    h2 = headrace.resolve(f"{folder}@refresh", store=ms)
    assert h2 != h and headrace.resolve(folder, store=ms) == h2
    # The older snapshot stays addressable.
    assert headrace.resolve(f"{folder}@sha256:{h}", store=ms) == h
    assert len(snapshot(f"{folder}@sha256:{h}", store=ms).manifest) == 4
    # A non-recursive listing is pinned separately.
    flat = snapshot(folder, store=ms, recursive=False)
    assert flat.manifest.keys == ("top.bin",) and flat.hash not in (h, h2)


def test_same_content_same_hash_anywhere(tmp_path):
    files = {"a/x": b"1", "b/y": b"22"}
    a, b = _tree(tmp_path / "one", files), _tree(tmp_path / "two", files)
    for p in (a, b):  # same mtimes too: the hash covers size and mtime
        for f in p.rglob("*"):
            if f.is_file():
                os.utime(f, ns=(1_000_000_000, 1_000_000_000))
    assert headrace.resolve(a, store=tmp_path / "ms") == headrace.resolve(b, store=tmp_path / "ms")


def test_unknown_pinned_hash_fails_clearly(folder, tmp_path):
    with pytest.raises(LinkError, match="manifest not found: " + "0" * 64):
        headrace.resolve(f"{folder}@sha256:{'0' * 64}", store=tmp_path / "ms")
    with pytest.raises(LinkError, match="64 lowercase hex"):
        headrace.resolve(f"{folder}@sha256:abc", store=tmp_path / "ms")


def test_damaged_manifest_is_detected(folder, tmp_path):
    ms = tmp_path / "ms"
    h = headrace.resolve(folder, store=ms)
    (ms / "by-hash" / h).write_bytes(b"headrace-manifest\tversion=1\tkind=objects\n")
    with pytest.raises(LinkError, match="damaged"):
        headrace.resolve(f"{folder}@sha256:{h}", store=ms)


@pytest.mark.parametrize("make, match", [
    (lambda p: p, "does not exist"),
    (lambda p: (p.mkdir(), p)[1], "holds no files"),
    (lambda p: (p.write_bytes(b"x"), p)[1], "not a directory"),
])
def test_bad_bases(tmp_path, make, match):
    with pytest.raises(LinkError, match=match):
        headrace.resolve(make(tmp_path / "base"), store=tmp_path / "ms")


def test_store_base_is_pinned_by_committed_state(tmp_path):
    d = tmp_path / "st"
    d.mkdir()
    (d / "meta.json").write_text('{"format": "headrace-store", "version": 1, "length": 7,'
                                 ' "generation": 1, "commit": 3}')
    snap = snapshot(d, store=tmp_path / "ms")
    assert snap.manifest.kind == "store" and snap.manifest.store == {
        "length": 7, "generation": 1, "commit": 3}


def _resolve_in_child(args):
    folder, ms = args
    return headrace.resolve(folder, store=ms)


def test_concurrent_processes_pin_one_snapshot(folder, tmp_path):
    ms = str(tmp_path / "ms")
    with multiprocessing.get_context("spawn").Pool(3) as pool:
        hashes = pool.map(_resolve_in_child, [(str(folder), ms)] * 6)
    assert len(set(hashes)) == 1
    assert os.listdir(os.path.join(ms, "by-hash")) == [hashes[0]]


def test_manifest_store_put_is_idempotent_and_atomic(tmp_path):
    st = ManifestStore(tmp_path)
    m = Manifest.from_objects([("a", 1, "", 0)])
    h = st.put(m)
    t = os.stat(tmp_path / "by-hash" / h).st_mtime_ns
    time.sleep(0.01)
    assert st.put(m) == h and os.stat(tmp_path / "by-hash" / h).st_mtime_ns == t
    assert not [n for n in os.listdir(tmp_path / "by-hash") if n.startswith(".tmp")]
    assert st.get(h).keys == ("a",)


def test_unknown_options_are_refused(folder, tmp_path):
    with pytest.raises(headrace.ConfigError, match=r"unknown options \['node'\]"):
        headrace.resolve(folder, store=tmp_path / "ms", node="x")
