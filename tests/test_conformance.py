"""The conformance suite: every public loader kind through the same checks.

The kinds are the table in ``tests/_kinds.py`` (one factory each, on tiny generated data): arrays
through ``Loader`` and ``load``, ``image``, ``text``, ``audio``, ``video``, ``mix`` (text
sources, and array sources), loaderx's ``DataLoader`` and ``DistributedDataLoader``; the last one
also runs under a real 2-process torchrun (``test_torchrun_ranks_conform``). A new loader kind is
done when it is one entry of that table and passes every check here.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import subprocess
import sys
import threading
from typing import Any

import numpy as np
import pytest

import headrace
from _kinds import BATCH, KINDS, Data, Kind
from _loader_util import as_plain
from headrace._engine import checkpoint as _checkpoint
from headrace._engine import solo

ALL = list(KINDS.values())
MIXES = [k for k in ALL if k.name.startswith("mix")]


def kinds(*excluded: str) -> list[Kind]:
    """The kinds a check runs on: all of them but ``excluded`` (named, so a gap is visible)."""
    unknown = set(excluded) - set(KINDS)
    assert not unknown, unknown
    return [k for k in ALL if k.name not in excluded]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Data:
    return Data(tmp_path_factory.mktemp("conformance"))


def read(loader: Any, count: int | None = None) -> list[Any]:
    """Up to ``count`` batches (all when None) as plain, comparable Python data (with ``next``:
    a loader resumed after its last batch has nothing to give, which ``next`` says alike for
    every kind)."""
    out: list[Any] = []
    while count is None or len(out) < count:
        try:
            batch = next(loader)
        except StopIteration:
            break
        out.append(as_plain(batch))
    return out


def reference(kind: Kind, data: Data, **kw: Any) -> list[Any]:
    with kind.make(data, **kw) as loader:
        return read(loader, kind.take)


# -- state: checkpoint() / resume= -------------------------------------------------------------


@pytest.mark.parametrize("kind", ALL, ids=repr)
def test_checkpoint_resume_continues_exactly(kind: Kind, data: Data) -> None:
    ref = reference(kind, data)
    n = len(ref)
    assert n >= 3, f"{kind}: the test data gives only {n} batches"
    for stop in sorted({0, 1, n // 2, n - 1, n}):
        with kind.make(data) as first:
            head = read(first, stop)
            token = first.checkpoint()
        assert isinstance(token, bytes)
        with kind.make(data, resume=token) as second:
            rest = read(second, None if kind.take is None else n - stop)
            if not kind.endless:
                assert next(second, None) is None, f"{kind}: more batches after the end"
        assert head + rest == ref, f"{kind}: stop={stop}: the resumed stream differs"


class _AlwaysSolo(dict):
    """Solo verdicts saying that every kind of work went faster with the consumer alone."""

    def get(self, key: Any, default: Any = None) -> Any:
        return True


@pytest.mark.parametrize("kind", ALL, ids=repr)
def test_parked_engines_yield_the_same_stream_and_resume_exactly(
        kind: Kind, data: Data, monkeypatch: pytest.MonkeyPatch) -> None:
    # Every engine with its workers parked for the whole run: the consumer gathers each batch,
    # the next one started on the copy lane where its source can (arrays, stores, .npy).
    ref = reference(kind, data, epochs=2) if not kind.endless else reference(kind, data)
    monkeypatch.setattr(solo, "_VERDICTS", _AlwaysSolo())
    monkeypatch.setattr(solo, "_KEEP", 10**9)
    monkeypatch.setattr(solo, "_BUSY_SHARE", 1e9)
    kw = {} if kind.endless else {"epochs": 2}
    with kind.make(data, **kw) as loader:
        assert read(loader, kind.take) == ref, f"{kind}: parked, the stream differs"
    stop = len(ref) // 2 + 1
    with kind.make(data, **kw) as first:
        head = read(first, stop)
        token = first.checkpoint()
    with kind.make(data, resume=token, **kw) as second:
        rest = read(second, None if kind.take is None else len(ref) - stop)
    assert head + rest == ref, f"{kind}: parked, the resumed stream differs"


@pytest.mark.parametrize("kind", ALL, ids=repr)
def test_checkpoint_is_one_json_token_format(kind: Kind, data: Data) -> None:
    with kind.make(data) as loader:
        read(loader, 2)
        token = loader.checkpoint()
    body = json.loads(token.decode("ascii"))
    assert body["format"] == _checkpoint.FORMAT


@pytest.mark.parametrize("kind", ALL, ids=repr)
def test_state_dict_and_load_state_dict_continue_exactly_in_place(kind: Kind, data: Data) -> None:
    ref = reference(kind, data)
    n = len(ref)
    with kind.make(data) as loader:
        head = read(loader, 2)
        state = loader.state_dict()
        assert json.loads(json.dumps(state)) == state  # JSON-able, as torchdata saves it
        read(loader, 1)
        loader.load_state_dict(state)  # back, in place
        rest = read(loader, n - 2)
        assert kind.endless or next(loader, None) is None
    assert head + rest == ref
    with kind.make(data) as fresh:
        fresh.load_state_dict(state)
        assert head + read(fresh, n - 2) == ref
    with kind.make(data, resume=state) as resumed:  # resume= takes the dict too
        assert head + read(resumed, n - 2) == ref


@pytest.mark.parametrize("kind", ALL, ids=repr)
def test_a_for_part_way_through_continues(kind: Kind, data: Data) -> None:
    ref = reference(kind, data)
    with kind.make(data) as loader:
        got = []
        for batch in loader:
            got.append(as_plain(batch))
            if len(got) == 2:
                break
        for batch in loader:
            got.append(as_plain(batch))
            if len(got) == len(ref):
                break
    assert got == ref


@pytest.mark.parametrize("kind", ALL, ids=repr)
def test_set_epoch_rewinds_and_a_finished_loader_says_so(kind: Kind, data: Data) -> None:
    if kind.endless:  # no finished pass: set_epoch(e) moves the stream to epoch e's start
        with kind.make(data) as loader:
            first = read(loader, kind.take)
            loader.set_epoch(1)
            epoch1 = read(loader, kind.take)
            loader.set_epoch(0)
            assert read(loader, kind.take) == first
        with kind.make(data, epoch=1) as built:
            assert read(built, kind.take) == epoch1 != first
        return
    with kind.make(data) as loader:
        epoch0 = [as_plain(b) for b in loader]
        with pytest.raises(headrace.LoaderError, match="set_epoch"):
            iter(loader)  # never a silent empty pass
        loader.set_epoch(1)
        epoch1 = [as_plain(b) for b in loader]
        loader.set_epoch(0)
        again = [as_plain(b) for b in loader]
    assert again == epoch0 and len(epoch1) == len(epoch0)
    assert epoch1 != epoch0  # shuffled: another epoch is another order
    with kind.make(data, epoch=1) as built:
        assert [as_plain(b) for b in built] == epoch1


# -- as a source of a mix ----------------------------------------------------------------------


def _mixed(kind: Kind, data: Data, policy: str, resume: Any = None) -> Any:
    """Two loaders of ``kind`` (other seeds) in a mix, 2:1, on one shared byte budget that holds
    a few batches of each (a mix as a source splits its share among its own sources)."""
    sources = [kind.make(data, seed=1), kind.make(data, seed=2)]
    cap = 3 * sum(s._batch_need() for s in sources)
    return headrace.mix(sources, weights=[2, 1], on_source_exhausted=policy, inflight=cap,
                        resume=resume)


def _read_until_error(loader: Any, count: int | None) -> tuple[list[Any], bool]:
    """Batches up to ``count`` and whether the mix raised ``LoaderError`` (policy "error")."""
    out: list[Any] = []
    while count is None or len(out) < count:
        try:
            batch = next(loader)
        except StopIteration:
            return out, False
        except headrace.LoaderError:
            return out, True
        out.append(as_plain(batch))
    return out, False


@pytest.mark.parametrize("policy", ["error", "drop", "restart"])
@pytest.mark.parametrize("kind", ALL, ids=repr)
def test_mix_of_the_kind_shares_one_budget_and_resumes_exactly(kind: Kind, data: Data,
                                                               policy: str) -> None:
    with kind.make(data) as one:
        per_source = len(read(one, kind.take))
    take = kind.take if kind.endless else (3 * per_source + 2 if policy == "restart" else None)
    with _mixed(kind, data, policy) as m:
        ref, raised = _read_until_error(m, take)
        s = m.stats()
    if kind.endless or policy == "restart":
        assert len(ref) == take and not raised
        assert policy != "restart" or kind.endless or sum(s["mix_source_restarts_total"]) >= 2
    elif policy == "drop":
        assert len(ref) == 2 * per_source and s["mix_source_exhausted_total"] == [1, 1]
    else:
        assert raised and len(ref) < 2 * per_source
    assert s["mix_shared_budget"], f"{kind}: the sources keep their own caps"
    assert 0 < s["mix_inflight_high_water_bytes"] <= s["mix_shared_max_inflight_bytes"]
    for stop in sorted({1, len(ref) // 2}):
        with _mixed(kind, data, policy) as first:
            head, _ = _read_until_error(first, stop)
            token = first.checkpoint()
        assert json.loads(token)["kind"] == "mix"
        with _mixed(kind, data, policy, resume=token) as second:
            rest, raised_again = _read_until_error(second, None if take is None else take - stop)
        assert head + rest == ref, f"{kind}/{policy}: stop={stop}: the resumed mix differs"
        assert raised_again == raised


# -- adapters ----------------------------------------------------------------------------------


def leaves(batch: Any) -> list[Any]:
    """A batch's arrays in order (mappings by key; tuples, lists and named tuples in order),
    whatever their type (NumPy, JAX, torch), skipping ``None``."""
    if isinstance(batch, dict):
        return [x for k in sorted(batch) for x in leaves(batch[k])]
    if isinstance(batch, tuple | list):
        return [x for v in batch for x in leaves(v)]
    return [] if batch is None else [batch]


@pytest.mark.parametrize("kind", ALL, ids=repr)
def test_jax_iterator_accepts_the_batches(kind: Kind, data: Data) -> None:
    import headrace.jax

    with kind.make(data) as loader:
        first = next(loader)
    with kind.make(data) as loader:
        it = headrace.jax.iterator(loader)
        placed = next(it)
        assert isinstance(it.checkpoint(), bytes)
    host = [np.asarray(v) for v in leaves(placed)]
    want = [np.asarray(v) for v in leaves(first)]
    assert len(host) == len(want) and type(placed) is type(first)
    # JAX without x64 holds 64-bit values as 32-bit: compare in the placed dtype
    for got, ref in zip(host, want, strict=True):
        assert got.tolist() == ref.astype(got.dtype).tolist()


@pytest.mark.parametrize("kind", ALL, ids=repr)
def test_torch_adapters_accept_the_batches_and_resume(kind: Kind, data: Data) -> None:
    import torch

    import headrace.torch

    with kind.make(data) as loader:
        batch = next(loader)
        tensors = headrace.torch.as_tensors(batch)
    assert type(tensors) is type(batch)
    assert all(isinstance(v, torch.Tensor) for v in leaves(tensors))

    def factory(resume: bytes | None) -> Any:
        return kind.make(data, resume=resume)

    def plain(t: Any) -> Any:
        return [v.tolist() for v in leaves(t)]

    ds = headrace.torch.IterableDataset(factory)
    it = iter(ds)
    head = [plain(next(it)) for _ in range(2)]
    state = ds.state_dict()
    ds.close()
    ref = [plain(b) for _, b in zip(range(4), iter(headrace.torch.IterableDataset(factory)),
                                    strict=False)]
    again = headrace.torch.IterableDataset(factory)
    again.load_state_dict(state)
    rest = [plain(b) for _, b in zip(range(2), iter(again), strict=False)]
    again.close()
    assert head + rest == ref


@pytest.mark.parametrize("kind", ALL, ids=repr)
def test_adapter_state_over_a_built_loader_continues_exactly(kind: Kind, data: Data) -> None:
    """``headrace.torch.IterableDataset(loader)`` and ``headrace.jax.iterator(loader)``: their
    ``state_dict()`` after two batches, loaded into the adapter of a fresh loader, continues with
    exactly the batches the loader itself gives."""
    import headrace.jax
    import headrace.torch

    def lists(batch: Any) -> list[Any]:
        return [np.asarray(v).tolist() for v in leaves(batch)]

    with kind.make(data) as loader:
        ref = [lists(b) for _, b in zip(range(4), loader, strict=False)]
    assert len(ref) >= 3, kind
    with kind.make(data) as loader:
        ds = headrace.torch.IterableDataset(loader)
        it = iter(ds)
        head = [lists(next(it)) for _ in range(2)]
        state = ds.state_dict()
    with kind.make(data) as fresh:
        again = headrace.torch.IterableDataset(fresh)
        again.load_state_dict(state)
        rest = [lists(b) for _, b in zip(range(len(ref) - 2), again, strict=False)]
    assert head + rest == ref, f"{kind}: the torch dataset's state does not continue exactly"
    with kind.make(data) as loader:
        jit = headrace.jax.iterator(loader)
        for _ in range(2):
            next(jit)
        jstate = jit.state_dict()
    with kind.make(data) as fresh:
        jagain = headrace.jax.iterator(fresh)
        jagain.load_state_dict(jstate)
        got = [[np.asarray(v) for v in leaves(next(jagain))] for _ in range(len(ref) - 2)]
    for g, w in zip(got, ref[2:], strict=True):
        assert [x.tolist() for x in g] == [np.asarray(y).astype(x.dtype).tolist()
                                           for x, y in zip(g, w, strict=True)], str(kind)


# -- timeline, stats, print_stats, close -------------------------------------------------------


@pytest.mark.parametrize("kind", ALL, ids=repr)
def test_timeline_stats_print_stats_and_close(kind: Kind, data: Data) -> None:
    with kind.make(data, timeline=0.001) as loader:
        got = read(loader, 3)
        s = loader.stats()
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            loader.print_stats()
        tl = loader.stats_timeline()
    assert len(got) == 3
    assert s["delivered_batches_total"] == 3
    assert (out.getvalue() + err.getvalue()).strip()
    json.dumps(tl)  # what headrace.plot reads: plain JSON
    assert tl["samples"], f"{kind}: the timeline recorded nothing"
    loader.close()  # idempotent after the context manager closed it
    assert loader.stats()["status"] == "CLOSED"


@pytest.mark.parametrize("kind", ALL, ids=repr)
def test_tune_true_reads_the_untuned_batches_inside_the_cap(kind: Kind, data: Data) -> None:
    """``tune=True``: the same batches, a checkpoint that resumes exactly, bytes in flight never
    above the cap, and the tuner's setting in ``stats()`` and the timeline."""
    want = reference(kind, data)
    with kind.make(data, tune=True, timeline=0.001) as tuned:
        head = read(tuned, 2)
        token = tuned.checkpoint()
        got = head + read(tuned, None if kind.take is None else kind.take - 2)
        s = tuned.stats()
        tl = tuned.stats_timeline()
    assert got == want, kind
    with kind.make(data, tune=True, resume=token) as again:
        assert read(again, None if kind.take is None else kind.take - 2) == want[2:]
    assert s["autotune_enabled"] is True, kind
    cap = s["max_inflight_bytes"]
    assert cap and 0 < s["inflight_high_water_bytes"] <= cap, kind
    assert s["threads"] >= 1 and s["effective_max_queue_batches"] >= 1
    assert tl["autotune_enabled"] and all("threads" in x for x in tl["samples"])


