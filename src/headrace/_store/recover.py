"""Crash recovery: bring a store's files back to exactly what ``meta.json`` commits.

Everything a crashed (or rolled-back) writer can leave behind is either bytes past a committed size
(appends in place) or files ``meta.json`` does not name (copy-on-write index files, compacted
chunks, ``meta.json.tmp``). Both are invisible to readers; recovery removes them so the next writer
appends at the committed ends.
"""

from __future__ import annotations

import os
import stat

from headrace._store import format as _format
from headrace._store.format import AUX_DTYPE, CHUNK_DIR, INDEX_DTYPE, Meta

__all__ = ["recover"]


def recover(path: str, meta: Meta) -> None:
    """Truncates bytes past the commit and deletes files ``meta`` does not name.

    Run by a writer (holding the lock) when it opens a store and when it rolls back. Only names
    that match the store's own patterns are deleted (index/aux files, chunks, dictionaries, ``meta.json.tmp``),
    so files a user put in the directory (``_labels.tsv``, notes) are left alone.
    """
    keep = {_format.META_NAME, _format.LOCK_NAME}
    keep.update(fe.dict_file for fe in meta.fields if fe.dict_file is not None)
    for fe in meta.fields:
        for name, size in ((fe.index, meta.length * INDEX_DTYPE.itemsize),
                           (fe.aux, meta.length * AUX_DTYPE.itemsize)):
            keep.add(name)
            _truncate_to(os.path.join(path, name), size)
    chunk_keep = set()
    for c in meta.chunks:
        chunk_keep.add(f"{c.id}.zr")
        _truncate_to(os.path.join(path, _format.chunk_name(c.id)), c.size)
    removed = False
    for name in os.listdir(path):
        if name not in keep and (_format.INDEX_FILE.match(name) or _format.DICT_FILE.match(name)
                                 or name == _format.META_TMP_NAME):
            os.unlink(os.path.join(path, name))
            removed = True
    cdir = os.path.join(path, CHUNK_DIR)
    os.makedirs(cdir, exist_ok=True)
    for name in os.listdir(cdir):
        if name not in chunk_keep and _format.CHUNK_FILE.match(name):
            os.unlink(os.path.join(cdir, name))
            removed = True
    if removed:
        _format.fsync_dir(cdir)
        _format.fsync_dir(path)


def _truncate_to(path: str, size: int) -> None:
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return  # a missing committed file is reported by whoever reads it
    # (a directory or FIFO in its place is damage too, reported the same way: never truncated)
    if stat.S_ISREG(info.st_mode) and info.st_size > size:
        os.truncate(path, size)
