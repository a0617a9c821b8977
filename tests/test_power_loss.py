"""Durability as power loss, not process death: every tree a power cut may leave reopens correctly.

``_crashsim.PowerLoss`` records the file operations of a workload and rebuilds, for every instant,
the trees a power cut there may leave (unsynced bytes lost or kept, renames and creates kept only
once their directory was synced, or not). Each tree is reopened:

* the store opens at the last acknowledged commit or at the one in progress, never anything else,
  with exactly that commit's records; the writer's recovery accepts it and a new commit works;
* a pinned manifest is never lost once ``publish`` returned, and a pin never names a missing or
  torn manifest;
* the byte cache returns whole entries or misses, and stays under its hard limit afterwards.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

import headrace
from _crashsim import PowerLoss
from headrace._remote import cache as _cache
from headrace._remote.cache import ByteCache
from headrace._remote.manifest import Manifest, ManifestStore

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(not sys.platform.startswith("linux"),
                                 reason="the recorder reads /proc/self/fd")]


@pytest.fixture
def cuts(tmp_path):
    """Where the trees a cut leaves are rebuilt: tmpfs when there is one (reopening them fsyncs
    hundreds of times, which tmpfs makes free), else the test's tmp_path."""
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK):
        with tempfile.TemporaryDirectory(dir=shm, prefix="headrace-cuts-") as d:
            yield Path(d)
    else:
        yield tmp_path / "cuts"


def _records(path):
    st = headrace.open(path)
    try:
        n = len(st)
        return st.commit_id, [(st.record(i, "b").tobytes(), int(st.record(i, "n")))
                              for i in range(n)]
    finally:
        st.close()


def _writer_workload(path, rec):
    """Four commits: appends into a new chunk, appends again, modify + delete (copy-on-write),
    compaction. Returns the records each commit made visible (commit id -> records)."""
    want = {}
    blob = lambda i: bytes([i % 251]) * (300 + 37 * i)  # noqa: E731
    w = headrace.create(path, fields={"b": "bytes", "n": "int64"}, chunk_mb=4 / 1024)
    rec.mark()
    want[0] = []
    w.append({"b": [blob(i) for i in range(6)], "n": np.arange(6)})
    w.commit()
    rec.mark()
    want[1] = [(blob(i), i) for i in range(6)]
    w.append({"b": [blob(i) for i in range(6, 15)], "n": np.arange(6, 15)})
    w.commit()
    rec.mark()
    want[2] = [(blob(i), i) for i in range(15)]
    w.modify(2, {"b": b"changed", "n": np.int64(-2)})
    w.delete(0)  # the last record moves into slot 0
    w.commit()
    rec.mark()
    cur = [(blob(i), i) for i in range(15)]
    cur[2] = (b"changed", -2)
    cur[0] = cur.pop()
    want[3] = cur
    w.compact()
    w.commit()
    rec.mark()
    want[4] = list(cur)
    w.close()
    return want


def test_store_commits_survive_power_loss_at_every_instant(tmp_path, cuts):
    root = tmp_path / "disk"
    root.mkdir()
    with PowerLoss(root) as rec:
        want = _writer_workload(str(root / "s"), rec)
    assert _records(root / "s") == (4, want[4])
    checked = 0
    for k, state in enumerate(rec.states()):
        d = state.materialize(cuts / f"cut{k}")
        acked = state.marks - 1  # commit id acknowledged when the cut came (-1: create() unfinished)
        where = f"power cut after {state.label!r} (acknowledged commit {acked})"
        if acked < 0 and not (d / "s" / "meta.json").exists():
            continue  # create() had not returned: no store yet is a correct outcome
        try:
            commit, records = _records(d / "s")
        except headrace.HeadraceError as e:
            raise AssertionError(f"{where}: the store does not open: {e}") from e
        assert commit in (acked, acked + 1), f"{where}: reopened at commit {commit}"
        assert records == want[commit], f"{where}: commit {commit} has other records"
        with headrace.open(d / "s", mode="a") as w:  # recovery accepts what the cut left
            w.append({"b": [b"after"], "n": np.array([99])})
        commit2, records2 = _records(d / "s")
        assert commit2 == commit + 1 and records2 == [*want[commit], (b"after", 99)], where
        checked += 1
    assert checked > 100  # the workload really was cut at many instants


