"""What the framework adapters share about a delivered batch: which of its fields to convert."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from headrace._base.errors import ConfigError

__all__ = ["selected"]


def selected(batch: Mapping[str, Any], fields: Iterable[str] | None) -> Iterator[tuple[str, Any]]:
    """``(name, value)`` of each field in ``fields`` (``None``: every field), in that order.

    Raises:
        ConfigError: a name that the batch does not hold (named, with the fix).
    """
    for name in batch.keys() if fields is None else fields:
        if name not in batch:
            raise ConfigError(
                f"field {name!r} is not in the loader's batches (they hold {sorted(batch)}); "
                "fix fields=")
        yield name, batch[name]
