"""``Store``: the read-only view of a committed store, read through mmaps; and ``open``.

A ``Store`` holds one ``Snapshot`` (``_snapshot.py``): the commit it loaded at open or at the last
``refresh()``, every file of it mapped. It keeps working when a writer later commits, and readers
never lock. Fixed-shape raw fields read with one ``numpy.take`` over all their chunks mapped back to
back; ragged and compressed fields copy or decode into one preallocated buffer: a tight loop over
Python ints and memoryview slices, except zstd, whose small records decode in batches (one C call
per batch, ``Codec.decode_many``).

Thread-safety: ``gather``/``record``/``views``/``nbytes`` may be called from many threads; each call
works on the snapshot it started with, and ``refresh`` swaps snapshots atomically.
"""

from __future__ import annotations

import functools
import itertools
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, NamedTuple

import google_crc32c
import numpy as np

from headrace._base.errors import ConfigError, RecordIndexError, SchemaError, WriterClosedError
from headrace._store import format as _format
from headrace._store import lane
from headrace._store.codecs import loop_decoder
from headrace._store.crc_rows import crc32c_rows, take_checked
from headrace._store.format import FieldSpec, Meta
from headrace._store.recycle import Recycler
from headrace._store.snapshot import (
    NOPOS,
    Layout,
    MappedField,
    Snapshot,
    Verified,
    check_entries,
    corrupt,
    fetch,
    load_snapshot,
    row_slots,
    sequential_layout,
)

__all__ = ["Ragged", "Store", "open"]

VerifyMode = Literal["first", "always", "never"]
_VERIFY_MODES = ("first", "always", "never")
_EMPTY = np.empty(0, np.uint8)
_EMPTY.flags.writeable = False
_NONE = np.zeros(0, bool)
_INT64 = np.dtype(np.int64)
_UINT64 = np.dtype(np.uint64)
_MAX = np.maximum.reduce
_ALL = np.logical_and.reduce
# zstd records below this decode in batches (one C call per batch, then a copy into the output);
# bigger ones decode straight into the output, where the copy would cost more than the call
_DECODE_MANY_MAX_BYTES = 64 << 10
# decoded bytes per batch call: bounds the batch API's own output buffer (transient memory)
_DECODE_MANY_BATCH_BYTES = 256 << 10
# verify="first" over a sequential layout checks records in spans of about this many bytes
_SPAN_BYTES = 64 << 10
_IOTA = np.arange(0, dtype=np.int64)


class Ragged(NamedTuple):
    """A batch of variable-length records: record ``i`` is ``values[offsets[i]:offsets[i+1]]``.

    Attributes:
        values: all records' elements back to back, 1-D, in the field's dtype.
        offsets: int64 element offsets, ``len(records) + 1`` of them, starting at 0.
    """

    values: np.ndarray
    offsets: np.ndarray

    def __len__(self) -> int:  # number of records, not the tuple's 2
        return len(self.offsets) - 1

    def __getitem__(self, i: Any) -> Any:
        """Record ``i`` as a 1-D array (a view of ``values``); ``r[0:2]`` works on the tuple."""
        if isinstance(i, int | np.integer):
            n = len(self)
            j = int(i) + n if i < 0 else int(i)
            if not 0 <= j < n:
                raise IndexError(f"record {i} out of range for a Ragged of {n} records")
            return self.values[self.offsets[j]:self.offsets[j + 1]]
        return tuple.__getitem__(self, i)

    def __iter__(self) -> Any:  # keep tuple unpacking: values, offsets = r
        return tuple.__iter__(self)

    def to_list(self) -> list[np.ndarray]:
        """The records as a list of 1-D arrays (views of ``values``)."""
        o = self.offsets.tolist()
        return [self.values[o[j]:o[j + 1]] for j in range(len(o) - 1)]


def record_ids(indices: Any, n: int) -> np.ndarray:
    """``indices`` as a 1-D int64 array of record ids, every one checked against ``[0, n)``.

    Samplers' arrays (1-D int64) pass through as they are, checked by one reduction.

    Raises:
        RecordIndexError: an id outside ``[0, n)``, non-integer ids, or more than one dimension.
    """
    if type(indices) is np.ndarray and indices.dtype == _INT64 and indices.ndim == 1:
        # what samplers produce: one reduction checks both ends (negatives turn huge as u8)
        if len(indices) and int(_MAX(indices.view(_UINT64))) >= n:
            _out_of_range(indices, n)
        return indices
    idx = np.asarray(indices)
    if idx.ndim != 1:
        idx = idx.reshape(-1) if idx.ndim == 0 else idx
        if idx.ndim != 1:
            raise RecordIndexError(f"indices must be 1-D, got shape {idx.shape}")
    if idx.dtype.kind not in "iu":
        if idx.size == 0:
            return np.empty(0, np.int64)
        raise RecordIndexError(f"indices must be integers, got dtype {idx.dtype}")
    idx = idx.astype(np.int64, copy=False)
    # one reduction: negative ids turn huge when read as unsigned
    if idx.size and int(_MAX(idx.view(_UINT64))) >= n:
        _out_of_range(idx, n)
    return idx


