"""The ``zstd_dict`` codec: a dictionary trained on the field's first batch, stored with the field."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import headrace
from headrace import ConfigError, CorruptionError, FormatVersionError, SchemaError
from headrace._store.format import meta_bytes

pytestmark = pytest.mark.timeout(120)


def _rows(n: int, start: int = 0) -> list[bytes]:
    # small records that share their structure, as metadata rows do
    return [json.dumps({"id": i, "label": f"class_{i % 13}", "split": "train",
                        "w": 100 + i % 900, "h": 50 + i % 700}).encode()
            for i in range(start, start + n)]


def _meta(path) -> dict:
    with open(os.path.join(path, "meta.json")) as f:
        return json.load(f)


def _stored(path) -> int:
    return sum(os.path.getsize(os.path.join(path, "chunks", c))
               for c in os.listdir(os.path.join(path, "chunks")))


def test_round_trip_and_the_dictionary_lives_with_the_field(tmp_path):
    rows = _rows(3000)
    path = tmp_path / "s"
    with headrace.create(path, fields={"t": {"dtype": "bytes", "codec": "zstd_dict"},
                                       "y": "int64"}) as w:
        w.append({"t": rows[:1000], "y": np.arange(1000)})
    meta = _meta(path)
    entry = meta["fields"][0]
    assert meta["version"] == 3 and entry["dict"] == "t.dict"
    dictionary = (path / "t.dict").read_bytes()
    assert dictionary[:4] == b"\x37\xa4\x30\xec"  # zstd dictionary magic
    with headrace.open(path, mode="a") as w:  # later appends reuse it, unchanged
        w.append({"t": rows[1000:], "y": np.arange(1000, 3000)})
    assert (path / "t.dict").read_bytes() == dictionary
    st = headrace.open(path)
    ids = np.random.default_rng(0).permutation(3000)
    got = st.gather(ids)
    assert [bytes(r) for r in got["t"].to_list()] == [rows[i] for i in ids]
    np.testing.assert_array_equal(got["y"], ids)
    assert headrace.verify(path).ok
    with headrace.open(path, mode="a") as w:  # edits and compaction keep the dictionary
        w.modify(7, {"t": b"edited"})
        w.delete(0)
        w.compact()
    st = headrace.open(path)
    assert bytes(st.gather([7])["t"][0]) == b"edited"
    assert bytes(st.gather([1])["t"][0]) == rows[1]
    assert (path / "t.dict").read_bytes() == dictionary


def test_small_records_compress_several_times_better_than_plain_zstd(tmp_path):
    rows = _rows(20_000)
    sizes = {}
    for codec in ("raw", "zstd", "zstd_dict"):
        path = tmp_path / codec
        with headrace.create(path, fields={"t": {"dtype": "bytes", "codec": codec}}) as w:
            w.append({"t": rows})
        sizes[codec] = _stored(path) + sum(
            os.path.getsize(path / f) for f in os.listdir(path) if f.endswith(".dict"))
    # ~70-byte rows: plain zstd frames even grow them; with the dictionary (counted) they shrink
    # to under 40% of zstd's and 45% of raw (benchmarks/bench_small_records.py: larger rows)
    assert sizes["zstd"] > 2.5 * sizes["zstd_dict"] and sizes["raw"] > 2.2 * sizes["zstd_dict"], sizes
    assert _meta(tmp_path / "zstd")["version"] == 2  # stores without a dictionary stay version 2


def test_fixed_shape_fields_and_pack_arrays_take_the_codec(tmp_path):
    x = np.stack([np.frombuffer(r.ljust(80)[:80], np.uint8) for r in _rows(2000)])
    info = headrace.pack_arrays(tmp_path / "p", x=x, y=np.arange(2000), codec={"x": "zstd_dict"},
                                workers=2)
    assert info["fields"]["x"]["codec"] == "zstd_dict"
    st = headrace.open(tmp_path / "p")
    np.testing.assert_array_equal(st.gather(np.arange(2000))["x"], x)
    import concurrent.futures as cf

    with cf.ThreadPoolExecutor(1) as ex, pytest.raises(ConfigError, match="zstd_dict packs in"):
        headrace.pack_arrays(tmp_path / "q", x=x, codec="zstd_dict", executor=ex)


def test_a_first_batch_too_small_to_train_is_refused_and_nothing_is_written(tmp_path):
    path = tmp_path / "s"
    with headrace.create(path, fields={"t": {"dtype": "bytes", "codec": "zstd_dict"}}) as w:
        with pytest.raises(SchemaError, match="trains its dictionary on its first appended batch"):
            w.append({"t": _rows(3)})
        w.append({"t": _rows(200)})
        w.rollback()  # a rolled-back first batch takes its dictionary with it
        w.append({"t": [b"x" * 50] * 200})
    st = headrace.open(path)
    assert len(st) == 200 and bytes(st.gather([5])["t"][0]) == b"x" * 50
    # a dictionary file left by a writer that died before its commit is cleaned up
    other = tmp_path / "o"
    headrace.create(other, fields={"t": {"dtype": "bytes", "codec": "zstd_dict"}}).close()
    (other / "t.dict").write_bytes(b"left over")
    headrace.open(other, mode="a").close()
    assert not (other / "t.dict").exists()


def test_a_damaged_or_missing_dictionary_is_reported(tmp_path):
    path = tmp_path / "s"
    with headrace.create(path, fields={"t": {"dtype": "bytes", "codec": "zstd_dict"}}) as w:
        w.append({"t": _rows(500)})
    good = (path / "t.dict").read_bytes()
    (path / "t.dict").write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    with pytest.raises(CorruptionError, match="does not match its checksum"):
        headrace.open(path)
    (path / "t.dict").unlink()
    with pytest.raises(CorruptionError, match=r"t\.dict is missing"):
        headrace.open(path)


def test_format_versions(tmp_path):
    path = tmp_path / "s"
    with headrace.create(path, fields={"t": {"dtype": "bytes", "codec": "zstd_dict"}}) as w:
        w.append({"t": _rows(100)})
    doc = _meta(path)
    for version in (1, 2):  # older versions cannot hold a zstd_dict field
        doc["version"] = version
        (path / "meta.json").write_bytes(meta_bytes(doc))
        with pytest.raises(CorruptionError, match=f"zstd_dict in a version-{version} store"):
            headrace.open(path)
    doc["version"] = 4
    (path / "meta.json").write_bytes(meta_bytes(doc))
    with pytest.raises(FormatVersionError, match="version 4"):
        headrace.open(path)


def test_pack_of_a_folder_of_small_files_takes_the_codec(tmp_path):
    src = tmp_path / "rows"
    src.mkdir()
    rows = _rows(300)
    for i, r in enumerate(rows):
        (src / f"{i:04d}.json").write_bytes(r)
    out = tmp_path / "store"
    headrace.pack(str(src), out=str(out), codec="zstd_dict", workers=2, progress=False,
                  store=str(tmp_path / "ms"))
    st = headrace.open(out)
    assert st.fields["bytes"].codec == "zstd_dict"
    got = st.gather(np.arange(len(st)))
    assert sorted(bytes(r) for r in got["bytes"].to_list()) == sorted(rows)
    assert headrace.verify(out).ok
