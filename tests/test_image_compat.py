"""mx8 spellings of the image loader (start/end, the long-name ImageLoader constructor, accepted
knobs), what headrace.load reads from an image folder, and image loaders as mix sources."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import headrace
from _images import imagefolder
from headrace import ConfigError

KW = {"resize": (16, 20), "flip_p": 0.5, "jitter_contrast": 0.4, "float_out": False}


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("compat") / "tree"
    return root, imagefolder(root, {"a": 7, "b": 6}, h=24, w=30)


@pytest.fixture(scope="module")
def store(tree, tmp_path_factory):
    out = tmp_path_factory.mktemp("compat-store") / "st"
    headrace.pack_dir(str(tree[0]), out=str(out), progress=False)
    return str(out)


def _all(loader):
    xs, ls, ids = [], [], []
    with loader:
        for x, y in loader:
            xs.append(x.copy())
            ls.append(y.copy())
            ids.append(loader.last_ids.copy())
    return xs, ls, ids


def test_start_end_is_a_half_open_range_with_the_same_augmentations(store):
    full, full_labels, _ = _all(headrace.image(store, batch=13, seed=4, **KW))
    xs, ls, ids = _all(headrace.image(store, batch=3, seed=4, start=3, end=11, **KW))
    assert [len(i) for i in ids] == [3, 3, 2]
    assert np.concatenate(ids).tolist() == list(range(3, 11))
    np.testing.assert_array_equal(np.concatenate(xs), full[0][3:11])
    np.testing.assert_array_equal(np.concatenate(ls), full_labels[0][3:11])
    assert _all(headrace.image(store, start=5, end=5, **KW))[0] == []


def test_start_end_resume_inside_the_range(store):
    kw = dict(batch=2, seed=1, shuffle=True, start=2, end=12, epochs=2, **KW)
    ref = _all(headrace.image(store, **kw))[0]
    with headrace.image(store, **kw) as ld:
        for _ in range(7):  # into the second epoch
            next(ld)
        token = ld.checkpoint()
    rest = _all(headrace.image(store, resume=token, **kw))[0]
    assert len(rest) == len(ref) - 7
    for a, b in zip(rest, ref[7:], strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(("kw", "match"), [
    ({"start": 1}, "set together"),
    ({"end": 3}, "set together"),
    ({"start": 4, "end": 2}, r"invalid range \(start > end\)"),
    ({"start": 0, "end": 14}, "end out of range"),
    ({"start": -1, "end": 2}, ">= 0"),
])
def test_start_end_validation(store, kw, match):
    with pytest.raises(ConfigError, match=match):
        headrace.image(store, **kw, **KW)


def test_mx8_imageloader_constructor_maps_onto_image(store):
    mx8 = headrace.ImageLoader(
        store, batch_size_samples=4, max_inflight_bytes=32 << 20, max_queue_batches=3,
        prefetch_batches=2, max_ram_bytes=8 << 30, start_id=1, end_id=12, resize_hw=(18, 18),
        crop_hw=(12, 14), horizontal_flip_p=0.5, color_jitter_brightness=0.2,
        color_jitter_contrast=0.1, color_jitter_saturation=0.3, color_jitter_hue=0.05,
        normalize_mean=(0.5, 0.4, 0.3), normalize_std=(0.2, 0.25, 0.3), seed=9, epoch=2,
        to_float=True, node_id="n0", autotune=True)
    assert mx8.batch_size == 4 and mx8.config.max_inflight_bytes == 32 << 20
    assert mx8.config.max_ram_bytes == 8 << 30 and mx8.classes == ["a", "b"]
    ours = headrace.image(
        store, batch=4, inflight=32 << 20, queue=3, prefetch=2, start=1, end=12,
        resize=(18, 18), crop=(12, 14), flip_p=0.5, jitter_brightness=0.2, jitter_contrast=0.1,
        jitter_saturation=0.3, jitter_hue=0.05, mean=(0.5, 0.4, 0.3), std=(0.2, 0.25, 0.3),
        seed=9, epoch=2)
    a, b = _all(mx8), _all(ours)
    assert a[0][0].dtype == np.float32 and a[0][0].shape == (4, 3, 12, 14)
    for x, y in zip(a[0], b[0], strict=True):
        np.testing.assert_array_equal(x, y)
    # image() keywords pass through; the same setting twice does not
    with headrace.ImageLoader(store, batch_size_samples=5, layout="NHWC", resize_hw=(8, 8),
                              to_float=False) as ld:
        assert next(ld)[0].shape == (5, 8, 8, 3)
    with pytest.raises(ConfigError, match="pass each setting once"):
        headrace.ImageLoader(store, batch=3)


@pytest.mark.parametrize(("kw", "match"), [
    ({"manifest_path": "/x.tsv"}, "dev manifest"),
    ({"max_batch_bytes": 10}, "bytes > batch_bytes 10"),
    ({"bogus": 1}, "unknown image"),
])
def test_mx8_imageloader_refuses_what_has_no_meaning(store, kw, match):
    with pytest.raises(ConfigError, match=match):
        headrace.ImageLoader(store, resize_hw=(8, 8), **kw)


def test_mx8_load_knobs_are_accepted(store):
    with headrace.image(store, batch=4, resize=(8, 8), autopack=True, shard_mb=64, tune=True,
                        store="/nonexistent-manifest-store", recursive=False) as ld:
        assert next(ld)[0].shape == (4, 3, 8, 8)


def test_load_of_an_image_folder_yields_what_its_pack_yields(tree, store):
    root, paths = tree
    with headrace.load(str(root), batch=100) as a, headrace.load(store, batch=100) as b:
        x, y = next(a), next(b)
    assert set(x) == set(y) == {"image", "label", "path"}
    for f in ("image", "path"):
        np.testing.assert_array_equal(x[f].values, y[f].values)
        np.testing.assert_array_equal(x[f].offsets, y[f].offsets)
    np.testing.assert_array_equal(x["label"], y["label"])
    assert [bytes(p).decode() for p in x["path"].to_list()] == paths


def test_which_source_claims_a_folder_does_not_depend_on_import_order(tree):
    code = ("import sys, headrace._sources.links\n"
            "from headrace._sources.base import open_source\n"
            "assert 'headrace._sources.images' not in sys.modules\n"
            f"print(type(open_source({str(tree[0])!r})).__name__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "FolderImages"


def _take(m, k):
    out = []
    for _ in range(k):
        x, y = next(m)
        out.append((x.copy(), y.copy(), m.last_ids.copy(), m.last_source))
    return out


def _mix(store, root, resume=None):
    a = headrace.image(store, batch=3, shuffle=True, seed=1, **KW)
    b = headrace.image(str(root), batch=3, seed=2, **KW)
    return headrace.mix([a, b], weights=[2, 1], on_source_exhausted="restart",
                        inflight=4 << 20, resume=resume)


def test_mix_of_image_loaders_shares_a_budget_and_resumes_exactly(store, tree):
    with _mix(store, tree[0]) as m:
        assert m.budget is not None  # both rebuilt on shares of one 4 MiB cap
        assert all(type(s).__name__ == "ImageLoader" for s in m.sources)
        _take(m, 9)  # source 0 has 5 batches per epoch: it restarts inside these 9
        token = m.checkpoint()
        ref = _take(m, 8)
        assert max(m.restarts) >= 1
        assert m.budget.high_water_bytes <= 4 << 20
    with _mix(store, tree[0], resume=token) as m2:
        got = _take(m2, 8)
    for (xa, la, ia, sa), (xb, lb, ib, sb) in zip(got, ref, strict=True):
        assert sa == sb
        np.testing.assert_array_equal(ia, ib)
        np.testing.assert_array_equal(la, lb)
        np.testing.assert_array_equal(xa, xb)
