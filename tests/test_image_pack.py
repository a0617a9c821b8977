"""pack_dir: order, labels, skipped files, hashes, streaming; labels.tsv encoding; mx8 parity."""

from __future__ import annotations

import os
import tracemalloc

import mx8
import numpy as np
import pytest

import headrace
from _images import encode, gradient, imagefolder, write_tree
from headrace import ConfigError, StoreExistsError
from headrace._sources import file_batches
from headrace._sources.images import decode_label, encode_label, read_labels_tsv
from headrace._store.folio_writes import FOLIO_BYTES


def test_pack_dir_stores_bytes_labels_paths_in_sorted_order(tmp_path):
    root = tmp_path / "in"
    paths = imagefolder(root, {"dog": 2, "cat": 11})
    write_tree(root, {".DS_Store": b"x", "cat/.hidden.jpg": b"x", ".git/a.jpg": b"x",
                      "cat/notes.txt": b"hello", "dog/meta.json": b"{}"})
    res = headrace.pack_dir(root, out=tmp_path / "out", shard_mb=1)
    assert res["samples"] == 13 and res["classes"] == ["cat", "dog"]
    assert res["skipped"] == {"hidden": 3, "non_image": 2}
    assert res["labels_note"] is None and res["chunks"] >= 3
    assert paths[:3] == ["cat/0.jpg", "cat/1.jpg", "cat/10.jpg"]  # byte-wise, like mx8
    with headrace.open(tmp_path / "out") as st:
        assert st.attrs == {"kind": "images", "labels": "_labels.tsv"}
        got = st.gather(np.arange(13), ["label", "path"])
        assert [bytes(p).decode() for p in got["path"].to_list()] == paths
        assert got["label"].tolist() == [0] * 11 + [1] * 2
        for i, p in enumerate(paths):
            assert bytes(st.record(i, "image")) == (root / p).read_bytes()
    assert read_labels_tsv(res["labels_path"]) == ["cat", "dog"]


def test_dataset_hash_is_stable_across_locations_and_changes_with_content(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    imagefolder(a, {"x": 3, "y": 2})
    imagefolder(b, {"x": 3, "y": 2})
    h1 = headrace.pack_dir(a, out=tmp_path / "o1")["dataset_hash"]
    h2 = headrace.pack_dir(b, out=tmp_path / "o2")["dataset_hash"]
    assert h1 == h2
    (b / "y" / "1.jpg").write_bytes(encode(gradient(10, 10), "JPEG"))
    assert headrace.pack_dir(b, out=tmp_path / "o3")["dataset_hash"] != h1


def test_label_modes(tmp_path):
    root = tmp_path / "in"
    imagefolder(root, {"a": 2, "b": 1})
    write_tree(root, {"top.jpg": encode(gradient(8, 8)), "loose.png": encode(gradient(8, 8),
                                                                             "PNG")})
    with pytest.raises(ConfigError, match=r"loose\.png, top\.jpg"):
        headrace.pack_dir(root, out=tmp_path / "o1", label_mode="imagefolder")
    with pytest.raises(ConfigError, match=r"top\.jpg"):
        headrace.pack_dir(root, out=tmp_path / "o2", require_labels=True)
    with pytest.warns(UserWarning, match="not an ImageFolder"):
        res = headrace.pack_dir(root, out=tmp_path / "o3", label_mode="auto")
    assert res["classes"] is None and res["labels_path"] is None
    assert "not an ImageFolder" in res["labels_note"]
    with headrace.open(tmp_path / "o3") as st:
        assert (st.gather(np.arange(5), ["label"])["label"] == -1).all()
        assert "labels" not in st.attrs
    res = headrace.pack_dir(root, out=tmp_path / "o4", label_mode="none")
    assert res["classes"] is None and res["labels_note"] is None
    with pytest.raises(ConfigError, match="invalid label mode"):
        headrace.pack_dir(root, out=tmp_path / "o5", label_mode="foo")
    one = tmp_path / "one"
    imagefolder(one, {"only": 2})
    assert headrace.pack_dir(one, out=tmp_path / "o6")["classes"] == ["only"]  # mx8 needs >= 2


def test_errors_and_overwrite(tmp_path):
    with pytest.raises(FileNotFoundError, match="in_dir"):
        headrace.pack_dir(tmp_path / "missing", out=tmp_path / "o")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "a.txt").write_text("x")
    with pytest.raises(ConfigError, match="zero image files"):
        headrace.pack_dir(empty, out=tmp_path / "o")
    root = tmp_path / "in"
    imagefolder(root, {"a": 1, "b": 1})
    with pytest.raises(ConfigError, match="shard_mb"):
        headrace.pack_dir(root, out=tmp_path / "o", shard_mb=0)
    headrace.pack_dir(root, out=tmp_path / "o")
    with pytest.raises(StoreExistsError, match="overwrite=True"):
        headrace.pack_dir(root, out=tmp_path / "o")
    assert headrace.pack_dir(root, out=tmp_path / "o", overwrite=True)["samples"] == 2
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "keep.txt").write_text("x")
    with pytest.raises(StoreExistsError, match="not a headrace store"):
        headrace.pack_dir(root, out=tmp_path / "other", overwrite=True)
    # out inside in_dir is not walked
    res = headrace.pack_dir(root, out=root / "packed")
    assert res["samples"] == 2


