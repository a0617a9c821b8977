"""Order as a pure function: the record id at global position ``p`` from ``(mode, seed, N, p)``.

Three modes, all vectorized NumPy and all free of hidden RNG state (a checkpoint is a position):

* ``SEQUENTIAL``: ``p mod N``, loaderx's circular sliding window.
* ``IID``: uniform draws with replacement: word ``w`` of a PCG64 stream keyed by the seed, reached
  by jump-ahead, mapped to ``[0, N)`` by a multiply-high. For ``N <= 2**20`` one 64-bit word feeds
  two positions (32 bits each; relative bias between ids at most ``N / 2**32 <= 2**-12``); above
  that every position gets its own word (bias at most ``N / 2**64``).
* ``SHUFFLE``: epoch ``e = p // N`` and ``perm(seed, e)(p mod N)``, where ``perm`` is a balanced
  mixed-radix Feistel network over ``[0, a*b)`` (``a = 2**ceil(bits(N)/2)``, ``b = ceil(N/a)``)
  with cycle-walking (values that land at or past ``N`` are permuted again until they fall
  inside). Round functions are SplitMix64 hashes keyed by ``(seed, epoch, round)``; for halves
  up to ``_TABLE_MAX_BITS`` bits they are memoized per epoch in small tables (bounded memory,
  identical results), so a round costs one gather and one or three cheap ops.

Every function here is a pure function of its arguments; caches only memoize.
"""

from __future__ import annotations

import enum
import sys
import threading
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from ._errors import ConfigError

__all__ = ["MAX_LENGTH", "MAX_SEED", "Mode", "Order", "make_order", "mix64"]

MAX_LENGTH = 2**63  # record ids are int64
MAX_SEED = 2**64 - 1
_M64 = 2**64 - 1
_M32 = np.uint64(2**32 - 1)
_GAMMA = 0x9E3779B97F4A7C15  # SplitMix64's Weyl increment (odd, golden ratio)
_C1 = np.uint64(0xBF58476D1CE4E5B9)
_C2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S32 = (np.uint64(s) for s in (30, 27, 31, 32))
# Domain tags keep the modes' key streams apart for the same seed.
_TAG_IID = 0x1D5A_3C1E_8F0B_2A47
_TAG_SHUFFLE = 0x5B7E_15E5_A4D3_C2B1
_IID_HALF_MAX = 2**20  # N up to this uses 32-bit draws (two per hash)
_ROUNDS = 4  # Luby-Rackoff's count for a strong PRP; each more round costs ~1/4 more
_TABLE_MAX_BITS = 14  # per-round tables of <= 2**14 int64 = 128 KiB: <= 512 KiB an epoch
_BLOCK = 8192  # positions memoized at a time for short ranges
_EPOCH_GROUPS_MAX = 4  # indices() spanning more epochs than this uses per-element round keys
_SCALAR_WALK_MAX = 24  # cycle-walk this many strays one by one rather than as arrays
_LITTLE = sys.byteorder == "little"


class Mode(enum.IntEnum):
    """Sampling order. The values match loaderx (``SEQUENTIAL=0``, ``IID=1``)."""

    SEQUENTIAL = 0
    IID = 1
    SHUFFLE = 2


