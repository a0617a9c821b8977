"""The sequential-layout fast path of fixed-shape raw gathers (no index reads in steady state)."""

from __future__ import annotations

import dataclasses
import os
from types import SimpleNamespace

import numpy as np
import pytest

import headrace
from headrace._store import format as _format
from headrace._store import snapshot as _snapshot


def _make(path, n=3000, rec=1000):
    rng = np.random.default_rng(7)
    x = rng.integers(0, 255, size=(n, rec), dtype=np.uint8)
    y = np.arange(n, dtype=np.int64) * 3
    with headrace.create(path, fields={"x": {"dtype": "uint8", "shape": [rec]},
                                       "y": "int64"}, chunk_mb=1) as w:
        for s in range(0, n, 700):  # several appends and several chunks per field
            w.append({"x": x[s:s + 700], "y": y[s:s + 700]})
    return x, y


def _gather_all_ways(st, x, y, rng):
    for _ in range(20):
        ids = rng.integers(0, len(x), size=257)
        got = st.gather(ids)
        np.testing.assert_array_equal(got["x"], x[ids])
        np.testing.assert_array_equal(got["y"], y[ids])


def test_appended_store_takes_the_sequential_path_and_reads_right(tmp_path):
    x, y = _make(tmp_path / "s")
    rng = np.random.default_rng(0)
    with headrace.open(tmp_path / "s") as st:
        st.gather(np.arange(len(x)))  # first read: checksums and entries verified
        _gather_all_ways(st, x, y, rng)
        layout = st._st.layouts["x"]
        assert layout is not None and len(layout.starts) > 1  # several chunk runs
        assert st._st.layouts["y"] is not None


def test_modified_and_deleted_stores_fall_back_to_the_index(tmp_path):
    x, y = _make(tmp_path / "s")
    x, y = x.copy(), y.copy()
    with headrace.open(tmp_path / "s", mode="a") as w:
        w.modify(5, {"x": np.full(1000, 9, np.uint8), "y": 42})
        w.delete(10)  # the last record moves to id 10
    x[5], y[5] = 9, 42
    x[10], y[10] = x[-1], y[-1]
    x, y = x[:-1], y[:-1]
    rng = np.random.default_rng(1)
    with headrace.open(tmp_path / "s") as st:
        st.gather(np.arange(len(x)))
        _gather_all_ways(st, x, y, rng)
        assert st._st.layouts["x"] is None
    with headrace.open(tmp_path / "s", mode="a") as w:
        w.compact()  # rewritten into fresh chunks (in storage order, not necessarily id order)
    with headrace.open(tmp_path / "s") as st:
        st.gather(np.arange(len(x)))
        _gather_all_ways(st, x, y, rng)


def test_absent_records_are_not_sequential_and_read_as_zeros(tmp_path):
    with headrace.create(tmp_path / "s", fields={"x": {"dtype": "uint8", "shape": [8]},
                                                 "y": "int64"}) as w:
        w.append({"x": np.ones((4, 8), np.uint8), "y": np.arange(4)})
        w.append({"y": np.arange(4, 6)})  # x left out: length-0 entries
    with headrace.open(tmp_path / "s") as st:
        st.gather(np.arange(6))
        got = st.gather([5, 0, 4, 1])
        assert st._st.layouts["x"] is None
        np.testing.assert_array_equal(got["x"][[0, 2]], 0)
        np.testing.assert_array_equal(got["x"][[1, 3]], 1)
        np.testing.assert_array_equal(got["y"], [5, 0, 4, 1])


def test_chunks_of_whole_2mib_spans_map_back_to_back_so_ids_are_rows(tmp_path):
    # 4 KiB records, 2 MiB chunks: every full chunk ends on a 2 MiB boundary, so the chunks map
    # with no gap between them and record i is virtual row i (no shift lookups at all)
    rec, n = 4096, 1300
    x = np.random.default_rng(3).integers(0, 255, size=(n, rec), dtype=np.uint8)
    with headrace.create(tmp_path / "s", fields={"x": {"dtype": "uint8", "shape": [rec]}},
                         chunk_mb=2) as w:
        for s in range(0, n, 300):
            w.append({"x": x[s:s + 300]})
    with headrace.open(tmp_path / "s") as st:
        assert len(st.meta.chunks) == 3  # 512 + 512 + 276 records
        st.gather(np.arange(n))  # first read: checksums and entries verified
        ids = np.random.default_rng(4).integers(0, n, size=500)
        np.testing.assert_array_equal(st.gather(ids)["x"], x[ids])
        layout = st._st.layouts["x"]
        assert layout is not None and layout.identity
        np.testing.assert_array_equal(st._st.vrows["x"][0][:n], x)


