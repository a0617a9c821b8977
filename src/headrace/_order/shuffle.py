"""SHUFFLE: a fresh permutation of ``[0, N)`` every epoch, evaluated at any position.

``perm(seed, e)(x)`` for epoch ``e = p // N`` and offset ``x = p mod N``:

* ``N <= SMALL_MAX``: the permutation is materialized per epoch (at most 32 KiB) as the ``argsort``
  of ``N`` 64-bit keys read from a PCG64 stream at words ``e*N .. e*N + N - 1``: exactly uniform
  over all ``N!`` orders. A Feistel network over a tiny domain is far from uniform (its round
  tables have a handful of entries), and many tiny epochs fit one batch: one ``random_raw`` and
  one row-wise ``argsort`` serve them all.
* larger ``N``: a mixed-radix Feistel network with cycle-walking (``_Feistel``), O(1) state; up
  to ``N = 2**30`` its round functions are memoized per epoch as O(sqrt N) tables, with every
  stray's cycle-walk done once an epoch, and short ranges are cut from memoized blocks of whole
  rows of the network's grid (a loader's batch of 256 costs a slice most of the time). Blocks
  and runs go through the C loop of ``_cshuffle`` when it was built (``accelerated()``), about
  3x faster than the NumPy passes; both give the same ids bit for bit.
"""

from __future__ import annotations

import threading
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from headrace._order.order import (
    GAMMA,
    TAG_SHUFFLE,
    Mode,
    Order,
    PCGStream,
    mix64,
    mix64_array,
    mulhi,
)

try:  # the optional C build of the table network (setup.py); the NumPy passes are the fallback
    from headrace._order._cshuffle import Network as _CNetwork
except ImportError:  # pragma: no cover - only without a C compiler at install time
    _CNetwork = None

__all__ = ["SMALL_MAX", "accelerated", "make_shuffle"]

SMALL_MAX = 4096  # N up to this: exact permutations from sorted random keys
_ROUNDS = 6  # 4 leave a seed-dependent trace (adjacent ids keep their xor difference 2x as often)
_TABLE_MAX_BITS = 15  # N <= 2**30; tables of <= 17 * 2**15 int64: <= 4.3 MiB an epoch, two kept
_EPOCH_GROUPS_MAX = 4  # indices() spanning more epochs than this uses per-element round keys
_KEYS_MAX = 1 << 20  # keys sorted at once by the small shuffle (8 MiB)
_ROUND_STEP = 0xD1B54A32D192ED03  # round r's key is mix64(epoch key ^ r * this)
_M64 = 2**64 - 1
_BLOCK_BITS = 14  # short ranges are cut from memoized blocks of 2**14 offsets of one epoch
_SCRATCH = threading.local()  # per-thread work buffers of the block path


def accelerated() -> bool:
    """True when the SHUFFLE network runs in C (``headrace._order._cshuffle`` was built)."""
    return _CNetwork is not None


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


def _epoch_round_keys(seed_key: int, epoch: int) -> npt.NDArray[np.uint64]:
    """``_round_keys`` of one epoch, shape ``(_ROUNDS,)``, in Python ints (no NumPy call costs)."""
    e = mix64((epoch * GAMMA + seed_key) & _M64)
    return np.array([mix64(e ^ ((r * _ROUND_STEP) & _M64)) for r in range(1, _ROUNDS + 1)],
                    dtype=np.uint64)


