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


@pytest.fixture(params=["c", "c-crc32", "python"])
def path_kind(request, monkeypatch):
    if request.param.startswith("c"):
        assert crc_rows.accelerated(), NOT_BUILT
        if request.param == "c-crc32":  # no carry-less-multiply folds, where the CPU has them
            from headrace._store import _crcrows

            before = _crcrows.set_folds(False)
            request.addfinalizer(lambda: _crcrows.set_folds(before))
    else:
        from headrace._store import reader

        monkeypatch.setattr(crc_rows, "_c_rows", None)
        monkeypatch.setattr(reader, "take_checked", None)  # the fused gather is C only
    return request.param


# 255..513 and up: around where rows switch to the carry-less-multiply folds and their 256- and
# 64-byte steps (on a CPU with AVX-512 VPCLMULQDQ; elsewhere the crc32 instruction's path again)
@pytest.mark.parametrize("row_bytes", [0, 1, 7, 8, 9, 24, 255, 256, 257, 319, 320, 383, 511, 512,
                                       513, 3072, 3075, 70_001])
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


def _rows_and_aux(n, rec, seed):
    rng = np.random.default_rng(seed)
    src = rng.integers(0, 256, (n, rec), dtype=np.uint8)
    aux = np.zeros((n, 2), np.uint32)
    aux[:, 0] = [google_crc32c.value(r.tobytes()) for r in src]
    aux[:, 1] = rec
    return src, aux


@pytest.fixture(params=[True, False], ids=["folds", "crc32"])
def folds(request):
    """take_checked with and without the carry-less-multiply folds (where the CPU has them)."""
    assert crc_rows.take_checked is not None, NOT_BUILT
    from headrace._store import _crcrows

    before = _crcrows.set_folds(request.param)
    yield request.param
    _crcrows.set_folds(before)


@pytest.mark.parametrize("rec", [1, 8, 100, 256, 3072, 3075, 70_001])
def test_take_checked_copies_rows_and_checks_the_unverified_ones(rec, folds):
    n = 200
    src, aux = _rows_and_aux(n, rec, rec)
    damaged = [7, 50, 51]
    aux[damaged, 0] ^= 1
    bits = np.zeros((n + 7) // 8, np.uint8)
    bits[0] = 0xFF  # records 0-7 verified before (7's damage is then not looked for again)
    rng = np.random.default_rng(1)
    ids = np.concatenate([rng.integers(0, n, 150), [50, 7, 51, 50]]).astype(np.int64)
    rows = (n - 1 - ids).astype(np.int64)  # any id -> row map: here reversed
    src_by_id = src[::-1].copy()
    out = np.empty((len(ids), rec), np.uint8)
    new, bad = crc_rows.take_checked(src_by_id.reshape(-1), rec, rows, ids, aux, bits, out)
    bad = np.frombuffer(bad, np.int64)
    assert np.array_equal(out, src[ids])
    want_bad = [j for j, i in enumerate(ids.tolist()) if i in (50, 51)]
    assert bad.tolist() == want_bad
    good = {i for i in ids.tolist() if i >= 8 and i not in damaged}
    assert new == len(good)  # a record read twice is counted once
    marked = {i for i in range(n) if bits[i >> 3] >> (i & 7) & 1}
    assert marked == good | set(range(8))
    # everything good is verified now: nothing new, the damaged ones still caught
    new, bad = crc_rows.take_checked(src_by_id.reshape(-1), rec, rows, ids, aux, bits, out)
    assert new == 0 and np.frombuffer(bad, np.int64).tolist() == want_bad
    # no bitmap ("always"): every row is checked (read once, copied as it is checksummed where
    # the folds run), record 7 too
    out[:] = 0
    new, bad = crc_rows.take_checked(src_by_id.reshape(-1), rec, rows, ids, aux, None, out)
    assert new == 0 and np.array_equal(out, src[ids])
    assert np.frombuffer(bad, np.int64).tolist() == [j for j, i in enumerate(ids.tolist())
                                                     if i in damaged]


def test_take_checked_refuses_rows_ids_and_outputs_outside():
    assert crc_rows.take_checked is not None, NOT_BUILT
    src, aux = _rows_and_aux(10, 4, 0)
    bits = np.zeros(2, np.uint8)
    out = np.empty((2, 4), np.uint8)
    ok = np.array([0, 1], np.int64)
    with pytest.raises(IndexError, match="row 10 is outside"):
        crc_rows.take_checked(src.reshape(-1), 4, np.array([0, 10]), ok, aux, bits, out)
    with pytest.raises(IndexError, match="record -1 is outside"):
        crc_rows.take_checked(src.reshape(-1), 4, ok, np.array([0, -1]), aux, bits, out)
    with pytest.raises(ValueError, match="out holds 4 bytes"):
        crc_rows.take_checked(src.reshape(-1), 4, ok, ok, aux, bits, out[:1])
    ro = bits.copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):  # a bitmap that cannot be marked
        crc_rows.take_checked(src.reshape(-1), 4, ok, ok, aux, ro, out)


def test_threads_verifying_at_once_count_every_record_once(tmp_path):
    """Four threads read overlapping batches of a fresh store: each record is counted verified
    once (bits sharing a byte are set atomically), so the steady read starts exactly when every
    record was checked, and every batch holds the stored bytes."""
    import threading

    n, rec = 5000, 24
    x = np.random.default_rng(2).integers(0, 256, (n, rec), dtype=np.uint8)
    with headrace.create(tmp_path / "s", fields={"x": {"dtype": "uint8", "shape": [rec]}}) as w:
        w.append({"x": x})
    s = headrace.open(tmp_path / "s")
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def read(seed):
        rng = np.random.default_rng(seed)
        try:
            start.wait()
            for _ in range(60):
                ids = np.sort(rng.integers(0, n, 97))
                got = s.gather(ids)["x"]
                if not np.array_equal(got, x[ids]):
                    raise AssertionError(f"wrong bytes for {ids[:5]}...")
        except BaseException as e:  # reported below, in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=read, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    ver = s._st.verified
    bits = np.unpackbits(ver.bits["x"], bitorder="little")[:n]
    assert ver.count["x"] == int(bits.sum())
    assert np.array_equal(s.gather(np.arange(n))["x"], x)
    assert ver.count["x"] == n


def test_unset_answers_stay_whole_while_another_thread_marks():
    """``unset`` lists the not-yet-verified positions of a batch while take_checked, which runs
    without the GIL, marks bits in another thread: each answer must be positions of the batch in
    increasing order (a count taken before the bits changed once left unwritten tail entries)."""
    import threading

    from headrace._store import snapshot

    assert crc_rows.take_checked is not None, NOT_BUILT
    n, rec = 4096, 256
    src, aux = _rows_and_aux(n, rec, 3)
    ids = np.arange(n, dtype=np.int64)
    out = np.empty((n, rec), np.uint8)
    bits = np.zeros((n + 7) // 8, np.uint8)
    done = threading.Event()
    problems: list[str] = []

    def ask():
        while not done.is_set():
            pos = np.frombuffer(snapshot._c_unset(bits, ids), np.int64)
            if len(pos) and (pos.min() < 0 or pos.max() >= n or np.any(np.diff(pos) <= 0)):
                problems.append(f"unset returned {pos[:8]}... for a batch of {n}")
                return

    asker = threading.Thread(target=ask)
    asker.start()
    try:
        for _ in range(40):
            bits[:] = 0
            crc_rows.take_checked(src.reshape(-1), rec, ids, ids, aux, bits, out)
    finally:
        done.set()
        asker.join()
    assert not problems, problems[0]
