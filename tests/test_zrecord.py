"""loaderx 2.8.19 zrecord containers: read in place, through the engine, and converted to a store.

``tests/data/zrecord`` holds containers the real loaderx 2.8.19 wrote (``make_fixtures.py``; it
needs Python >= 3.12 and NumPy >= 2.5, so it does not run here). Every test compares records
with the values ``_zrecord_cases`` defines; ``_zrecord_write`` rebuilds the containers from the
documented layout and must match loaderx's files byte for byte.
"""

from __future__ import annotations

import fcntl
import filecmp
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import headrace
import headrace.loaderx as loaderx
from _zrecord_cases import CASES, Case, case, records
from _zrecord_write import write_container
from headrace import ConfigError, CorruptionError, NotAStoreError, RecordIndexError, SchemaError
from headrace._base.errors import StoreExistsError, WriterBusyError
from headrace._cli import main as _cli
from headrace._store.zrecord import ZrecordContainer

pytestmark = pytest.mark.timeout(120)

DATA = Path(__file__).parent / "data" / "zrecord"
IDS = [c.name for c in CASES]


def _path(c: Case) -> str:
    return str(DATA / c.name)


def _write(c: Case, path: Path, recs: list[np.ndarray] | None = None, **kw: object) -> str:
    geo = {"item_shape": c.geometry} if c.kind == "dense" else {"ndim": c.geometry}
    dictionary = (DATA / c.name / "dict.zr").read_bytes() if c.codec == "zstd_dict" else None
    return write_container(str(path), records(c) if recs is None else recs, dtype=c.dtype,
                           codec=c.codec, data_shards=c.shards, dictionary=dictionary,
                           **geo, **kw)


@pytest.mark.parametrize("name", IDS)
def test_documented_layout_rebuilds_loaderx_files_byte_for_byte(name, tmp_path):
    c = case(name)
    out = _write(c, tmp_path / "zr")
    files = sorted(os.listdir(_path(c)))
    assert files == sorted(os.listdir(out))
    for f in files:
        assert filecmp.cmp(os.path.join(_path(c), f), os.path.join(out, f), shallow=False), f


@pytest.mark.parametrize("name", IDS)
def test_every_record_of_a_loaderx_container_reads_back(name):
    c = case(name)
    want = records(c)
    ids = np.array([*range(len(want))[::-1], 0, 0])  # reversed, with repeats
    with ZrecordContainer(_path(c)) as z:
        assert (len(z), z.kind, z.dtype, z.codec, z.data_shards) == (
            len(want), c.kind, np.dtype(c.dtype), c.codec, c.shards)
        for i, rec in enumerate(want):
            got = z.record(i)
            assert got.dtype == rec.dtype and got.shape == rec.shape
            np.testing.assert_array_equal(got, rec)
        if c.kind == "dense":
            np.testing.assert_array_equal(z.dense(ids), np.stack([want[i] for i in ids]))
        else:
            values, dims = z.ragged(ids)
            for j, i in enumerate(ids):
                assert tuple(dims[j]) == want[i].shape
                np.testing.assert_array_equal(values[j].reshape(want[i].shape), want[i])


@pytest.mark.parametrize("name", IDS)
def test_loaderx_store_classes_index_as_2_8_19(name):
    c = case(name)
    want = records(c)
    cls = loaderx.DenseStore if c.kind == "dense" else loaderx.RaggedStore
    with cls(_path(c)) as store:
        view = store.bind(None)
        assert len(view) == len(store) == len(want)
        assert (store.dtype, store.codec, store.data_shards) == (np.dtype(c.dtype), c.codec,
                                                                 c.shards)
        picks = [[3, 1], [[0, 1], [2, 3]], slice(None, None, -2), np.arange(len(want)) % 2 == 0,
                 []]
        for idx in picks:
            ids = np.arange(len(want))[idx] if isinstance(idx, slice | np.ndarray) else \
                np.asarray(idx, np.int64).reshape(-1)
            got = view[idx]
            if c.kind == "dense":
                assert got.shape == (len(ids), *c.geometry)
                if len(ids):
                    np.testing.assert_array_equal(np.from_dlpack(got), np.stack([want[i] for i in ids]))
            else:
                assert len(got) == len(ids) and got.cu_seqlens.dtype == np.int32
                assert got.shapes.shape == (len(ids), c.geometry)
                for t, i in zip(got.to_tensors(), ids, strict=True):
                    np.testing.assert_array_equal(t, want[i])
        one = view[-1]
        if c.kind == "dense":
            np.testing.assert_array_equal(one, want[-1])
        else:
            np.testing.assert_array_equal(one.to_tensors()[0], want[-1])


