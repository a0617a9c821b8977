"""Progress bars for long work (packing, compaction, verification).

One helper, :func:`progress`, so every long operation shows the same kind of bar and follows the same
rule: a bar appears on an interactive terminal, or when the caller asks for one, and never otherwise
(logs of batch jobs and test output stay clean).
"""

from __future__ import annotations

import sys
from typing import Any

from tqdm import tqdm

__all__ = ["progress", "wants_progress"]


def wants_progress(enabled: bool | None) -> bool:
    """Resolves a ``progress=`` argument: ``True``/``False`` as given, ``None`` = stderr is a TTY."""
    if enabled is None:
        isatty = getattr(sys.stderr, "isatty", None)
        return bool(isatty and isatty())
    return bool(enabled)


def progress(total: float | None, *, desc: str, unit: str = "B",
             enabled: bool | None = None) -> tqdm[Any]:
    """Returns a tqdm bar (a context manager with ``update(n)``), disabled unless it should show.

    Args:
        total: the amount of work in ``unit``s, or ``None`` when unknown.
        desc: a short label printed before the bar.
        unit: ``"B"`` shows bytes with SI prefixes (kB, MB, ...); anything else counts items.
        enabled: ``True`` always shows the bar, ``False`` never, ``None`` only on a TTY.
    """
    show = wants_progress(enabled)
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=unit == "B",
                unit_divisor=1000, disable=not show, file=sys.stderr, dynamic_ncols=True,
                leave=show)
