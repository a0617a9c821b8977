"""Listing the files of one kind under a folder: sorted, hidden entries skipped and counted."""

from __future__ import annotations

import os
from collections.abc import Collection
from typing import NamedTuple

import numpy as np


class Listing(NamedTuple):
    """Files under a root, byte-wise sorted by relative path (``/``-separated)."""

    paths: list[str]
    sizes: np.ndarray  # int64 bytes
    mtimes_ns: np.ndarray  # int64
    hidden: int  # files skipped because they or a folder above them start with "."
    other: int  # visible files whose extension is not in ``extensions``


def list_files(root: str, extensions: Collection[str], *, exclude: str | None = None,
               recursive: bool = True) -> Listing:
    """Walks ``root`` (absolute) for files whose lower-cased extension is in ``extensions``.

    ``exclude`` names a folder not to descend into (e.g. an output folder inside the input);
    ``recursive=False`` lists the files directly in ``root`` only (mx8's ``recursive=False``).
    Files that vanish during the walk are left out.
    """
    excl = os.path.abspath(exclude) if exclude is not None else None
    found: list[tuple[bytes, str, int, int]] = []
    hidden = other = 0
    for dirpath, dirnames, filenames in os.walk(root):
        if not recursive:
            dirnames[:] = []
        if excl is not None:
            dirnames[:] = [d for d in dirnames if os.path.join(dirpath, d) != excl]
        rel_dir = os.path.relpath(dirpath, root)
        parts = [] if rel_dir == "." else rel_dir.split(os.sep)
        in_hidden = any(p.startswith(".") for p in parts)
        for name in filenames:
            if in_hidden or name.startswith("."):
                hidden += 1
                continue
            if os.path.splitext(name)[1].lower() not in extensions:
                other += 1
                continue
            full = os.path.join(dirpath, name)
            try:
                st = os.stat(full)
            except FileNotFoundError:  # vanished during the walk
                continue
            if not os.path.isfile(full):
                continue
            rel = "/".join([*parts, name])
            found.append((os.fsencode(rel), rel, st.st_size, st.st_mtime_ns))
    found.sort(key=lambda t: t[0])
    n = len(found)
    return Listing([t[1] for t in found], np.fromiter((t[2] for t in found), np.int64, n),
                   np.fromiter((t[3] for t in found), np.int64, n), hidden, other)