def test_loaderx_store_errors_name_the_fix(tmp_path):
    with pytest.raises(SchemaError, match=r"invalid dense schema fields.*open it with RaggedStore"):
        loaderx.DenseStore(_path(case("ragged_raw_i32")))
    with pytest.raises(FileNotFoundError, match="not a loaderx zrecord container"):
        loaderx.DenseStore(tmp_path)
    store = loaderx.DenseStore(_path(case("dense_raw_f32")))
    with pytest.raises(IndexError, match="record index 11 is out of range for a container of 11"):
        store[11]
    with pytest.raises(RecordIndexError):
        store[[0, -12]]
    with pytest.raises(TypeError, match="indices must be integers or a bool mask"):
        store[[0.5]]
    with pytest.raises(IndexError, match="boolean mask must be one-dimensional with length 11"):
        store[np.ones(3, bool)]

    class Rocm:
        device_type = "amdgpu"

    with pytest.raises(ConfigError, match="allocator device 'amdgpu' is not supported"):
        store.bind(Rocm())
    view = store.bind(None)
    store.close()
    with pytest.raises(RuntimeError, match="is closed"):
        view[0]


def test_ragged_batch_from_records_round_trips():
    recs = [np.arange(6, dtype=np.int16).reshape(2, 3), np.arange(4, dtype=np.int16).reshape(4, 1)]
    rb = loaderx.RaggedBatch.from_records(recs)
    assert repr(rb) == "RaggedBatch(n=2, values=(10,), cu_seqlens=(3,), shapes=(2, 2))"
    for got, want in zip(rb.to_tensors(), recs, strict=True):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(SchemaError, match="share one dtype and one rank"):
        loaderx.RaggedBatch.from_records([np.zeros(2, np.int16), np.zeros(2, np.int32)])


def test_many_records_over_many_shards_gather_in_any_order(tmp_path):
    rng = np.random.default_rng(3)
    dense = [rng.integers(0, 1000, (5, 3)).astype(np.int32) for _ in range(20_000)]
    ragged = [rng.integers(0, 255, rng.integers(1, 40)).astype(np.uint8) for _ in range(20_000)]
    ids = rng.integers(0, 20_000, 5000)
    for codec in ("raw", "zstd"):
        d = write_container(str(tmp_path / f"d{codec}"), dense, dtype="int32", item_shape=(5, 3),
                            codec=codec, data_shards=7)
        r = write_container(str(tmp_path / f"r{codec}"), ragged, dtype="uint8", ndim=1,
                            codec=codec, data_shards=4)
        with ZrecordContainer(d) as zd, ZrecordContainer(r) as zr:
            np.testing.assert_array_equal(zd.dense(ids), np.stack([dense[i] for i in ids]))
            values, _dims = zr.ragged(ids)
            np.testing.assert_array_equal(values.values, np.concatenate([ragged[i] for i in ids]))
            assert zr.nbytes(ids) == sum(len(ragged[i]) for i in ids)


def test_an_unpublished_container_is_empty_and_a_writing_one_is_refused(tmp_path):
    c = case("dense_raw_f32")
    path = _write(c, tmp_path / "zr", published=False)  # a writer killed before close()
    with ZrecordContainer(path) as z:
        assert len(z) == 0 and len(z.dense(np.zeros(0, np.int64))) == 0
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # what a loaderx writer holds until close()
        with pytest.raises(WriterBusyError, match="locked by a loaderx writer"):
            ZrecordContainer(path)
    finally:
        os.close(fd)
    ZrecordContainer(path).close()


def test_damaged_containers_raise_corruption_naming_the_record(tmp_path):
    c = case("ragged_raw_i32")
    path = tmp_path / "zr"
    shutil.copytree(_path(c), path)
    with open(path / "data_1.zr", "r+b") as f:
        f.truncate(8)
    with pytest.raises(CorruptionError, match="truncated"):
        ZrecordContainer(path)
    c = case("dense_zstd_i16")
    path = tmp_path / "zs"
    shutil.copytree(_path(c), path)
    data = bytearray((path / "data_0.zr").read_bytes())
    data[:4] = b"\0\0\0\0"  # the first record's frame loses its zstd magic
    (path / "data_0.zr").write_bytes(bytes(data))
    with ZrecordContainer(path) as z, pytest.raises(
            CorruptionError, match=r"record \d+ does not decode with zstd"):
        z.dense(np.arange(len(z)))
    path = tmp_path / "zd"
    shutil.copytree(_path(case("dense_zstd_dict_u8")), path)
    (path / "dict.zr").unlink()
    with pytest.raises(CorruptionError, match=r"has no dict\.zr"):
        ZrecordContainer(path)


def test_engine_loads_one_container_and_a_dict_of_them(tmp_path):
    c2 = case("ragged_zstd_f32_2d")
    want = records(c2)
    got = []
    for batch in headrace.load(_path(c2), batch=3):
        assert set(batch) == {"data", "data_shape"}
        got += [v.reshape(s) for v, s in zip(batch["data"].to_list(), batch["data_shape"],
                                             strict=True)]
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
    # two streams of one training set, as a 2.8.19 Loader({"x": ..., "t": ...}) reads them
    n = 300
    x = [np.full((2,), i, np.int64) for i in range(n)]
    xs = write_container(str(tmp_path / "x"), x, dtype="int64", item_shape=(2,), data_shards=3)
    ts = _path(case("ragged_zstd_dict_u8"))
    text = records(case("ragged_zstd_dict_u8"))
    loader = headrace.load({"x": xs, "t": ts}, batch=64, shuffle=True, seed=5)
    seen = []
    for batch in loader:
        for xi, ti in zip(batch["x"][:, 0].tolist(), batch["t"].to_list(), strict=True):
            np.testing.assert_array_equal(ti, text[xi])
            seen.append(xi)
    assert sorted(seen) == list(range(n)) and seen != list(range(n))
    with pytest.raises(ConfigError, match="same number of records"):
        headrace.load({"x": xs, "y": _path(case("dense_raw_f32"))})


