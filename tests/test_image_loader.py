"""headrace.image over a store, a raw folder and a real mx8 1.0.7 pack: pixels, determinism,
resume with augmentations, decode-error policies."""

from __future__ import annotations

import shutil

import mx8
import numpy as np
import pytest

import headrace
from _images import encode, gradient, imagefolder, photo, write_tree
from headrace import ConfigError, DecodeError
from headrace._modal.image_decode import decode

AUG = {"random_resized_crop": (24, 24), "flip_p": 0.5, "jitter_brightness": 0.3,
       "jitter_contrast": 0.3, "jitter_saturation": 0.3, "jitter_hue": 0.1}


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("imgs") / "in"
    paths = imagefolder(root, {"cat": 7, "dog": 6, "emu": 4})
    return root, paths


@pytest.fixture(scope="module")
def store(tree, tmp_path_factory):
    out = tmp_path_factory.mktemp("st") / "store"
    headrace.pack_dir(tree[0], out=out, shard_mb=1)
    return out


def _run(loader):
    with loader:
        batches = [(im.copy(), lb.copy(), loader.last_ids.copy()) for im, lb in loader]
    return batches


def _cat(batches):
    return (np.concatenate([b[0] for b in batches]), np.concatenate([b[1] for b in batches]),
            np.concatenate([b[2] for b in batches]))


def test_store_yields_resized_images_equal_to_reference_decode(tree, store):
    root, paths = tree
    ld = headrace.image(str(store) + "@refresh", batch=5, resize=(32, 40))
    assert ld.classes == ["cat", "dog", "emu"]
    images, labels, _ids = _cat(_run(ld))
    assert images.shape == (17, 3, 32, 40) and images.dtype == np.float32
    assert labels.tolist() == [0] * 7 + [1] * 6 + [2] * 4
    for i in (0, 9, 16):  # a resize decodes with libjpeg-turbo's fast IDCT by default
        ref = decode((root / paths[i]).read_bytes(), size=(32, 40), fast=True)
        np.testing.assert_allclose(images[i], ref.transpose(2, 0, 1) / 255.0, atol=1e-6)
    u8, _, _ = _cat(_run(headrace.image(store, batch=5, resize=(32, 40), float_out=False,
                                        layout="NHWC")))  # decoded straight into the batch
    assert u8.dtype == np.uint8 and u8.shape == (17, 32, 40, 3)
    exact, _, _ = _cat(_run(headrace.image(store, batch=5, resize=(32, 40), float_out=False,
                                           layout="NHWC", fast_decode=False)))
    for i in (0, 9, 16):
        data = (root / paths[i]).read_bytes()
        np.testing.assert_array_equal(u8[i], decode(data, size=(32, 40), fast=True))
        np.testing.assert_array_equal(exact[i], decode(data, size=(32, 40)))
    # Small saturated-colour test images: the box chroma upsampling moves them most (1.9 levels).
    assert np.abs(u8.astype(int) - exact).mean() < 2.5


def test_store_folder_and_mx8_pack_give_identical_batches(tree, store, tmp_path):
    root, _ = tree
    kw = {"batch": 4, "shuffle": True, "seed": 3, **AUG}
    a = _cat(_run(headrace.image(store, **kw)))
    b = _cat(_run(headrace.image(root, **kw)))
    pack = tmp_path / "mx8pack"
    mx8.pack_dir(str(root), out=str(pack), shard_mb=1, label_mode="imagefolder")
    ld = headrace.image(pack, **kw)
    assert ld.classes == ["cat", "dog", "emu"]
    c = _cat(_run(ld))
    for x, y in ((a, b), (a, c)):
        for u, v in zip(x, y, strict=True):
            np.testing.assert_array_equal(u, v)


def test_mx8_pack_bytes_match_mx8_and_relocated_pack_loads(tree, tmp_path):
    root, _ = tree
    pack = tmp_path / "p"
    res = mx8.pack_dir(str(root), out=str(pack), shard_mb=1, label_mode="imagefolder")
    from headrace._sources.images import Mx8PackImages

    with headrace.image(f"{pack}@sha256:{res['manifest_hash']}", batch=4, resize=(8, 8)) as ld:
        assert len(next(ld)[0]) == 4
    with pytest.raises(headrace.LinkError, match="changed"):
        headrace.image(f"{pack}@sha256:{'0' * 64}")

    ours = Mx8PackImages(pack)
    for b in mx8.load(str(pack), batch=8):
        ids = np.array(b.sample_ids)
        payload = b.payload
        got = [bytes(p) for p in ours.payloads(ids)]
        want = [payload[b.offsets[k]:b.offsets[k + 1]] for k in range(len(ids))]
        assert got == want
        assert ours.labels(ids).tolist() == b.label_ids
    ours.close()
    before = _cat(_run(headrace.image(pack, batch=6, resize=(16, 16))))
    moved = tmp_path / "moved"
    shutil.copytree(pack, moved)
    shutil.rmtree(pack)  # the manifest's absolute shard paths now point nowhere
    after = _cat(_run(headrace.image(moved, batch=6, resize=(16, 16))))
    for u, v in zip(before, after, strict=True):
        np.testing.assert_array_equal(u, v)


