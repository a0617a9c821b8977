"""mx8's ``recursive=`` keyword: accepted wherever mx8 takes it, with its meaning.

``recursive=True`` (mx8's default) reads a folder's subfolders too; ``False`` only the files
directly in it. Stores, mx8 packs and zrecord containers list their own records, so there it
changes nothing (as in mx8, where a pack's manifest wins over walking).
"""

from __future__ import annotations

from pathlib import Path

import mx8
import numpy as np
import pytest

import headrace
from _images import encode, gradient, write_tree
from _media import sine, write_audio, write_video
from headrace import ConfigError

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    root = tmp_path / "imgs"
    files = {f"{c}/{i}.jpg": encode(gradient(16, 20, phase=i)) for c in ("cat", "dog")
             for i in range(3)}
    files.update({f"top{i}.png": encode(gradient(16, 20, phase=9 + i), "PNG") for i in range(2)})
    write_tree(root, files)
    return root


def _count(loader) -> int:
    n = 0
    for batch in loader:
        first = batch[0] if isinstance(batch, tuple) else next(iter(batch.values()))
        n += len(first)
    return n


def test_load_of_an_image_folder_takes_mx8s_zero_manifest_spelling(folder):
    # the mx8 README's example, which raised TypeError from FolderImages.__init__ (the warning:
    # two files sit outside class folders, so the whole folder is unlabeled)
    with pytest.warns(UserWarning, match="not an ImageFolder layout"):
        assert _count(headrace.load(str(folder), recursive=True, profile="balanced")) == 8
    with pytest.warns(UserWarning, match="not an ImageFolder layout"):
        assert _count(headrace.image(str(folder), recursive=True, resize=(8, 8), batch=4)) == 8
    # a flat listing: only the two top-level files (no warning: no file can have a class folder)
    assert _count(headrace.load(str(folder), recursive=False, batch=4)) == 2
    assert _count(headrace.image(str(folder), recursive=False, resize=(8, 8), batch=4)) == 2
    assert _count(headrace.run(str(folder), recursive=False, batch=4)) == 2


def test_recursive_changes_nothing_for_stores_packs_and_containers(folder, tmp_path):
    store = tmp_path / "store"
    headrace.pack_arrays(store, x=np.arange(10))
    for flag in (True, False):
        assert _count(headrace.load(str(store), recursive=flag, batch=4)) == 10
    pack = tmp_path / "pack"
    mx8.pack_dir(str(folder), out=str(pack), shard_mb=1, label_mode="none")
    assert _count(headrace.load(str(pack), recursive=False, batch=4)) == 8
    zr = Path(__file__).parent / "data" / "zrecord" / "dense_raw_f32"
    assert _count(headrace.load(str(zr), recursive=True, batch=4)) == 11


def test_audio_and_video_take_recursive(tmp_path):
    root = tmp_path / "audio"
    for rel in ("a.wav", "b.wav", "speech/c.wav", "speech/deep/d.wav"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        write_audio(str(root / rel), sine(440, 8000, 800), 8000)
    assert _count(headrace.audio(str(root), samples=400, batch=8)) == 4
    assert _count(headrace.audio(str(root), samples=400, batch=8, recursive=False)) == 2
    import av  # noqa: F401  (the test needs it installed)
    vids = tmp_path / "video"
    (vids / "sub").mkdir(parents=True)
    write_video(str(vids / "top.mp4"), 12, fps=8)
    write_video(str(vids / "sub" / "inner.mp4"), 12, fps=8)
    kw = {"clip": 4, "stride": 4, "fps": 8, "batch": 16, "index_dir": tmp_path / "idx"}
    assert _count(headrace.video(str(vids), recursive=True, **kw)) == 6
    assert _count(headrace.video(str(vids), recursive=False, **kw)) == 3


def test_run_under_a_launcher_refuses_a_flat_listing(folder):
    with pytest.raises(ConfigError, match=r"recursive=False\) applies to one-process"):
        headrace.run(str(folder), recursive=False, rank=0, world_size=2)