@pytest.mark.parametrize("kind", ALL, ids=repr)
def test_close_is_idempotent_and_ends_iteration(kind: Kind, data: Data) -> None:
    loader = kind.make(data)
    next(loader)
    loader.close()
    loader.close()
    with kind.make(data) as again:
        next(again)
    assert next(again, None) is None or kind.endless


# -- nothing to yield --------------------------------------------------------------------------


def _outcome(fn: Any, limit_s: float = 60.0) -> BaseException | None:
    """What ``fn()`` raised (None: it returned), failing if it still runs after ``limit_s``: a
    loader that spins instead of raising would otherwise hang the suite."""
    box: list[BaseException | None] = []

    def run() -> None:
        try:
            fn()
            box.append(None)
        except BaseException as e:  # reported below
            box.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(limit_s)
    assert box, f"still running after {limit_s} s: a spin instead of an error"
    return box[0]


def _drain_empty(kind: Kind, data: Data, epochs: int | None) -> None:
    with kind.empty(data, epochs=epochs) as loader:
        for _ in zip(range(1000), loader, strict=False):
            pass


@pytest.mark.parametrize("kind", ALL, ids=repr)
def test_nothing_to_yield_endless_is_an_error_not_a_spin(kind: Kind, data: Data) -> None:
    err = _outcome(lambda: _drain_empty(kind, data, None))
    assert isinstance(err, headrace.HeadraceError), f"{kind}: {err!r}"


