"""Flipped bits: every flip in record bytes is caught by gather and by verify, with the record id."""

import os
import random
import shutil

import numpy as np
import pytest

import headrace
from headrace._store import format as _format

N = 40
FIELDS = {"x": {"dtype": "uint8", "shape": [8]}, "b": "bytes",
          "z": {"dtype": "bytes", "codec": "zstd"}, "l": {"dtype": "int64", "codec": "lz4"},
          "d": {"dtype": "float32", "shape": None, "codec": "deflate"}}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    path = tmp_path_factory.mktemp("corrupt") / "base"
    rng = np.random.default_rng(0)
    with headrace.create(path, fields=FIELDS, chunk_mb=0.0005) as w:
        w.append({"x": rng.integers(0, 256, (N, 8), dtype=np.uint8),
                  "b": [rng.integers(0, 256, int(k), dtype=np.uint8).tobytes()
                        for k in rng.integers(1, 40, N)],
                  "z": [rng.integers(0, 4, int(k), dtype=np.uint8).tobytes()
                        for k in rng.integers(1, 60, N)],
                  "l": rng.integers(-(2**60), 2**60, N),
                  "d": [rng.standard_normal(int(k)).astype(np.float32)
                        for k in rng.integers(1, 9, N)]})
    s = headrace.open(path)
    return path, s.gather(np.arange(N))


def _copy(base, tmp_path):
    dst = tmp_path / "s"
    shutil.copytree(base, dst)
    return dst


def _flip(path, offset, bit):
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ (1 << bit)]))


def _owner(path, field, chunk_id, pos):
    s = headrace.open(path)
    fe = next(f for f in s.meta.fields if f.spec.name == field)
    ent = np.fromfile(os.path.join(path, fe.index), _format.INDEX_DTYPE)
    hit = np.flatnonzero((ent["chunk"] == chunk_id) & (ent["offset"] <= pos)
                         & (pos < ent["offset"] + ent["length"]) & (ent["length"] > 0))
    return hit.tolist()


@pytest.mark.parametrize("seed", range(3))
def test_chunk_bit_flips_are_detected(base, tmp_path, seed):
    base_path, _want = base
    rng = random.Random(seed)
    for trial in range(25):
        path = _copy(base_path, tmp_path / f"{trial}")
        meta = headrace.open(path).meta
        chunk = rng.choice(meta.chunks)
        pos = rng.randrange(chunk.size)
        _flip(os.path.join(path, _format.chunk_name(chunk.id)), pos, rng.randrange(8))
        owners = _owner(path, chunk.field, chunk.id, pos)
        assert len(owners) == 1  # no dead bytes in this store: every chunk byte is a record's
        rid = owners[0]
        s = headrace.open(path)
        with pytest.raises(headrace.CorruptionError) as e:
            s.gather(np.arange(N), fields=chunk.field)
        assert e.value.field == chunk.field and e.value.record_ids == [rid]
        assert f"field {chunk.field!r}" in str(e.value) and str(rid) in str(e.value)
        # verify="always" catches it on every read, not only the first
        s2 = headrace.open(path, verify="always")
        for _ in range(2):
            with pytest.raises(headrace.CorruptionError):
                s2.gather([rid], fields=chunk.field)
        others = [i for i in range(N) if i != rid]
        s.gather(others)  # the other records still read
        report = headrace.verify(path)
        assert not report.ok and report.bad == {chunk.field: [rid]}


@pytest.mark.parametrize("kind", ["index", "aux"])
def test_index_and_aux_bit_flips_never_return_wrong_bytes(base, tmp_path, kind):
    base_path, want = base
    rng = random.Random(kind)
    detected = 0
    for trial in range(40):
        path = _copy(base_path, tmp_path / f"{trial}")
        meta = headrace.open(path).meta
        fe = rng.choice(meta.fields)
        name = fe.spec.name
        size = _format.INDEX_DTYPE.itemsize if kind == "index" else _format.AUX_DTYPE.itemsize
        rid = rng.randrange(N)
        _flip(os.path.join(path, getattr(fe, kind)), rid * size + rng.randrange(size),
              rng.randrange(8))
        s = headrace.open(path)
        report = headrace.verify(path)
        try:
            got = s.gather([rid], fields=name)[name]
        except headrace.CorruptionError as e:
            assert e.record_ids == [rid] and e.field == name
            assert report.bad == {name: [rid]}
            detected += 1
            continue
        # not detected: then the flip did not change what the record reads as
        one = want[name][rid:rid + 1] if not isinstance(want[name], headrace.Ragged) else None
        if one is not None:
            assert np.array_equal(got, one)
        else:
            assert np.array_equal(got[0], want[name][rid])
        assert report.ok
    assert detected >= 30  # nearly every flip changes what the entry says


def test_flip_in_uncommitted_tail_is_harmless(base, tmp_path):
    path = _copy(base[0], tmp_path)
    with open(os.path.join(path, "b.index"), "ab") as f:
        f.write(b"\xff" * 16)  # an entry past N, as a crashed append would leave
    assert headrace.verify(path).ok
    assert len(headrace.open(path)) == N


@pytest.mark.parametrize("codec", ["zstd", "lz4", "deflate"])
@pytest.mark.parametrize("delta", [-1, 1])
def test_wrong_decoded_size_is_caught_without_checksums(tmp_path, codec, delta):
    # verify="never" skips checksums; a decoded size that disagrees with the aux file must still
    # fail loudly instead of returning a short or overlong record
    path = tmp_path / "s"
    with headrace.create(path, fields={"b": {"dtype": "bytes", "codec": codec}}) as w:
        w.append({"b": [bytes(range(256)) * 100, b"abc" * 10]})
    aux = np.fromfile(path / "b.aux", _format.AUX_DTYPE)
    aux[0]["nbytes"] = int(aux[0]["nbytes"]) + delta
    aux.tofile(path / "b.aux")
    s = headrace.open(path, verify="never")
    with pytest.raises(headrace.CorruptionError, match=r"record ids \[0\]"):
        s.gather([1, 0])
    assert s.gather([1])["b"][0].tobytes() == b"abc" * 10
    assert headrace.verify(path).bad == {"b": [0]}


def test_verify_first_checks_each_record_once_per_generation(tmp_path):
    path = tmp_path / "s"
    w = headrace.create(path, fields={"b": "bytes"})
    w.append({"b": [b"aaaa", b"bbbb"]})
    w.commit()
    s = headrace.open(path)  # verify="first"
    s.gather([0, 1])
    chunk = path / "chunks" / "0.zr"
    _flip(chunk, 0, 0)  # damage record 0 AFTER this process verified it
    assert headrace.open(path).gather([1])["b"][0].tobytes() == b"bbbb"
    with pytest.raises(headrace.CorruptionError):
        headrace.open(path).gather([0])  # a fresh reader checks it
    w.append({"b": [b"cccc"]})
    w.commit()
    assert s.refresh() and len(s) == 3
    s.gather([0, 2])  # same generation: record 0 stays verified, record 2 is checked
    w.modify(1, {"b": b"dddd"})
    w.commit()
    s.refresh()  # a new generation: everything is checked again
    with pytest.raises(headrace.CorruptionError, match=r"record ids \[0\]"):
        s.gather([0])
    w.close()