def test_pinned_manifest_survives_power_loss_at_every_instant(tmp_path, cuts):
    root = tmp_path / "disk"
    root.mkdir()
    m1 = Manifest.from_objects([("a/x.jpg", 10, "e1", 5), ("b/y.jpg", 20, "e2", 6)])
    m2 = Manifest.from_objects([("a/x.jpg", 10, "e1", 5), ("b/z.jpg", 30, "e3", 7)])
    with PowerLoss(root) as rec:
        ms = ManifestStore(root / "m")
        h1 = ms.put(m1)
        ms.publish("sha256_base", h1, base="s3://bkt/base/")
        rec.mark()
        h2 = ms.put(m2)
        ms.publish("sha256_base", h2, base="s3://bkt/base/")
        rec.mark()
    for k, state in enumerate(rec.states()):
        d = state.materialize(cuts / f"cut{k}")
        where = f"power cut after {state.label!r}"
        ms = ManifestStore(d / "m")
        pinned = ms.current("sha256_base")
        allowed = {0: {None, h1}, 1: {h1, h2}, 2: {h2}}[state.marks]
        assert pinned in allowed, f"{where}: pinned {pinned}"
        if pinned is not None:
            got = ms.get(pinned)  # never "not found" or "damaged"
            assert got.keys == (m1 if pinned == h1 else m2).keys, where


def test_byte_cache_returns_whole_entries_or_misses_after_power_loss(tmp_path, cuts,
                                                                    monkeypatch):
    root = tmp_path / "disk"
    root.mkdir()
    blobs = {f"k{i}": bytes([65 + i]) * (300 + 50 * i) for i in range(6)}
    cap = 1500
    with PowerLoss(root) as rec:
        c = ByteCache(root / "c", max_bytes=cap)
        for key, data in blobs.items():  # later puts evict earlier ones
            assert c.put(key, data)
            assert c.get(key) == data
            rec.mark()
    boots = iter(range(10**6))
    for k, state in enumerate(rec.states()):
        # a power cut is a reboot: a new boot id for every cache opened on what it left
        monkeypatch.setattr(_cache, "_boot_id", lambda n=next(boots): f"boot-after-cut-{n}")
        d = state.materialize(cuts / f"cut{k}")
        where = f"power cut after {state.label!r}"
        c = ByteCache(d / "c", max_bytes=cap)
        for key, data in blobs.items():
            got = c.get(key)
            assert got is None or got == data, f"{where}: {key} gives {len(got)} wrong bytes"
        for i in range(3):  # the cache keeps its hard limit from here on
            c.put(f"new{i}", b"z" * 700)
            assert c.usage_bytes() <= cap, where
            on_disk = sum(f.stat().st_size for f in (d / "c").glob("??/*")
                          if not f.name.startswith(".tmp-"))
            assert on_disk <= cap, f"{where}: {on_disk} bytes of entries over the {cap} cap"


def test_byte_cache_fills_to_exactly_its_limit(tmp_path):
    c = ByteCache(tmp_path / "c", max_bytes=1000)
    assert c.put("whole", b"w" * 1000)  # an entry of exactly the limit is kept
    assert c.get("whole") == b"w" * 1000 and c.usage_bytes() == 1000
    assert not c.put("over", b"o" * 1001)
    assert c.put("a", b"a" * 600) and c.get("whole") is None  # evicted to make room
    assert c.put("b", b"b" * 400)  # 600 + 400 is exactly the limit: nothing evicted
    assert c.get("a") == b"a" * 600 and c.usage_bytes() == 1000 and c.evictions == 1
    assert c.put("c", b"c")  # one byte more: the least recently used goes
    assert c.get("b") is None or c.get("a") is None
    assert c.usage_bytes() <= 1000