@pytest.mark.parametrize("kind", ALL, ids=repr)
def test_nothing_to_yield_in_one_epoch_is_an_error(kind: Kind, data: Data) -> None:
    """Empty data is refused the same way by every kind (never an epoch that silently yields
    nothing): a ConfigError naming what is empty and what to do."""
    err = _outcome(lambda: _drain_empty(kind, data, 1))
    assert isinstance(err, headrace.ConfigError), f"{kind}: {err!r}"
    assert "nothing to load" in str(err) and "check the path" in str(err), f"{kind}: {err}"


def test_an_empty_range_of_data_and_a_rank_without_a_batch_are_not_errors(data: Data) -> None:
    """What refusing empty data leaves alone: ``start == end`` (a resume at the end of a range)
    and a rank whose share is no full batch (as torch's DistributedSampler with drop_last)."""
    with headrace.Loader(str(data.store), batch=4, start=5, end=5) as ld:
        assert list(ld) == []
    with headrace.DistributedDataLoader(str(data.store), batch=4, rank=1, world_size=2,
                                        check=False, end=2, drop_last=True) as ld:
        assert list(ld) == []


# -- keywords ----------------------------------------------------------------------------------

#: the core keywords a mix takes with their meaning (``batch``: checked against the sources')
MIX_CORE = ("seed", "epoch", "inflight", "ram_gb", "profile", "constraints", "runtime", "resume",
            "timeline", "tune", "batch")
