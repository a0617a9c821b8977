"""undo_dir: what a failed create or pack leaves is removed, and only that."""

from __future__ import annotations

import os

from headrace._fsutil import undo_dir


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
