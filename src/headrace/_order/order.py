"""Order as a pure function: the record id at global position ``p`` from ``(mode, seed, N, p)``.

Three modes, all vectorized and all free of hidden RNG state (a checkpoint is a position):

* ``SEQUENTIAL``: ``p mod N``, loaderx's circular sliding window.
* ``IID``: uniform draws with replacement: word ``w`` of a PCG64 stream keyed by the seed,
  reached by jump-ahead (:class:`PCGStream`), mapped to ``[0, N)`` by a multiply-high. For
  ``N <= 2**20`` one 64-bit word feeds two positions (32 bits each; relative bias between ids at
  most ``N / 2**32 <= 2**-12``); above that every position gets its own word (bias at most
  ``N / 2**53``, exact 128-bit multiply-high above ``2**32``: ``N / 2**64``).
* ``SHUFFLE``: epoch ``e = p // N`` and ``perm(seed, e)(p mod N)``; see ``_shuffle.py``.

Every function here is a pure function of its arguments; caches only memoize.
"""

from __future__ import annotations

import enum
import sys
import threading
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from headrace._base.errors import ConfigError

__all__ = ["BLOCK", "GAMMA", "MAX_LENGTH", "MAX_SEED", "TAG_SHUFFLE", "IIDOrder", "Mode", "Order",
           "PCGStream", "SequentialOrder", "as_mode",
           "check_int",
           "mix64", "mix64_array", "mulhi"]

MAX_LENGTH = 2**63  # record ids are int64
MAX_SEED = 2**64 - 1
_M64 = 2**64 - 1
_M32 = np.uint64(2**32 - 1)
GAMMA = 0x9E3779B97F4A7C15  # SplitMix64's Weyl increment (odd, golden ratio)
_C1 = np.uint64(0xBF58476D1CE4E5B9)
_C2 = np.uint64(0x94D049BB133111EB)
_S11, _S27, _S30, _S31, _S32 = (np.uint64(s) for s in (11, 27, 30, 31, 32))
# Domain tags keep the modes' key streams apart for the same seed.
_TAG_IID = 0x1D5A_3C1E_8F0B_2A47
TAG_SHUFFLE = 0x5B7E_15E5_A4D3_C2B1
_IID_HALF_MAX = 2**20  # N up to this uses 32-bit draws (two per 64-bit word)
_IID_FLOAT_MAX = 2**32  # N up to this maps a word through a float64 product
BLOCK = 8192  # positions memoized at a time for short ranges
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


