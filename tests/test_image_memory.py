"""What an image loader keeps in memory: recycled batch arrays (never one the program still
holds) and no mapped pages of the encoded images it has decoded."""

from __future__ import annotations

import itertools
import mmap
import weakref

import mx8
import numpy as np
import pytest

import headrace
from _images import encode, imagefolder, photo, write_tree
from headrace._sources.images import drop_mapped_pages

# 2 x 3 x 64 x 64 float32 = 96 KiB per batch: large enough to be recycled
KW = {"batch": 2, "resize": (64, 64), "flip_p": 0.5, "seed": 4}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("imgs") / "in"
    imagefolder(root, {"cat": 15, "dog": 14})
    out = tmp_path_factory.mktemp("st") / "store"
    headrace.pack_dir(root, out=out)
    return out


def _copies(store, **kw):
    with headrace.image(store, **KW, **kw) as ld:
        return [(np.asarray(im).copy(), np.asarray(lb).copy()) for im, lb in ld]


@pytest.mark.parametrize("hold", ["arrays", "views", "tensors"])
def test_batches_the_program_holds_are_never_rewritten(store, hold):
    want = _copies(store)
    held = []
    with headrace.image(store, **KW, to_torch=hold == "tensors") as ld:
        for im, lb in ld:
            held.append((im[:1], lb) if hold == "views" else (im, lb))
    assert len(held) == len(want) == 15
    for (im, lb), (w_im, w_lb) in zip(held, want, strict=True):
        np.testing.assert_array_equal(np.asarray(im), w_im[:len(im)])
        np.testing.assert_array_equal(np.asarray(lb), w_lb)


def test_batches_the_program_dropped_are_written_again(store):
    kw = {**KW, "batch": 1, "resize": (96, 96), "threads": 2}  # 29 batches of 108 KiB
    with headrace.image(store, **kw) as ld:
        want = [(im.copy(), lb.copy()) for im, lb in ld]
    refs: list[weakref.ref[np.ndarray]] = []  # a dropped array that was not reused dies
    reused = 0
    with headrace.image(store, **kw) as ld:
        for (im, _lb), (w_im, _) in zip(ld, want, strict=True):
            np.testing.assert_array_equal(im, w_im)
            reused += any(r() is im for r in refs)
            refs.append(weakref.ref(im))
            del im
    # at most window + threads + 3 = 9 arrays are ever new (those the first batches fill while
    # they are all referenced at once): the rest are written again
    assert len(want) == 29 and reused >= 29 - 9 - 4
    assert all(r() is None for r in refs)  # closed: the loader keeps none


def _mapped_kb(prefix: str) -> int:
    """Resident kB of this process's mappings of files under ``prefix`` (/proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if len(head) >= 5 and "-" in head[0] and not head[0].endswith(":"):
                inside = len(head) >= 6 and head[5].startswith(prefix)
            elif inside and line.startswith("Rss:"):
                total += int(head[1])
    return total


def test_drop_mapped_pages_unmaps_the_pages_and_keeps_the_bytes(tmp_path):
    data = np.random.default_rng(0).integers(0, 256, 8 << 20, np.uint8).tobytes()
    path = tmp_path / "blob"
    path.write_bytes(data)
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    mv = memoryview(m)
    cuts = np.linspace(0, len(data), 101).astype(int)
    views = [mv[a:b] for a, b in itertools.pairwise(cuts)][::-1]  # any order
    assert sum(int(np.frombuffer(v, np.uint8)[::4096].sum()) for v in views) > 0  # touch
    before = _mapped_kb(str(path))
    drop_mapped_pages(views[::2])  # half of them: every other 80 KiB span
    half = _mapped_kb(str(path))
    drop_mapped_pages([*views, mv[0:0]])
    after = _mapped_kb(str(path))
    assert before >= 7 * 1024 and half < before * 0.6 and after <= 8
    assert b"".join(bytes(v) for v in views[::-1]) == data  # mapped again from the page cache
    del mv, views
    m.close()


@pytest.mark.parametrize("kind", ["store", "mx8"])
def test_a_pass_leaves_no_decoded_image_pages_mapped(tmp_path, kind):
    big = [photo(name, size=(600, 800)) for name in ("astronaut", "coffee", "chelsea")]
    files = {f"c{i % 2}/{i:02d}.jpg": encode(big[i % 3], quality=97) for i in range(48)}
    root = tmp_path / "in"
    write_tree(root, files)
    size_kb = sum(len(b) for b in files.values()) // 1024
    if kind == "store":
        data = tmp_path / "store"
        headrace.pack_dir(root, out=data)
    else:
        data = tmp_path / "pack"
        mx8.pack_dir(str(root), out=str(data), label_mode="imagefolder")
    with headrace.image(data, batch=4, resize=(32, 32)) as ld:
        n = sum(len(im) for im, _ in ld)
        left = _mapped_kb(str(data))
    assert n == 48 and size_kb > 6000
    # Without giving the pages back every decoded image would stay mapped: all of the data.
    # What may remain is the last batches' pages (page-cache folios of up to 2 MiB map whole).
    assert left < size_kb / 2, (left, size_kb)
