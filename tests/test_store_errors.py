"""Bad input gets a clear error from the documented hierarchy and loses nothing."""

import json
import os

import numpy as np
import pytest

import headrace
from headrace._store import format as _format


def _store(path, n=4):
    with headrace.create(path, fields={"x": {"dtype": "uint8", "shape": [3]}, "b": "bytes",
                                       "z": {"dtype": "bytes", "codec": "lz4"}}) as w:
        w.append({"x": np.arange(3 * n, dtype=np.uint8).reshape(n, 3),
                  "b": [bytes([i]) * (i + 1) for i in range(n)],
                  "z": [b"zz" * (i + 1) for i in range(n)]})


def _still_readable(path, n=4):
    s = headrace.open(path)
    assert len(s) == n
    s.gather(np.arange(n))
    return s


def test_unknown_codec(tmp_path):
    with pytest.raises(headrace.SchemaError, match=r"unknown codec 'snappy'.*deflate, lz4, raw, zstd"):
        headrace.create(tmp_path / "s", fields={"a": {"dtype": "bytes", "codec": "snappy"}})
    assert not (tmp_path / "s").exists()


def test_bad_field_specs(tmp_path):
    with pytest.raises(headrace.SchemaError, match="field name"):
        headrace.create(tmp_path / "s", fields={"a/b": "bytes"})
    with pytest.raises(headrace.SchemaError, match="at least one field"):
        headrace.create(tmp_path / "s", fields={})
    with pytest.raises(headrace.SchemaError, match="cannot be stored"):
        headrace.create(tmp_path / "s", fields={"o": "object"})


def test_dtype_and_shape_mismatch(tmp_path):
    _store(tmp_path / "s")
    with headrace.open(tmp_path / "s", mode="a") as w:
        with pytest.raises(headrace.SchemaError, match=r"field 'x'.*shape \(n, 3\).*got shape \(2, 4\)"):
            w.append({"x": np.zeros((2, 4), np.uint8)})
        with pytest.raises(headrace.SchemaError, match=r"field 'x': expected dtype uint8, got float32"):
            w.append({"x": np.zeros((2, 3), np.float32)})
        with pytest.raises(headrace.SchemaError, match="unknown fields"):
            w.append({"nope": [b""]})
        with pytest.raises(headrace.SchemaError, match="other fields have"):
            w.append({"x": np.zeros((2, 3), np.uint8), "b": [b"a"]})
        with pytest.raises(headrace.SchemaError, match="ragged"):
            w.append({"b": b"not a list"})
        with pytest.raises(headrace.RecordIndexError, match="N=4"):
            w.modify(4, {"b": b""})
        assert len(w) == 4  # nothing was written by the failed calls
    _still_readable(tmp_path / "s")


def test_record_too_large(tmp_path, monkeypatch):
    _store(tmp_path / "s")

    class Huge:  # claims 5 GiB; the writer must refuse it before reading a byte
        nbytes = 5 << 30

    with headrace.open(tmp_path / "s", mode="a") as w:
        with pytest.raises(headrace.RecordTooLargeError, match=r"field 'b'.*5368709120 bytes"):
            w.append({"b": [b"ok", Huge()]})
        monkeypatch.setattr(_format, "MAX_RECORD_BYTES", 10)
        with pytest.raises(headrace.RecordTooLargeError, match="over the format's limit of 10"):
            w.append({"b": [b"x" * 11]})
        w.append({"b": [b"x" * 10]})
        assert len(w) == 5
    with pytest.raises(headrace.RecordTooLargeError):
        headrace.create(tmp_path / "t", fields={"big": {"dtype": "uint8", "shape": [11]}})


def test_not_a_store_and_missing(tmp_path):
    (tmp_path / "d").mkdir()
    with pytest.raises(headrace.NotAStoreError, match=r"no meta\.json"):
        headrace.open(tmp_path / "d")
    with pytest.raises(headrace.NotAStoreError, match="no such directory"):
        headrace.open(tmp_path / "missing")
    with pytest.raises(FileNotFoundError):  # NotAStoreError is a FileNotFoundError
        headrace.open(tmp_path / "d", mode="a")
    with pytest.raises(headrace.NotAStoreError):
        headrace.verify(tmp_path / "d")
    (tmp_path / "d" / "meta.json").write_text(json.dumps({"hello": 1}))
    with pytest.raises(headrace.NotAStoreError, match="format"):
        headrace.open(tmp_path / "d")


def test_newer_format_version(tmp_path):
    _store(tmp_path / "s")
    meta = json.loads((tmp_path / "s" / "meta.json").read_text())
    meta["version"] = 7
    (tmp_path / "s" / "meta.json").write_text(json.dumps(meta))
    for call in (lambda: headrace.open(tmp_path / "s"),
                 lambda: headrace.open(tmp_path / "s", mode="a"),
                 lambda: headrace.verify(tmp_path / "s")):
        with pytest.raises(headrace.FormatVersionError, match=r"version 7.*upgrade headrace"):
            call()


