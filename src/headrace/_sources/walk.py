"""Listing the files of one kind under a folder: sorted, hidden entries skipped and counted.

A loader rebuilt every epoch over the same folder would list it again each time (one ``stat`` per
file: most of the cost). Listings are kept in a small process-wide cache and reused while every
directory of the tree has the ``(inode, mtime)`` it had when listed: adding, removing or renaming
a file (an atomic replace too) changes its directory's mtime, so a changed tree is listed again,
while checking costs one ``stat`` per directory. A listing taken while a directory was changing
(mtime within ``_RACY_NS`` of the listing) is not kept, since a second change in the same clock
tick would leave the mtime as it was. ``fresh=True`` (``path@refresh``) always lists again.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Collection
from typing import NamedTuple

import numpy as np

#: listings kept, and files across them (a bound on the memory the cache holds)
_CACHE_LISTINGS = 8
_CACHE_FILES = 4_000_000
#: a directory modified this close to its listing may change again unseen (coarse timestamps)
_RACY_NS = 2_000_000_000


class Listing(NamedTuple):
    """Files under a root, byte-wise sorted by relative path (``/``-separated)."""

    paths: list[str]
    sizes: np.ndarray  # int64 bytes
    mtimes_ns: np.ndarray  # int64
    hidden: int  # files skipped because they or a folder above them start with "."
    other: int  # visible files whose extension is not in ``extensions``


_DirState = tuple[str, int, int]  # (directory, st_ino, st_mtime_ns)
_Key = tuple[str, frozenset[str], str | None, bool]

_lock = threading.Lock()
_cache: OrderedDict[_Key, tuple[Listing, tuple[_DirState, ...]]] = OrderedDict()


def list_files(root: str, extensions: Collection[str], *, exclude: str | None = None,
               recursive: bool = True, fresh: bool = False) -> Listing:
    """Walks ``root`` (absolute) for files whose lower-cased extension is in ``extensions``.

    ``exclude`` names a folder not to descend into (e.g. an output folder inside the input);
    ``recursive=False`` lists the files directly in ``root`` only (mx8's ``recursive=False``).
    Files that vanish during the walk are left out. An unchanged tree listed before in this
    process is not listed again (see the module note); ``fresh=True`` lists it regardless.
    """
    excl = os.path.abspath(exclude) if exclude is not None else None
    key: _Key = (root, frozenset(extensions), excl, recursive)
    if not fresh:
        with _lock:
            hit = _cache.get(key)
            if hit is not None:
                _cache.move_to_end(key)
        if hit is not None and _unchanged(hit[1]):
            return hit[0]._replace(paths=list(hit[0].paths))
    started = time.time_ns()
    listing, dirs = _walk(root, extensions, excl, recursive)
    if all(mt < started - _RACY_NS for _d, _i, mt in dirs) and len(listing.paths) <= _CACHE_FILES:
        listing.sizes.flags.writeable = False
        listing.mtimes_ns.flags.writeable = False
        with _lock:
            _cache[key] = (listing, dirs)
            _cache.move_to_end(key)
            while (len(_cache) > _CACHE_LISTINGS
                   or sum(len(v[0].paths) for v in _cache.values()) > _CACHE_FILES):
                _cache.popitem(last=False)
        return listing._replace(paths=list(listing.paths))
    return listing


def _unchanged(dirs: tuple[_DirState, ...]) -> bool:
    for d, ino, mtime in dirs:
        try:
            st = os.stat(d)
        except OSError:
            return False
        if st.st_ino != ino or st.st_mtime_ns != mtime:
            return False
    return True


def _walk(root: str, extensions: Collection[str], excl: str | None,
          recursive: bool) -> tuple[Listing, tuple[_DirState, ...]]:
    """The listing, and the state of every directory it looked into (a directory changed while
    walking has an mtime after the walk started, so ``list_files`` does not keep the listing)."""
    found: list[tuple[bytes, str, int, int]] = []
    dirs: list[_DirState] = []
    hidden = other = 0
    for dirpath, dirnames, filenames in os.walk(root):
        try:
            dst = os.stat(dirpath)
        except OSError:  # vanished during the walk: never trust this listing again
            dirs.append((dirpath, -1, -1))
        else:
            dirs.append((dirpath, dst.st_ino, dst.st_mtime_ns))
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
            if not stat.S_ISREG(st.st_mode):
                continue
            rel = "/".join([*parts, name])
            found.append((os.fsencode(rel), rel, st.st_size, st.st_mtime_ns))
    found.sort(key=lambda t: t[0])
    n = len(found)
    return Listing([t[1] for t in found], np.fromiter((t[2] for t in found), np.int64, n),
                   np.fromiter((t[3] for t in found), np.int64, n), hidden, other), tuple(dirs)
