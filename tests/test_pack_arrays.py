"""pack_arrays: NumPy arrays and .npy files into a store, round trips, errors, bounded memory."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import headrace
from headrace._pack import arrays as _pack_arrays

CODECS = ["raw", "zstd", "lz4", "deflate"]


def _images(n, row=48, seed=0):
    rng = np.random.default_rng(seed)
    base = np.linspace(0, 200, row, dtype=np.float64)
    return (base[None, :] + rng.integers(0, 40, size=(n, row))).astype(np.uint8)


@pytest.mark.parametrize("codec", CODECS)
def test_round_trip_fixed_scalar_and_ragged(tmp_path, codec):
    x = _images(57).reshape(57, 4, 12)
    y = np.arange(57, dtype=np.int64) * 3 - 10
    blobs = [bytes([i % 256]) * (i % 7) for i in range(57)]  # includes 0-byte records
    tokens = [np.arange(i % 5, dtype=np.int32) for i in range(57)]
    info = headrace.pack_arrays(tmp_path / "s", x=x, y=y, blob=blobs, tok=tokens, codec=codec,
                                slice_bytes=1000)
    assert info["samples"] == 57
    assert set(info["fields"]) == {"x", "y", "blob", "tok"}
    assert info["fields"]["x"]["shape"] == [4, 12]
    assert info["fields"]["y"]["shape"] == []
    assert info["fields"]["blob"]["shape"] is None
    assert info["bytes_written"] > 0 and info["seconds"] >= 0
    assert info["path"] == str(tmp_path / "s")
    with headrace.open(tmp_path / "s") as st:
        assert len(st) == 57
        assert {f.codec for f in st.fields.values()} == {codec}
        ids = np.array([56, 0, 3, 3, 20])
        got = st.gather(ids)
        np.testing.assert_array_equal(got["x"], x[ids])
        np.testing.assert_array_equal(got["y"], y[ids])
        assert [bytes(b) for b in got["blob"].to_list()] == [blobs[i] for i in ids]
        for arr, i in zip(got["tok"].to_list(), ids, strict=True):
            np.testing.assert_array_equal(arr, tokens[i])
            assert arr.dtype == np.int32


def test_per_field_codec_dict(tmp_path):
    info = headrace.pack_arrays(tmp_path / "s", a=_images(10), b=np.zeros(10, np.float32),
                                codec={"a": "zstd"})
    assert info["fields"]["a"]["codec"] == "zstd"
    assert info["fields"]["b"]["codec"] == "raw"
    with pytest.raises(headrace.ConfigError, match="nope"):
        headrace.pack_arrays(tmp_path / "t", a=_images(10), codec={"nope": "zstd"})


def _write_npy(path, arr):
    np.save(path, arr)
    return str(path)


@pytest.mark.parametrize("order", ["C", "F", "big-endian"])
def test_npy_files_are_streamed_in_slices(tmp_path, order):
    x = _images(301, row=40).reshape(301, 8, 5)
    if order == "F":
        x = np.asfortranarray(x)
    y = np.arange(301, dtype=">i8" if order == "big-endian" else "<i8")
    xp = _write_npy(tmp_path / "x.npy", x)
    yp = _write_npy(tmp_path / "y.npy", y)
    # 1000 bytes per step -> ~20 rows per append: many appends, exercising the slice boundaries.
    info = headrace.pack_arrays(tmp_path / "s", x=xp, y=yp, codec="lz4", slice_bytes=1000)
    assert info["samples"] == 301
    with headrace.open(tmp_path / "s") as st:
        got = st.gather(np.arange(301))
        np.testing.assert_array_equal(got["x"], x)
        np.testing.assert_array_equal(got["y"], y.astype("<i8"))
        assert st.fields["y"].dtype == np.dtype("<i8")


def test_memmaps_are_read_from_their_file(tmp_path):
    x = _images(90)
    np.save(tmp_path / "x.npy", x)
    mm = np.load(tmp_path / "x.npy", mmap_mode="r")
    assert _pack_arrays._source("x", mm).npy_path == str(tmp_path / "x.npy")  # streamed
    cow = np.load(tmp_path / "x.npy", mmap_mode="c")
    cow[3] = 7  # a private change: only the map has it, so it must be read from the map
    assert _pack_arrays._source("x", cow).npy_path is None
    headrace.pack_arrays(tmp_path / "s", x=mm, y=cow, slice_bytes=500)
    with headrace.open(tmp_path / "s") as st:
        got = st.gather(np.arange(90))
        np.testing.assert_array_equal(got["x"], x)
        want = x.copy()
        want[3] = 7
        np.testing.assert_array_equal(got["y"], want)


def test_pathlike_and_list_of_numbers(tmp_path):
    p = tmp_path / "y.npy"
    np.save(p, np.arange(5, dtype=np.int16))
    headrace.pack_arrays(tmp_path / "s", y=p, z=[1.5, 2.5, 3.5, 4.5, 5.5])
    with headrace.open(tmp_path / "s") as st:
        got = st.gather([4, 0])
        np.testing.assert_array_equal(got["y"], [4, 0])
        np.testing.assert_array_equal(got["z"], [5.5, 1.5])


def test_object_array_is_ragged(tmp_path):
    obj = np.empty(3, dtype=object)
    obj[:] = [np.arange(3, dtype=np.float32), np.arange(0, dtype=np.float32), np.ones(1, np.float32)]
    headrace.pack_arrays(tmp_path / "s", v=obj)
    with headrace.open(tmp_path / "s") as st:
        assert st.fields["v"].shape is None
        got = st.gather([0, 1, 2])["v"].to_list()
        assert [a.tolist() for a in got] == [[0, 1, 2], [], [1]]


def test_empty_dataset(tmp_path):
    info = headrace.pack_arrays(tmp_path / "s", x=np.zeros((0, 3), np.uint8))
    assert info["samples"] == 0
    with headrace.open(tmp_path / "s") as st:
        assert len(st) == 0


def test_unequal_lengths_name_each_length(tmp_path):
    with pytest.raises(headrace.SchemaError, match=r"x=10, y=9"):
        headrace.pack_arrays(tmp_path / "s", x=np.zeros(10), y=np.zeros(9))
    assert not (tmp_path / "s").exists()


def test_bad_inputs_get_clear_errors_and_leave_nothing(tmp_path):
    with pytest.raises(headrace.ConfigError, match="at least one field"):
        headrace.pack_arrays(tmp_path / "s")
    with pytest.raises(headrace.SchemaError, match="nope"):
        headrace.pack_arrays(tmp_path / "s", x=np.zeros(4), codec="nope")
    assert not (tmp_path / "s").exists()  # a failed pack leaves no half-made store
    with pytest.raises(headrace.ConfigError, match=r"missing\.npy"):
        headrace.pack_arrays(tmp_path / "s", x=str(tmp_path / "missing.npy"))
    with pytest.raises(headrace.ConfigError, match=r"\.npy"):
        headrace.pack_arrays(tmp_path / "s", x=str(tmp_path / "data.bin"))
    with pytest.raises(headrace.SchemaError, match="encode"):
        headrace.pack_arrays(tmp_path / "s", x=["text", b"bytes"])
    with pytest.raises(headrace.SchemaError, match="1-D"):
        headrace.pack_arrays(tmp_path / "s", x=[np.zeros((2, 2)), np.zeros(3)])
    with pytest.raises(headrace.SchemaError, match="0-d"):
        headrace.pack_arrays(tmp_path / "s", x=np.array(3.0))
    with pytest.raises(headrace.ConfigError, match="dict"):
        headrace.pack_arrays(tmp_path / "s", x={"a": 1})
    np.save(tmp_path / "obj.npy", np.array([b"a", None], dtype=object), allow_pickle=True)
    with pytest.raises(headrace.SchemaError, match="object"):
        headrace.pack_arrays(tmp_path / "s", x=str(tmp_path / "obj.npy"))
    assert not (tmp_path / "s").exists()


def test_truncated_npy_is_reported(tmp_path):
    p = tmp_path / "x.npy"
    np.save(p, _images(100))
    with open(p, "r+b") as f:
        f.truncate(os.path.getsize(p) - 100)
    # numpy's own mmap check may already refuse it; either way it is a headrace error naming it.
    with pytest.raises((headrace.SchemaError, headrace.ConfigError), match=r"x\.npy"):
        headrace.pack_arrays(tmp_path / "s", x=str(p))
    assert not (tmp_path / "s").exists()


def test_non_empty_output_is_refused_and_untouched(tmp_path):
    out = tmp_path / "s"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(headrace.StoreExistsError):
        headrace.pack_arrays(out, x=np.zeros(3))
    assert (out / "keep.txt").read_text() == "mine"
    # An existing empty directory is fine to pack into.
    empty = tmp_path / "empty"
    empty.mkdir()
    headrace.pack_arrays(empty, x=np.zeros(3))
    assert json.loads((empty / "meta.json").read_text())["length"] == 3


def test_progress_bar_only_when_asked(tmp_path, capsys):
    headrace.pack_arrays(tmp_path / "a", x=_images(50), progress=True)
    assert "pack a" in capsys.readouterr().err
    headrace.pack_arrays(tmp_path / "b", x=_images(50), progress=False)
    assert capsys.readouterr().err == ""
    headrace.pack_arrays(tmp_path / "c", x=_images(50))  # stderr is not a TTY under pytest
    assert capsys.readouterr().err == ""


_STREAM_CHILD = textwrap.dedent("""
    import json, resource, sys
    import numpy as np
    import headrace
    from headrace._store import reader, writer  # noqa: F401 # import everything first: only packing is measured
    src, out = sys.argv[1], sys.argv[2]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    headrace.pack_arrays(out, x=src, codec="raw", slice_bytes=16 << 20, chunk_mb=64)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"before": before, "after": after}))