def _run_start(ids: np.ndarray) -> int:
    """The first of ``ids`` when they are consecutive increasing ints ``a, a + 1, ...`` with
    ``a >= 0`` (a sequential order's batch), else -1. Distinct increasing ints spanning
    ``n - 1`` are such a run; the ends are compared first, so other batches cost two reads."""
    n = len(ids)
    if not n:
        return -1
    a = int(ids[0])
    if a < 0 or int(ids[-1]) - a != n - 1:
        return -1
    return a if n == 1 or bool(_ALL(ids[1:] > ids[:-1])) else -1


def _out_of_range(idx: np.ndarray, n: int) -> None:
    bad = (idx < 0) | (idx >= n)
    first = int(idx[np.argmax(bad)])
    raise RecordIndexError(
        f"record id {first} is out of range for a store of N={n} records "
        f"(valid ids are 0..{n - 1}); {int(bad.sum())} of {idx.size} ids are out of range")


def pick_fields(fields: str | Iterable[str] | None, available: Mapping[str, Any], *,
                default: Iterable[str] | None = None, where: str = "this store") -> list[str]:
    """The field names a read asks for: ``fields`` (one name or several) or ``default``.

    Raises:
        SchemaError: a name that is not a key of ``available``.
    """
    if fields is None:
        return list(available if default is None else default)
    names = [fields] if isinstance(fields, str) else list(fields)
    for name in names:
        if name not in available:  # a dict lookup: this runs on every non-steady gather
            raise SchemaError(f"unknown field {name!r}; {where} has {list(available)}")
    return names


class _SteadyPlan(NamedTuple):
    """A field list's steady-state reads for one snapshot.

    Per field: its name, its virtual rows, the id -> row map (``None``: row = id) and the view
    that gives records their dtype and shape (``None``: uint8 rows already are the records).
    """

    snapshot: Snapshot
    fields: tuple[tuple[str, np.ndarray, Any, Any], ...]


class _CheckedPlan(NamedTuple):
    """A field list's checked reads for one snapshot: under ``verify="first"`` until every record
    was verified (then the steady plan takes over), under ``"always"`` for good.

    For fixed-shape raw fields filled by appends (a sequential layout, whose scan checked every
    entry): a record's first read only needs its crc32c, which ``take_checked`` computes from
    the copy it just made, one C call per field and batch. Per field: its name, its mapped field,
    its virtual rows and the same bytes flat, the id -> row map (``None``: row = id), the view
    that gives records their dtype and shape (``None``: uint8 rows already are the records) and
    its layout.
    """

    snapshot: Snapshot
    names: list[str]
    fields: tuple[tuple[str, MappedField, np.ndarray, np.ndarray, Any, Any, Layout], ...]


class _CheckedRead:
    """A checked read in progress on the copy lane (``Store.gather_start`` before every record
    was verified): ``wait()`` gives what ``gather`` would have, or raises what it would have."""

    __slots__ = ("_idx", "_key", "_outs", "_pending", "_plan", "_reader", "_st")

    def __init__(self, reader: Store, st: Snapshot, plan: _CheckedPlan, key: Any,
                 idx: np.ndarray, outs: list[np.ndarray], pending: list[Any]) -> None:
        self._reader, self._st, self._plan, self._key = reader, st, plan, key
        self._idx, self._outs, self._pending = idx, outs, pending

    def wait(self) -> dict[str, np.ndarray | Ragged]:
        results = [p.wait() for p in self._pending]  # every copy done before anything raises
        reader, st = self._reader, self._st
        out = {field[0]: reader._settle_checked(st, field, self._idx, got, new, bad)
               for field, got, (new, bad) in zip(self._plan.fields, self._outs, results, strict=True)}
        if reader.verify != "always":
            reader._plan_steady(st, self._key, self._plan.names)
        return out


