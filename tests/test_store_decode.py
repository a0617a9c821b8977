"""Batched decoding in gathers: many records over several chunks, absent records mixed in, zstd
records above the batch-decode size limit, and damaged records found inside a batch."""

import itertools
import shutil

import numpy as np
import pytest

import headrace
from headrace._store import format as _format
from headrace._store import reader as _store

CODECS = ["raw", "zstd", "lz4", "deflate"]
N = 300


def _records(rng, n):
    """Compressible ragged records: mostly small, a few above the batch-decode limit, some absent."""
    sizes = rng.integers(1, 3000, n)
    sizes[rng.choice(n, 6, replace=False)] = rng.integers(
        _store._DECODE_MANY_MAX_BYTES, 3 * _store._DECODE_MANY_MAX_BYTES, 6)
    recs = [np.repeat(rng.integers(0, 256, -(-int(k) // 7), dtype=np.uint8), 7)[:k].tobytes()
            for k in sizes]
    for j in rng.choice(n, 20, replace=False):
        recs[j] = b""  # absent
    return recs


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    rng = np.random.default_rng(1)
    recs = _records(rng, N)
    fixed = rng.integers(0, 4, (N, 50), dtype=np.int32)
    absent_f = [*range(64, 70), *range(200, 203)]  # appended without "f": reads as zeros
    fixed[absent_f] = 0
    cuts = [0, 30, 64, 70, 128, 200, 203, 250, N]
    out = {}
    for codec in CODECS:
        path = tmp_path_factory.mktemp("decode") / codec
        fields = {"b": {"dtype": "bytes", "codec": codec},
                  "f": {"dtype": "int32", "shape": [50], "codec": codec}}
        with headrace.create(path, fields=fields, chunk_mb=0.01) as w:  # many chunks
            for a, b in itertools.pairwise(cuts):
                batch = {"b": recs[a:b]} if a in absent_f else {"b": recs[a:b], "f": fixed[a:b]}
                w.append(batch)
            w.commit()
        out[codec] = path
    return out, recs, fixed


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("verify", ["first", "always", "never"])
def test_gather_matches_records_across_chunks(stores, codec, verify):
    paths, recs, fixed = stores
    s = headrace.open(paths[codec], verify=verify)
    assert len({c.id for c in s.meta.chunks if c.field == "b"}) > 5
    rng = np.random.default_rng(2)
    for idx in (rng.integers(0, N, 400), np.arange(N), np.array([5]), np.array([], np.int64)):
        got = s.gather(idx)
        assert got["b"].to_list() == [] or [r.tobytes() for r in got["b"].to_list()] == [
            recs[j] for j in idx.tolist()]
        assert len(got["b"]) == len(idx)
        np.testing.assert_array_equal(got["f"], fixed[idx])


def test_batches_split_and_large_records_decode_in_place(stores, monkeypatch):
    # a small batch limit forces many batch calls; records above the size limit take the
    # in-place path: both must land each record at its own place
    paths, recs, fixed = stores
    monkeypatch.setattr(_store, "_DECODE_MANY_BATCH_BYTES", 5000)
    s = headrace.open(paths["zstd"], verify="never")
    idx = np.random.default_rng(3).permutation(N)
    got = s.gather(idx)
    assert [r.tobytes() for r in got["b"].to_list()] == [recs[j] for j in idx.tolist()]
    np.testing.assert_array_equal(got["f"], fixed[idx])


def _damage_record(path, field, rid):
    s = headrace.open(path, verify="never")
    fe = next(f for f in s.meta.fields if f.spec.name == field)
    ent = np.fromfile(path / fe.index, _format.INDEX_DTYPE)[rid]
    with open(path / _format.chunk_name(int(ent["chunk"])), "r+b") as f:
        f.seek(int(ent["offset"]))
        n = int(ent["length"])
        f.write(bytes(n))  # zeros: not a valid frame/block/stream of the recorded size


@pytest.mark.parametrize("codec", ["zstd", "lz4", "deflate"])
def test_damaged_record_inside_a_batch_is_named(stores, tmp_path, codec):
    paths, recs, _ = stores
    path = tmp_path / codec
    shutil.copytree(paths[codec], path)
    bad = next(j for j in range(40, N) if 0 < len(recs[j]) < 2000)
    _damage_record(path, "b", bad)
    s = headrace.open(path, verify="never")  # no checksums: the decoder must catch it
    idx = np.arange(N)
    with pytest.raises(headrace.CorruptionError, match=rf"record ids \[{bad}\]") as e:
        s.gather(idx, "b")
    assert e.value.record_ids == [bad]
    ok = np.delete(idx, bad)
    assert [r.tobytes() for r in s.gather(ok, "b")["b"].to_list()] == [recs[j] for j in ok]
    with pytest.raises(headrace.CorruptionError, match=rf"record ids \[{bad}\]"):
        headrace.open(path).gather(idx, "b")  # with checksums: caught before decoding


@pytest.mark.parametrize("codec", ["zstd", "lz4", "deflate"])
@pytest.mark.parametrize("size", ["plus_one", "zero"])
def test_wrong_size_inside_a_batch_is_named(stores, tmp_path, codec, size):
    paths, recs, _ = stores
    path = tmp_path / codec
    shutil.copytree(paths[codec], path)
    bad = next(j for j in range(40, N) if 0 < len(recs[j]) < 2000)
    s = headrace.open(path, verify="never")
    fe = next(f for f in s.meta.fields if f.spec.name == "b")
    aux = np.fromfile(path / fe.aux, _format.AUX_DTYPE)
    # 0 is "size unknown" to zstd's batch API: it must still be caught
    aux[bad]["nbytes"] = int(aux[bad]["nbytes"]) + 1 if size == "plus_one" else 0
    aux.tofile(path / fe.aux)
    s = headrace.open(path, verify="never")
    with pytest.raises(headrace.CorruptionError, match=rf"record ids \[{bad}\]"):
        s.gather(np.arange(N), "b")
