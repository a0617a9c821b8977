"""A loader rebuilt over an unchanged folder reuses its listing; a changed folder is listed again.

The listing is reused while every directory keeps its inode and mtime, so these tests backdate
the tree (a directory changed within the last seconds is never trusted, see
``headrace._sources.walk``) and count the walks.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import headrace
from _images import encode, gradient, write_tree
from _media import sine, write_audio
from headrace._sources import walk
from headrace._sources.images import FolderImages

pytestmark = pytest.mark.timeout(180)

_PAST = 1_600_000_000  # 2020: far outside the window in which a directory is not trusted


def _backdate(root: Path) -> None:
    for dirpath, _dirs, _files in os.walk(root):
        os.utime(dirpath, (_PAST, _PAST))


@pytest.fixture
def walks(monkeypatch):
    calls: list[str] = []
    real = walk._walk

    def counted(root, *args):
        calls.append(root)
        return real(root, *args)

    monkeypatch.setattr(walk, "_walk", counted)
    monkeypatch.setattr(walk, "_cache", type(walk._cache)())
    return calls


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    root = tmp_path / "imgs"
    write_tree(root, {f"{c}/{i}.jpg": encode(gradient(12, 12, phase=i)) for c in ("cat", "dog")
                      for i in range(3)})
    _backdate(root)
    return root


def _paths(loader) -> list[str]:
    return sorted(bytes(p).decode() for batch in loader for p in batch["path"].to_list())


def test_rebuilt_loader_reuses_the_listing_of_an_unchanged_folder(folder, walks):
    first = _paths(headrace.load(str(folder), batch=4))
    for _ in range(3):  # a loader rebuilt each epoch
        assert _paths(headrace.load(str(folder), batch=4)) == first
    assert len(first) == 6 and len(walks) == 1
    # the same listing serves the image loader, and gives the same fingerprint
    assert sum(len(y) for _x, y in headrace.image(str(folder), resize=(8, 8), batch=3)) == 6
    assert FolderImages(folder).fingerprint == FolderImages(folder).fingerprint
    assert len(walks) == 1


@pytest.mark.parametrize("change", ["add", "remove", "rename", "new_folder"])
def test_a_changed_folder_is_listed_again(folder, walks, change):
    before = _paths(headrace.load(str(folder), batch=4))
    if change == "add":
        (folder / "cat" / "9.jpg").write_bytes(encode(gradient(12, 12, phase=9)))
        want = sorted([*before, "cat/9.jpg"])
    elif change == "remove":
        (folder / "dog" / "0.jpg").unlink()
        want = [p for p in before if p != "dog/0.jpg"]
    elif change == "rename":
        os.rename(folder / "dog" / "1.jpg", folder / "dog" / "7.jpg")
        want = sorted(["dog/7.jpg" if p == "dog/1.jpg" else p for p in before])
    else:  # a new class folder, below the root
        write_tree(folder / "eel", {"0.jpg": encode(gradient(12, 12, phase=4))})
        want = sorted([*before, "eel/0.jpg"])
    assert _paths(headrace.load(str(folder), batch=4)) == want
    assert len(walks) == 2


def test_a_folder_changed_just_before_listing_is_not_trusted(folder, walks):
    (folder / "cat" / "8.jpg").write_bytes(encode(gradient(12, 12, phase=8)))  # mtime: now
    headrace.load(str(folder), batch=4)
    headrace.load(str(folder), batch=4)
    assert len(walks) == 2  # a second change in the same clock tick would not show


def test_refresh_suffix_lists_again(folder, walks):
    headrace.image(str(folder), resize=(8, 8), batch=3)
    headrace.image(f"{folder}@refresh", resize=(8, 8), batch=3)
    assert len(walks) == 2


def test_cached_listing_cannot_be_changed_by_a_caller(folder, walks):
    one = walk.list_files(str(folder), {".jpg"})
    one.paths.append("bogus.jpg")
    two = walk.list_files(str(folder), {".jpg"})
    assert "bogus.jpg" not in two.paths and len(walks) == 1
    with pytest.raises(ValueError):
        two.sizes[0] = 1


def test_audio_folder_listing_is_reused_and_refreshed(tmp_path, walks):
    root = tmp_path / "aud"
    for c in ("a", "b"):
        for i in range(2):
            write_audio(str(root / c / f"{i}.wav"), sine(440, 8000, 800), 8000)
    _backdate(root)

    def count() -> int:
        with headrace.audio(str(root), batch=2, samples=800) as ld:
            return sum(len(y) for _x, y in ld)

    assert count() == 4 and count() == 4
    assert len(walks) == 1
    (root / "a" / "1.wav").unlink()
    assert count() == 3 and len(walks) == 2
