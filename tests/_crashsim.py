"""Power-loss simulation: record a workload's file operations, rebuild what a power cut would leave.

A process kill keeps the page cache, so a crash test that kills the writer never loses an unsynced
byte. A power cut does. ``PowerLoss`` wraps the ``os`` calls that change files (``open``, ``write``,
``pwrite``, ``ftruncate``, ``fsync``, ``rename``/``replace``, ``unlink``, ``mkdir``, ...) in the
test process, and after each call under ``root`` it records two things:

* the tree as it is now (what the page cache holds), and
* the tree as the disk is guaranteed to hold it: a file's bytes as of its last ``fsync``, a
  directory's entries (creates, renames, unlinks) as of the last ``fsync`` of that directory
  (the model of ALICE and CrashMonkey: a rename is durable only once its directory is synced).

``PowerLoss.states()`` then yields, for every recorded instant, the trees a power cut there may
leave: file bytes as synced or as written, crossed with directory entries as synced, as current,
and each directory alone current (one directory's journal commit reaching the disk before
another's). The test materializes each one into a fresh directory and checks what reopening it
gives. Linux only (it reads ``/proc/self/fd``).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["PowerLoss", "State"]

_WRAPPED = ("open", "write", "pwrite", "writev", "pwritev", "ftruncate", "truncate", "fsync",
            "fdatasync", "rename", "replace", "unlink", "remove", "mkdir", "rmdir", "link",
            "symlink", "copy_file_range", "sendfile", "fallocate", "posix_fallocate")
_SYNCS = ("fsync", "fdatasync")


@dataclass
class _Tree:
    dirs: dict[int, dict[str, int]]  # identity -> {name: identity}
    files: dict[int, bytes]


@dataclass
class _Point:
    label: str
    marks: int  # how many ``mark()`` calls came before this instant
    current: _Tree
    durable_dirs: dict[int, dict[str, int]]
    durable_files: dict[int, bytes]


@dataclass
class State:
    """One tree a power cut may leave: ``files`` maps a relative path to bytes (``None``: a dir)."""

    label: str
    marks: int
    files: dict[str, bytes | None] = field(default_factory=dict)

    def materialize(self, into: Path) -> Path:
        into.mkdir(parents=True, exist_ok=True)
        for rel, data in sorted(self.files.items()):
            p = into / rel
            if data is None:
                p.mkdir(parents=True, exist_ok=True)
            else:
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_bytes(data)
        return into

    def key(self) -> str:
        h = hashlib.sha256()
        for rel, data in sorted(self.files.items()):
            h.update(rel.encode() + b"\0" + (b"D" if data is None else b"F" + data) + b"\0")
        return h.hexdigest()


class PowerLoss:
    """Records the file operations under ``root`` while the ``with`` block runs."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.path.realpath(os.fspath(root))
        self.points: list[_Point] = []
        self._marks = 0
        self._ident: dict[int, int] = {}  # inode -> identity (a fresh one when an inode reappears)
        self._next_id = 0
        self._root_id = -1
        self._saved: dict[str, object] = {}
        self._busy = False
        self._dur_dirs: dict[int, dict[str, int]] = {}
        self._dur_files: dict[int, bytes] = {}

    # -- recording -----------------------------------------------------------------------------

    def mark(self) -> None:
        """Notes that the workload reached an acknowledged point (e.g. ``commit()`` returned)."""
        self._marks += 1
        self._record("mark")

    def __enter__(self) -> PowerLoss:
        tree = self._walk()
        self._dur_dirs = {k: dict(v) for k, v in tree.dirs.items()}
        self._dur_files = dict(tree.files)
        self.points.append(_Point("start", 0, tree, dict(self._dur_dirs), dict(self._dur_files)))
        for name in _WRAPPED:
            real = getattr(os, name, None)
            if real is not None:
                self._saved[name] = real
                setattr(os, name, self._wrap(name, real))
        return self

    def __exit__(self, *exc: object) -> None:
        for name, real in self._saved.items():
            setattr(os, name, real)
        self._saved.clear()

    def _wrap(self, name: str, real):  # type: ignore[no-untyped-def]
        def call(*args, **kwargs):  # type: ignore[no-untyped-def]
            result = real(*args, **kwargs)
            if not self._busy and self._touches_root(name, args, result):
                self._busy = True
                try:
                    if name in _SYNCS:
                        self._synced(args[0])
                    self._record(f"{name}{self._describe(name, args, result)}")
                finally:
                    self._busy = False
            return result

        call.__wrapped__ = real  # type: ignore[attr-defined]
        return call

    def _fd_path(self, fd: int) -> str:
        try:
            return os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return ""

    def _under(self, path: object) -> bool:
        if isinstance(path, int):
            path = self._fd_path(path)
        if not isinstance(path, str | bytes | os.PathLike):
            return False
        p = os.path.realpath(os.fsdecode(os.fspath(path)))
        return p == self.root or p.startswith(self.root + os.sep)

    def _touches_root(self, name: str, args: tuple, result: object) -> bool:
        if name == "open":
            return isinstance(result, int) and self._under(result)
        if name in ("rename", "replace", "link", "symlink", "copy_file_range", "sendfile"):
            return any(self._under(a) for a in args[:2])
        return bool(args) and self._under(args[0]) if name not in ("unlink", "remove", "rmdir") \
            else bool(args) and self._under(os.path.dirname(os.path.abspath(os.fspath(args[0]))))

    def _describe(self, name: str, args: tuple, result: object) -> str:
        def rel(a: object) -> str:
            if isinstance(a, int):
                a = self._fd_path(a)
            with contextlib.suppress(TypeError, ValueError):
                return os.path.relpath(os.fsdecode(os.fspath(a)), self.root)  # type: ignore[arg-type]
            return "?"

        if name in ("rename", "replace", "link"):
            return f"({rel(args[0])} -> {rel(args[1])})"
        return f"({rel(result if name == 'open' else args[0])})"

    def _synced(self, fd: int) -> None:
        tree = self._walk()
        try:
            st = os.fstat(fd)
        except OSError:
            return
        ident = self._ident.get(st.st_ino)
        if ident is None:
            return
        if stat.S_ISDIR(st.st_mode):
            if ident in tree.dirs:
                self._dur_dirs[ident] = dict(tree.dirs[ident])
        elif ident in tree.files:
            self._dur_files[ident] = tree.files[ident]

    def _record(self, label: str) -> None:
        self.points.append(_Point(label, self._marks, self._walk(), dict(self._dur_dirs),
                                  dict(self._dur_files)))

    def _walk(self) -> _Tree:
        seen: dict[int, int] = {}
        dirs: dict[int, dict[str, int]] = {}
        files: dict[int, bytes] = {}

        def ident(ino: int) -> int:
            if ino not in self._ident or ino not in self._live:
                self._ident[ino] = self._next_id
                self._next_id += 1
            seen[ino] = self._ident[ino]
            return self._ident[ino]

        self._live = getattr(self, "_live", set())

        def walk(path: str, my_id: int) -> None:
            listing: dict[str, int] = {}
            with os.scandir(path) as it:
                entries = list(it)
            for e in entries:
                st = e.stat(follow_symlinks=False)
                child = ident(st.st_ino)
                listing[e.name] = child
                if stat.S_ISDIR(st.st_mode):
                    walk(e.path, child)
                elif stat.S_ISREG(st.st_mode):
                    with open(e.path, "rb") as f:
                        files[child] = f.read()
            dirs[my_id] = listing

        root_ino = os.stat(self.root).st_ino
        rid = ident(root_ino)
        if self._root_id < 0:
            self._root_id = rid
        walk(self.root, rid)
        self._live = set(seen)
        return _Tree(dirs, files)

    # -- the states a power cut may leave ----------------------------------------------------

    def states(self) -> Iterator[State]:
        """Every distinct tree a power cut at some recorded instant may leave.

        Deduplicated per number of marks before the instant (what the workload had acknowledged
        decides which trees are correct)."""
        seen: set[str] = set()
        for pt in self.points:
            dir_ids = sorted(set(pt.current.dirs) | set(pt.durable_dirs))
            dir_choices: list[set[int]] = [set(), set(dir_ids)] + [{d} for d in dir_ids]
            for files_current in (False, True):
                for current_dirs in dir_choices:
                    st = self._build(pt, files_current, current_dirs)
                    k = f"{st.marks}:{st.key()}"
                    if k not in seen:
                        seen.add(k)
                        yield st

    def _build(self, pt: _Point, files_current: bool, current_dirs: set[int]) -> State:
        out = State(pt.label, pt.marks)
        is_dir = set(pt.current.dirs) | set(pt.durable_dirs)

        def listing(d: int) -> dict[str, int]:
            if d in current_dirs and d in pt.current.dirs:
                return pt.current.dirs[d]
            return pt.durable_dirs.get(d, {})

        def build(d: int, prefix: str, depth: int) -> None:
            if depth > 32:
                return
            for name, child in sorted(listing(d).items()):
                rel = f"{prefix}{name}"
                if child in is_dir:
                    out.files[rel] = None
                    build(child, rel + "/", depth + 1)
                elif files_current and child in pt.current.files:
                    out.files[rel] = pt.current.files[child]
                else:
                    out.files[rel] = pt.durable_files.get(child, b"")

        build(self._root_id, "", 0)
        return out
