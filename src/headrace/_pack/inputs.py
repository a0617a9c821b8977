"""Input files named the ways users name them: a file, a folder, a glob, a brace pattern, a list;
local or ``s3://``. Shared by ``pack_arrow`` (Parquet files) and ``pack_webdataset`` (tar shards).

Order is part of the dataset: inputs come out in the order given, and a folder, prefix or glob
expands to its matches sorted byte-wise by path/key, so a pack is the same wherever it runs.
An ``InputFile`` is small and picklable, so parallel tasks carry their inputs, not their bytes.
"""

from __future__ import annotations

import fnmatch
import glob
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO, Any

from headrace._base.errors import ConfigError

__all__ = ["InputFile", "expand_braces", "list_inputs"]

_BRACE = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)$")
_GLOB_CHARS = frozenset("*?[")


@dataclass(frozen=True)
class InputFile:
    """One input: a local path, or an S3 object (``client`` is its bucket's ``ObjectStore``)."""

    name: str  # local path or s3:// URL, for messages
    size: int
    key: str | None = None
    client: Any = None

    def open(self) -> IO[bytes]:
        """A seekable binary reader (S3: ranged GETs behind an 8 MiB buffer)."""
        if self.client is None:
            return open(self.name, "rb")
        from headrace._remote.range_file import open_object

        assert self.key is not None
        return open_object(self.client, self.key, self.size)


def expand_braces(pattern: str) -> list[str]:
    """WebDataset/bash brace expansion: ``a-{000..002}.tar`` -> ``a-000.tar, a-001.tar, a-002.tar``
    (zero padding kept from the wider bound), ``{train,val}`` -> both; several braces multiply."""
    m = _BRACE.search(pattern)
    if m is None:
        return [pattern]
    body = m.group(1)
    rng = _RANGE.match(body)
    if rng is not None:
        lo, hi = int(rng.group(1)), int(rng.group(2))
        if hi < lo:
            raise ConfigError(f"brace range {{{body}}} in {pattern!r} counts down; write "
                              f"{{{rng.group(2)}..{rng.group(1)}}}")
        width = max(len(rng.group(1)), len(rng.group(2)))
        padded = rng.group(1).startswith("0") or rng.group(2).startswith("0")
        items = [f"{i:0{width}d}" if padded else str(i) for i in range(lo, hi + 1)]
    elif "," in body:
        items = body.split(",")
    else:
        items = ["{" + body + "}"]  # not a pattern: keep the braces
        head, tail = pattern[:m.end()], pattern[m.end():]
        return [head + rest for rest in expand_braces(tail)]
    out: list[str] = []
    for item in items:
        out.extend(expand_braces(pattern[:m.start()] + item + pattern[m.end():]))
    return out


def _has_glob(text: str) -> bool:
    return any(c in _GLOB_CHARS for c in text)


def _local(spec: str, suffixes: tuple[str, ...], what: str) -> list[InputFile]:
    if _has_glob(spec):
        paths = sorted(glob.glob(spec, recursive=True), key=os.fsencode)
        found = [p for p in paths if os.path.isfile(p)]
        if not found:
            raise ConfigError(f"{spec!r} matches no {what} files")
        return [InputFile(p, os.path.getsize(p)) for p in found]
    if os.path.isfile(spec):
        return [InputFile(spec, os.path.getsize(spec))]
    if os.path.isdir(spec):
        found = []
        for root, dirs, files in os.walk(spec):
            dirs[:] = [d for d in dirs if not d.startswith(".")]
            found.extend(os.path.join(root, f) for f in files
                         if not f.startswith(".") and f.lower().endswith(suffixes))
        if not found:
            raise ConfigError(f"folder {spec!r} holds no {what} files (looked for "
                              f"{', '.join(suffixes)})")
        found.sort(key=os.fsencode)
        return [InputFile(p, os.path.getsize(p)) for p in found]
    raise ConfigError(f"no such {what} file or folder: {spec!r}")


def _s3(spec: str, suffixes: tuple[str, ...], what: str, options: dict[str, Any],
        clients: dict[str, Any]) -> list[InputFile]:
    from headrace._remote.objstore import ObjectNotFoundError, ObjectStore, S3Options, split_s3_url

    bucket, key = split_s3_url(spec)
    client = clients.get(bucket)
    if client is None:
        client = clients[bucket] = ObjectStore(bucket, options=S3Options.from_kwargs(dict(options)))
    if _has_glob(key):
        cut = min(key.index(c) for c in _GLOB_CHARS if c in key)
        # Object stores list by path segments: list the folder above the first wildcard.
        head = key[:cut]
        prefix = head[:head.rfind("/") + 1]
        objs = [o for o in client.list(prefix) if fnmatch.fnmatchcase(o.key, key)]
        if not objs:
            raise ConfigError(f"{spec!r} matches no {what} objects")
    elif key and not key.endswith("/"):
        try:
            info = client.head(key)
        except ObjectNotFoundError:
            info = None
        if info is not None:
            return [InputFile(spec, info.size, key=key, client=client)]
        objs = [o for o in client.list(key + "/") if o.key.lower().endswith(suffixes)]
        if not objs:
            raise ConfigError(f"no such {what} object or prefix: {spec!r}")
    else:
        objs = [o for o in client.list(key) if o.key.lower().endswith(suffixes)
                and not os.path.basename(o.key).startswith(".")]
        if not objs:
            raise ConfigError(f"{spec!r} holds no {what} objects (looked for "
                              f"{', '.join(suffixes)})")
    objs.sort(key=lambda o: o.key.encode())
    return [InputFile(f"s3://{bucket}/{o.key}", o.size, key=o.key, client=client) for o in objs]


def list_inputs(spec: Any, *, suffixes: Sequence[str], what: str,
                options: dict[str, Any] | None = None) -> list[InputFile]:
    """The input files named by ``spec``: one name or a list of names, each a file, a folder
    (its ``suffixes`` files, recursively, hidden ones skipped), a glob, or a brace pattern;
    local paths or ``s3://`` URLs (``options``: S3 settings such as ``endpoint``).

    Raises:
        ConfigError: a name that matches nothing, or a file given twice.
    """
    names = [spec] if isinstance(spec, str | os.PathLike) else list(spec)
    if not names:
        raise ConfigError(f"no {what} inputs given")
    sfx = tuple(s.lower() for s in suffixes)
    clients: dict[str, Any] = {}
    out: list[InputFile] = []
    for raw in names:
        if not isinstance(raw, str | os.PathLike):
            raise ConfigError(f"{what} input {raw!r} is not a path or s3:// URL")
        for name in expand_braces(os.fspath(raw)):
            if name.startswith("s3://"):
                out.extend(_s3(name, sfx, what, options or {}, clients))
            else:
                out.extend(_local(name, sfx, what))
    seen: set[str] = set()
    for f in out:
        if f.name in seen:
            raise ConfigError(f"{what} input {f.name} is named twice; name each input once")
        seen.add(f.name)
    return out
