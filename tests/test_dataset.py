"""Dataset: loaderx's indexing over a headrace store field, a .npy file and a Blosc2 .b2nd file."""

import pickle
import subprocess
import sys

import blosc2
import numpy as np
import pytest

import headrace

N = 37
REF = (np.arange(N * 6, dtype=np.int64).reshape(N, 2, 3) * 7) % 251


@pytest.fixture(params=["store", "store-zstd", "npy", "b2nd"])
def ds(request, tmp_path):
    kind = request.param
    if kind.startswith("store"):
        codec = "zstd" if kind == "store-zstd" else "raw"
        headrace.pack_arrays(tmp_path / "s", x=REF, codec=codec)
        path = tmp_path / "s"
    elif kind == "npy":
        path = tmp_path / "x.npy"
        np.save(path, REF)
    else:
        path = tmp_path / "x.b2nd"
        blosc2.asarray(REF, urlpath=str(path), mode="w")  # as loaderx's README converts
    d = headrace.Dataset(path)
    yield d
    d.close()


def test_len_shape_dtype(ds):
    assert len(ds) == N
    assert ds.shape == (N, 2, 3)
    assert ds.dtype == np.int64


def test_getitem_int_negative_and_slice(ds):
    np.testing.assert_array_equal(ds[0], REF[0])
    np.testing.assert_array_equal(ds[-1], REF[-1])
    np.testing.assert_array_equal(ds[np.int64(5)], REF[5])
    np.testing.assert_array_equal(ds[3:9], REF[3:9])
    np.testing.assert_array_equal(ds[-5:], REF[-5:])
    np.testing.assert_array_equal(ds[::7], REF[::7])
    np.testing.assert_array_equal(ds[30:2:-4], REF[30:2:-4])
    assert ds[10:10].shape == (0, 2, 3)
    for bad in (N, -N - 1):
        with pytest.raises(IndexError, match=str(bad)):
            ds[bad]


def test_tuple_keys_index_like_numpy(ds):
    np.testing.assert_array_equal(ds[3, 1], REF[3, 1])
    np.testing.assert_array_equal(ds[-2, 0, 2], REF[-2, 0, 2])
    np.testing.assert_array_equal(ds[2:9:3, 1], REF[2:9:3, 1])
    np.testing.assert_array_equal(ds[[5, 0], :, 1], REF[[5, 0], :, 1])
    np.testing.assert_array_equal(ds[4,], REF[4])


def test_getitems_is_an_ordered_fancy_gather(ds):
    for idx in ([5, 3, 3, 36, 0], np.array([2, 2, 1], dtype=np.uint64), [-1, 0], range(4)):
        np.testing.assert_array_equal(ds.__getitems__(idx), REF[np.asarray(idx, dtype=np.int64)])
    assert ds.__getitems__([]).shape == (0, 2, 3)
    np.testing.assert_array_equal(ds[[4, 1]], REF[[4, 1]])  # list index routes to the gather
    with pytest.raises(IndexError, match=f"{N}"):
        ds.__getitems__([1, N])
    with pytest.raises(IndexError):
        ds.__getitems__(np.array([2**63 + 5], dtype=np.uint64))
    with pytest.raises(headrace.RecordIndexError):
        ds.__getitems__([-N - 1])
    with pytest.raises(IndexError, match="integers"):
        ds.__getitems__([1.5])


def test_pickles_by_path(ds):
    again = pickle.loads(pickle.dumps(ds))
    np.testing.assert_array_equal(again.__getitems__([3, 1]), REF[[3, 1]])
    again.close()


def test_store_fields_are_picked_by_name(tmp_path):
    labels = np.arange(N, dtype=np.int64)
    blobs = [bytes(range(i % 9)) for i in range(N)]
    headrace.pack_arrays(tmp_path / "s", x=REF, label=labels, image=blobs)
    with pytest.raises(headrace.ConfigError, match=r"field=.*") as e:
        headrace.Dataset(tmp_path / "s")
    for name in ("x", "label", "image"):
        assert name in str(e.value)
    with pytest.raises(headrace.ConfigError, match="nope"):
        headrace.Dataset(tmp_path / "s", field="nope")
    with headrace.Dataset(tmp_path / "s", field="label") as d:
        assert d.shape == (N,)
        np.testing.assert_array_equal(d.__getitems__([9, 2]), [9, 2])
        assert d[4] == 4
        assert "label" in repr(d)
    with headrace.Dataset(tmp_path / "s", field="image") as d:
        assert d.shape == (N,) and d.dtype == np.uint8
        assert bytes(d[5]) == blobs[5]
        got = d.__getitems__([8, 0, 8])
        assert [bytes(b) for b in got.to_list()] == [blobs[8], blobs[0], blobs[8]]


def test_bad_paths_get_clear_errors(tmp_path):
    with pytest.raises(headrace.NotAStoreError, match="missing"):
        headrace.Dataset(tmp_path / "missing.b2nd")
    with pytest.raises(FileNotFoundError):
        headrace.Dataset(tmp_path / "missing")
    (tmp_path / "plain").mkdir()
    with pytest.raises(headrace.NotAStoreError):
        headrace.Dataset(tmp_path / "plain")
    (tmp_path / "x.txt").write_text("hello")
    with pytest.raises(headrace.ConfigError, match=r"x\.txt"):
        headrace.Dataset(tmp_path / "x.txt")
    (tmp_path / "bad.b2nd").write_bytes(b"not blosc2 at all" * 10)
    with pytest.raises(headrace.ConfigError, match=r"bad\.b2nd"):
        headrace.Dataset(tmp_path / "bad.b2nd")
    np.save(tmp_path / "x.npy", REF)
    with pytest.raises(headrace.ConfigError, match="field"):
        headrace.Dataset(tmp_path / "x.npy", field="x")


def test_npy_dataset_does_not_import_blosc2(tmp_path):
    np.save(tmp_path / "x.npy", REF)
    code = (
        "import sys, headrace\n"
        f"d = headrace.Dataset({str(tmp_path / 'x.npy')!r})\n"
        "assert d.__getitems__([1, 0]).shape == (2, 2, 3)\n"
        "print('blosc2' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