def test_mx8_manifest_errors(tmp_path):
    (tmp_path / "p" / "_mx8").mkdir(parents=True)
    m = tmp_path / "p" / "_mx8" / "manifest.tsv"
    for text, match in [("0\tx\t\t\t\n", "schema_version"),
                        ("schema_version=1\n", "unsupported"),
                        ("schema_version=0\n0\tx\t1\n", "5 columns"),
                        ("schema_version=0\n0\tx\t5\t\t\n", "together"),
                        ("schema_version=0\n1\tx\t0\t3\t\n", "expected sample_id 0")]:
        m.write_text(text)
        with pytest.raises(headrace.CorruptionError, match=match):
            headrace.image(tmp_path / "p")


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_augmented_output_is_independent_of_threads_and_batch_size(store, layout):
    kw = {"shuffle": True, "seed": 11, "layout": layout, **AUG}
    ref = _cat(_run(headrace.image(store, batch=4, threads=1, **kw)))
    for batch, threads in ((7, 3), (17, 2), (1, 2)):
        got = _cat(_run(headrace.image(store, batch=batch, threads=threads, **kw)))
        for u, v in zip(ref, got, strict=True):
            np.testing.assert_array_equal(u, v)
    other = _cat(_run(headrace.image(store, batch=4, **{**kw, "seed": 12})))
    assert not np.array_equal(ref[0], other[0])


def test_epochs_get_new_augmentations_and_resume_is_exact(store):
    kw = {"batch": 4, "shuffle": True, "seed": 5, "epochs": 3, **AUG}
    full = _run(headrace.image(store, **kw))
    assert len(full) == 15  # 5 batches per epoch
    e0, e1 = _cat(full[:5]), _cat(full[5:10])
    assert sorted(e0[2].tolist()) == sorted(e1[2].tolist()) == list(range(17))
    order0 = np.argsort(e0[2])
    order1 = np.argsort(e1[2])
    assert not np.array_equal(e0[0][order0], e1[0][order1])  # new epoch, new crops
    for cut in (2, 5, 7):
        ld = headrace.image(store, **kw)
        for _ in range(cut):
            next(ld)
        token = ld.checkpoint()
        ld.close()
        rest = _run(headrace.image(store, resume=token, **kw))
        assert len(rest) == len(full) - cut
        for (a, la, ia), (b, lb, ib) in zip(full[cut:], rest, strict=True):
            np.testing.assert_array_equal(a, b)
            np.testing.assert_array_equal(la, lb)
            np.testing.assert_array_equal(ia, ib)


def test_mx8_style_resize_crop_and_eval_and_uint8(store, tree):
    root, paths = tree
    images, _, _ = _cat(_run(headrace.image(store, batch=8, resize=(30, 40), crop=(20, 24))))
    assert images.shape == (17, 3, 20, 24)
    ev, _, _ = _cat(_run(headrace.image(store, batch=8, augment="eval", center_crop=(16, 16))))
    assert ev.shape == (17, 3, 16, 16) and ev.min() < 0  # ImageNet-normalised
    u8, _, _ = _cat(_run(headrace.image(store, batch=8, float_out=False, layout="NHWC",
                                        flip_p=1.0)))
    ref = decode((root / paths[3]).read_bytes())
    np.testing.assert_array_equal(u8[3], ref[:, ::-1])


def test_to_torch(store):
    import torch

    with headrace.image(store, batch=8, resize=(8, 8), to_torch=True) as ld:
        images, labels = next(iter(ld))
    assert isinstance(images, torch.Tensor) and images.shape == (8, 3, 8, 8)
    assert labels.dtype == torch.int64


def test_different_sizes_without_resize_is_a_clear_error(tmp_path):
    write_tree(tmp_path, {"a/0.png": encode(gradient(8, 8), "PNG"),
                          "a/1.png": encode(gradient(9, 8), "PNG")})
    with pytest.raises(ConfigError, match=r"resize=\(H, W\)"), \
            headrace.image(tmp_path, batch=2) as ld:
        next(ld)


