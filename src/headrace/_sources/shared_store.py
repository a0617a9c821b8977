"""Stores opened by path, shared within a process while their files stay unchanged.

A script that builds its loader every epoch (``for epoch ...: with headrace.load(path) as ld``)
would otherwise open the store again each time: map every file afresh (page faults over the whole
store again), scan its layout, hash its aux entries for the fingerprint, and checksum each record
again on its first read. ``verify="first"`` promises one check per record per *process* (committed
bytes never change), so the same ``Store`` can serve the next open as long as its files are the
ones it checked.

"The same files" is decided by ``os.stat`` of ``meta.json`` and of every index, aux, dictionary
and chunk file the store's commit names: device, inode, size, mtime and ctime must all be equal.
A commit replaces ``meta.json`` (a new inode), an append or an in-place write changes a file's
size or times, so any of these opens the store afresh. Timestamps have a granularity (the kernel
stamps files with a clock that lags by up to a tick; some filesystems keep whole seconds), so a
write within the same tick as the earlier stamp could leave the times equal: a store whose newest
file changed less than ``_SETTLE_NS`` before it was opened is never reused (git's "racily clean"
rule). A later write then stamps a time past every one recorded, and is seen.

At most ``_IDLE_MAX`` stores no loader uses stay open (a train and an eval store read in turn);
an older idle one is closed. A forked child starts with no shared stores.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from typing import Any

from headrace._sources import base as _base
from headrace._sources.base import StoreSource
from headrace._store import format as _format

__all__ = ["SharedStoreSource", "open_data", "open_shared", "opens_as_store", "shared_count"]

_SETTLE_NS = 2_000_000_000  # files changed this shortly before the open: not reused
_IDLE_MAX = 2

_Signature = tuple[tuple[str, int, int, int, int, int], ...]


class _Entry:
    __slots__ = ("closed", "key", "settled", "signature", "sources", "store", "users")

    def __init__(self, key: tuple[str, str], store: Any, signature: _Signature,
                 settled: bool) -> None:
        self.key = key
        self.store = store
        self.signature = signature
        self.settled = settled
        self.users = 0
        self.closed = False
        # StoreSource per field selection: its fingerprint hashes every aux entry, once
        self.sources: dict[tuple[str, ...] | None, StoreSource] = {}


# Reentrant: a loader dropped without close() gives its store back from a finalizer, which the
# garbage collector may run inside any allocation, including one made while this lock is held.
_lock = threading.RLock()
_entries: dict[tuple[str, str], _Entry] = {}
_idle: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
_pid = os.getpid()


def _files(store: Any) -> list[str]:
    meta = store.meta
    names = [_format.META_NAME]
    for fe in meta.fields:
        names += [fe.index, fe.aux]
        if fe.dict_file is not None:
            names.append(fe.dict_file)
    names += [_format.chunk_name(c.id) for c in meta.chunks]
    return names


def _signature(path: str, names: list[str]) -> _Signature | None:
    out = []
    for name in names:
        try:
            st = os.stat(os.path.join(path, name))
        except OSError:
            return None  # a file the commit names is gone: never reused
        out.append((name, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    return tuple(out)


def _meta_stat(path: str) -> tuple[int, int, int, int, int] | None:
    try:
        st = os.stat(os.path.join(path, _format.META_NAME))
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _alive(store: Any) -> bool:
    try:
        len(store)  # raises once the store was closed (by a program that reached it)
    except Exception:
        return False
    return True


def _close(entry: _Entry) -> None:
    entry.closed = True
    entry.store.close()


def _reset_after_fork() -> None:
    global _pid
    if os.getpid() != _pid:  # the parent's stores are its own (and their locks may be held)
        _entries.clear()
        _idle.clear()
        _pid = os.getpid()


def _open_entry(path: str, verify: str) -> _Entry:
    """Opens the store and records its files; the entry is shared only when they had settled
    before the open and did not change during it."""
    from headrace._store.reader import open as open_store

    opened_at = time.time_ns()
    before = _meta_stat(path)
    store = open_store(path, verify=verify)  # type: ignore[arg-type]
    try:
        after = _meta_stat(path)
        sig = _signature(path, _files(store)) if before is not None and before == after else None
    except BaseException:
        store.close()
        raise
    if sig is None:
        return _Entry((path, verify), store, (), settled=False)
    newest = max(max(s[4], s[5]) for s in sig)
    return _Entry((path, verify), store, sig, settled=newest < opened_at - _SETTLE_NS)


def opens_as_store(data: Any) -> bool:
    """Whether ``open_source(data)`` would open ``data`` as a local store path (plugins first,
    as ``open_source`` tries them)."""
    if not isinstance(data, str | os.PathLike):
        return False
    return _base.opener_of(data) is _base._open_store


def open_data(data: Any) -> Any:
    """``open_source(data)``, except that a local store path gives the store this process already
    opened there while its files are unchanged: a loader built per epoch (or per rank wrapper)
    then maps, scans and checksums the store once, as one over a kept ``Store`` does."""
    if opens_as_store(data):
        return open_shared(data)
    return _base.open_source(data)


def open_shared(path: str | os.PathLike[str], *, fields: list[str] | str | None = None,
                verify: str = "first") -> SharedStoreSource:
    """A source over the store at ``path``: the store this process already opened there when its
    files are unchanged, else a newly opened one (shared from then on)."""
    real = os.path.realpath(os.fspath(path))
    key = (real, verify)
    wanted = None if fields is None else ((fields,) if isinstance(fields, str) else tuple(fields))
    with _lock:
        _reset_after_fork()
        entry = _entries.get(key)
        if entry is not None:
            same = (entry.settled and _alive(entry.store)
                    and _signature(real, [s[0] for s in entry.signature]) == entry.signature)
            if not same:
                _entries.pop(key, None)
                _idle.pop(key, None)
                if entry.users == 0:
                    _close(entry)
                entry = None
        if entry is None:
            entry = _open_entry(real, verify)
            if entry.settled:
                _entries[key] = entry
        entry.users += 1
        _idle.pop(key, None)
        if entry.closed:  # a finalizer gave it back and pushed it out meanwhile: open anew
            entry = _open_entry(real, verify)
            entry.users += 1
        try:
            source = entry.sources.get(wanted)
            if source is None:
                source = StoreSource(entry.store, fields=None if wanted is None else list(wanted),
                                     owned=False)
                entry.sources[wanted] = source
        except BaseException:
            _release(entry)
            raise
    return SharedStoreSource(entry, source)


def _release(entry: _Entry) -> None:
    """One user fewer (called with ``_lock`` held)."""
    entry.users -= 1
    if entry.users > 0 or entry.closed:
        return
    if _entries.get(entry.key) is not entry:  # replaced or never shared: nobody else can use it
        _close(entry)
        return
    _idle[entry.key] = entry
    _idle.move_to_end(entry.key)
    while len(_idle) > _IDLE_MAX:
        _, old = _idle.popitem(last=False)
        _entries.pop(old.key, None)
        _close(old)


def shared_count() -> int:
    """Stores this process keeps open for reuse (in use or idle)."""
    with _lock:
        _reset_after_fork()
        return len(_entries)


class SharedStoreSource:
    """A ``StoreSource`` over a shared store: ``close()`` gives the store back instead of closing
    it (it closes once no loader uses it and newer idle stores push it out, or its files change).
    """

    def __init__(self, entry: _Entry, source: StoreSource) -> None:
        self._entry = entry
        self._source = source
        self._released = False
        self._pid = os.getpid()  # a forked child's copy gives nothing back to the parent's
        self.store = source.store
        self.fields = source.fields
        # bound methods of the shared source: no extra call per batch
        self.gather = source.gather
        self.nbytes = source.nbytes
        self.record_nbytes = source.record_nbytes
        self.gather_start = source.gather_start
        self.work_state = source.work_state

    def __len__(self) -> int:
        return len(self._source)

    @property
    def fingerprint(self) -> str:
        return self._source.fingerprint

    def close(self) -> None:
        with _lock:
            if self._released:
                return
            self._released = True
            if os.getpid() == self._pid:
                _release(self._entry)

    def __reduce__(self) -> tuple[Any, ...]:
        # another process opens (and shares) its own
        return (_reopen, (self.store.path, self.fields, self.store.verify))

    def __repr__(self) -> str:
        return f"SharedStoreSource({self.store!r}, fields={self.fields})"


def _reopen(path: str, fields: tuple[str, ...], verify: str) -> SharedStoreSource:
    return open_shared(path, fields=list(fields), verify=verify)
