"""verify="first" over a sequential layout: records verified in spans once a field was read N
times over, and consecutive ids read as one copy of their run; both give the bytes a take would."""

import numpy as np
import pytest

import headrace

N = 400
ROW = 4096  # 64 KiB spans hold 16 records


def _make(path, chunk_mb=64.0):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (N, ROW), dtype=np.uint8)
    with headrace.create(path, fields={"x": {"dtype": "uint8", "shape": [ROW]}},
                         chunk_mb=chunk_mb) as w:
        w.append({"x": x})
    return x


def _damage(path, rid):
    s = headrace.open(path, verify="never")
    ent = s._st.fields["x"].index[rid]
    chunk = path / "chunks" / f"{int(ent['chunk'])}.zr"
    with open(chunk, "r+b") as f:
        f.seek(int(ent["offset"]) + 5)
        b = f.read(1)[0]
        f.seek(int(ent["offset"]) + 5)
        f.write(bytes([b ^ 1]))


def test_draws_with_replacement_verify_every_record_in_about_one_more_pass(tmp_path):
    x = _make(tmp_path / "s")
    s = headrace.open(tmp_path / "s")
    rng = np.random.default_rng(1)
    for _ in range(2 * N // 32):  # two passes' worth of draws: some records never drawn
        ids = rng.integers(0, N, 32)
        assert np.array_equal(s.gather(ids)["x"], x[ids])
    # every record got checked: those drawn on the copy, the rest in the spans around them
    assert s._st.verified.count["x"] == N
    assert np.array_equal(s.gather(np.arange(N))["x"], x)


def test_a_damaged_neighbour_raises_only_when_asked_for(tmp_path):
    x = _make(tmp_path / "s")
    _damage(tmp_path / "s", 7)
    s = headrace.open(tmp_path / "s")
    others = np.array([i for i in range(N) if i != 7])
    for _ in range(3):  # past N reads: spans are checked, record 7's among them
        assert np.array_equal(s.gather(others)["x"], x[others])
    assert s._st.verified.count["x"] == N - 1  # its span was checked; record 7 failed
    with pytest.raises(headrace.CorruptionError) as e:
        s.gather([6, 7, 8])
    assert e.value.record_ids == [7]


@pytest.mark.parametrize("verify", ["first", "always", "never"])
def test_consecutive_ids_read_as_their_run(tmp_path, verify):
    x = _make(tmp_path / "s", chunk_mb=0.1)  # several chunks: runs cross chunk boundaries
    with headrace.open(tmp_path / "s", mode="a") as w:
        w.modify(3, {"x": np.full(ROW, 9, np.uint8)})  # a second run with another shift
        w.compact()
    x[3] = 9
    s = headrace.open(tmp_path / "s", verify=verify)
    for _ in range(2):  # the first pass verifies, the second is the steady state
        for a in range(0, N, 48):
            got = s.gather(np.arange(a, min(N, a + 48)))["x"]
            assert np.array_equal(got, x[a:a + 48])
    assert np.array_equal(s.gather([5, 6, 6, 7])["x"], x[[5, 6, 6, 7]])  # not a run
    assert np.array_equal(s.gather([7, 6, 5, 4])["x"], x[[7, 6, 5, 4]])
    assert np.array_equal(s.gather([4, 6, 5, 7])["x"], x[[4, 6, 5, 7]])  # spans 3, not a run


@pytest.mark.parametrize("block", [1, 3, 7, 1 << 15])
def test_layout_scan_in_blocks_finds_the_same_runs(tmp_path, monkeypatch, block):
    from headrace._store import snapshot

    rng = np.random.default_rng(2)
    x = rng.integers(0, 256, (50, 8), dtype=np.uint8)
    with headrace.create(tmp_path / "s", fields={"x": {"dtype": "uint8", "shape": [8]}},
                         chunk_mb=0.0001) as w:  # a chunk every few records: many runs
        for a in range(0, 50, 10):
            w.append({"x": x[a:a + 10]})
            w.commit()
    whole = snapshot.sequential_layout(headrace.open(tmp_path / "s")._st, "x")
    monkeypatch.setattr(snapshot, "_SCAN_BLOCK", block)
    s = headrace.open(tmp_path / "s")
    got = snapshot.sequential_layout(s._st, "x")
    assert whole is not None and got is not None and len(whole.starts) > 1
    assert np.array_equal(got.starts, whole.starts) and np.array_equal(got.shifts, whole.shifts)
    ids = rng.integers(0, 50, 64)
    assert np.array_equal(s.gather(ids)["x"], x[ids])
