"""Dataset links: ``base``, ``base@refresh`` or ``base@sha256:<64 hex>`` (the mx8 grammar).

``base`` is a local path, a ``file://`` URL or ``s3://bucket/prefix/``. A link names a *snapshot* of
what lives at ``base``: a plain link reuses the snapshot pinned for that base the first time it was
listed, ``@refresh`` lists again and repins, ``@sha256:<h>`` names one snapshot exactly (and, unlike
mx8, fails when that snapshot is unknown). Snapshots are kept by :mod:`headrace._remote.manifest`.

Differences from mx8, on purpose: local bases are made absolute before they key a pin, so
``data/x`` from two working directories, ``/d/./x`` and ``file:///d/x`` are one base (mx8 keys the
text as written); an ``@`` followed by a ``/`` is part of the path, not a suffix.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from typing import Literal
from urllib.parse import unquote, urlsplit

from headrace._base.errors import LinkError

__all__ = ["Link", "parse_link"]

_HASH_RE = re.compile(r"[0-9a-f]{64}")
Mode = Literal["plain", "refresh", "pinned"]


@dataclasses.dataclass(frozen=True)
class Link:
    """A parsed dataset link.

    Attributes:
        text: the link as given.
        base: the canonical base: an absolute local path, or ``s3://bucket/prefix`` (no trailing
            ``/``; ``s3://bucket`` for a whole bucket).
        mode: ``"plain"``, ``"refresh"`` or ``"pinned"``.
        pinned_hash: the 64-hex manifest hash of a ``@sha256:`` link, else ``None``.
    """

    text: str
    base: str
    mode: Mode
    pinned_hash: str | None = None

    def __post_init__(self) -> None:
        if (self.mode == "pinned") != (self.pinned_hash is not None):
            raise LinkError(f"{self.text!r}: a pinned hash goes with mode 'pinned' only")

    @property
    def is_s3(self) -> bool:
        return self.base.startswith("s3://")

    @property
    def bucket(self) -> str:
        """The bucket of an ``s3://`` base."""
        return self.base[5:].partition("/")[0]

    @property
    def prefix(self) -> str:
        """The key prefix of an ``s3://`` base, ending in ``/`` (``""`` for a whole bucket)."""
        p = self.base[5:].partition("/")[2]
        return f"{p}/" if p else ""

    def intent_key(self, *, variant: str = "") -> str:
        """``sha256_<sha256(base)>``: the directory name of this base's pin in the manifest store.

        ``variant`` separates listings of one base made with different options (non-recursive).
        """
        return "sha256_" + hashlib.sha256((self.base + variant).encode()).hexdigest()

    def with_hash(self, manifest_hash: str) -> str:
        """The pinned link text ``base@sha256:<hash>``."""
        return f"{self.base}@sha256:{manifest_hash}"


def parse_link(link: str | os.PathLike[str]) -> Link:
    """Parses a dataset link; raises :class:`LinkError` naming what is wrong and the fix."""
    text = os.fspath(link)
    if not isinstance(text, str):
        raise LinkError(f"a dataset link must be a str or path, got {type(link).__name__}")
    if not text.strip():
        raise LinkError("dataset link parse error: empty dataset link")
    base, mode, pinned = text, "plain", None
    head, at, suffix = text.rpartition("@")
    if at and "/" not in suffix and not os.path.exists(text):
        base = head
        if suffix == "refresh":
            mode = "refresh"
        elif suffix.startswith("sha256:"):
            h = suffix[7:]
            if not _HASH_RE.fullmatch(h):
                raise LinkError(f"invalid pinned link {text!r}; expected '@sha256:<hash>' with 64 "
                                f"lowercase hex digits, got {h!r}")
            mode, pinned = "pinned", h
        else:
            raise LinkError(f"unknown dataset link suffix {'@' + suffix!r} in {text!r}; expected "
                            "'@refresh' or '@sha256:<64 hex>'")
        if not base:
            raise LinkError(f"dataset link {text!r} has a suffix but no base")
    return Link(text=text, base=_canonical_base(base, text), mode=mode,  # type: ignore[arg-type]
                pinned_hash=pinned)


def _canonical_base(base: str, text: str) -> str:
    if base.startswith("s3://"):
        bucket, _, prefix = base[5:].partition("/")
        if not bucket:
            raise LinkError(f"dataset link {text!r} has no bucket; expected s3://bucket/prefix/")
        prefix = prefix.strip("/")
        return f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
    if base.startswith("file://"):
        parts = urlsplit(base)
        if parts.netloc not in ("", "localhost"):
            raise LinkError(f"file:// link {text!r} names a host; use file:///absolute/path")
        base = unquote(parts.path)
    elif re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", base):
        raise LinkError(f"unsupported dataset link scheme in {text!r}; supported: a local path, "
                        "file:///path, s3://bucket/prefix/")
    path = os.path.abspath(os.path.expanduser(base))
    return path.rstrip("/") or "/"
