"""A batch's rows checksummed in one call: the same crc32c as google_crc32c, with or without C;
a damaged record among verified ones is still caught on its first read."""

import os

import google_crc32c
import numpy as np
import pytest

import headrace
from headrace._store import crc_rows
from headrace._store import format as _format

# The install builds the extension (setup.py); the suite runs on what users get, so a missing build
# fails here instead of passing on the fallback alone.
NOT_BUILT = "headrace._store._crcrows was not built: `pip install -e .` with a C compiler builds it"


@pytest.fixture(params=["c", "python"])
def path_kind(request, monkeypatch):
    if request.param == "c":
        assert crc_rows.accelerated(), NOT_BUILT
    else:
        monkeypatch.setattr(crc_rows, "_c_rows", None)
    return request.param


@pytest.mark.parametrize("row_bytes", [0, 1, 7, 8, 9, 24, 3072, 3075])
def test_rows_match_google_crc32c(path_kind, row_bytes):
    rng = np.random.default_rng(row_bytes)
    rows = rng.integers(0, 256, (37, row_bytes), dtype=np.uint8)
    for pos in (np.arange(37), rng.integers(0, 37, 11), np.zeros(0, np.int64),
                np.array([5, 5, 5, 0])):
        got = crc_rows.crc32c_rows(rows, pos)
        assert got.dtype == np.uint32 and got.flags.writeable
        assert got.tolist() == [google_crc32c.value(rows[j].tobytes()) for j in pos.tolist()]


def test_multi_dim_rows(path_kind):
    rows = np.arange(5 * 4 * 3, dtype=np.float32).reshape(5, 4, 3)
    got = crc_rows.crc32c_rows(rows, np.array([4, 1]))
    assert got.tolist() == [google_crc32c.value(rows[j].tobytes()) for j in (4, 1)]


def test_out_of_range_row_is_refused():
    assert crc_rows.accelerated(), NOT_BUILT
    from headrace._store._crcrows import rows as c_rows

    with pytest.raises(IndexError, match="outside"):
        c_rows(np.zeros((3, 4), np.uint8), 4, np.array([3], np.int64))


def test_damaged_record_among_verified_ones_is_caught(path_kind, tmp_path):
    n, rec = 64, 16
    x = np.arange(n * rec, dtype=np.uint8).reshape(n, rec)
    with headrace.create(tmp_path / "s", fields={"x": {"dtype": "uint8", "shape": [rec]}}) as w:
        w.append({"x": x})
    s = headrace.open(tmp_path / "s")
    fe = s.meta.fields[0]
    ent = np.fromfile(os.path.join(tmp_path / "s", fe.index), _format.INDEX_DTYPE)
    victim = 41
    chunk = os.path.join(tmp_path / "s", _format.chunk_name(int(ent["chunk"][victim])))
    # verify every record but the victim, then damage it on disk (the mapping sees the write)
    s.gather(np.array([i for i in range(n) if i != victim]))
    with open(chunk, "r+b") as f:
        f.seek(int(ent["offset"][victim]) + 3)
        b = f.read(1)[0]
        f.seek(int(ent["offset"][victim]) + 3)
        f.write(bytes([b ^ 0x10]))
    with pytest.raises(headrace.CorruptionError) as info:
        s.gather(np.array([3, victim, 7]))
    assert info.value.record_ids == [victim]
    assert s.gather(np.array([3, 7]))["x"].tolist() == x[[3, 7]].tolist()


@pytest.mark.parametrize("kind", ["c", "python"])
def test_verified_bitmap_same_in_c_and_numpy(kind, monkeypatch):
    from headrace._store import snapshot

    if kind == "python":
        monkeypatch.setattr(snapshot, "_c_mark", None)
        monkeypatch.setattr(snapshot, "_c_unset", None)
    else:
        assert snapshot._c_mark is not None, NOT_BUILT
    n = 1003
    v = snapshot.Verified(["x"], n)
    rng = np.random.default_rng(1)
    seen: set[int] = set()
    for _ in range(40):
        ids = rng.integers(0, n, 64)  # repeats within a batch count once
        todo = v.todo("x", ids)
        assert todo.tolist() == [j for j, i in enumerate(ids.tolist()) if i not in seen]
        v.mark("x", ids[todo])
        seen.update(ids.tolist())
        assert v.count["x"] == len(seen)
    v.mark("x", np.arange(n, dtype=np.int64))
    assert v.count["x"] == n and not len(v.todo("x", np.arange(n, dtype=np.int64)))


def test_bitmap_refuses_ids_outside():
    from headrace._store import snapshot

    assert snapshot._c_mark is not None, NOT_BUILT
    with pytest.raises(IndexError, match="outside"):
        snapshot._c_mark(np.zeros(2, np.uint8), np.array([16], np.int64))
    with pytest.raises(IndexError, match="outside"):
        snapshot._c_unset(np.zeros(2, np.uint8), np.array([-1], np.int64))
