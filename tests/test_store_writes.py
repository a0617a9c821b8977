"""Writer semantics: modify, delete (swap-with-last), compact, generations, commit and rollback."""

import os

import numpy as np
import pytest

import headrace


def _make(path, n=10, **kw):
    fields = {"x": {"dtype": "int32", "shape": [2]}, "b": {"dtype": "bytes", "codec": "zstd"}}
    w = headrace.create(path, fields=fields, **kw)
    w.append({"x": np.arange(2 * n, dtype=np.int32).reshape(n, 2),
              "b": [f"rec{i}".encode() for i in range(n)]})
    w.commit()
    return w


def _content(path):
    s = headrace.open(path)
    got = s.gather(np.arange(len(s)))
    return got["x"][:, 0].tolist(), [a.tobytes().decode() for a in got["b"].to_list()]


def test_modify_repoints_and_bumps_generation(tmp_path):
    w = _make(tmp_path / "s")
    assert (w.generation, w.commit_id) == (0, 1)
    w.modify(3, {"b": b"new"})
    w.modify(4, {"x": np.array([100, 101], np.int32), "b": b"four"})
    w.commit()
    assert (w.generation, w.commit_id) == (1, 2)
    xs, bs = _content(tmp_path / "s")
    assert xs == [0, 2, 4, 6, 100, 10, 12, 14, 16, 18]
    assert bs[3:5] == ["new", "four"] and bs[2] == "rec2"
    # an append-only commit keeps the generation
    w.append({"b": [b"eleven"]})
    w.commit()
    assert (w.generation, w.commit_id) == (1, 3)
    w.close()
    assert headrace.open(tmp_path / "s").gather([10])["x"].tolist() == [[0, 0]]


def test_delete_swaps_with_last(tmp_path):
    w = _make(tmp_path / "s", n=5)
    w.delete(1)
    assert len(w) == 4
    w.delete(3)  # the last one: just shrinks
    w.commit()
    assert w.generation == 1
    w.close()
    assert _content(tmp_path / "s") == ([0, 8, 4], ["rec0", "rec4", "rec2"])


def test_modify_and_delete_of_uncommitted_records_keep_generation(tmp_path):
    w = _make(tmp_path / "s", n=2)
    w.append({"x": [[50, 51], [60, 61]], "b": [b"a", b"b"]})
    w.modify(3, {"b": b"z"})
    w.delete(2)
    w.commit()
    assert w.generation == 0 and len(w) == 3
    w.close()
    assert _content(tmp_path / "s") == ([0, 2, 60], ["rec0", "rec1", "z"])


def test_compact_reports_utilization_and_drops_dead_bytes(tmp_path):
    w = _make(tmp_path / "s", n=50, chunk_mb=0.0005)
    for i in range(0, 50, 2):
        w.modify(i, {"x": np.array([i + 1000, 0], np.int32), "b": f"m{i}".encode()})
    w.delete(0)
    w.commit()
    before_files = set(os.listdir(tmp_path / "s" / "chunks"))
    reader = headrace.open(tmp_path / "s")
    want = _content(tmp_path / "s")
    u0, u1 = w.compact()
    assert 0 < u0 < 0.8 and u1 == pytest.approx(1.0)
    assert w.utilization() == pytest.approx(1.0)
    assert _content(tmp_path / "s") == want  # not visible before commit
    w.commit()
    assert w.generation == 2
    after_files = set(os.listdir(tmp_path / "s" / "chunks"))
    assert not before_files & after_files  # old chunks deleted after the commit
    assert _content(tmp_path / "s") == want
    # a reader opened before the compaction keeps reading its (unlinked) files
    got = reader.gather(np.arange(len(reader)))
    assert got["x"][:, 0].tolist() == want[0]
    assert reader.refresh() and reader.generation == 2
    w.append({"x": [[7, 7]], "b": [b"after"]})
    w.commit()
    w.close()
    assert _content(tmp_path / "s")[1][-1] == "after"
    assert headrace.verify(tmp_path / "s").ok