def _round_keys(seed_key: int, epochs: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """Round keys, shape ``(_ROUNDS, len(epochs))``: independent-looking per (seed, epoch, round)."""
    e = mix64_array(epochs * np.uint64(GAMMA) + np.uint64(seed_key))
    rounds = np.arange(1, _ROUNDS + 1, dtype=np.uint64)[:, None] * np.uint64(_ROUND_STEP)
    return mix64_array(e[None, :] ^ rounds)


class _Tables(NamedTuple):
    """One epoch's network as lookup tables (built by ``_Feistel._epoch_tables``)."""

    rounds: list[npt.NDArray[np.int64]]  # the six round functions; the first fused with the split
    merge: npt.NDArray[np.int64]  # final hi -> (hi mod b) << ka
    fa0: npt.NDArray[np.int64]  # the first round's FA alone, indexed by hi < b
    walk: npt.NDArray[np.int64]  # walk[v - N] for v in [N, a*b): where v's cycle-walk ends
    src: npt.NDArray[np.int64]  # the offsets < N that the network maps to a stray, sorted
    dst: npt.NDArray[np.int64]  # their ids (the end of their cycle-walk)


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
        self._memoize = True  # N > SMALL_MAX: short ranges are cut from memoized blocks
        self._tables: dict[int, _Tables] = {}
        self._nets: dict[int, Any] = {}  # the same networks in C, for blocks and runs
        self._lock = threading.Lock()
        # memoized blocks, keyed by their first position: (first, stop, ids at first .. stop - 1)
        self._offset_blocks: dict[int, tuple[int, int, npt.NDArray[np.int64]]] = {}
        # (row, column) of the 2**_BLOCK_BITS offsets of a block, when a block is whole rows
        self._rows: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]] | None = None

    # The round functions, the single definition that the table path (memoized over the whole
    # domain of the round input) and the per-element path both evaluate.
    def _round_f(self, i: int, r: npt.NDArray[np.uint64], key: Any) -> npt.NDArray[np.uint64]:
        z = r * np.uint64(GAMMA) + key  # broadcasts: a round's key, or one key per row/element
        mix64_array(z)
        if i % 2 == 0:  # FA: hi -> ka bits
            z >>= np.uint64(64 - self._ka)
            return z
        return mulhi(z, self._b)  # FB: lo -> [0, b)

    def _epoch_tables(self, epoch: int) -> _Tables:
        """The epoch's round functions as lookup tables, laid out for a reduction-free pass.

        ``hi`` is never reduced mod ``b`` inside the network: after ``j`` hi-rounds it is below
        ``(j+1)*b``, so the next lo-round's table is ``FA`` repeated ``j+1`` times, and a last
        table maps the final ``hi`` to ``(hi mod b) << ka`` for the merge. Same function, two
        fewer vector ops a hi-round. The cycle-walks are done here too, once an epoch: where
        every stray ends (``walk``), and which offsets land on one (``src``, ``dst``).
        """
        tables = self._tables.get(epoch)
        if tables is None:
            keys = _epoch_round_keys(self._key, epoch)
            dom_hi = np.arange(self._b, dtype=np.uint64)
            dom_lo = np.arange(self._a, dtype=np.uint64)
            # every lo-round's FA at once (one row a round), then every hi-round's FB
            fa = self._round_f(0, dom_hi[None, :], keys[0::2, None]).view(np.int64)
            fb = self._round_f(1, dom_lo[None, :], keys[1::2, None]).view(np.int64)
            rounds = []
            for i in range(len(keys)):
                if i % 2 == 0:  # lo-round: indexed by hi < (i//2 + 1) * b
                    rounds.append(np.tile(fa[i // 2], i // 2 + 1))
                else:
                    rounds.append(fb[i // 2])
            fa0 = rounds[0]
            # the first round also does the split: x ^ (FA(hi) ^ hi << ka) == (x mod a) ^ FA(hi)
            rounds[0] = fa0 ^ (dom_hi.view(np.int64) << self._ka)
            merge = np.tile(dom_hi.view(np.int64) << self._ka, (len(keys) + 1) // 2 + 1)
            walk = self._walk_table(rounds, merge)
            # the offsets whose image is a stray: the inverse network of every stray, kept < N
            strays = np.arange(self.length, self._a * self._b, dtype=np.int64)
            src = self._inverse(strays, rounds, fa0)
            keep = (src < self.length).nonzero()[0]
            by_src = keep[src[keep].argsort()]
            tables = _Tables(rounds, merge, fa0, walk, src[by_src], walk[by_src])
            for t in (*rounds, merge, *tables[2:]):
                t.flags.writeable = False
            with self._lock:  # keep the two most recent epochs (a batch may straddle one)
                while len(self._tables) >= 2:
                    self._tables.pop(next(iter(self._tables)))
                self._tables[epoch] = tables
        return tables

    def _epoch_net(self, epoch: int) -> Any:
        """The epoch's network built in C (``None`` without the C build or past table sizes).

        The same tables as ``_epoch_tables`` (and the same cycle-walks), made in one C call
        instead of ~100 NumPy ones; the memoized blocks and contiguous runs use it.
        """
        if _CNetwork is None or self._ka > _TABLE_MAX_BITS:
            return None
        net = self._nets.get(epoch)
        if net is None:
            net = _CNetwork.build(self._ka, self._b, self.length,
                                  _epoch_round_keys(self._key, epoch).tolist())
            with self._lock:  # the two most recent epochs (a batch may straddle one)
                while len(self._nets) >= 2:
                    self._nets.pop(next(iter(self._nets)))
                self._nets[epoch] = net
        return net

    def _walk_table(self, rounds: list[npt.NDArray[np.int64]],
                    merge: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """``walk[v - N]``: the first value below N in ``F(v), F(F(v)), ...``, for v in ``[N, a*b)``.

        Cycle-walking an offset ``x < N`` whose image ``y`` is a stray (``>= N``) gives
        ``walk[y - N]``: the same walk, done once an epoch for all ``a*b - N < a`` strays instead of
        once per stray per block. A stray on a cycle of strays only is never the image of an
        offset; its walk stops when it comes back to itself (its entry is then unused).
        """
        n = self.length
        start = np.arange(n, self._a * self._b, dtype=np.int64)
        walk = self._feistel_tables(start.copy(), rounds, merge)
        todo = (walk >= n).nonzero()[0]
        while todo.size:
            sub = self._feistel_tables(walk[todo], rounds, merge)
            walk[todo] = sub
            todo = todo[(sub >= n) & (sub != start[todo])]
        return walk

    def _inverse(self, y: npt.NDArray[np.int64], rounds: list[npt.NDArray[np.int64]],
                 fa0: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """The network's inverse over ``y`` in ``[0, a*b)`` (rounds undone last to first)."""
        hi = y >> self._ka
        lo = y & (self._a - 1)
        for i in range(len(rounds) - 1, 0, -1):
            if i % 2 == 0:  # lo ^= FA(hi), hi < b: the first b entries of the repeated table
                lo ^= rounds[i].take(hi)
            else:  # hi = (hi + FB(lo)) mod b
                hi -= rounds[i].take(lo)
                hi %= self._b
        lo ^= fa0.take(hi)
        hi <<= self._ka
        hi |= lo
        return hi

    def _feistel_tables(self, x: npt.NDArray[np.int64], rounds: list[npt.NDArray[np.int64]],
                        merge: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """One pass of the network over ``x`` (consumed: it becomes a scratch buffer)."""
        hi = x >> self._ka
        tmp = np.empty_like(hi)
        rounds[0].take(hi, mode="wrap", out=tmp)  # the first round, fused with the split
        lo = x
        lo ^= tmp
        for i in range(1, len(rounds)):
            # indices are always in range: mode="wrap" only skips the bounds checks
            if i % 2 == 0:
                rounds[i].take(hi, mode="wrap", out=tmp)
                lo ^= tmp
            else:
                rounds[i].take(lo, mode="wrap", out=tmp)
                hi += tmp
        merge.take(hi, mode="wrap", out=tmp)  # (hi mod b) << ka
        tmp |= lo
        return tmp

    def _unstray(self, y: npt.NDArray[np.int64], tables: _Tables) -> npt.NDArray[np.int64]:
        """Finish the cycle-walk of the strays in ``y`` (in place) from the epoch's walk table."""
        n = self.length
        bad = (y >= n).nonzero()[0]
        if bad.size:
            y[bad] = tables.walk[y[bad] - n]
        return y

    def _offset_block(self, epoch: int, s: int) -> npt.NDArray[np.int64]:
        """Ids at offsets ``s .. min(N, s + 2**_BLOCK_BITS) - 1`` of ``epoch`` (``s`` aligned).

        One C call with the C build (``_epoch_net``). Without it, the same network as
        ``_feistel_tables``, with the first two rounds cheaper because the offsets are whole rows
        of the ``(hi, lo)`` grid (or part of one row when ``a`` is larger than a block): ``hi``
        runs over ``h0 + row`` and ``lo`` over the columns, both read from ``arange``-like
        constants. ``hi`` is carried minus ``h0`` and the tables indexed by it
        are read from ``h0`` on (views), so the first hi-round needs no addition of ``h0``. The
        strays' offsets are known for the epoch (``_Tables.src``): no search over the block.
        """
        count = min(self.length - s, 1 << _BLOCK_BITS)
        net = self._epoch_net(epoch)
        if net is not None:  # the whole run, strays included, in one C call
            out = np.empty(count, dtype=np.int64)  # fresh: it becomes the memoized block
            net.run(out, s)
            return out
        tables = self._epoch_tables(epoch)
        rounds = tables.rounds
        ka = self._ka
        h0 = s >> ka
        scratch = getattr(_SCRATCH, "buffers", None)
        if scratch is None:  # per thread: the loader's workers may compute blocks at once
            scratch = _SCRATCH.buffers = (np.empty(1 << _BLOCK_BITS, dtype=np.int64),
                                          np.empty(1 << _BLOCK_BITS, dtype=np.int64))
        if ka <= _BLOCK_BITS:  # whole rows: lo = column ^ FA0(hi), hi = h0 + row
            if self._rows is None:
                iota = self._iota(1 << _BLOCK_BITS)
                row, col = iota >> ka, (iota & (self._a - 1)).reshape(-1, self._a)
                row.flags.writeable = col.flags.writeable = False
                self._rows = (row, col)  # one reference swap: safe under concurrent readers
            rows = -(-count >> ka)  # whole rows: a*b >= N, so none is past the last one
            width = rows << ka
            lo, hi = scratch[0][:width], scratch[1][:width]
            np.bitwise_xor(self._rows[1][:rows], tables.fa0[h0:h0 + rows, None],
                           out=lo.reshape(rows, -1))
            rounds[1].take(lo, mode="wrap", out=hi)
            hi += self._rows[0][:width]
        else:  # one aligned part of row h0: (l0 + j) ^ FA0(h0) == j ^ (l0 ^ FA0(h0)), j < block
            width = count
            lo, hi = scratch[0][:width], scratch[1][:width]
            np.bitwise_xor(self._iota(count), (s & (self._a - 1)) ^ int(tables.fa0[h0]), out=lo)
            rounds[1].take(lo, mode="wrap", out=hi)
        out = np.empty(width, dtype=np.int64)  # fresh: it becomes the memoized block
        for i in range(2, len(rounds)):
            if i % 2 == 0:
                rounds[i][h0:].take(hi, mode="wrap", out=out)
                lo ^= out
            else:
                rounds[i].take(lo, mode="wrap", out=out)
                hi += out
        tables.merge[h0:].take(hi, mode="wrap", out=out)
        out |= lo
        return self._fix_strays(out[:count], tables, s)

    @staticmethod
    def _fix_strays(y: npt.NDArray[np.int64], tables: _Tables,
                    off: int) -> npt.NDArray[np.int64]:
        """Finish the cycle-walks in ``y``, the network's images of offsets ``off, off + 1, ...``.

        The epoch's stray offsets are known (``tables.src``): a contiguous run finds its own by
        bisection instead of comparing every image with N.
        """
        src = tables.src
        i, j = int(src.searchsorted(off)), int(src.searchsorted(off + y.shape[0]))
        if i < j:
            y[src[i:j] - off] = tables.dst[i:j]
        return y

    def _offset_block_at(self, p: int) -> tuple[int, int, npt.NDArray[np.int64]]:
        """The memoized block holding position ``p``: ``(first, stop, ids at first .. stop-1)``."""
        epoch, off = divmod(p, self.length)
        first = p - (off & ((1 << _BLOCK_BITS) - 1))
        blocks = self._offset_blocks
        got = blocks.get(first)
        if got is None:
            ids = self._offset_block(epoch, off >> _BLOCK_BITS << _BLOCK_BITS)
            ids.flags.writeable = False
            got = (first, min(first + ids.shape[0], 2**64), ids)  # no position past 2**64
            with self._lock:  # the two most recent blocks: a batch may straddle two
                while len(blocks) >= 2:
                    blocks.pop(next(iter(blocks)), None)
                blocks[first] = got
        self._hot = got
        return got

    def _small_range(self, start: int, count: int) -> npt.NDArray[np.int64]:
        """A short range cut from memoized blocks of ``2**_BLOCK_BITS`` offsets of one epoch.

        Blocks are aligned to the epoch's start (not to positions, as ``Order``'s are) so that
        each holds whole rows of the network's grid (see ``_offset_block``).
        """
        if self._ka > _TABLE_MAX_BITS:  # per-element round keys: position-aligned blocks
            return super()._small_range(start, count)
        first, stop, ids = self._offset_block_at(start)
        if start + count <= stop:
            return ids[start - first:start - first + count].copy()
        out = np.empty(count, dtype=np.int64)
        done = stop - start
        out[:done] = ids[start - first:]
        while done < count:
            first, stop, ids = self._offset_block_at(start + done)
            take = min(stop - first, count - done)
            out[done:done + take] = ids[:take]
            done += take
        return out

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
        if self._ka <= _TABLE_MAX_BITS:
            tables = self._epoch_tables(epoch)
            return self._unstray(self._feistel_tables(x, tables.rounds, tables.merge), tables)
        keys = _epoch_round_keys(self._key, epoch)
        return self._walk_keys(x.astype(np.uint64), keys, same=True)

    def _permute_run(self, epoch: int, off: int, count: int) -> npt.NDArray[np.int64]:
        """``perm(seed, epoch)`` of offsets ``off .. off + count - 1`` (all below N)."""
        if self._ka > _TABLE_MAX_BITS:
            return self._permute_epoch(np.add(self._iota(count), off), epoch)
        net = self._epoch_net(epoch)
        if net is not None:  # strays included
            y = np.empty(count, dtype=np.int64)
            net.run(y, off)
            return y
        tables = self._epoch_tables(epoch)
        y = self._feistel_tables(np.add(self._iota(count), off), tables.rounds, tables.merge)
        return self._fix_strays(y, tables, off)

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
            return self._permute_run(epoch, off, count)
        if count // n > 2:  # many tiny epochs in one request: per-element keys
            return super()._range(start, count)
        out = np.empty(count, dtype=np.int64)
        done = 0
        while done < count:
            take = min(n - off, count - done)
            out[done:done + take] = self._permute_run(epoch, off, take)
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
