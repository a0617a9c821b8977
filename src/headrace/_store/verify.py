"""``verify``: checks every record of a store and lists the bad ones (never raises for damage).

Checks, per field: the index and aux files hold at least N entries; every index entry points inside
a committed chunk of its own field and agrees with the schema (fixed sizes, alignment of raw
fixed-shape records); every record's stored bytes match their crc32c; compressed records decode to
the size recorded in the aux file. Store-wide: ``meta.json`` parses, every chunk file exists and holds
at least its committed size.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import google_crc32c
import numpy as np

from headrace._base.errors import CorruptionError
from headrace._base.progress import progress as progress_bar
from headrace._store import format as _format
from headrace._store.snapshot import check_entries, load_snapshot

__all__ = ["VerifyReport", "verify"]

_BLOCK = 1 << 16  # records per vectorized bounds check


@dataclass
class VerifyReport:
    """What ``verify`` found.

    Attributes:
        path: the store.
        ok: True when nothing is wrong.
        length: N of the verified commit (0 if meta.json is unreadable).
        commit: the commit id verified (-1 if meta.json is unreadable).
        bad: field name -> sorted ids of bad records (only fields with bad records).
        problems: human-readable findings, store-wide and per field.
    """

    path: str
    ok: bool = True
    length: int = 0
    commit: int = -1
    bad: dict[str, list[int]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return self.ok

    def summary(self) -> str:
        """A few lines for a terminal."""
        if self.ok:
            return f"{self.path}: OK ({self.length} records, commit {self.commit})"
        lines = [f"{self.path}: DAMAGED"]
        lines += [f"  {p}" for p in self.problems[:50]]
        for name, ids in self.bad.items():
            shown = ", ".join(map(str, ids[:20])) + (" ..." if len(ids) > 20 else "")
            lines.append(f"  field {name!r}: {len(ids)} bad records: [{shown}]")
        return "\n".join(lines)


def verify(path: str | os.PathLike[str], *, progress: bool | None = None) -> VerifyReport:
    """Checks a whole store; returns a report (``report.ok``, ``report.bad``) instead of raising.

    Args:
        path: the store directory.
        progress: show a progress bar (default: only when stderr is a terminal).

    Raises:
        NotAStoreError: ``path`` is not a store. FormatVersionError: written by a newer headrace.
    """
    path = os.fspath(path)
    report = VerifyReport(path)
    try:
        st = load_snapshot(path)  # maps one consistent commit, even while a writer commits
    except CorruptionError as e:
        report.ok = False
        report.problems.append(str(e))
        return report
    meta = st.meta
    report.length, report.commit = meta.length, meta.commit
    for c in meta.chunks:
        have = len(st.chunks[c.id])
        if have >= c.size:
            continue
        p = os.path.join(path, _format.chunk_name(c.id))
        if not os.path.isfile(p):
            report.problems.append(f"chunk {c.id} (field {c.field!r}): {p} is missing (or not "
                                   "a regular file)")
        else:
            report.problems.append(
                f"chunk {c.id} (field {c.field!r}) is truncated: {have} bytes, "
                f"meta.json commits {c.size}")
    n = st.meta.length
    bad: dict[str, set[int]] = {}
    total = n * len(st.fields)
    with progress_bar(total, desc="verify", unit="rec", enabled=progress) as bar:
        for name, f in st.fields.items():
            fe = next(e for e in st.meta.fields if e.spec.name == name)
            for fname, size, want in ((fe.index, len(f.index) * 16, n * 16),
                                      (fe.aux, len(f.aux) * 8, n * 8)):
                if size < want:
                    report.problems.append(
                        f"field {name!r}: {fname} holds {size} bytes, {want} expected for N={n}")
            found = bad.setdefault(name, set())
            avail = min(len(f.index), len(f.aux))
            found.update(range(avail, n))
            for start in range(0, avail, _BLOCK):
                idx = np.arange(start, min(start + _BLOCK, avail), dtype=np.int64)
                flags, cid, off, ln, nb, crc = check_entries(st, f, idx)
                found.update(idx[flags].tolist())
                for j in np.flatnonzero(~flags).tolist():
                    k, o, m = int(cid[j]), int(off[j]), int(ln[j])
                    data = st.chunks[k][o:o + m] if m else np.empty(0, np.uint8)
                    if google_crc32c.value(data) != int(crc[j]):
                        found.add(int(idx[j]))
                    elif m and f.spec.codec != "raw":
                        try:
                            if len(f.codec.decode(data, int(nb[j]))) != int(nb[j]):
                                found.add(int(idx[j]))
                        except Exception:
                            found.add(int(idx[j]))
                bar.update(len(idx))
            bar.update(n - avail)
    report.bad = {k: sorted(v) for k, v in bad.items() if v}
    for name, ids in report.bad.items():
        report.problems.append(f"field {name!r}: {len(ids)} records fail their checks")
    report.ok = not report.problems
    return report