class Store:
    """A read-only view of a store's last commit (at open or at the last ``refresh()``).

    Use ``headrace.open(path)``. ``verify`` chooses when checksums are checked: ``"first"`` (the
    first time this process reads a record: committed bytes never change), ``"always"`` or
    ``"never"``. Under ``"first"``, bytes damaged on disk after this process read (and checked) a
    record are served as they are from then on: a reader that must notice damage that happens
    while it runs uses ``"always"``, which checks the crc32c of every record on every read (see
    ``docs/format.md``, "Reading", for what it costs).
    """

    def __init__(self, path: str | os.PathLike[str], *, verify: VerifyMode = "first") -> None:
        if verify not in _VERIFY_MODES:
            raise ConfigError(f"verify={verify!r} is not a mode; use one of {_VERIFY_MODES}")
        self.path = os.fspath(path)
        self.verify: VerifyMode = verify
        self._state: Snapshot | None = load_snapshot(self.path)
        self._plans: dict[Any, _SteadyPlan] = {}  # by fields argument, for the loaded snapshot
        self._checked: dict[Any, _CheckedPlan] = {}  # the same, for reads that check crcs
        self._recycler = Recycler()  # batch outputs written again once the program drops them

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def _st(self) -> Snapshot:
        st = self._state
        if st is None:
            raise WriterClosedError(f"store {self.path} is closed; open it again to read")
        return st

    def refresh(self) -> bool:
        """Loads the newest commit. Returns True if it differs from the one held before."""
        old = self._st
        new_meta = _format.read_meta(self.path)
        if new_meta.commit == old.meta.commit:
            return False
        new = load_snapshot(self.path)
        if new.meta.generation == old.meta.generation:  # same records, maybe more: keep checks
            new.verified = Verified(new.fields, new.meta.length, old=old.verified)
        self._state = new
        self._plans, self._checked = {}, {}
        return True

    def close(self) -> None:
        """Drops the mappings (idempotent). Arrays returned earlier stay valid."""
        self._state = None
        self._plans, self._checked = {}, {}
        self._recycler.clear()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:  # pickles as (path, verify): reopened on load
        return {"path": self.path, "verify": self.verify}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], verify=state["verify"])  # type: ignore[misc]

    def __repr__(self) -> str:
        if self._state is None:
            return f"Store({self.path!r}, closed)"
        return (f"Store({self.path!r}, length={len(self)}, generation={self.generation}, "
                f"fields={list(self.fields)})")

    # -- metadata --------------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._st.meta.length

    @property
    def generation(self) -> int:
        """Changes on every commit that rewrote existing records (modify, delete, compact)."""
        return self._st.meta.generation

    @property
    def commit_id(self) -> int:
        """Increments on every commit."""
        return self._st.meta.commit

    @property
    def fields(self) -> dict[str, FieldSpec]:
        return {name: f.spec for name, f in self._st.fields.items()}

    @property
    def attrs(self) -> dict[str, Any]:
        return dict(self._st.meta.attrs)

    def checked_all(self, fields: Iterable[str] | None = None) -> bool:
        """Whether reads of ``fields`` (default: all) check nothing more on first reads: every
        record was verified in this process (``verify="first"``), or checks are never or always
        made: reads cost the same from then on."""
        if self.verify != "first":
            return True
        ver = self._st.verified
        names = self._st.fields if fields is None else fields
        return all(ver.count.get(name, ver.n) >= ver.n for name in names)

    @property
    def meta(self) -> Meta:
        """The parsed ``meta.json`` of the loaded commit."""
        return self._st.meta

    # -- reads -----------------------------------------------------------------------------------

    def _entries(self, st: Snapshot, f: MappedField, idx: np.ndarray, check: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Index/aux entries of ``idx``: ``(chunk, offset, length, nbytes, crc)``.

        Entries are consistency-checked (vectorized) unless this process already verified them:
        committed entries never change within a generation, like committed chunk bytes, so with
        ``verify="first"`` a record's entry and checksum are checked on its first read only.
        """
        if len(f.index) < st.meta.length:
            short = idx >= len(f.index)
            if short.any():
                raise _short(st, f, idx[short])
        todo = idx if self.verify != "first" else idx[check]
        if len(todo) == len(idx):
            bad, cid, off, ln, nb, crc = check_entries(st, f, idx)
        else:
            bad = check_entries(st, f, todo)[0] if len(todo) else _NONE
            cid, off, ln, nb, crc = fetch(f, idx)
        if bad.any():
            raise corrupt(f.spec, todo[bad], "index/aux entries point outside their chunk or "
                           "disagree with the field's schema (corrupted index or truncated chunk)")
        return cid, off, ln, nb, crc

    def _to_check(self, st: Snapshot, f: MappedField, idx: np.ndarray) -> np.ndarray:
        """Positions in ``idx`` whose checksum must be checked now."""
        if self.verify == "first":
            return st.verified.todo(f.spec.name, idx)
        if self.verify == "always":
            return np.arange(len(idx))
        return NOPOS

    def _check_crcs(self, st: Snapshot, f: MappedField, idx: np.ndarray, pos: np.ndarray,
                    crc: np.ndarray, data: list[Any]) -> None:
        value = google_crc32c.value
        got = np.array([value(d) for d in data], np.uint32)
        bad = got != crc[pos]
        if bad.any():
            raise corrupt(f.spec, idx[pos[bad]], "stored bytes do not match their crc32c")
        if self.verify == "first":
            st.verified.mark(f.spec.name, idx[pos])

    def gather(self, indices: Sequence[int] | np.ndarray,
               fields: str | Iterable[str] | None = None) -> dict[str, np.ndarray | Ragged]:
        """Reads records ``indices`` (any order, repeats allowed) of ``fields`` (default: all).

        Returns:
            ``{field: array}``: fixed-shape fields give an array of shape ``(n, *shape)`` (absent
            records are zeros); ragged fields give a ``Ragged``.

        Raises:
            RecordIndexError: an id outside ``[0, N)``.
            CorruptionError: a record's bytes or index entry are damaged (names field and ids).
        """
        st = self._st
        if fields is not None and not isinstance(fields, str):
            fields = tuple(fields)  # once: an iterator would be used up by the plan key
        key = fields
        plan = self._plans.get(key)
        if plan is not None and plan.snapshot is st:
            n = st.meta.length
            idx = (indices if type(indices) is np.ndarray and indices.dtype == _INT64
                   and indices.ndim == 1 else record_ids(indices, n))
            # One look at the ids serves every field: a run of consecutive ids (a sequential
            # order's batch) is bounds-checked by its ends and copied as one block per field;
            # any other ids by one reduction, then a take per field.
            run = _run_start(idx)
            if (run < 0 or run + len(idx) > n) and len(idx) and int(_MAX(idx.view(_UINT64))) >= n:
                _out_of_range(idx, n)
            # "clip" never clips (the layout scan proved every row in range) and, unlike the
            # default "raise", skips a per-index bounds check; None: identity, nothing to call
            take = self._take
            return {name: (take(vrows, idx, run) if rows is None else take(vrows, rows(idx)))
                    if view is None else
                    view(take(vrows, idx, run) if rows is None else take(vrows, rows(idx)))
                    for name, vrows, rows, view in plan.fields}
        idx = record_ids(indices, st.meta.length)
        checked = self._checked.get(key)
        out: dict[str, np.ndarray | Ragged]
        if checked is not None and checked.snapshot is st:
            names = checked.names
            out = self._gather_checked(st, checked, idx)
        else:
            names = pick_fields(fields, st.fields)
            out = {name: self._gather_field(st, st.fields[name], idx) for name in names}
            if self.verify != "never":
                self._plan_checked(st, key, names)
        if self.verify != "always":
            self._plan_steady(st, key, names)
        return out

    def gather_start(self, indices: Sequence[int] | np.ndarray,
                     fields: str | Iterable[str] | None = None
                     ) -> lane.Started | _CheckedRead | None:
        """Starts ``gather(indices, fields)`` on the copy lane (a native thread that copies while
        the caller runs Python) and returns at once; ``wait()`` on the result gives the records.

        Reads that are copies take the lane: fixed-shape raw fields, verified or not (a first
        read checks each record's crc32c as the lane copies it, as ``gather`` does; an error
        then raises from ``wait()``), once a ``gather`` of the same fields planned them (the
        store's first read of them). Otherwise, or where the lane was not built, returns None:
        call ``gather``.

        Raises:
            RecordIndexError: an id outside ``[0, N)`` (nothing is started).
        """
        if not lane.available():
            return None
        st = self._st
        if fields is not None and not isinstance(fields, str):
            fields = tuple(fields)
        plan = self._plans.get(fields)
        if plan is None or plan.snapshot is not st:
            checked = self._checked.get(fields)
            if checked is None or checked.snapshot is not st or lane.start_checked is None:
                return None
            return self._checked_start(st, checked, fields, indices)
        n = st.meta.length
        idx = (indices if type(indices) is np.ndarray and indices.dtype == _INT64
               and indices.ndim == 1 else record_ids(indices, n))
        if not idx.flags.c_contiguous:
            idx = np.ascontiguousarray(idx)
        out: dict[str, Any] = {}
        pending = []
        empty = self._recycler.empty
        try:
            for name, vrows, rows, view in plan.fields:
                if not vrows.flags.c_contiguous or vrows.ndim != 2:
                    return None  # (a layout the plan never makes today) gather copies it
                got = empty((len(idx), vrows.shape[1]), vrows.dtype)
                # the lane checks the ids against [0, n) itself when rows are ids
                pending.append(lane.start_rows(vrows, idx, got, n) if rows is None
                               else lane.start_rows(vrows, rows(record_ids(idx, n)), got, -1))
                out[name] = got if view is None else view(got)
        except IndexError:
            _out_of_range(idx, n)
        return lane.Started(out, pending)

    def _plan_checked(self, st: Snapshot, key: Any, names: list[str]) -> None:
        """Memoizes ``names``' checked reads when every one of them has a sequential layout (the
        gather that just ran found them) and the C accelerator is built."""
        if take_checked is None:
            return
        fields = []
        for name in names:
            f = st.fields[name]
            virtual = st.vrows.get(name)
            layout = st.layouts.get(name)
            if virtual is None or layout is None or f.rec <= 0 or not virtual[0].flags.c_contiguous:
                return
            vrows = virtual[0]
            fields.append((name, f, vrows, vrows.reshape(-1), None if layout.identity else layout.rows,
                           None if f.plain else functools.partial(self._as_fixed, f), layout))
        self._checked[key] = _CheckedPlan(st, names, tuple(fields))

    def _gather_checked(self, st: Snapshot, plan: _CheckedPlan, idx: np.ndarray
                        ) -> dict[str, np.ndarray | Ragged]:
        """Records ``idx`` (checked ids) of the plan's fields, each record's crc32c checked on
        this read (``"always"``) or on its first (``"first"``)."""
        assert take_checked is not None
        bits = st.verified.bits if self.verify == "first" else None
        idx = np.ascontiguousarray(idx)
        out: dict[str, np.ndarray | Ragged] = {}
        for field in plan.fields:
            name, f, vrows, flat, rows, _view, _layout = field
            got = self._recycler.empty((len(idx), f.rec), vrows.dtype)
            new, bad = take_checked(flat, f.rec, idx if rows is None else rows(idx), idx, f.aux_u4,
                                    None if bits is None else bits[name], got)
            out[name] = self._settle_checked(st, field, idx, got, new, bad)
        return out

    def _checked_start(self, st: Snapshot, plan: _CheckedPlan, key: Any,
                       indices: Sequence[int] | np.ndarray) -> _CheckedRead:
        """``_gather_checked`` started on the copy lane (``gather_start``)."""
        assert lane.start_checked is not None
        idx = np.ascontiguousarray(record_ids(indices, st.meta.length))
        bits = st.verified.bits if self.verify == "first" else None
        outs, pending = [], []
        for name, f, vrows, flat, rows, _view, _layout in plan.fields:
            got = self._recycler.empty((len(idx), f.rec), vrows.dtype)
            pending.append(lane.start_checked(flat, f.rec, idx if rows is None else rows(idx), idx,
                                         f.aux_u4, None if bits is None else bits[name], got))
            outs.append(got)
        return _CheckedRead(self, st, plan, key, idx, outs, pending)

    def _settle_checked(self, st: Snapshot, field: tuple[Any, ...], idx: np.ndarray,
                        got: np.ndarray, new: int, bad: bytes) -> np.ndarray | Ragged:
        """One field's checked read, copied into ``got``: raises for the records whose crc32c
        did not match (``bad``: their positions), counts the ``new`` ones verified, and verifies
        the rest in spans once the reads have covered the field."""
        name, f, vrows, _flat, _rows, view, layout = field
        if bad:
            raise corrupt(f.spec, idx[np.frombuffer(bad, np.int64)],
                          "stored bytes do not match their crc32c")
        if self.verify == "first":
            ver = st.verified
            ver.add(name, new)
            if ver.count[name] < ver.n and ver.read(name, len(idx)):
                self._check_spans(st, f, idx, vrows, layout)
        return got if view is None else view(got)

    def _take(self, vrows: np.ndarray, rows: np.ndarray, run: int | None = None) -> np.ndarray:
        """``vrows[rows]`` into a recycled array when one is free. ``"clip"`` never clips (the
        layout scan proved every row in range) and, unlike the default ``"raise"``, skips a
        per-index bounds check and writes straight into ``out``. ``run``: ``_run_start(rows)``
        when the caller has it already."""
        n = len(rows)
        out = self._recycler.empty((n, *vrows.shape[1:]), vrows.dtype)
        a = _run_start(rows) if run is None else run
        if a >= 0:  # consecutive rows: one copy of the run, not a take that indexes row by row
            np.copyto(out, vrows[a:a + n])
            return out
        return vrows.take(rows, axis=0, mode="clip", out=out)

    def _plan_steady(self, st: Snapshot, key: Any, names: list[str]) -> None:
        """Memoizes the steady state of ``names`` once every one of them has reached it.

        Fixed-shape raw fields filled by appends, once each record was verified, read as a take
        over their virtual rows (``_gather_field``); then nothing else of the snapshot is needed.
        Holding just that per field list keeps the hot path from touching a dozen Python objects
        per field and call, each a likely cache and TLB miss after a batch's worth of copying.
        """
        ver = st.verified
        verified = self.verify == "never"  # entries are proved by the layout scan alone
        for name in names:
            if ((not verified and ver.count[name] < ver.n) or name not in st.vrows
                    or st.layouts.get(name) is None):
                return
        steady = []
        for name in names:
            f = st.fields[name]
            layout = st.layouts[name]
            assert layout is not None
            steady.append((name, st.vrows[name][0], None if layout.identity else layout.rows,
                           None if f.plain else functools.partial(self._as_fixed, f)))
        self._plans[key] = _SteadyPlan(st, tuple(steady))

    def _gather_field(self, st: Snapshot, f: MappedField, idx: np.ndarray) -> np.ndarray | Ragged:
        check = self._to_check(st, f, idx)
        virtual = st.vrows.get(f.spec.name)
        if virtual is not None:
            layout = sequential_layout(st, f.spec.name)
            if layout is not None:  # appended in order: no index reads for the rows at all
                # "clip" never clips (the layout scan proved every row in range); unlike the
                # default "raise" it skips a per-index bounds check
                got = self._take(virtual[0], layout.rows(idx))
                if len(check):  # only records not verified yet read their entries and crcs
                    self._check_rows(st, f, idx, check, got)
                    if self.verify == "first" and st.verified.read(f.spec.name, len(idx)):
                        self._check_spans(st, f, idx, virtual[0], layout)
                return self._as_fixed(f, got)
        if virtual is not None and self.verify == "first" and not len(check):
            # Steady state of a fixed-shape raw field: every entry was checked before (they do
            # not change within a generation), so this is an index lookup and one take.
            vrows, vstart, small = virtual
            ent = f.index_u4.take(idx, axis=0).T.copy()  # rows: chunk, offset lo, hi, length
            first = vstart.take(ent[0] if st.chunk_ids is None else row_slots(st, ent[0]))
            if small:  # every chunk is under 4 GiB: valid offsets fit the low word
                rows = first + ent[1] // f.rec
            else:
                off = ent[1].astype(np.int64) | (ent[2].astype(np.int64) << 32)
                rows = first + off // f.rec
            got = vrows.take(rows, axis=0)
            if np.count_nonzero(ent[3]) != len(idx):  # absent records read as zeros
                got[ent[3] == 0] = 0
            return self._as_fixed(f, got)
        cid, off, ln, nb, crc = self._entries(st, f, idx, check)
        if f.rec >= 0 and f.spec.codec == "raw":
            return self._gather_fixed_raw(st, f, idx, cid, off, ln, crc, check)
        if len(check):  # array slices: google_crc32c refuses memoryviews
            chunks = st.chunks
            self._check_crcs(st, f, idx, check, crc, [
                chunks[c][o:o + n] if n else _EMPTY for c, o, n in zip(
                    cid[check].tolist(), off[check].tolist(), ln[check].tolist(), strict=True)])
        out: np.ndarray
        if f.rec >= 0:
            # empty, not zeros: every present row is overwritten; only absent rows need zeroing
            out = np.empty((len(idx), f.rec), np.uint8)
            starts = np.arange(len(idx), dtype=np.int64) * f.rec
            absent = ln == 0
            if absent.any():
                out[absent] = 0
        else:
            starts = np.zeros(len(idx) + 1, np.int64)
            np.cumsum(nb, out=starts[1:])
            out = np.empty(int(starts[-1]), np.uint8)
        self._copy_records(st, f, idx, cid, off, ln, nb, starts,
                           memoryview(out.reshape(-1)))  # type: ignore[arg-type]
        if f.rec >= 0:
            return self._as_fixed(f, out)
        isz = f.spec.dtype.itemsize
        return Ragged(out.view(f.spec.dtype) if isz else np.empty(0, f.spec.dtype), starts // max(isz, 1))

    @staticmethod
    def _copy_records(st: Snapshot, f: MappedField, idx: np.ndarray, cid: np.ndarray,
                      off: np.ndarray, ln: np.ndarray, nb: np.ndarray, starts: np.ndarray,
                      out: memoryview) -> None:
        """Copies (raw) or decodes each present record into ``out`` at ``starts[j]``.

        Entries are turned into Python ints once (``tolist``) and the loops slice memoryviews
        (cheaper than arrays). zstd decodes batches of small records in one C call; records of
        64 KiB and more decode straight into ``out``.
        """
        present = np.flatnonzero(ln)
        # None: all present (the common case), no selection copies
        pos: np.ndarray | None = None if len(present) == len(idx) else present
        starts = starts[:len(idx)]  # a ragged field's has one more (the end)
        if f.spec.codec == "raw":
            views = st.views
            for c, o, n, s in zip(*_lists(pos, cid, off, ln, starts), strict=True):
                out[s:s + n] = views[c][o:o + n]
            return
        if f.codec.decode_many is not None:
            pos = Store._decode_many(st, f, idx, cid, off, ln, nb, starts, out, pos)
            if pos is None or not len(pos):
                return
        Store._decode_loop(st, f, idx, cid, off, ln, nb, starts, out, pos)

    @staticmethod
    def _decode_loop(st: Snapshot, f: MappedField, idx: np.ndarray, cid: np.ndarray,
                     off: np.ndarray, ln: np.ndarray, nb: np.ndarray, starts: np.ndarray,
                     out: memoryview, pos: np.ndarray | None) -> None:
        """Decodes records ``pos`` (None: all, every one present) one by one into ``out``."""
        views = st.views
        decode, into = loop_decoder(f.codec), f.codec.decode_into
        big = _DECODE_MANY_MAX_BYTES if into is not None else 1 << 62
        j = 0
        try:
            # a wrong decoded size fails the slice assignment (ValueError): no length check here
            for j, c, o, n, m, s in zip(range(len(idx)), *_lists(pos, cid, off, ln, nb, starts),  # noqa: B007
                                        strict=False):
                if m < big:
                    out[s:s + m] = decode(views[c][o:o + n], m)
                else:
                    into(views[c][o:o + n], out[s:s + m])  # type: ignore[misc]
        except Exception as e:
            k = j if pos is None else int(pos[j])
            raise Store._decode_error(st, f, idx, cid, off, ln, nb, k, e) from e

    @staticmethod
    def _decode_error(st: Snapshot, f: MappedField, idx: np.ndarray, cid: np.ndarray,
                      off: np.ndarray, ln: np.ndarray, nb: np.ndarray, k: int,
                      e: Exception) -> Exception:
        """The ``CorruptionError`` for record ``k`` of a batch whose decode raised ``e``."""
        c, o, n, m = int(cid[k]), int(off[k]), int(ln[k]), int(nb[k])
        if not isinstance(e, ValueError) or (f.codec.decode_into is not None
                                             and m >= _DECODE_MANY_MAX_BYTES):
            return corrupt(f.spec, idx[k:k + 1], f"{f.spec.codec} data does not decode "
                           f"({type(e).__name__}: {e})")
        try:  # the slice assignment failed: decode again for the size (or the codec's error)
            dec = f.codec.decode(st.views[c][o:o + n], m)
        except Exception as e2:
            return corrupt(f.spec, idx[k:k + 1], f"{f.spec.codec} data does not decode "
                           f"({type(e2).__name__}: {e2})")
        return corrupt(f.spec, idx[k:k + 1], f"decodes to {len(dec)} bytes, expected {m}")

    @staticmethod
    def _decode_many(st: Snapshot, f: MappedField, idx: np.ndarray, cid: np.ndarray,
                     off: np.ndarray, ln: np.ndarray, nb: np.ndarray, starts: np.ndarray,
                     out: memoryview, pos: np.ndarray | None) -> np.ndarray | None:
        """Decodes the small present records with the codec's batch API.

        Batches hold at most ``_DECODE_MANY_BATCH_BYTES`` decoded bytes (the batch API allocates
        its own output, copied into ``out``: this bounds that transient memory). A batch that
        fails is decoded again record by record, which names the damaged record.

        Returns:
            Positions left to decode one by one (large records), or None/empty when done.
        """
        assert f.codec.decode_many is not None
        sel = np.arange(len(idx)) if pos is None else pos
        m_s = nb[sel]
        # a (damaged) size of 0 would mean "size unknown" to the batch API: decode it alone
        small = (m_s < _DECODE_MANY_MAX_BYTES) & (m_s > 0)
        rest = sel[~small]
        if len(rest):
            sel, m_s = sel[small], m_s[small]
        if not len(sel):
            return rest
        # batch boundaries: where the running decoded size crosses a multiple of the batch size
        cuts = np.flatnonzero(np.diff(np.cumsum(m_s) // _DECODE_MANY_BATCH_BYTES)) + 1
        bounds = [0, *cuts.tolist(), len(sel)]
        sizes = m_s.astype(np.uint64)
        views = st.views
        c_l, o_l, n_l, m_l, s_l = _lists(sel, cid, off, ln, nb, starts)
        for a, b in itertools.pairwise(bounds):
            frames = [views[c][o:o + n] for c, o, n in zip(c_l[a:b], o_l[a:b], n_l[a:b],
                                                           strict=True)]
            try:
                got = f.codec.decode_many(frames, sizes[a:b])
                for s, m, dec in zip(s_l[a:b], m_l[a:b], got, strict=True):
                    out[s:s + m] = dec
            except Exception:
                Store._decode_loop(st, f, idx, cid, off, ln, nb, starts, out, sel[a:b])
        return rest

    def _check_spans(self, st: Snapshot, f: MappedField, sub: np.ndarray, vrows: np.ndarray,
                     layout: Layout) -> None:
        """Checks the crc32c of the unverified records near records ``sub`` (a batch whose
        records are verified now; a ``verify="first"`` read over a sequential layout), read
        from the mapping.

        Near: in the same span of ``_SPAN_BYTES`` of consecutive records. Called once this process
        has read as many records of the field as it holds (``Verified.read``) and some are still
        unverified, which an order that reads some records more than once and misses others
        (iid) leaves: verifying whole spans then lets it reach the steady state (every record
        verified: one take per field and batch, no bookkeeping) in about one more epoch instead
        of ``ln(N)``. Orders that read every record once an epoch never get here, and their first
        epoch checks each record on the copy it just made, as before.
        A damaged neighbour raises nothing here: it stays unverified, and the read that asks
        for it raises.
        """
        name = f.spec.name
        n = st.meta.length
        span = max(1, _SPAN_BYTES // f.rec)
        first = np.unique(sub // span) * span
        ids = (first[:, None] + _iota(span)).reshape(-1)
        if ids[-1] >= n:  # sorted: only the last span can pass the end
            ids = ids[:int(np.searchsorted(ids, n))]
        ids = ids[st.verified.todo(name, ids)]
        if not len(ids):
            return
        good = crc32c_rows(vrows, layout.rows(ids)) == f.aux_u4.take(ids, axis=0)[:, 0]
        st.verified.mark(name, ids if good.all() else ids[good])

    def _check_rows(self, st: Snapshot, f: MappedField, idx: np.ndarray, pos: np.ndarray,
                    out: np.ndarray) -> None:
        """Checks the crc32c of records ``idx[pos]``, already read into ``out[pos]`` from their
        sequential layout, whose scan checked every entry (``sequential_layout``)."""
        sub = idx[pos]
        crc = f.aux_u4.take(sub, axis=0)[:, 0]  # a column view would be copied whole by take
        got = crc32c_rows(out, pos)
        wrong = got != crc
        if wrong.any():
            raise corrupt(f.spec, sub[wrong], "stored bytes do not match their crc32c")
        if self.verify == "first":
            st.verified.mark(f.spec.name, sub)

    def _as_fixed(self, f: MappedField, rows: np.ndarray) -> np.ndarray:
        shape = f.spec.shape or ()
        if f.plain:
            return rows
        if f.rec == 0:
            return np.zeros((len(rows), *shape), f.spec.dtype)
        return rows.view(f.spec.dtype).reshape((len(rows), *shape))

    def _gather_fixed_raw(self, st: Snapshot, f: MappedField, idx: np.ndarray, cid: np.ndarray,
                          off: np.ndarray, ln: np.ndarray, crc: np.ndarray, check: np.ndarray
                          ) -> np.ndarray:
        n = len(idx)
        if f.rec == 0:
            return self._as_fixed(f, np.empty((n, 0), np.uint8))
        row = off // f.rec
        absent = ln == 0
        virtual = st.vrows.get(f.spec.name)
        if virtual is not None:  # all chunks back to back: one take, like a single .npy memmap
            vrows, vstart, _small = virtual
            out = vrows.take(vstart[row_slots(st, cid)] + row, axis=0)
            if absent.any():
                out[absent] = 0
            return self._check_fixed(st, f, idx, out, absent, crc, check)
        present = ~absent
        first = int(cid[0]) if n else -1
        if n and bool(present.all()) and bool((cid == first).all()):
            out = st.rows[first].take(row, axis=0)  # the common case: one vectorized take
        else:
            out = np.zeros((n, f.rec), np.uint8)
            for c in np.unique(cid[present]).tolist():
                sel = np.flatnonzero(present & (cid == c))
                out[sel] = st.rows[c].take(row[sel], axis=0)
        return self._check_fixed(st, f, idx, out, absent, crc, check)

    def _check_fixed(self, st: Snapshot, f: MappedField, idx: np.ndarray, out: np.ndarray,
                     absent: np.ndarray, crc: np.ndarray, check: np.ndarray) -> np.ndarray:
        if len(check):
            got = crc32c_rows(out, check)
            got[absent[check]] = 0  # an absent record's stored bytes are none: crc32c(b"") = 0
            bad = got != crc[check]
            if bad.any():
                raise corrupt(f.spec, idx[check[bad]], "stored bytes do not match their crc32c")
            if self.verify == "first":
                st.verified.mark(f.spec.name, idx[check])
        return self._as_fixed(f, out)

    def nbytes(self, indices: Sequence[int] | np.ndarray,
               fields: str | Iterable[str] | None = None) -> int:
        """Exact decoded bytes ``gather(indices, fields)`` returns (reads index/aux only)."""
        st = self._st
        idx = record_ids(indices, st.meta.length)
        total = 0
        for name in pick_fields(fields, st.fields):
            f = st.fields[name]
            if f.rec >= 0:
                total += f.rec * len(idx)
            else:
                if len(f.aux) < st.meta.length and idx.size and idx.max() >= len(f.aux):
                    raise _short(st, f, idx[idx >= len(f.aux)])
                # Sizes not verified yet are checked as a gather would: a damaged ``nbytes`` is
                # reported as corruption, not as a batch of gigabytes to budget for.
                check = self._to_check(st, f, idx)
                if len(check) or self.verify == "never":
                    self._entries(st, f, idx, check)
                total += int(f.aux["nbytes"][idx].sum(dtype=np.int64))
        return total

    def aux_entries(self, field: str) -> np.ndarray:
        """``field``'s aux entries (``crc``: crc32c of each record's stored bytes, ``nbytes``: its
        decoded size), one per committed record: a read-only view of the mapped file."""
        return self._st.fields[field].aux

    def record(self, i: int, field: str) -> np.ndarray:
        """One record of ``field``. Raw records are zero-copy read-only views of the mmap."""
        st = self._st
        idx = record_ids([i], st.meta.length)
        f = st.fields[pick_fields(field, st.fields)[0]]
        if f.spec.codec != "raw":
            got = self._gather_field(st, f, idx)
            return got[0]
        view = self._raw_views(st, f, idx)[0]
        if f.rec >= 0:
            if f.rec == 0 or len(view) == 0:
                return np.zeros(f.spec.shape or (), f.spec.dtype)
            return view.view(f.spec.dtype).reshape(f.spec.shape or ())
        return view.view(f.spec.dtype) if f.spec.dtype.itemsize else view

    def views(self, indices: Sequence[int] | np.ndarray, field: str) -> list[memoryview]:
        """Zero-copy memoryviews of the stored bytes of a raw field's records (absent: empty).

        For other codecs the decoded bytes are returned (a copy).
        """
        st = self._st
        idx = record_ids(indices, st.meta.length)
        f = st.fields[pick_fields(field, st.fields)[0]]
        if f.spec.codec != "raw":
            got = self._gather_field(st, f, idx)
            if isinstance(got, Ragged):
                return [memoryview(a.view(np.uint8)) for a in got.to_list()]  # type: ignore[arg-type]
            rows = np.ascontiguousarray(got).reshape(len(idx), -1).view(np.uint8)
            return [memoryview(r) for r in rows]  # type: ignore[arg-type]
        return [memoryview(v) for v in self._raw_views(st, f, idx)]  # type: ignore[arg-type]

    def _raw_views(self, st: Snapshot, f: MappedField, idx: np.ndarray) -> list[np.ndarray]:
        check = self._to_check(st, f, idx)
        cid, off, ln, _nb, crc = self._entries(st, f, idx, check)
        views = [st.chunks[c][o:o + n] if n else _EMPTY
                 for c, o, n in zip(cid.tolist(), off.tolist(), ln.tolist(), strict=True)]
        if len(check):
            self._check_crcs(st, f, idx, check, crc, [views[j] for j in check.tolist()])
        return views


def _iota(n: int) -> np.ndarray:
    """A shared read-only ``arange(n)`` (grown on demand)."""
    global _IOTA
    a = _IOTA
    if len(a) < n:
        a = np.arange(max(n, 2 * len(a)), dtype=np.int64)
        a.flags.writeable = False
        _IOTA = a  # one reference swap: safe under concurrent readers
    return a[:n]


def _short(st: Snapshot, f: MappedField, ids: np.ndarray) -> Exception:
    """The error for records past the end of a field's (truncated or lost) index or aux file."""
    fe = st.meta.fields[f.fidx]
    lost = [p for p in st.missing if os.path.basename(p) in (fe.index, fe.aux)]
    why = (f"{', '.join(lost)} is missing or not a regular file" if lost else
           "the index or aux file is shorter than N (truncated)")
    return corrupt(f.spec, ids, f"{why}, so these entries are missing")