def mix64_array(z: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
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


def mulhi(z: npt.NDArray[np.uint64], n: int) -> npt.NDArray[np.uint64]:
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


def as_mode(mode: Any) -> Mode:
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
        # (first, stop, ids at positions first .. stop - 1): the block the last short range came
        # from; range() serves the next one from it before any other work (one tuple: swapped
        # atomically under concurrent readers)
        self._hot: tuple[int, int, npt.NDArray[np.int64]] = (0, 0, self._arange)

    def __repr__(self) -> str:
        return f"make_order({self.mode.name!r}, {self.length}, seed={self.seed})"

    def __reduce__(self) -> tuple[Any, ...]:
        # pickles as its three defining ints; caches and locks are rebuilt empty
        return (type(self), (self.length, self.seed))

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
        first, stop, block = self._hot
        if first <= start and start + count <= stop and count >= 0 and out is None:
            return block[start - first:start - first + count].copy()
        if start < 0 or count < 0 or start + count > 2**64:
            raise ConfigError(
                f"positions {start}..{start + count} are outside 0..2**64; "
                "use a start >= 0 and count >= 0")
        if count == 0:
            res = np.zeros(0, dtype=np.int64)
        elif count <= BLOCK // 4 and self._memoize and start + 2 * BLOCK <= 2**64:
            res = self._small_range(start, count)
        else:
            res = self._range(start, count)
        if out is None:
            return res
        out[...] = res
        return out

    def shared_range(self, start: int, count: int) -> npt.NDArray[np.int64]:
        """``range(start, count)`` as a read-only array that may share a memoized block's memory.

        For callers that only read the ids (the loader's dispatcher): a batch inside the block the
        last one came from is a slice, with no copy and no further work, which at a loader's pace
        is a quarter of the sampler's cost per batch.
        """
        first, stop, block = self._hot
        if first <= start and count >= 0 and start + count <= stop:
            return block[start - first:start - first + count]
        res = self.range(start, count)
        res.flags.writeable = False
        return res

    def _small_range(self, start: int, count: int) -> npt.NDArray[np.int64]:
        """A short range cut from memoized aligned blocks of ``BLOCK`` positions.

        Each NumPy call costs about a microsecond whatever its size, so a batch of 256 computed
        alone pays for ~20 of them; a loader reading consecutive batches then pays once a block.
        """
        first, off = divmod(start, BLOCK)
        block = self._block(first)
        if off + count <= BLOCK:
            return block[off:off + count].copy()
        head = BLOCK - off
        out = np.empty(count, dtype=np.int64)
        out[:head] = block[off:]
        out[head:] = self._block(first + 1)[:count - head]
        return out

    def _block(self, b: int) -> npt.NDArray[np.int64]:
        blocks = self._blocks
        got = blocks.get(b)
        if got is None:
            got = self._range(b * BLOCK, BLOCK)
            got.flags.writeable = False
            with self._blocks_lock:  # the two most recent blocks: a batch may straddle two
                while len(blocks) >= 2:
                    blocks.pop(next(iter(blocks)), None)
                blocks[b] = got
        self._hot = (b * BLOCK, b * BLOCK + BLOCK, got)
        return got

    def _range(self, start: int, count: int) -> npt.NDArray[np.int64]:
        return self._indices(self._iota(count).astype(np.uint64) + np.uint64(start))

    def _indices(self, p: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
        raise NotImplementedError


class SequentialOrder(Order):
    mode = Mode.SEQUENTIAL

    def shared_range(self, start: int, count: int) -> npt.NDArray[np.int64]:
        """As ``Order.shared_range``, a batch cut from a memoized read-only block: ``range()``
        computes sequential ids with one add, but the loader's dispatcher asks once a batch and a
        slice of the block it came from skips even that."""
        first, stop, block = self._hot
        if first <= start and count >= 0 and start + count <= stop:
            return block[start - first:start - first + count]
        if start >= 0 and 0 <= count <= BLOCK // 4 and start + 2 * BLOCK <= 2**64:
            b, off = divmod(start, BLOCK)
            if off + count <= BLOCK:
                return self._block(b)[off:off + count]
        return super().shared_range(start, count)

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


class PCGStream:
    """One PCG64 stream keyed by an int, read at any word index by jump-ahead.

    Word ``w`` is reached with ``PCG64.advance(w)`` (O(log w)), so reading is a pure function of
    ``(key, w)`` while a run of words costs one ``random_raw`` call: one tight C loop rather than
    a dozen NumPy passes of a hash. Thread-safe (one lock around the shared generator).
    """

    def __init__(self, key: int) -> None:
        self._state = (mix64(key) << 64) | mix64(key ^ GAMMA)
        self._inc = (mix64(key + 1) << 65 | mix64(key + 2) << 1 | 1) & (2**128 - 1)
        self._bg = np.random.PCG64(0)  # its state is set before first use
        self._at = -1  # the word the generator would produce next (-1: unknown)
        self._lock = threading.Lock()

    def words(self, w0: int, count: int) -> npt.NDArray[np.uint64]:
        """Words ``w0 .. w0 + count - 1`` of the stream."""
        with self._lock:
            bg = self._bg
            at, self._at = self._at, -1  # unknown until this call succeeds
            if w0 != at:  # a sequential reader (the common case) skips the jump
                bg.state = {"bit_generator": "PCG64",
                            "state": {"state": self._state, "inc": self._inc},
                            "has_uint32": 0, "uinteger": 0}
                if w0:
                    bg.advance(w0)
            out = bg.random_raw(count)
            self._at = w0 + count
            return out

    def words_at(self, w: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
        """Words at arbitrary indices ``w`` (one ``words`` call per run of consecutive ones)."""
        uniq, inv = np.unique(w, return_inverse=True)
        z = np.empty(uniq.shape[0], dtype=np.uint64)
        for a, b in self.runs(uniq):
            z[a:b] = self.words(int(uniq[a]), b - a)
        return z[inv.reshape(-1)]

    @staticmethod
    def runs(sorted_unique: npt.NDArray[np.uint64]) -> list[tuple[int, int]]:
        """``[(a, b), ...]``: slices of ``sorted_unique`` holding consecutive integers."""
        cuts = (np.flatnonzero(np.diff(sorted_unique) != 1) + 1).tolist()
        return list(zip([0, *cuts], [*cuts, sorted_unique.shape[0]], strict=True))


class IIDOrder(Order):
    """Uniform draws with replacement: word ``p`` (or half of word ``p // 2``) of a PCG64 stream."""

    mode = Mode.IID

    def __init__(self, length: int, seed: int) -> None:
        super().__init__(length, seed)
        self._stream = PCGStream(mix64(seed ^ _TAG_IID))
        self._words = self._stream.words
        self._half = length <= _IID_HALF_MAX
        self._n = np.uint64(length)

    def _map_full(self, z: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
        """One 64-bit word per position into ``[0, N)``."""
        n = self.length
        if n > _IID_FLOAT_MAX:
            return mulhi(z, n).view(np.int64)  # exact 128-bit multiply-high
        # floor(top 53 bits * N / 2**53): 3 passes instead of mulhi's 7; the product is one IEEE
        # rounding away from exact, so it may reach N: clamp (relative bias <= N / 2**53)
        z >>= _S11
        f = np.multiply(z, n * 2.0**-53)
        res = f.astype(np.int64)
        np.minimum(res, n - 1, out=res)
        return res

    def _range(self, start: int, count: int) -> npt.NDArray[np.int64]:
        if not self._half:
            return self._map_full(self._words(start, count))
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
        z = self._stream.words_at(p >> np.uint64(1) if self._half else p)
        if not self._half:
            return self._map_full(z)
        z >>= (p & np.uint64(1)) * _S32  # odd positions take the high half
        z &= _M32
        z *= self._n
        z >>= _S32
        return z.view(np.int64)