def mix64(x: int) -> int:
    """SplitMix64's finalizer on a Python int (a 64-bit bijection with full avalanche)."""
    x &= _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def _mix64_inplace(z: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """Vectorized SplitMix64 finalizer, in place (same function as ``mix64``)."""
    t = np.right_shift(z, _S30)
    z ^= t
    z *= _C1
    np.right_shift(z, _S27, out=t)
    z ^= t
    z *= _C2
    np.right_shift(z, _S31, out=t)
    z ^= t
    return z


def _mulhi(z: npt.NDArray[np.uint64], n: int) -> npt.NDArray[np.uint64]:
    """``floor(z * n / 2**64)`` exactly, for uint64 ``z`` and ``1 <= n <= 2**63``."""
    nl, nh = np.uint64(n & 0xFFFFFFFF), np.uint64(n >> 32)
    zl = z & _M32
    zh = z >> _S32
    t = zl * nl
    t >>= _S32
    u = zh * nl
    u += t  # < 2**64: (2**32-1)**2 + 2**32 - 1 fits
    if not nh:
        u >>= _S32
        return u
    v = zl * nh
    v += u & _M32
    zh *= nh
    u >>= _S32
    v >>= _S32
    zh += u
    zh += v
    return zh


def _as_mode(mode: Any) -> Mode:
    if isinstance(mode, bool):
        raise TypeError(f"mode must be a Mode, an int 0..2 or a name, got bool {mode!r}")
    if isinstance(mode, str):
        try:
            return Mode[mode.strip().upper()]
        except KeyError:
            pass
    elif isinstance(mode, (int, np.integer)):
        try:
            return Mode(int(mode))
        except ValueError:
            pass
    else:
        raise TypeError(f"mode must be a Mode, an int 0..2 or a name, got {type(mode).__name__}")
    names = ", ".join(f"{m.name} ({m.value})" for m in Mode)
    raise ConfigError(f"unknown sampler mode {mode!r}; use one of {names}")


def check_int(name: str, value: Any, lo: int, hi: int, hint: str = "") -> int:
    """Return ``value`` as an int in ``[lo, hi]``; bool/float are a TypeError, range a ConfigError."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    value = int(value)
    if not lo <= value <= hi:
        raise ConfigError(f"{name} must be in {lo}..{hi}, got {value}{hint}")
    return value


class Order:
    """The record id at each global position: a pure function of ``(mode, seed, length, p)``.

    Use :func:`make_order` to build one. Instances are immutable and safe to share between
    threads (their caches only memoize).

    Attributes:
        mode: the :class:`Mode`.
        length: N, the number of records (ids are in ``[0, N)``).
        seed: the seed, ``0 .. 2**64 - 1``.
    """

    mode: ClassVar[Mode]

    def __init__(self, length: int, seed: int) -> None:
        self.length = length
        self.seed = seed
        self._arange = np.arange(0, dtype=np.int64)
        # cut short ranges from memoized blocks (see _small_range); SEQUENTIAL is one add anyway
        self._memoize = self.mode is not Mode.SEQUENTIAL
        self._blocks: dict[int, npt.NDArray[np.int64]] = {}
        self._blocks_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"make_order({self.mode.name!r}, {self.length}, seed={self.seed})"

    def __reduce__(self) -> tuple[Any, ...]:
        # pickles as its three defining ints; caches and locks are rebuilt empty
        return (_rebuild, (int(self.mode), self.length, self.seed))

    def _iota(self, count: int) -> npt.NDArray[np.int64]:
        """A shared read-only ``arange(count)`` (grown on demand)."""
        a = self._arange
        if a.shape[0] < count:
            a = np.arange(max(count, 2 * a.shape[0]), dtype=np.int64)
            a.flags.writeable = False
            self._arange = a  # one reference swap: safe under concurrent readers
        return a[:count]

    def indices(self, positions: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """Record ids at arbitrary global positions (any shape; int64 or uint64, all >= 0)."""
        p = np.asarray(positions)
        if p.dtype.kind not in "iu":
            raise TypeError(f"positions must be an integer array, got dtype {p.dtype}")
        if p.dtype.kind == "i" and p.size and int(p.min()) < 0:
            raise ConfigError(f"positions must be >= 0, got {int(p.min())}")
        if p.size == 0:
            return np.zeros(p.shape, dtype=np.int64)
        flat = p.astype(np.uint64, copy=False).ravel()
        return self._indices(flat).reshape(p.shape)

    def range(self, start: int, count: int,
              out: npt.NDArray[np.int64] | None = None) -> npt.NDArray[np.int64]:
        """Record ids at positions ``start .. start + count - 1`` (the fast path).

        Args:
            start: first global position, ``>= 0``.
            count: how many positions.
            out: optional int64 array of shape ``(count,)`` to write into.

        Returns:
            ``out`` (or a new int64 array) holding the ids.
        """
        if start < 0 or count < 0 or start + count > 2**64:
            raise ConfigError(
                f"positions {start}..{start + count} are outside 0..2**64; "
                "use a start >= 0 and count >= 0")
        if count == 0:
            res = np.zeros(0, dtype=np.int64)
        elif count <= _BLOCK // 4 and self._memoize and start + 2 * _BLOCK <= 2**64:
            res = self._small_range(start, count)
        else:
            res = self._range(start, count)
        if out is None:
            return res
        out[...] = res
        return out

    def _small_range(self, start: int, count: int) -> npt.NDArray[np.int64]:
        """A short range cut from memoized aligned blocks of ``_BLOCK`` positions.

        Each NumPy call costs about a microsecond whatever its size, so a batch of 256 computed
        alone pays for ~20 of them; a loader reading consecutive batches then pays once a block.
        """
        first, off = divmod(start, _BLOCK)
        block = self._block(first)
        if off + count <= _BLOCK:
            return block[off:off + count].copy()
        head = _BLOCK - off
        out = np.empty(count, dtype=np.int64)
        out[:head] = block[off:]
        out[head:] = self._block(first + 1)[:count - head]
        return out

    def _block(self, b: int) -> npt.NDArray[np.int64]:
        blocks = self._blocks
        got = blocks.get(b)
        if got is None:
            got = self._range(b * _BLOCK, _BLOCK)
            got.flags.writeable = False
            with self._blocks_lock:  # the two most recent blocks: a batch may straddle two
                while len(blocks) >= 2:
                    blocks.pop(next(iter(blocks)), None)
                blocks[b] = got
        return got

    def _range(self, start: int, count: int) -> npt.NDArray[np.int64]:
        return self._indices(self._iota(count).astype(np.uint64) + np.uint64(start))

    def _indices(self, p: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
        raise NotImplementedError


class _Sequential(Order):
    mode = Mode.SEQUENTIAL

    def _range(self, start: int, count: int) -> npt.NDArray[np.int64]:
        n = self.length
        s = start % n
        if s + count <= n:
            return np.add(self._iota(count), s)
        res = self._iota(count).astype(np.uint64)
        res += np.uint64(s)
        res %= np.uint64(n)
        return res.view(np.int64)

    def _indices(self, p: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
        return (p % np.uint64(self.length)).astype(np.int64)


class _IID(Order):
    """Uniform draws with replacement from one PCG64 stream per seed, read by jump-ahead.

    Word ``w`` of the stream is reached with ``PCG64.advance(w)`` (O(log w)), so the draw at any
    position is a pure function of ``(seed, p)`` while a range costs one ``random_raw`` call: the
    bits come from one tight C loop rather than a dozen NumPy passes of a hash.
    """

    mode = Mode.IID

    def __init__(self, length: int, seed: int) -> None:
        super().__init__(length, seed)
        key = mix64(seed ^ _TAG_IID)
        self._pcg_state = (mix64(key) << 64) | mix64(key ^ _GAMMA)
        self._pcg_inc = (mix64(key + 1) << 65 | mix64(key + 2) << 1 | 1) & (2**128 - 1)
        self._half = length <= _IID_HALF_MAX
        self._n = np.uint64(length)
        self._bg = np.random.PCG64(0)  # its state is overwritten before every use
        self._bg_lock = threading.Lock()

    def _words(self, w0: int, count: int) -> npt.NDArray[np.uint64]:
        """Words ``w0 .. w0 + count - 1`` of this seed's PCG64 stream."""
        with self._bg_lock:
            bg = self._bg
            bg.state = {"bit_generator": "PCG64",
                        "state": {"state": self._pcg_state, "inc": self._pcg_inc},
                        "has_uint32": 0, "uinteger": 0}
            if w0:
                bg.advance(w0)
            return bg.random_raw(count)

    def _range(self, start: int, count: int) -> npt.NDArray[np.int64]:
        if not self._half:
            return _mulhi(self._words(start, count), self.length).view(np.int64)
        # two positions per 64-bit word: position 2w is the low half of word w, 2w+1 the high
        off = start & 1
        z = self._words(start >> 1, (count + off + 1) >> 1)
        if _LITTLE:
            r32 = z.view(np.uint32)[off:off + count]
        else:  # keep the stream identical on big-endian hosts: low half first
            r32 = np.empty(2 * z.shape[0], dtype=np.uint32)
            r32[0::2] = z & _M32
            r32[1::2] = z >> _S32
            r32 = r32[off:off + count]
        res = r32.astype(np.uint64)
        res *= self._n
        res >>= _S32
        return res.view(np.int64)

    def _indices(self, p: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
        w = p >> np.uint64(1) if self._half else p
        uniq, inv = np.unique(w, return_inverse=True)
        z = np.empty(uniq.shape[0], dtype=np.uint64)
        cuts = (np.flatnonzero(np.diff(uniq) != 1) + 1).tolist()
        for a, b in zip([0, *cuts], [*cuts, uniq.shape[0]], strict=True):  # one call a run
            z[a:b] = self._words(int(uniq[a]), b - a)
        z = z[inv.reshape(-1)]
        if not self._half:
            return _mulhi(z, self.length).view(np.int64)
        z >>= (p & np.uint64(1)) * _S32  # odd positions take the high half
        z &= _M32
        z *= self._n
        z >>= _S32
        return z.view(np.int64)


def _round_keys(seed_key: int, epochs: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """Round keys, shape ``(_ROUNDS, len(epochs))``: independent-looking per (seed, epoch, round)."""
    e = _mix64_inplace(epochs * np.uint64(_GAMMA) + np.uint64(seed_key))
    rounds = np.arange(1, _ROUNDS + 1, dtype=np.uint64)[:, None] * np.uint64(0xD1B54A32D192ED03)
    return _mix64_inplace(e[None, :] ^ rounds)


class _Shuffle(Order):
    """A mixed-radix Feistel network over ``[0, a*b)``, ``a = 2**ka``, with cycle-walking.

    An offset ``x`` splits into ``lo = x mod a`` (``ka`` bits) and ``hi = x // a`` in ``[0, b)``,
    ``b = ceil(N / a)``. Four rounds alternate ``lo ^= FA(hi)`` and ``hi = (hi + FB(lo)) mod b``;
    each is invertible, so the network is a bijection of ``[0, a*b)``. As ``a*b - N < a ~ sqrt(N)``,
    cycle-walking (re-permuting the few values that land at or past N) is short for every N,
    unlike a binary Feistel whose domain can be 4x too large.
    """

    mode = Mode.SHUFFLE

    def __init__(self, length: int, seed: int) -> None:
        super().__init__(length, seed)
        self._key = mix64(seed ^ _TAG_SHUFFLE)
        bits = max(1, (length - 1).bit_length())
        self._ka = (bits + 1) // 2
        self._a = 1 << self._ka
        self._b = -(-length // self._a)
        # memoized blocks only pay off when a block spans at most two epochs' tables
        self._memoize = length >= _BLOCK
        self._tables: dict[int, list[npt.NDArray[np.int64]]] = {}
        self._lists: dict[int, list[list[int]]] = {}
        self._lock = threading.Lock()

    # The round functions, the single definition that the table path (memoized over the whole
    # domain of the round input) and the per-element path both evaluate.
    def _round_f(self, i: int, r: npt.NDArray[np.uint64], key: Any) -> npt.NDArray[np.uint64]:
        z = r * np.uint64(_GAMMA)
        z += key
        _mix64_inplace(z)
        if i % 2 == 0:  # FA: hi -> ka bits
            z >>= np.uint64(64 - self._ka)
            return z
        return _mulhi(z, self._b)  # FB: lo -> [0, b)

    def _epoch_tables(self, epoch: int) -> list[npt.NDArray[np.int64]]:
        tables = self._tables.get(epoch)
        if tables is None:
            keys = _round_keys(self._key, np.array([epoch], dtype=np.uint64))[:, 0]
            doms = (np.arange(self._b, dtype=np.uint64), np.arange(self._a, dtype=np.uint64))
            tables = [self._round_f(i, doms[i % 2], k).view(np.int64) for i, k in enumerate(keys)]
            for t in tables:
                t.flags.writeable = False
            with self._lock:  # keep the two most recent epochs (a batch may straddle one)
                while len(self._tables) >= 2:
                    self._tables.pop(next(iter(self._tables)))
                self._tables[epoch] = tables
        return tables

    def _epoch_lists(self, epoch: int) -> list[list[int]]:
        lists = self._lists.get(epoch)
        if lists is None:
            lists = [t.tolist() for t in self._epoch_tables(epoch)]
            with self._lock:
                while len(self._lists) >= 2:
                    self._lists.pop(next(iter(self._lists)))
                self._lists[epoch] = lists
        return lists

    def _walk_scalar(self, y: int, lists: list[list[int]]) -> int:
        """Cycle-walk one value with the memoized round tables (same maths as the arrays)."""
        n, ka, b, mask = self.length, self._ka, self._b, self._a - 1
        while y >= n:
            lo, hi = y & mask, y >> ka
            for i, t in enumerate(lists):
                if i % 2 == 0:
                    lo ^= t[hi]
                else:
                    hi += t[lo]
                    if hi >= b:
                        hi -= b
            y = (hi << ka) | lo
        return y

    def _feistel_tables(self, x: npt.NDArray[np.int64],
                        tables: list[npt.NDArray[np.int64]]) -> npt.NDArray[np.int64]:
        """One pass of the network over ``x`` (consumed: it becomes a scratch buffer)."""
        hi = x >> self._ka
        lo = x
        lo &= self._a - 1
        tmp = np.empty_like(lo)
        hi_u, tmp_u, b = hi.view(np.uint64), tmp.view(np.uint64), np.uint64(self._b)
        for i, t in enumerate(tables):
            # indices are always in range: mode="wrap" only skips the bounds checks
            if i % 2 == 0:
                t.take(hi, mode="wrap", out=tmp)
                lo ^= tmp
            else:
                t.take(lo, mode="wrap", out=tmp)
                hi += tmp
                # branch-free mod b: hi - b wraps past 2**63 when hi < b, so the unsigned min
                # picks hi then (np.remainder or out-of-range "wrap" indices cost far more)
                np.subtract(hi_u, b, out=tmp_u)
                np.minimum(hi_u, tmp_u, out=hi_u)
        hi <<= self._ka
        hi |= lo
        return hi

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
        if n == 1:
            return np.zeros_like(x)
        if self._ka <= _TABLE_MAX_BITS:
            tables = self._epoch_tables(epoch)
            y = self._feistel_tables(x, tables)
            bad = np.flatnonzero(y >= n)
            if 0 < bad.size <= _SCALAR_WALK_MAX:  # a few strays: cheaper in plain Python
                lists = self._epoch_lists(epoch)
                for j in bad.tolist():
                    y[j] = self._walk_scalar(int(y[j]), lists)
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
        if self.length == 1:
            return np.zeros(p.shape, dtype=np.int64)
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


def _rebuild(mode: int, length: int, seed: int) -> Order:
    return make_order(mode, length, seed=seed)


_MODES: dict[Mode, type[Order]] = {
    Mode.SEQUENTIAL: _Sequential, Mode.IID: _IID, Mode.SHUFFLE: _Shuffle}


def make_order(mode: Mode | int | str, length: int, *, seed: int = 42) -> Order:
    """Build the pure position -> record-id function for ``mode`` over ``length`` records.

    Args:
        mode: a :class:`Mode`, its int value, or its name (case-insensitive).
        length: number of records N, ``1 .. 2**63``.
        seed: ``0 .. 2**64 - 1``.

    Raises:
        ConfigError: a value out of range or an unknown mode.
        TypeError: a non-int length/seed (bool and float included).
    """
    m = _as_mode(mode)
    if isinstance(length, (int, np.integer)) and not isinstance(length, bool) and length == 0:
        raise ConfigError("Sampler length must be >= 1, got 0: the dataset is empty")
    length = check_int("Sampler length", length, 1, MAX_LENGTH,
                       " (record ids are int64: use at most 2**63 records)" if
                       isinstance(length, int) and length > MAX_LENGTH else "")
    seed = check_int("seed", seed, 0, MAX_SEED)
    return _MODES[m](length, seed)