def test_parallel_pack_splits_on_whole_chunks_so_ids_stay_rows(tmp_path):
    rec, n = 4096, 1300  # 2 MiB chunks of 512 records: the parts split at record 512
    x = np.random.default_rng(5).integers(0, 255, size=(n, rec), dtype=np.uint8)
    y = np.arange(n, dtype=np.int64)
    headrace.pack_arrays(tmp_path / "s", x=x, y=y, chunk_mb=2, workers=2, progress=False)
    with headrace.open(tmp_path / "s") as st:
        st.gather(np.arange(n))
        ids = np.random.default_rng(6).integers(0, n, size=300)
        got = st.gather(ids)
        np.testing.assert_array_equal(got["x"], x[ids])
        np.testing.assert_array_equal(got["y"], y[ids])
        assert st._st.layouts["x"].identity  # widest field: back to back, as one writer packs it
        # labels: one partial chunk per part, but a small field maps them back to back too
        assert st._st.layouts["y"].identity
        assert sum(c.field == "y" for c in st.meta.chunks) == 2  # really packed in two parts


def test_steady_plan_checks_ids_and_follows_new_commits(tmp_path):
    x, y = _make(tmp_path / "s")
    rng = np.random.default_rng(2)
    st = headrace.open(tmp_path / "s")
    st.gather(np.arange(len(x)))
    _gather_all_ways(st, x, y, rng)  # steady now: the plan for all fields is memoized
    assert st._plans[None].snapshot is st._st
    for bad in ([len(x)], [-1], [3, 10**12]):
        with pytest.raises(headrace.RecordIndexError, match="out of range"):
            st.gather(np.array(bad, np.int64))
    got = st.gather(np.array([4, 2]), (f for f in ["y"]))  # any iterable, used once
    np.testing.assert_array_equal(got["y"], y[[4, 2]])
    got = st.gather(np.array([4, 2]), ["y"])  # a field list gets its own plan
    np.testing.assert_array_equal(got["y"], y[[4, 2]])
    assert list(got) == ["y"]
    with headrace.open(tmp_path / "s", mode="a") as w:  # a new commit: more records, new values
        w.modify(1, {"x": np.full(x.shape[1], 7, np.uint8), "y": -5})
        w.append({"x": x[:3], "y": y[:3]})
    assert st.refresh()
    x2 = np.concatenate([x, x[:3]])
    y2 = np.concatenate([y, y[:3]])
    x2[1], y2[1] = 7, -5
    st.gather(np.arange(len(x2)))
    _gather_all_ways(st, x2, y2, rng)  # modified: read through the index, never a stale plan
    assert st._st.layouts["x"] is None
    st.close()