def _lists(pos: np.ndarray | None, *cols: np.ndarray) -> list[list[int]]:
    """``cols`` (all, or at positions ``pos``) as lists of Python ints, for per-record loops."""
    if pos is None:
        return [c.tolist() for c in cols]
    return [c[pos].tolist() for c in cols]


def open(path: str | os.PathLike[str], *, mode: str = "r", verify: VerifyMode = "first") -> Any:
    """Opens a store: ``mode="r"`` (default) gives a read-only ``Store``, ``mode="a"`` a ``Writer``.

    Args:
        path: the store directory.
        mode: ``"r"`` to read, ``"a"`` to append/modify/delete/compact (takes the writer lock).
        verify: for readers, when to check checksums: ``"first"`` read of each record in this
            process (default; damage that happens to a record after that read is not noticed),
            ``"always"`` (every read; the steady state of a raw field's shuffled gathers then
            reads about 0.6x the rows/s of ``"first"``'s, ``docs/format.md``), or ``"never"``
            (entries only).

    Raises:
        NotAStoreError, FormatVersionError, CorruptionError (meta.json damaged), WriterBusyError.
    """
    if mode == "r":
        return Store(path, verify=verify)
    if mode == "a":
        from headrace._store.writer import Writer
        return Writer._open_existing(os.fspath(path))
    raise ConfigError(f"mode={mode!r} is not a mode; use 'r' to read or 'a' to write")
