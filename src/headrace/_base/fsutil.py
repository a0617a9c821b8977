"""Small file-system helpers for the writer: full writes, copies, the writer lock, full-disk errors."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import stat
import tempfile
import time

from headrace._base.errors import CorruptionError, StoreExistsError, StoreFullError, WriterBusyError

__all__ = ["acquire_lock", "copy_prefix", "discard_dir", "file_kind", "is_disk_full",
           "open_regular", "publish_dir", "pwrite_all", "replace_store", "store_full", "undo_dir"]

_FULL = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT}


def file_kind(mode: int) -> str:
    """What a non-regular file is, in words (for error messages)."""
    for test, name in ((stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO"),
                       (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device")):
        if test(mode):
            return name
    return "special file"


def open_regular(path: str) -> int:
    """Opens ``path`` read-only and returns the fd, refusing anything but a regular file.

    ``O_NONBLOCK``: opening a FIFO for reading would otherwise wait for a writer forever, and a
    directory or device opened as a store file would fail later with a confusing error (or hang).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        CorruptionError: ``path`` is a directory, FIFO, socket or device.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
    except BaseException:
        os.close(fd)
        raise
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise CorruptionError(f"{path} is a {file_kind(mode)}, not a regular file; the store is "
                              "damaged: restore that file from a backup")
    return fd


def pwrite_all(fd: int, data: object, offset: int) -> None:
    """Writes all of ``data`` (any contiguous buffer) at ``offset``, looping over short writes."""
    view = memoryview(data).cast("B")  # type: ignore[arg-type]
    while view:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n


def copy_prefix(src_fd: int, dst_fd: int, nbytes: int) -> None:
    """Copies the first ``nbytes`` of ``src_fd`` to the start of ``dst_fd``."""
    done = 0
    fast = hasattr(os, "copy_file_range")  # Linux: the kernel copies (or reflinks) the bytes
    while done < nbytes:
        n = 0
        if fast:
            try:
                n = os.copy_file_range(src_fd, dst_fd, nbytes - done, done, done)
            except OSError as e:
                if e.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                    raise
                fast = False
        if n == 0:  # not supported here, or the source is shorter: fall back to read/write
            buf = os.pread(src_fd, min(nbytes - done, 1 << 24), done)
            if not buf:
                raise OSError(errno.EIO, f"source file ends at {done} bytes, expected {nbytes}")
            pwrite_all(dst_fd, buf, done)
            n = len(buf)
        done += n


def acquire_lock(lock_path: str, store: str) -> int:
    """Takes the store's exclusive writer lock (non-blocking) and writes our pid into it."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
        except OSError:
            holder = ""
        os.close(fd)
        who = f" (held by pid {holder})" if holder.isdigit() else ""
        raise WriterBusyError(
            f"store {store} already has a writer{who}; only one writer at a time is allowed: "
            "close the other writer (or wait for it to finish), or open the store read-only "
            "with headrace.open(path)") from None
    try:  # informational only (error messages name the holder): a full disk must not block us
        os.ftruncate(fd, 0)
        pwrite_all(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError:
        pass
    return fd


def is_disk_full(e: BaseException) -> bool:
    return isinstance(e, OSError) and e.errno in _FULL


def store_full(store: str, e: OSError) -> StoreFullError:
    err = StoreFullError(
        f"the disk holding store {store} is full ({os.strerror(e.errno or 0)}) during a write; "
        "nothing was committed and the store is still at its last commit: free some space "
        "(or `headrace compact` the store) and write again")
    err.errno = e.errno
    return err


def undo_dir(path: str | os.PathLike[str], *, made: bool) -> None:
    """Removes what a failed create or pack left at ``path``, so a retry finds it as before.

    ``made``: this call created the directory (remove it); else it was empty before (empty it).
    """
    if made:
        shutil.rmtree(path, ignore_errors=True)
        return
    for name in os.listdir(path):
        full = os.path.join(path, name)
        if os.path.isdir(full) and not os.path.islink(full):
            shutil.rmtree(full, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(full)


def discard_dir(path: str, *, attempts: int = 50, pause_s: float = 0.02) -> None:
    """Removes ``path`` even while workers elsewhere may still be writing into it by path.

    A task on a remote executor (Dask, Ray) can outlive the cancel of its future and keep creating
    files under ``path``; a plain ``rmtree`` racing it leaves a half-removed folder behind. So the
    folder is first renamed to a fresh sibling: from then on every path a late writer opens under
    the old name fails (ENOENT), nothing new can appear, and the renamed tree is removed for good.
    """
    if not os.path.lexists(path):
        return
    parent, name = os.path.split(os.path.abspath(path))
    grave = path
    with contextlib.suppress(OSError):  # cannot rename here (permissions, odd fs): remove in place
        holder = tempfile.mkdtemp(dir=parent, prefix=f".{name.lstrip('.')}.removing-")
        try:
            os.rename(path, os.path.join(holder, name))
            grave = holder
        except OSError:
            os.rmdir(holder)
    for _ in range(attempts):  # fd-relative writes (an open file) may still land for a moment
        shutil.rmtree(grave, ignore_errors=True)
        if not os.path.lexists(grave):
            return
        time.sleep(pause_s)
    shutil.rmtree(grave)  # still there: say why


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish_dir(staging: str, out: str, *, who: str) -> None:
    """Moves a finished store from its private ``staging`` folder to ``out`` with one rename.

    Readers (and a crash) see either nothing at ``out`` or the whole store. The rename replaces
    only a missing or empty ``out``: when another process published there first (two ranks
    packing the same missing path), its store is kept as it is and this one is refused. The
    caller removes ``staging`` when this raises.

    Raises:
        StoreExistsError: ``out`` was filled (by another pack) while this one was running.
    """
    _fsync_dir(staging)
    try:
        os.rename(staging, out)  # over an empty folder too (POSIX)
    except OSError as e:
        if e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
            raise
        raise StoreExistsError(
            f"{who}: {out} was filled by someone else (another pack to the same path?) while "
            "this one ran; that store was left as it is and this pack's copy was removed: open "
            f"{out} if it holds the same data, or pack to a new path") from None
    _fsync_dir(os.path.dirname(os.path.abspath(out)) or ".")


def replace_store(out: str, *, overwrite: bool, who: str) -> None:
    """Makes way for a new store at ``out``: nothing to do when it is absent or empty.

    A non-empty ``out`` is deleted only with ``overwrite`` and only when it is a headrace store
    (it has a ``meta.json``), never any other directory.

    Raises:
        StoreExistsError: ``out`` is not empty and ``overwrite`` is false, or it is not a store.
    """
    if not os.path.exists(out) or (os.path.isdir(out) and not os.listdir(out)):
        return
    if not overwrite:
        raise StoreExistsError(f"{who}: {out} exists and is not empty; pass overwrite=True to "
                               "replace the store there, or pick a new out")
    if not os.path.isfile(os.path.join(out, "meta.json")):
        raise StoreExistsError(f"{who}: {out} is not a headrace store; refusing to delete it "
                               "even with overwrite=True")
    shutil.rmtree(out)