def _vm_flags(addr: int) -> list[str]:
    """The VmFlags of this process's mapping that holds ``addr`` (Linux ``/proc/self/smaps``)."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(" ", 1)[0]
            if "-" in head and all(c in "0123456789abcdef-" for c in head):
                lo, hi = (int(v, 16) for v in head.split("-"))
                inside = lo <= addr < hi
            elif inside and line.startswith("VmFlags:"):
                return line.split()[1:]
    raise AssertionError(f"no mapping holds {addr:#x}")


def test_raw_fields_ask_the_kernel_for_2mib_pages(tmp_path):
    x, _ = _make(tmp_path / "s", rec=4096)
    with headrace.open(tmp_path / "s") as st:
        np.testing.assert_array_equal(st.gather(np.arange(len(x)))["x"], x)
        flags = _vm_flags(st._st.vrows["x"][0].ctypes.data)
    # "hg" = MADV_HUGEPAGE on the chunk files' mapping; a kernel built without transparent huge
    # pages has no such switch (and no sysfs entry), and there the advice is simply ignored
    if os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled"):
        assert "hg" in flags, flags


def test_verify_never_takes_the_same_fast_path_and_still_checks_entries(tmp_path):
    # "never" skips checksums only: the layout scan proves every entry valid, so its gathers
    # take the sequential path and the steady plan like a verified "first" store does
    x, y = _make(tmp_path / "s")
    rng = np.random.default_rng(3)
    with headrace.open(tmp_path / "s", verify="never") as st:
        _gather_all_ways(st, x, y, rng)
        assert st._st.layouts["x"] is not None and st._plans[None].snapshot is st._st
        _gather_all_ways(st, x, y, rng)  # through the plan now
    fe = next(f for f in headrace.open(tmp_path / "s").meta.fields if f.spec.name == "x")
    index = tmp_path / "s" / fe.index
    ent = np.fromfile(index, _format.INDEX_DTYPE)
    chunk = tmp_path / "s" / _format.chunk_name(int(ent[0]["chunk"]))
    with open(chunk, "r+b") as f:  # damage a byte of record 0's data: no checksum looks at it
        f.seek(int(ent[0]["offset"]))
        b = f.read(1)[0]
        f.seek(int(ent[0]["offset"]))
        f.write(bytes([b ^ 1]))
    with headrace.open(tmp_path / "s", verify="never") as st:
        assert st.gather([0])["x"][0, 0] == x[0, 0] ^ 1
    with pytest.raises(headrace.CorruptionError):
        headrace.open(tmp_path / "s").gather([0])  # "first" still catches it
    ent[7]["offset"] = 1 << 40  # record 7's entry points far outside its chunk
    ent.tofile(index)
    with headrace.open(tmp_path / "s", verify="never") as st:
        with pytest.raises(headrace.CorruptionError, match=r"\[7\]"):
            st.gather([3, 7])
        assert st._st.layouts["x"] is None  # the scan refused the layout: the index path checks


def _scans(st, name, f=None):
    """The C scan and the NumPy one on field ``name`` (or a doctored copy ``f`` of it): they
    agree, and the result is returned."""
    snap = st._st
    f = f or snap.fields[name]
    vrows, vstart, _small = snap.vrows[name]
    n = len(f.index)
    want = _snapshot._scan_layout(snap, f, vrows, vstart, n)
    got = _snapshot._scan_layout_c(snap, f, vrows, vstart, n)
    assert (got is None) == (want is None)
    if want is not None:
        np.testing.assert_array_equal(got.starts, want.starts)
        np.testing.assert_array_equal(got.shifts, want.shifts)
    return got


def test_the_c_layout_scan_agrees_with_numpy_on_good_and_broken_indexes(tmp_path):
    assert _snapshot._c_scan is not None  # built by the install (setup.py)
    _make(tmp_path / "s")
    with headrace.open(tmp_path / "s") as st:
        assert _scans(st, "x") is not None and _scans(st, "y") is not None
        f = st._st.fields["x"]
        rec = f.rec

        def doctored(edit):
            ent, aux = f.index_u4.copy(), f.aux_u4.copy()
            edit(ent, aux)
            return dataclasses.replace(f, index_u4=ent, aux_u4=aux)

        def swap(ent, aux):
            ent[[10, 11]] = ent[[11, 10]]  # rows no longer rise

        def set_at(col, value, where="ent"):
            def edit(ent, aux):
                (ent if where == "ent" else aux)[20, col] = value
            return edit

        def shift_run(ent, aux):
            ent[100:, 1] += rec  # a gap: a new run starts at id 100 (still valid)
            ent[-1, 1] = ent[-2, 1] + rec

        breaks = [swap, set_at(3, rec - 1), set_at(1, int(f.index_u4[20, 1]) + 1),
                  set_at(1, 0xFFFFFFF0), set_at(0, 99), set_at(1, rec - 1, "aux")]
        for edit in breaks:
            assert _scans(st, "x", doctored(edit)) is None, edit
        _scans(st, "x", doctored(shift_run))
    with headrace.open(tmp_path / "s", mode="a") as w:
        w.modify(5, {"x": np.full(1000, 9, np.uint8), "y": 42})
    with headrace.open(tmp_path / "s") as st:
        assert _scans(st, "x") is None
    with headrace.open(tmp_path / "s", mode="a") as w:
        w.compact()
    with headrace.open(tmp_path / "s") as st:
        _scans(st, "x")
        _scans(st, "y")


def test_the_c_layout_scan_maps_sparse_chunk_ids_as_numpy_does():
    # three chunks with ids 3, 7, 9 (a sparse table: slots are positions in chunk_ids), 40
    # records of 16 bytes, 10 + 20 + 10 of them; chunk 7 starts its rows 5 rows after chunk 3 ends
    rec, per = 16, [10, 20, 10]
    ids = np.array([3, 7, 9], np.int64)
    vstart = np.array([0, 15, 35], np.int64)
    ent = np.zeros((40, 4), np.uint32)
    ent[:, 0] = np.repeat(ids, per)
    ent[:, 1] = np.concatenate([np.arange(k) * rec for k in per])
    ent[:, 3] = rec
    aux = np.zeros((40, 2), np.uint32)
    aux[:, 1] = rec
    st = SimpleNamespace(chunk_ids=ids, chunk_size=np.array(per, np.int64) * rec,
                         limits={"x": np.array([*per, 0], np.int64) * rec})
    vrows = np.zeros((45, rec), np.uint8)

    def both(ent):
        f = SimpleNamespace(index_u4=ent, aux_u4=aux, rec=rec, spec=SimpleNamespace(name="x"))
        want = _snapshot._scan_layout(st, f, vrows, vstart, 40)
        got = _snapshot._scan_layout_c(st, f, vrows, vstart, 40)
        assert (got is None) == (want is None)
        return got, want

    got, want = both(ent)
    assert got.starts.tolist() == want.starts.tolist() == [0, 10]
    assert got.shifts.tolist() == want.shifts.tolist() == [0, 0, 5]
    unknown = ent.copy()
    unknown[30, 0] = 8  # names no chunk
    assert both(unknown) == (None, None)