""")


def _row_ids(start, stop):
    return (np.arange(start, stop) % 256).astype(np.uint8)


def test_packing_a_large_npy_needs_bounded_memory(tmp_path):
    rows, row_bytes = 80_000, 4096  # 328 MB: far more than the 16 MiB slice the pack may hold
    src = tmp_path / "big.npy"
    with open(src, "wb") as f:
        np.lib.format.write_array_header_1_0(
            f, {"descr": "|u1", "fortran_order": False, "shape": (rows, row_bytes)})
        block = np.arange(row_bytes, dtype=np.uint8)
        for start in range(0, rows, 4000):
            f.write((_row_ids(start, start + 4000)[:, None] ^ block).tobytes())
    size = os.path.getsize(src)
    out = subprocess.run([sys.executable, "-c", _STREAM_CHILD, str(src), str(tmp_path / "s")],
                         capture_output=True, text=True, check=True, timeout=240)
    rss = json.loads(out.stdout.strip().splitlines()[-1])
    grown = rss["after"] - rss["before"]
    # Generous: 16 MiB slices plus allocator slack, versus the 328 MB that loading would need.
    assert grown < size // 3, f"peak RSS grew by {grown / 1e6:.0f} MB packing a {size / 1e6:.0f} MB .npy"
    with headrace.open(tmp_path / "s") as st:
        assert len(st) == rows
        ids = np.array([0, 1, 39_999, rows - 1])
        want = (ids % 256).astype(np.uint8)[:, None] ^ block
        np.testing.assert_array_equal(st.gather(ids)["x"], want)