#: the core keywords that are each source's business: a mix refuses them, saying so
MIX_SOURCES_ONLY = ("order", "shuffle", "epochs", "drop_last", "tail", "rank", "world_size",
                    "threads", "queue", "prefetch", "transform")


@pytest.mark.parametrize(("typo", "meant"), [("sede", "seed"), ("resum", "resume"),
                                             ("timelime", "timeline")])
@pytest.mark.parametrize("kind", ALL, ids=repr)
def test_an_unknown_keyword_is_a_config_error_naming_the_closest(kind: Kind, data: Data,
                                                                 typo: str, meant: str) -> None:
    with pytest.raises(headrace.ConfigError, match=f"did you mean '{meant}'") as info:
        kind.make(data, **{typo: 1})
    assert "__init__" not in str(info.value) and "_open" not in str(info.value)


@pytest.mark.parametrize("kind", ALL, ids=repr)
def test_the_core_keywords_are_accepted(kind: Kind, data: Data) -> None:
    """Every core keyword at once (the factory's own fixed ones aside), each with its meaning."""
    from headrace._engine.keywords import CORE

    values = {"order": None, "shuffle": True, "seed": 4, "epoch": 1, "epochs": 2,
              "drop_last": False, "tail": "partial", "rank": 0, "world_size": 1, "threads": 1,
              "inflight": 64 << 20, "ram_gb": 8, "queue": 8, "prefetch": 2,
              "profile": "balanced", "constraints": headrace.Constraints(),
              "runtime": headrace.RuntimeConfig(), "resume": None, "timeline": 0.01,
              "transform": None, "tune": True}
    assert set(values) | {"batch"} == set(CORE) == set(MIX_CORE) | set(MIX_SOURCES_ONLY)
    fixed = {"batch"} | ({"rank", "world_size"} if kind.name == "DistributedDataLoader" else set())
    names = set(MIX_CORE) if kind.name.startswith("mix") else set(CORE) - fixed
    values["batch"] = BATCH  # a mix checks it against its sources' batch size
    if kind.endless:  # loaderx's DataLoader: endless unless told, a loaderx transform
        names -= {"epochs", "transform"}
    with kind.make(data, **{k: values[k] for k in names}) as loader:
        got = read(loader, kind.take)
        s = loader.stats()
        assert loader.stats_timeline()["samples"]
    with kind.make(data, seed=4, epoch=1) as plain:
        one_epoch = read(plain, kind.take)
    if kind.endless or kind.name.startswith("mix"):
        assert got == one_epoch
    else:
        assert got[:len(one_epoch)] == one_epoch and len(got) == 2 * len(one_epoch)  # epochs=2
    assert s["delivered_batches_total"] == len(got)