def test_packing_streams_in_bounded_batches(tmp_path, monkeypatch):
    root = tmp_path / "in"
    blob = os.urandom(64 * 1024)  # packed as-is, never decoded here
    write_tree(root, {f"c{i % 3}/{i:04d}.jpg": blob[i:] + blob[:i] for i in range(240)})
    monkeypatch.setattr(file_batches, "_BATCH_BYTES", 1 << 20)
    tracemalloc.start()
    try:
        res = headrace.pack_dir(root, out=tmp_path / "out", shard_mb=4)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    total = 240 * 64 * 1024
    assert res["samples"] == 240
    # ~2 batches of 1 MiB plus the writer's held chunk tail (< 2 MiB), not 15 MiB
    assert peak < total / 3 + FOLIO_BYTES, (peak, total)


def test_labels_tsv_percent_encoding_round_trips(tmp_path):
    names = ["a%b", "dog house", "tab\tx", "ünï", "plain"]
    assert [encode_label(n) for n in names[:4]] == ["a%25b", "dog%20house", "tab%09x",
                                                    "%C3%BCn%C3%AF"]
    assert [decode_label(encode_label(n)) for n in names] == names
    p = tmp_path / "labels.tsv"
    from headrace._sources.images import write_labels_tsv

    write_labels_tsv(str(p), names, header=True)
    assert p.read_text().splitlines()[0] == "schema_version=1"
    assert read_labels_tsv(str(p)) == names


def test_label_ids_match_mx8_pack_dir(tmp_path):
    root = tmp_path / "in"
    paths = imagefolder(root, {"dog house": 2, "cat": 2, "ünï": 1, "a%b": 1})
    ours = headrace.pack_dir(root, out=tmp_path / "ours")
    theirs = mx8.pack_dir(str(root), out=str(tmp_path / "mx8"), label_mode="imagefolder")
    assert theirs["samples"] == ours["samples"] == len(paths)
    rows = (tmp_path / "mx8" / "_mx8" / "manifest.tsv").read_text().splitlines()[1:]
    mx8_labels = [int(r.split("label_id=")[1]) for r in rows]
    with headrace.open(tmp_path / "ours") as st:
        assert st.gather(np.arange(len(paths)), ["label"])["label"].tolist() == mx8_labels
    assert read_labels_tsv(theirs["labels_path"]) == ours["classes"]


def test_progress_bar_on_request(tmp_path, capsys):
    root = tmp_path / "in"
    imagefolder(root, {"a": 3, "b": 2})
    headrace.pack_dir(root, out=tmp_path / "o", progress=True)
    assert "pack_dir" in capsys.readouterr().err
    headrace.pack_dir(root, out=tmp_path / "o2", progress=False)
    assert capsys.readouterr().err == ""