def test_context_manager_commits_or_rolls_back(tmp_path):
    _make(tmp_path / "s", n=3).close()
    with pytest.raises(RuntimeError, match="boom"), headrace.open(tmp_path / "s", mode="a") as w:
        w.append({"b": [b"lost"]})
        w.delete(0)
        w.compact()
        raise RuntimeError("boom")
    assert _content(tmp_path / "s") == ([0, 2, 4], ["rec0", "rec1", "rec2"])
    s = headrace.open(tmp_path / "s")
    assert s.generation == 0 and s.commit_id == 1
    with headrace.open(tmp_path / "s", mode="a") as w:
        w.append({"b": [b"kept"]})
    assert _content(tmp_path / "s")[1] == ["rec0", "rec1", "rec2", "kept"]
    # leftovers of the rolled-back transaction are gone
    names = set(os.listdir(tmp_path / "s"))
    assert names == {".lock", "meta.json", "x.index", "x.aux", "b.index", "b.aux", "chunks"}


def test_close_without_commit_discards_and_rollback(tmp_path):
    w = _make(tmp_path / "s", n=2)
    w.append({"b": [b"x"]})
    w.rollback()
    assert len(w) == 2
    w.modify(0, {"b": b"y"})
    w.close()
    w.close()  # idempotent
    assert _content(tmp_path / "s")[1] == ["rec0", "rec1"]
    with pytest.raises(headrace.WriterClosedError, match="closed"):
        w.append({"b": [b"z"]})


def test_reader_sees_committed_prefix_until_refresh(tmp_path):
    w = _make(tmp_path / "s", n=4)
    r = headrace.open(tmp_path / "s")
    w.append({"b": [b"five"]})
    assert len(headrace.open(tmp_path / "s")) == 4  # not committed yet
    w.commit()
    assert len(r) == 4 and r.gather([3])["b"][0].tobytes() == b"rec3"
    with pytest.raises(headrace.RecordIndexError):
        r.gather([4])
    assert r.refresh() and len(r) == 5 and not r.refresh()
    assert r.gather([4])["b"][0].tobytes() == b"five"
    w.delete(0)
    w.commit()
    assert r.gather([0])["b"][0].tobytes() == b"rec0"  # old generation still readable
    r.refresh()
    assert r.gather([0])["b"][0].tobytes() == b"five"
    w.close()


def test_many_small_commits_append_in_place(tmp_path):
    w = _make(tmp_path / "s", n=1, chunk_mb=1)
    for i in range(20):
        w.append({"x": [[i, i]], "b": [bytes([65 + i])]})
        w.commit()
    w.close()
    s = headrace.open(tmp_path / "s")
    assert len(s) == 21 and s.commit_id == 21 and len(s.meta.chunks) == 2
    assert s.gather([20])["b"][0].tobytes() == b"T"


def test_writer_reopen_continues_open_chunk(tmp_path):
    _make(tmp_path / "s", n=3).close()
    with headrace.open(tmp_path / "s", mode="a") as w:
        assert len(w) == 3 and w.fields["x"].shape == (2,)
        w.append({"x": [[9, 9]], "b": [b"more"]})
    s = headrace.open(tmp_path / "s")
    assert len(s.meta.chunks) == 2  # one chunk per field, reused across writers
    assert _content(tmp_path / "s")[1][-1] == "more"


def test_io_error_after_the_rename_keeps_the_new_commit(tmp_path, monkeypatch):
    # An EIO from the directory fsync that follows the meta.json rename: the commit happened (and
    # may or may not survive a power cut), so the writer must not "roll back" by deleting the
    # files the new meta.json names. Fault injection on the real fsync, nothing else faked.
    from headrace._store import format as _format

    w = _make(tmp_path / "s", n=3)
    w.delete(0)
    real = _format.fsync_dir

    def failing_fsync_dir(path):
        if os.path.exists(os.path.join(path, "meta.json")) and not os.path.exists(
                os.path.join(path, "meta.json.tmp")) and headrace.open(path).commit_id == 2:
            raise OSError(5, "Input/output error")
        real(path)

    monkeypatch.setattr(_format, "fsync_dir", failing_fsync_dir)
    with pytest.raises(OSError, match="Input/output"):
        w.commit()
    monkeypatch.setattr(_format, "fsync_dir", real)
    assert w.closed
    assert _content(tmp_path / "s") == ([4, 2], ["rec2", "rec1"])
    assert headrace.verify(tmp_path / "s").ok
    with headrace.open(tmp_path / "s", mode="a") as w2:  # recovery tidies up, writes go on
        w2.append({"b": [b"next"]})
    assert _content(tmp_path / "s")[1] == ["rec2", "rec1", "next"]
    assert not (tmp_path / "s" / "x.index").exists()  # generation 0 files are gone now