def test_loaderx_dataloader_reads_containers_through_dataset():
    c = case("dense_zstd_dict_u8")
    want = np.stack(records(c))
    ds = loaderx.Dataset(_path(c))
    labels = np.arange(len(want)) % 7
    assert ds.shape == want.shape and ds.dtype == np.uint8
    np.testing.assert_array_equal(ds[[5, 2, 5]], want[[5, 2, 5]])
    with loaderx.DataLoader(ds, labels, num_workers=2, batch_size=32, mode=0) as ld:
        batch = next(ld)
    np.testing.assert_array_equal(batch["data"], want[:32])
    np.testing.assert_array_equal(batch["label"], labels[:32])


def test_loaderx_module_reuses_the_top_level_classes():
    assert loaderx.Dataset is headrace.Dataset
    assert loaderx.DataLoader is headrace.DataLoader
    assert loaderx.Sampler is headrace.Sampler
    s = loaderx.Sampler(10, 4, loaderx.Sampler.Mode.SEQUENTIAL)
    assert [s.next().tolist() for _ in range(3)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 1]]


@pytest.mark.parametrize("name", IDS)
def test_convert_copies_every_record_and_keeps_the_codec(name, tmp_path):
    c = case(name)
    want = records(c)
    out = tmp_path / "store"
    info = loaderx.convert_zrecord(_path(c), out, name="v")
    assert info["samples"] == len(want)
    st = headrace.open(out)
    assert st.fields["v"].codec == c.codec
    assert st.attrs["zrecord"]["v"]["codec"] == c.codec
    got = st.gather(np.arange(len(want)))
    if c.kind == "dense":
        np.testing.assert_array_equal(got["v"], np.stack(want))
    else:
        shapes = got["v_shape"] if c.geometry > 1 else [w.shape for w in want]
        for r, s, w in zip(got["v"].to_list(), shapes, want, strict=True):
            np.testing.assert_array_equal(r.reshape(tuple(s)), w)
    assert headrace.verify(out).ok


def test_convert_cli_merges_named_containers_and_refuses_a_full_target(tmp_path, capsys):
    n = 400
    labels = [np.array(i % 5, np.int16) for i in range(n)]
    lab = write_container(str(tmp_path / "lab"), labels, dtype="int16", item_shape=(),
                          data_shards=2)
    out = tmp_path / "train"
    rc = _cli.main(["convert-zrecord", f"text={_path(case('dense_zstd_dict_u8'))}",
                    f"label={lab}", str(out), "--codec", "zstd", "--no-progress"])
    assert rc == 0 and "converted 400 records" in capsys.readouterr().out
    st = headrace.open(out)
    assert {k: v.codec for k, v in st.fields.items()} == {"text": "zstd", "label": "zstd"}
    np.testing.assert_array_equal(st.gather(np.arange(n))["label"], np.arange(n) % 5)
    with pytest.raises(StoreExistsError):
        loaderx.convert_zrecord(lab, out)
    assert _cli.main(["convert-zrecord", lab, lab, str(tmp_path / "x")]) == 2
    assert "need names" in capsys.readouterr().err
    with pytest.raises(NotAStoreError):
        loaderx.convert_zrecord(tmp_path / "nothing", tmp_path / "y")
    assert not (tmp_path / "y").exists()


def test_a_checkpoint_resumes_exactly_and_refuses_other_containers(tmp_path):
    path = _path(case("ragged_zstd_dict_u8"))
    full = [b["data"].values.copy() for b in headrace.load(path, batch=32, shuffle=True, seed=9)]
    loader = headrace.load(path, batch=32, shuffle=True, seed=9)
    it = iter(loader)
    head = [next(it)["data"].values.copy() for _ in range(3)]
    token = loader.checkpoint()
    loader.close()
    rest = [b["data"].values.copy() for b in headrace.load(path, batch=32, shuffle=True, seed=9,
                                                            resume=token)]
    for got, want in zip(head + rest, full, strict=True):
        np.testing.assert_array_equal(got, want)
    other = tmp_path / "other"
    recs = records(case("ragged_zstd_dict_u8"))
    recs[0] = recs[0][:-1]  # one record differs: another data version
    _write(case("ragged_zstd_dict_u8"), other, recs)
    with pytest.raises(headrace.CheckpointError):
        headrace.load(str(other), batch=32, shuffle=True, seed=9, resume=token)