def test_meta_json_garbage(tmp_path):
    _store(tmp_path / "s")
    good = (tmp_path / "s" / "meta.json").read_bytes()
    for garbage in (b"\x00\xffnot json", good[: len(good) // 2],
                    good.replace(b'"length": 4', b'"length": -4')):
        (tmp_path / "s" / "meta.json").write_bytes(garbage)
        with pytest.raises(headrace.CorruptionError, match=r"meta\.json"):
            headrace.open(tmp_path / "s")
        with pytest.raises(headrace.CorruptionError, match=r"meta\.json"):
            headrace.open(tmp_path / "s", mode="a")
        report = headrace.verify(tmp_path / "s")
        assert not report.ok and "meta.json" in report.problems[0]
    (tmp_path / "s" / "meta.json").write_bytes(good)
    _still_readable(tmp_path / "s")


def test_create_into_non_empty_dir(tmp_path):
    _store(tmp_path / "s")
    with pytest.raises(headrace.StoreExistsError, match="not an empty directory"):
        headrace.create(tmp_path / "s", fields={"b": "bytes"})
    (tmp_path / "f").write_text("x")
    with pytest.raises(FileExistsError):
        headrace.create(tmp_path / "f", fields={"b": "bytes"})
    (tmp_path / "empty").mkdir()
    headrace.create(tmp_path / "empty", fields={"b": "bytes"}).close()
    _still_readable(tmp_path / "s")


def test_truncated_chunk(tmp_path):
    _store(tmp_path / "s")
    s = headrace.open(tmp_path / "s")
    b_chunk = next(c for c in s.meta.chunks if c.field == "b")
    path = tmp_path / "s" / "chunks" / f"{b_chunk.id}.zr"
    os.truncate(path, b_chunk.size - 2)  # cuts into the last record (id 3, 4 bytes)
    s = headrace.open(tmp_path / "s")
    with pytest.raises(headrace.CorruptionError, match=r"field 'b', record ids \[3\]") as e:
        s.gather([0, 3])
    assert e.value.field == "b" and e.value.record_ids == [3]
    assert s.gather([0, 1, 2])["b"][2].tobytes() == b"\x02\x02\x02"  # the rest reads fine
    report = headrace.verify(tmp_path / "s")
    assert not report.ok and report.bad == {"b": [3]}
    assert any("truncated" in p for p in report.problems)
    # a writer can still open it and append; the damaged record stays reported
    with headrace.open(tmp_path / "s", mode="a") as w:
        w.append({"b": [b"new"]})
    s = headrace.open(tmp_path / "s")
    assert s.gather([4])["b"][0].tobytes() == b"new"


def test_missing_chunk_file(tmp_path):
    _store(tmp_path / "s")
    s = headrace.open(tmp_path / "s")
    z_chunk = next(c for c in s.meta.chunks if c.field == "z")
    os.unlink(tmp_path / "s" / "chunks" / f"{z_chunk.id}.zr")
    s = headrace.open(tmp_path / "s")
    assert s.gather([1], fields=["x", "b"])["x"].tolist() == [[3, 4, 5]]
    with pytest.raises(headrace.CorruptionError, match="field 'z'"):
        s.gather([1])
    report = headrace.verify(tmp_path / "s")
    assert report.bad == {"z": [0, 1, 2, 3]} and any("missing" in p for p in report.problems)


def test_corrupted_index_entry(tmp_path):
    _store(tmp_path / "s")
    idx = np.fromfile(tmp_path / "s" / "x.index", _format.INDEX_DTYPE)
    idx[2]["offset"] = 1 << 40
    idx[1]["chunk"] = 999
    idx.tofile(tmp_path / "s" / "x.index")
    s = headrace.open(tmp_path / "s")
    with pytest.raises(headrace.CorruptionError, match=r"field 'x', record ids \[1, 2\]"):
        s.gather([0, 1, 2, 3])
    assert s.gather([0, 3])["x"].tolist() == [[0, 1, 2], [9, 10, 11]]
    assert headrace.verify(tmp_path / "s").bad == {"x": [1, 2]}


def test_truncated_index_file(tmp_path):
    _store(tmp_path / "s")
    os.truncate(tmp_path / "s" / "b.index", 16 * 3)
    s = headrace.open(tmp_path / "s")
    with pytest.raises(headrace.CorruptionError, match=r"field 'b', record ids \[3\]"):
        s.gather([3])
    assert s.gather([2])["b"][0].tobytes() == b"\x02" * 3
    report = headrace.verify(tmp_path / "s")
    assert report.bad == {"b": [3]}


def test_bad_index_arguments(tmp_path):
    _store(tmp_path / "s")
    s = headrace.open(tmp_path / "s")
    with pytest.raises(headrace.RecordIndexError, match=r"record id -1 .* N=4"):
        s.gather([0, -1])
    with pytest.raises(IndexError, match=r"record id 4 .* N=4"):
        s.gather(np.array([4, 0]))
    with pytest.raises(headrace.RecordIndexError, match="integers"):
        s.gather([0.5])
    with pytest.raises(headrace.ConfigError, match="verify"):
        headrace.open(tmp_path / "s", verify="sometimes")
    with pytest.raises(headrace.ConfigError, match="mode"):
        headrace.open(tmp_path / "s", mode="w")
    s.close()
    with pytest.raises(headrace.StoreError, match="closed"):
        s.gather([0])