@pytest.fixture()
def broken(tmp_path):
    good = encode(photo("chelsea", size=(60, 90)), "JPEG")
    files = {f"c/{i}.jpg": good for i in range(10)}
    files["c/3.jpg"] = good[: len(good) // 3]  # truncated
    files["c/7.jpg"] = b"definitely not a jpeg" * 10
    write_tree(tmp_path / "in", files)
    headrace.pack_dir(tmp_path / "in", out=tmp_path / "st")
    return tmp_path / "st"


def test_decode_error_policy_error_names_record_and_path(broken):
    ld = headrace.image(broken, batch=3, resize=(16, 16))
    next(ld)  # records 0..2 are fine
    with pytest.raises(DecodeError, match=r"record 3 \(c/3\.jpg\)") as info:
        next(ld)
    assert info.value.record_id == 3 and info.value.path == "c/3.jpg"
    ld.close()


def test_decode_error_policy_skip_drops_only_bad_images_and_resumes_exactly(broken):
    kw = {"batch": 4, "resize": (16, 16), "on_decode_error": "skip", "shuffle": True,
          "seed": 2, "epochs": 2, "flip_p": 0.5}
    with headrace.image(broken, **kw) as ld:
        full = [(im.copy(), ld.last_ids.copy()) for im, _ in ld]
        stats = ld.stats()
    ids = np.concatenate([f[1] for f in full])
    assert len(ids) == 16 and 3 not in ids and 7 not in ids
    assert stats["decode_errors_total"] == 4 and stats["images_decoded_total"] == 16
    assert sum(len(f[1]) for f in full) == 16 and any(len(f[1]) < 4 for f in full)
    ld = headrace.image(broken, **kw)
    next(ld)
    next(ld)
    token = ld.checkpoint()
    ld.close()
    with headrace.image(broken, resume=token, **kw) as ld2:
        rest = [(im.copy(), ld2.last_ids.copy()) for im, _ in ld2]
    assert len(rest) == len(full) - 2
    for (a, ia), (b, ib) in zip(full[2:], rest, strict=True):
        np.testing.assert_array_equal(ia, ib)
        np.testing.assert_array_equal(a, b)


def test_bad_policy_and_missing_path(tmp_path):
    with pytest.raises(ConfigError, match="on_decode_error"):
        headrace.image(tmp_path, on_decode_error="ignore")
    with pytest.raises(FileNotFoundError):
        headrace.image(tmp_path / "nope")


def test_generic_loader_reads_folder_and_mx8_sources(tree, tmp_path):
    root, paths = tree
    with headrace.Loader(root, batch=5) as ld:
        first = next(ld)
    assert len(first["image"]) == 5 and first["label"].tolist() == [0] * 5
    assert bytes(first["image"][0]) == (root / paths[0]).read_bytes()
    pack = tmp_path / "p"
    mx8.pack_dir(str(root), out=str(pack), label_mode="imagefolder")
    with headrace.Loader(pack, batch=17) as ld:
        batch = next(ld)
    assert bytes(batch["image"][16]) == (root / paths[16]).read_bytes()


def test_endless_and_len(store):
    with headrace.image(store, batch=8, resize=(8, 8), epochs=2) as ld:
        assert len(ld) == 6  # 8 + 8 + 1 per epoch
        assert sum(1 for _ in ld) == 6
    with headrace.image(store, batch=8, resize=(8, 8), epochs=None, shuffle=True) as ld:
        with pytest.raises(TypeError):
            len(ld)
        seen = [ld.last_ids.copy() for _ in zip(range(9), ld, strict=False)]
        assert ld.epoch == 2  # 9 batches = 3 epochs of 8 + 8 + 1; the third is not yet over
    ids = np.concatenate(seen)
    assert sorted(ids[:17].tolist()) == list(range(17))


def test_dropped_loader_stops_its_threads(store):
    import gc
    import threading
    import time

    def workers():
        return sum(t.name.startswith("headrace-") for t in threading.enumerate())

    before = workers()
    ld = headrace.image(store, batch=2, resize=(8, 8), threads=2)
    next(ld)
    assert workers() > before
    del ld
    gc.collect()
    deadline = time.monotonic() + 10
    while workers() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert workers() == before


@pytest.mark.parametrize("kw", [{"resize": (20, 28)}, {"resize": (20, 28), "flip_p": 1.0},
                                {"resize": (30, 40), "crop": (20, 24)}, AUG])
def test_float_nchw_is_the_normalised_uint8_nhwc_output(store, kw):
    # The default layout's float conversion (plane by plane) must equal (x / 255 - mean) / std of
    # the very pixels the uint8 NHWC path yields, flipped and cropped views included. Colour
    # jitter computes in float, which the uint8 path rounds: half a grey level apart at most.
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    u8, _, ids = _cat(_run(headrace.image(store, batch=5, float_out=False, layout="NHWC", **kw)))
    for norm in ({}, {"mean": mean, "std": std}):
        f, _, ids_f = _cat(_run(headrace.image(store, batch=5, **kw, **norm)))
        np.testing.assert_array_equal(ids, ids_f)
        assert f.dtype == np.float32 and f.shape == (len(ids), 3, *u8.shape[1:3])
        want = u8.transpose(0, 3, 1, 2).astype(np.float64) / 255
        if norm:
            want = (want - np.array(mean)[:, None, None]) / np.array(std)[:, None, None]
        tol = 0.5 / 255 / (min(std) if norm else 1) if "jitter_hue" in kw else 1e-5
        np.testing.assert_allclose(f, want, atol=tol + 1e-5)
