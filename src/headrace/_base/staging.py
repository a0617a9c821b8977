"""The private sibling folder a pack builds its store in, and the leftovers of killed packs.

Every packer builds into ``.NAME.partial-<host>.<pid>.<start>.<random>`` beside ``out`` and
publishes it with one rename, so a failure or a kill never leaves a half-made store at ``out``.
A killed pack (SIGKILL, power loss) cannot remove its folder, so the next pack to the same
``out`` removes the folders of writers that are certainly gone: started on this host by a pid
that no longer runs, or that now runs another process (its start time differs). A folder of a
live writer, of another host, or with a name not in this form (an older version's) is never
touched.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import tempfile

from headrace._base.fsutil import discard_dir

__all__ = ["make_staging", "remove_stale_staging"]

_TAG = ".partial-"


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname()) or "host"


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22), or
    ``"0"`` where there is no ``/proc``: then a live pid is always taken for the writer."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return "0"
    fields = raw[raw.rfind(b")") + 2:].split()
    return fields[19].decode() if len(fields) > 19 else "0"


def make_staging(out: str) -> str:
    """A new empty staging folder for ``out`` (absolute), after removing dead writers' ones."""
    parent, base = os.path.split(out)
    remove_stale_staging(out)
    pid = os.getpid()
    return tempfile.mkdtemp(dir=parent or ".",
                            prefix=f".{base}{_TAG}{_host()}.{pid}.{_start_time(pid)}.")


def _dead(name: str, base: str) -> bool:
    rest = name[len(base) + 1 + len(_TAG):]
    parts = rest.rsplit(".", 3)
    if len(parts) != 4 or not parts[1].isdigit() or not parts[2].isdigit():
        return False  # not a name this module gave: whose it is cannot be told
    host, pid_s, start, _random = parts
    if host != _host():
        return False  # another machine's writer may be running
    pid = int(pid_s)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # runs, as another user
        pass
    return start != "0" and _start_time(pid) not in (start, "0")  # the pid was reused


def remove_stale_staging(out: str) -> list[str]:
    """Removes the staging folders of ``out`` whose writer is gone; returns their paths."""
    parent, base = os.path.split(out)
    prefix = f".{base}{_TAG}"
    try:
        names = os.listdir(parent or ".")
    except OSError:
        return []
    removed = []
    for name in names:
        path = os.path.join(parent, name)
        if not name.startswith(prefix) or os.path.islink(path) or not os.path.isdir(path):
            continue
        if _dead(name, base):
            with contextlib.suppress(OSError):  # another pack removing it too
                discard_dir(path)
                removed.append(path)
    return removed
