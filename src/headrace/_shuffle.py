"""SHUFFLE: a fresh permutation of ``[0, N)`` every epoch, evaluated at any position.

``perm(seed, e)(x)`` for epoch ``e = p // N`` and offset ``x = p mod N``:

* ``N <= SMALL_MAX``: the permutation is materialized per epoch (at most 32 KiB) as the ``argsort``
  of ``N`` 64-bit keys read from a PCG64 stream at words ``e*N .. e*N + N - 1``: exactly uniform
  over all ``N!`` orders. A Feistel network over a tiny domain is far from uniform (its round
  tables have a handful of entries), and many tiny epochs fit one batch: one ``random_raw`` and
  one row-wise ``argsort`` serve them all.
* larger ``N``: a mixed-radix Feistel network with cycle-walking (``_Feistel``), O(1) state.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import numpy.typing as npt

from ._order import (
    GAMMA,
    TAG_SHUFFLE,
    Mode,
    Order,
    PCGStream,
    mix64,
    mix64_array,
    mulhi,
)

__all__ = ["SMALL_MAX", "make_shuffle"]

SMALL_MAX = 4096  # N up to this: exact permutations from sorted random keys
_ROUNDS = 6  # 4 leave a seed-dependent trace (adjacent ids keep their xor difference 2x as often)
_TABLE_MAX_BITS = 15  # N <= 2**30; tables of <= 13 * 2**15 int64: <= 3.4 MiB an epoch, two kept
_EPOCH_GROUPS_MAX = 4  # indices() spanning more epochs than this uses per-element round keys
_SCALAR_WALK_MAX = 24  # cycle-walk this many strays one by one rather than as arrays
_KEYS_MAX = 1 << 20  # keys sorted at once by the small shuffle (8 MiB)


def make_shuffle(length: int, seed: int) -> Order:
    """The SHUFFLE order over ``length`` records (validated by ``make_order``)."""
    return _Small(length, seed) if length <= SMALL_MAX else _Feistel(length, seed)


class _Small(Order):
    """Exact per-epoch permutations: ``argsort`` of PCG64 keys at words ``e*N ..``."""

    mode = Mode.SHUFFLE

    def __init__(self, length: int, seed: int) -> None:
        super().__init__(length, seed)
        self._stream = PCGStream(mix64(seed ^ TAG_SHUFFLE))
        self._memoize = False  # whole epochs are memoized instead
        self._perms: dict[int, npt.NDArray[np.int64]] = {}
        self._lock = threading.Lock()

    def _epochs(self, e0: int, count: int) -> npt.NDArray[np.int64]:
        """Permutations of epochs ``e0 .. e0 + count - 1``, shape ``(count, N)``."""
        n = self.length
        keys = self._stream.words(e0 * n, count * n).reshape(count, n)
        # "stable": a tie (odds ~ N**2 / 2**65) still resolves the same way on every platform
        return keys.argsort(axis=1, kind="stable")

    def _epoch(self, e: int) -> npt.NDArray[np.int64]:
        perm = self._perms.get(e)
        if perm is None:
            perm = self._epochs(e, 1)[0]
            perm.flags.writeable = False
            with self._lock:  # the two most recent epochs (a batch may straddle one)
                while len(self._perms) >= 2:
                    self._perms.pop(next(iter(self._perms)))
                self._perms[e] = perm
        return perm

    def _range(self, start: int, count: int) -> npt.NDArray[np.int64]:
        n = self.length
        e0, off = divmod(start, n)
        if off + count <= n:
            return self._epoch(e0)[off:off + count].copy()
        epochs = -(-(off + count) // n)
        if epochs * n > _KEYS_MAX:
            return super()._range(start, count)
        return self._epochs(e0, epochs).reshape(-1)[off:off + count].copy()

    def _indices(self, p: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
        n = np.uint64(self.length)
        epochs = p // n
        offs = (p - epochs * n).view(np.int64)
        uniq, inv = np.unique(epochs, return_inverse=True)
        inv = inv.reshape(-1)
        out = np.empty(p.shape[0], dtype=np.int64)
        step = max(1, _KEYS_MAX // self.length)
        for a in range(0, uniq.shape[0], step):  # bounded memory: so many epochs at a time
            chunk = uniq[a:a + step]
            if chunk.shape[0] == 1:
                perms = self._epoch(int(chunk[0]))[None, :]
            else:
                idx = PCGStream.runs(chunk)
                perms = np.concatenate([self._epochs(int(chunk[i]), j - i) for i, j in idx])
            sel = np.flatnonzero((inv >= a) & (inv < a + step))
            out[sel] = perms[inv[sel] - a, offs[sel]]
        return out


def _round_keys(seed_key: int, epochs: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """Round keys, shape ``(_ROUNDS, len(epochs))``: independent-looking per (seed, epoch, round)."""
    e = mix64_array(epochs * np.uint64(GAMMA) + np.uint64(seed_key))
    rounds = np.arange(1, _ROUNDS + 1, dtype=np.uint64)[:, None] * np.uint64(0xD1B54A32D192ED03)
    return mix64_array(e[None, :] ^ rounds)


class _Feistel(Order):
    """A mixed-radix Feistel network over ``[0, a*b)``, ``a = 2**ka``, with cycle-walking.

    An offset ``x`` splits into ``lo = x mod a`` (``ka`` bits) and ``hi = x // a`` in ``[0, b)``,
    ``b = ceil(N / a)``. Six rounds alternate ``lo ^= FA(hi)`` and ``hi = (hi + FB(lo)) mod b``;
    each is invertible, so the network is a bijection of ``[0, a*b)``. As ``a*b - N < a ~ sqrt(N)``,
    cycle-walking (re-permuting the few values that land at or past N) is short for every N,
    unlike a binary Feistel whose domain can be 4x too large.
    """

    mode = Mode.SHUFFLE

    def __init__(self, length: int, seed: int) -> None:
        super().__init__(length, seed)
        self._key = mix64(seed ^ TAG_SHUFFLE)
        bits = max(1, (length - 1).bit_length())
        self._ka = (bits + 1) // 2
        self._a = 1 << self._ka
        self._b = -(-length // self._a)
        self._memoize = True  # N > SMALL_MAX: a block spans at most a few epochs' tables
        self._tables: dict[int, list[npt.NDArray[np.int64]]] = {}
        self._lock = threading.Lock()

    # The round functions, the single definition that the table path (memoized over the whole
    # domain of the round input) and the per-element path both evaluate.
    def _round_f(self, i: int, r: npt.NDArray[np.uint64], key: Any) -> npt.NDArray[np.uint64]:
        z = r * np.uint64(GAMMA)
        z += key
        mix64_array(z)
        if i % 2 == 0:  # FA: hi -> ka bits
            z >>= np.uint64(64 - self._ka)
            return z
        return mulhi(z, self._b)  # FB: lo -> [0, b)

    def _epoch_tables(self, epoch: int) -> list[npt.NDArray[np.int64]]:
        """The epoch's round functions as lookup tables, laid out for a reduction-free pass.

        ``hi`` is never reduced mod ``b`` inside the network: after ``j`` hi-rounds it is below
        ``(j+1)*b``, so the next lo-round's table is ``FA`` repeated ``j+1`` times, and a last
        table maps the final ``hi`` to ``(hi mod b) << ka`` for the merge. Same function, two
        fewer vector ops a hi-round.
        """
        tables = self._tables.get(epoch)
        if tables is None:
            keys = _round_keys(self._key, np.array([epoch], dtype=np.uint64))[:, 0]
            dom_hi = np.arange(self._b, dtype=np.uint64)
            dom_lo = np.arange(self._a, dtype=np.uint64)
            tables = []
            for i, k in enumerate(keys):
                if i % 2 == 0:  # lo-round: indexed by hi < (i//2 + 1) * b
                    tables.append(np.tile(self._round_f(i, dom_hi, k).view(np.int64), i // 2 + 1))
                else:
                    tables.append(self._round_f(i, dom_lo, k).view(np.int64))
            # the first round also does the split: x ^ (FA(hi) ^ hi << ka) == (x mod a) ^ FA(hi)
            tables[0] = tables[0] ^ (dom_hi.view(np.int64) << self._ka)
            merge = np.tile(dom_hi.view(np.int64) << self._ka, (len(keys) + 1) // 2 + 1)
            tables.append(merge)
            for t in tables:
                t.flags.writeable = False
            with self._lock:  # keep the two most recent epochs (a batch may straddle one)
                while len(self._tables) >= 2:
                    self._tables.pop(next(iter(self._tables)))
                self._tables[epoch] = tables
        return tables

    def _walk_scalar(self, y: int, tables: list[npt.NDArray[np.int64]]) -> int:
        """Cycle-walk one value with the memoized round tables (same maths as the arrays)."""
        n, ka = self.length, self._ka
        *rounds, merge = tables
        while y >= n:
            hi = y >> ka
            lo = y ^ rounds[0].item(hi)
            for i, t in enumerate(rounds[1:], 1):
                if i % 2 == 0:
                    lo ^= t.item(hi)
                else:
                    hi += t.item(lo)
            y = merge.item(hi) | lo
        return y

    def _feistel_tables(self, x: npt.NDArray[np.int64],
                        tables: list[npt.NDArray[np.int64]]) -> npt.NDArray[np.int64]:
        """One pass of the network over ``x`` (consumed: it becomes a scratch buffer)."""
        hi = x >> self._ka
        tmp = np.empty_like(hi)
        *rounds, merge = tables
        rounds[0].take(hi, mode="wrap", out=tmp)  # the first round, fused with the split
        lo = x
        lo ^= tmp
        for i, t in enumerate(rounds[1:], 1):
            # indices are always in range: mode="wrap" only skips the bounds checks
            if i % 2 == 0:
                t.take(hi, mode="wrap", out=tmp)
                lo ^= tmp
            else:
                t.take(lo, mode="wrap", out=tmp)
                hi += tmp
        merge.take(hi, mode="wrap", out=tmp)  # (hi mod b) << ka
        tmp |= lo
        return tmp

    def _feistel_keys(self, x: npt.NDArray[np.uint64],
                      keys: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
        lo = x & np.uint64(self._a - 1)
        hi = x >> np.uint64(self._ka)
        b = np.uint64(self._b)
        for i, key in enumerate(keys):
            if i % 2 == 0:
                lo ^= self._round_f(i, hi, key)
            else:
                hi += self._round_f(i, lo, key)
                np.minimum(hi, hi - b, out=hi)  # unsigned: hi - b wraps when hi < b
        hi *= np.uint64(self._a)
        hi |= lo
        return hi

    def _permute_epoch(self, x: npt.NDArray[np.int64], epoch: int) -> npt.NDArray[np.int64]:
        """``perm(seed, epoch)`` of offsets ``x`` (all in ``[0, N)``), by cycle-walking."""
        n = self.length
        if self._ka <= _TABLE_MAX_BITS:
            tables = self._epoch_tables(epoch)
            y = self._feistel_tables(x, tables)
            bad = np.flatnonzero(y >= n)
            if 0 < bad.size <= _SCALAR_WALK_MAX:  # a few strays: cheaper in plain Python
                for j in bad.tolist():
                    y[j] = self._walk_scalar(int(y[j]), tables)
                return y
            while bad.size:
                sub = self._feistel_tables(y[bad], tables)
                y[bad] = sub
                bad = bad[sub >= n]
            return y
        keys = _round_keys(self._key, np.array([epoch], dtype=np.uint64))[:, 0]
        return self._walk_keys(x.astype(np.uint64), keys, same=True)

    def _walk_keys(self, x: npt.NDArray[np.uint64], keys: npt.NDArray[np.uint64],
                   same: bool) -> npt.NDArray[np.int64]:
        """Cycle-walk with round keys per element (``keys[:, i]``), or shared when ``same``."""
        n = np.uint64(self.length)
        y = self._feistel_keys(x, keys)
        bad = np.flatnonzero(y >= n)
        while bad.size:
            sub = self._feistel_keys(y[bad], keys if same else keys[:, bad])
            y[bad] = sub
            bad = bad[sub >= n]
        return y.view(np.int64)

    def _range(self, start: int, count: int) -> npt.NDArray[np.int64]:
        n = self.length
        epoch, off = divmod(start, n)
        if off + count <= n:  # one epoch: the common case
            return self._permute_epoch(np.add(self._iota(count), off), epoch)
        if count // n > 2:  # many tiny epochs in one request: per-element keys
            return super()._range(start, count)
        out = np.empty(count, dtype=np.int64)
        done = 0
        while done < count:
            take = min(n - off, count - done)
            out[done:done + take] = self._permute_epoch(np.add(self._iota(take), off), epoch)
            done += take
            epoch, off = epoch + 1, 0
        return out

    def _indices(self, p: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
        n = np.uint64(self.length)
        epochs = p // n
        offs = (p - epochs * n).view(np.int64)
        if not epochs.size:
            return offs.copy()
        lo, hi = int(epochs.min()), int(epochs.max())
        if lo == hi:
            return self._permute_epoch(offs, lo)
        if hi - lo < _EPOCH_GROUPS_MAX:  # a few epochs: memoized tables, one group at a time
            out = np.empty_like(offs)
            for e in range(lo, hi + 1):
                sel = np.flatnonzero(epochs == np.uint64(e))
                if sel.size:
                    out[sel] = self._permute_epoch(offs[sel], e)
            return out
        keys = _round_keys(self._key, epochs)
        return self._walk_keys(offs.view(np.uint64), keys, same=False)
