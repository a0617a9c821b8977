"""An optional local byte cache for remote reads: a hard size limit, LRU eviction, many processes.

Entries are plain files ``<root>/<2 hex>/<sha256 of the key>``. A read opens the file and bumps its
mtime (the LRU clock); a write goes to a temporary file and is renamed into place, so a reader sees a
whole entry or none. The bytes in use are tracked in ``<root>/usage`` under an exclusive ``flock`` of
``<root>/.lock``; a write that would pass ``max_bytes`` first evicts the least recently used entries
(oldest mtime) until the new entry fits, so the cache never holds more than ``max_bytes`` of entries.
An entry bigger than ``max_bytes`` is simply not cached. A reader that loses an entry to another
process's eviction gets a miss (an open file stays readable after the unlink).

Power loss: an entry's bytes are fsynced before its rename, so a cut leaves a whole entry or none
(losing an entry is only a miss, so directories are not synced). ``usage`` is not synced at all;
it carries the boot id it was written under, and the first process after a reboot finds another
boot id, rescans the entries and removes the temporary files that processes of the old boot left.

Callers must make keys immutable-content names (an object's key plus its ETag, or a committed chunk
range plus the store generation): the cache never checks the origin again.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import tempfile
import threading
import time
from collections.abc import Iterator

from headrace._base.errors import ConfigError

__all__ = ["ByteCache"]


def _boot_time() -> float:
    """When this machine booted (seconds since the epoch); 0 where that is unknown."""
    try:
        with open("/proc/uptime") as f:
            return time.time() - float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0


def _boot_id() -> str:
    """Changes at every boot (Linux); elsewhere constant, so the usage file is always trusted."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


class ByteCache:
    """A directory of cached byte strings, at most ``max_bytes`` in total.

    Args:
        root: the cache directory (created if missing); may be shared by several processes.
        max_bytes: the hard limit on the bytes of all entries together.

    Attributes:
        hits, misses, evictions: counters of this process.
    """

    def __init__(self, root: str | os.PathLike[str], *, max_bytes: int) -> None:
        if not isinstance(max_bytes, int) or max_bytes <= 0:
            raise ConfigError(f"cache max_bytes must be a positive int, got {max_bytes!r}")
        self.root = os.path.abspath(os.fspath(root))
        self.max_bytes = max_bytes
        os.makedirs(self.root, exist_ok=True)
        self.hits = self.misses = self.evictions = 0
        self._tlock = threading.Lock()  # flock is per open file; threads also need a mutex

    def __getstate__(self) -> dict[str, object]:
        state = self.__dict__.copy()
        del state["_tlock"]
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._tlock = threading.Lock()

    def _path(self, key: str) -> str:
        h = hashlib.sha256(key.encode()).hexdigest()
        return os.path.join(self.root, h[:2], h)

    def get(self, key: str) -> bytes | None:
        """The cached bytes of ``key``, or ``None``."""
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            self.misses += 1
            return None
        with contextlib.suppress(OSError):
            os.utime(path)
        self.hits += 1
        return data

    def put(self, key: str, data: bytes | memoryview) -> bool:
        """Stores ``data`` under ``key``; returns False when it is larger than the whole cache."""
        size = len(data)
        if size > self.max_bytes:
            return False
        path = self._path(key)
        d = os.path.dirname(path)
        os.makedirs(d, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())  # renamed whole or not at all, even across a power cut
            with self._locked():
                old = os.path.getsize(path) if os.path.exists(path) else 0
                usage = self._read_usage() - old
                if usage + size > self.max_bytes:
                    usage = self._evict(self.max_bytes - size, keep=path)
                os.replace(tmp, path)
                self._write_usage(usage + size)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return True

    def usage_bytes(self) -> int:
        """Bytes of all entries, as tracked."""
        with self._locked():
            return self._read_usage()

    # -- internals (called with the lock held) ------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with self._tlock:
            fd = os.open(os.path.join(self.root, ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)

    def _read_usage(self) -> int:
        try:
            with open(os.path.join(self.root, "usage")) as f:
                boot, _, n = f.read().strip().rpartition(" ")
            if boot == _boot_id():
                return int(n)
            # from before a reboot: a power cut may have lost updates, and every writer of that
            # boot is gone, so their temporary files are garbage
            self._remove_temp_files()
        except (FileNotFoundError, ValueError):
            pass  # missing or torn: count the entries (writers of this boot may be mid-put)
        return self._scan_total()

    def _write_usage(self, n: int) -> None:
        tmp = os.path.join(self.root, ".usage.tmp")
        with open(tmp, "w") as f:
            f.write(f"{_boot_id()} {n}")
        os.replace(tmp, os.path.join(self.root, "usage"))

    def _remove_temp_files(self) -> None:
        """Removes temporary files written before this boot (a put of this boot may be running)."""
        booted = _boot_time()
        for sub in os.scandir(self.root):
            if sub.is_dir() and len(sub.name) == 2:
                for e in os.scandir(sub.path):
                    with contextlib.suppress(FileNotFoundError):
                        if e.name.startswith(".tmp-") and e.stat().st_mtime < booted:
                            os.unlink(e.path)

    def _entries(self) -> list[tuple[int, int, str]]:
        out = []
        for sub in os.scandir(self.root):
            if not sub.is_dir() or len(sub.name) != 2:
                continue
            for e in os.scandir(sub.path):
                if e.name.startswith(".tmp-"):
                    continue
                try:
                    st = e.stat()
                except FileNotFoundError:
                    continue
                out.append((st.st_mtime_ns, st.st_size, e.path))
        return out

    def _scan_total(self) -> int:
        return sum(size for _, size, _ in self._entries())

    def _evict(self, target: int, *, keep: str) -> int:
        """Deletes least recently used entries until at most ``target`` bytes remain."""
        entries = sorted(self._entries())
        total = sum(size for _, size, p in entries if p != keep)
        for _, size, p in entries:
            if total <= target:
                break
            if p == keep:
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p)
                self.evictions += 1
            total -= size
        return total
