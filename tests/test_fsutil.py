"""undo_dir and discard_dir: what a failed create or pack leaves is removed, and only that."""

from __future__ import annotations

import os
import threading

from headrace._base.fsutil import discard_dir, undo_dir


def test_a_directory_the_call_made_is_removed(tmp_path):
    made = tmp_path / "s"
    (made / "chunks").mkdir(parents=True)
    (made / "meta.json").write_text("{}")
    undo_dir(made, made=True)
    assert not made.exists()


def test_a_directory_that_was_empty_is_emptied_but_kept_and_links_are_not_followed(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("x")
    out = tmp_path / "s"
    (out / "chunks").mkdir(parents=True)
    (out / "chunks" / "0.zr").write_bytes(b"abc")
    (out / "x.index").write_bytes(b"")
    os.symlink(outside, out / "link")
    undo_dir(out, made=False)
    assert out.is_dir() and not any(out.iterdir())
    assert (outside / "keep.txt").read_text() == "x"  # the link went, not what it pointed at


def test_discard_dir_removes_a_folder_that_a_late_writer_keeps_filling(tmp_path):
    # A cancelled remote task keeps writing parts by path while the pack gives up (the Dask case).
    staging = tmp_path / ".store.partial-x"
    parts = staging / ".parts"
    parts.mkdir(parents=True)
    stop, started, failures = threading.Event(), threading.Event(), []

    def late_writer() -> None:
        i = 0
        while not stop.is_set():
            try:
                part = parts / f"{i:06d}"
                part.mkdir()
                (part / "meta.json").write_bytes(b"x" * 4096)
            except OSError as e:
                failures.append(e)
            started.set()
            i += 1

    t = threading.Thread(target=late_writer)
    t.start()
    started.wait(5)
    try:
        discard_dir(str(staging))
        assert not staging.exists()
        assert os.listdir(tmp_path) == []  # neither the folder nor its renamed copy is left
    finally:
        stop.set()
        t.join()
    assert failures  # writes after the rename fail instead of re-creating the folder
    assert os.listdir(tmp_path) == []


def test_discard_dir_of_a_missing_folder_does_nothing(tmp_path):
    discard_dir(str(tmp_path / "absent"))
    assert os.listdir(tmp_path) == []
