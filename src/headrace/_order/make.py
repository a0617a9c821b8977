"""``make_order``: the one constructor of every order, validating its arguments."""

from __future__ import annotations

from typing import Any

import numpy as np

from headrace._base.errors import ConfigError
from headrace._order.order import (
    MAX_LENGTH,
    MAX_SEED,
    IIDOrder,
    Mode,
    Order,
    SequentialOrder,
    as_mode,
    check_int,
)
from headrace._order.shuffle import make_shuffle

__all__ = ["make_order"]


def make_order(mode: Mode | int | str, length: Any, *, seed: Any = 42) -> Order:
    """Build the pure position -> record-id function for ``mode`` over ``length`` records.

    Args:
        mode: a :class:`Mode`, its int value, or its name (case-insensitive).
        length: number of records N, ``1 .. 2**63``.
        seed: ``0 .. 2**64 - 1``.

    Raises:
        ConfigError: a value out of range or an unknown mode.
        TypeError: a non-int length/seed (bool and float included).
    """
    m = as_mode(mode)
    if isinstance(length, (int, np.integer)) and not isinstance(length, bool) and length == 0:
        raise ConfigError("Sampler length must be >= 1, got 0: the dataset is empty")
    length = check_int("Sampler length", length, 1, MAX_LENGTH,
                       " (record ids are int64: use at most 2**63 records)" if
                       isinstance(length, int) and length > MAX_LENGTH else "")
    seed = check_int("seed", seed, 0, MAX_SEED)
    if m is Mode.SEQUENTIAL:
        return SequentialOrder(length, seed)
    if m is Mode.IID:
        return IIDOrder(length, seed)
    return make_shuffle(length, seed)