@pytest.mark.parametrize("name", MIX_SOURCES_ONLY)
def test_a_mix_refuses_the_core_keywords_of_its_sources_saying_why(data: Data,
                                                                   name: str) -> None:
    value = {"order": "shuffle", "shuffle": True, "epochs": 2, "drop_last": True,
             "tail": "drop", "rank": 0, "world_size": 2, "threads": 2, "queue": 4,
             "prefetch": 2, "transform": lambda b, ids: b}[name]
    why = rf"mix\({name}=.*does not apply to a mix: .*; set {name}= on each source instead"
    with KINDS["Loader"].make(data) as a, KINDS["load"].make(data) as b, \
            pytest.raises(headrace.ConfigError, match=why):
        headrace.mix([a, b], **{name: value})


@pytest.mark.parametrize("kind", MIXES, ids=repr)
def test_a_mix_checks_batch_against_its_sources(kind: Kind, data: Data) -> None:
    with kind.make(data, batch=BATCH) as mixed:
        assert read(mixed, 3)
    with pytest.raises(headrace.ConfigError, match=rf"batch size is {BATCH}.*on each source"):
        kind.make(data, batch=BATCH + 1)


# -- ranks under a real launcher ---------------------------------------------------------------

WORKER = os.path.join(os.path.dirname(__file__), "_conformance_worker.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _records(kind: Kind, data: Data) -> set[tuple[Any, int]]:
    """Every (source, record id) one epoch of ``kind`` reads in one process."""
    with kind.make(data) as loader:
        out = set()
        for _ in range(2 * kind.take if kind.endless and kind.take else 10_000):
            try:
                next(loader)
            except StopIteration:
                break
            out |= {(getattr(loader, "last_source", None), int(i)) for i in loader.last_ids}
            if kind.endless and len(out) == 40:
                break
    return out


def test_torchrun_ranks_conform(data: Data, tmp_path: Any) -> None:
    """Two real ranks (torchrun, gloo, loopback), every kind built with no rank arguments: rank
    and world size from the launcher, equal batch counts, shards that together cover the data,
    exact resume on each rank, the torch adapter, stats and timeline on each rank."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK") and not k.startswith("SLURM_")}
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           "--master_addr=127.0.0.1", f"--master_port={_free_port()}", "--monitor-interval=0.1",
           WORKER, str(data.root), str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
    if proc.returncode != 0:
        at = proc.stderr.find("Traceback")
        pytest.fail("torchrun failed:\n" + proc.stderr[max(at, 0):][:6000] + proc.stdout[-2000:])
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert set(reports[0]["kinds"]) == set(KINDS) | {"run"}
    for r, rep in enumerate(reports):
        assert rep["rank"] == r and rep["world_size"] == 2
        for name, got in rep["kinds"].items():
            if got["rank"] is not None:  # a mix has no rank of its own: its sources do
                assert (got["rank"], got["world_size"]) == (r, 2), name
            assert got["head"] + got["rest"] == got["all"], f"{name}: resume differs on rank {r}"
            assert got["delivered"] == len(got["all"]), name
    for name in reports[0]["kinds"]:
        per_rank = [rep["kinds"][name]["all"] for rep in reports]
        assert len(per_rank[0]) == len(per_rank[1]), f"{name}: ranks read different counts"
        seen = {(src, i) for batches in per_rank for src, ids in batches for i in ids}
        # run() and DistributedDataLoader read the store Loader reads, with the same seed
        kind = KINDS["Loader" if name in ("run", "DistributedDataLoader") else name]
        universe = _records(kind, data)
        assert seen == universe, f"{name}: the ranks' shards do not cover the data"
        # disjoint: together the ranks read each source's records once, plus at most the pad
        # that fills the last step of two ranks
        step = 2 * max(len(ids) for batches in per_rank for _, ids in batches)
        sizes = [sum(1 for src, _ in universe if src == s) for s in {s for s, _ in universe}]
        total = sum(len(ids) for batches in per_rank for _, ids in batches)
        assert total <= sum(-(-n // step) * step for n in sizes), f"{name}: ranks overlap"


# -- byte-aware batching -----------------------------------------------------------------------

#: kinds whose records are all one size once read (token windows, decoded clips), loaderx's
#: DataLoader (no byte batching in loaderx) and mixes (each source cuts its own batches): the
#: byte keywords are a ConfigError there
BYTES_REFUSED = ("text", "video", "mix", "mix-arrays", "DataLoader")


def _engine(loader: Any) -> Any:
    """The ``headrace.Loader`` doing a kind's batching (a wrapper's inner one)."""
    for name in ("_inner", "_loader"):
        inner = getattr(loader, name, None)
        if isinstance(inner, headrace.Loader):
            return inner
        if inner is not None and not isinstance(loader, headrace.Loader):
            return _engine(inner)
    return loader


def _read_ids(loader: Any) -> list[list[int]]:
    out = []
    for _ in loader:
        out.append([int(i) for i in loader.last_ids])
    return out


@pytest.mark.parametrize("kind", ALL, ids=repr)
def test_byte_aware_batching_cuts_by_record_bytes_or_is_refused(kind: Kind, data: Data) -> None:
    """``batch_bytes`` (hard ceiling) and ``target_bytes`` (mx8's soft target) on every kind of
    variable-size records, counted over each record's stored bytes: the same records in the same
    order as without them, no batch past the ceiling or ``batch``, and an exact resume."""
    from headrace._sources.base import record_sizes

    if kind.name in BYTES_REFUSED:
        with pytest.raises(headrace.ConfigError, match="batch_bytes"):
            kind.make(data, batch_bytes=1 << 20)
        return
    with kind.make(data) as plain:
        src = _engine(plain).source
        sizes = record_sizes(src, np.arange(len(src)))
        want = _read_ids(plain)
    ceiling = int(sizes.max() + sizes.min())
    kw = {"batch_bytes": ceiling, "target_bytes": ceiling // 2 + 1}
    with kind.make(data, **kw) as ld:
        ranks = _engine(ld).world_size
        got = _read_ids(ld)
    flat = [i for b in got for i in b]
    if ranks == 1:
        assert flat == [i for b in want for i in b]
    else:  # this rank's share of the global byte-cut batches: whole records, none twice
        assert len(set(flat)) == len(flat) and set(flat) <= set(range(len(sizes)))
    assert all(1 <= len(b) <= BATCH and int(sizes[b].sum()) <= ceiling for b in got)
    assert len(got) > len(want)  # the ceiling cut batches short of `batch`
    with kind.make(data, **kw) as ld:
        next(ld)
        token = ld.checkpoint()
        rest = _read_ids(ld)
    with kind.make(data, resume=token, **kw) as again:
        assert _read_ids(again) == rest
    with pytest.raises(headrace.ConfigError, match="bytes > batch_bytes"):
        kind.make(data, batch_bytes=int(sizes.max()) - 1)


# -- who gathers: workers parked or running ----------------------------------------------------


@pytest.mark.parametrize("kind", ALL, ids=repr)
def test_parking_and_running_the_workers_mid_stream_changes_nothing(kind: Kind, data: Data,
                                                                    monkeypatch) -> None:
    # The engine parks its workers while the consumer alone is faster (``_engine.solo``); here it
    # switches on every batch, so consumer-only and worker gathers alternate: the same stream.
    from headrace._engine.solo import SoloProbe

    ref = reference(kind, data)
    switches = []

    def flip(self: SoloProbe, now: float, *own: Any) -> bool:
        self.solo = not self.solo
        switches.append(self.solo)
        return self.solo

    monkeypatch.setattr(SoloProbe, "leave", flip)
    assert reference(kind, data) == ref, f"{kind}: the stream changed with parked workers"
    assert switches, f"{kind}: no engine consulted its probe"
