"""Stores opened by path are shared within a process while their files are unchanged: ``load`` every
epoch maps and checksums a store once, and any change to its files (a commit, an in-place write,
a file changed just before the open) opens it afresh, checksums included."""

import os
import time

import numpy as np
import pytest

import headrace
from headrace._base.errors import CorruptionError, LoaderError
from headrace._sources import shared_store
from headrace._store import format as _format

N, REC = 96, 64


def _pack(path, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, (N, REC), dtype=np.uint8)
    headrace.pack_arrays(path, x=x, label=np.arange(N, dtype=np.int64), progress=False)
    return x


@pytest.fixture
def settled(monkeypatch):
    """Files count as settled at once; the tests still wait past a timestamp tick before writing,
    so a write they make is seen in the files' times."""
    monkeypatch.setattr(shared_store, "_SETTLE_NS", 0)
    time.sleep(0.05)


def _read(loader):
    with loader:
        return [(b["x"].copy(), b["label"].copy()) for b in loader]


def test_load_reuses_an_unchanged_store(tmp_path, settled):
    _pack(tmp_path / "s")
    time.sleep(0.05)
    first = headrace.load(str(tmp_path / "s"), batch=16, shuffle=True, seed=3)
    store = first.source.store
    a = _read(first)
    second = headrace.load(str(tmp_path / "s"), batch=16, shuffle=True, seed=3)
    assert second.source.store is store
    b = _read(second)
    assert all((x == y).all() and (u == v).all() for (x, u), (y, v) in zip(a, b, strict=True))
    assert "closed" not in repr(store)  # kept for the next open, not closed with the loader


def test_a_commit_opens_the_store_again(tmp_path, settled):
    _pack(tmp_path / "s")
    time.sleep(0.05)
    first = headrace.load(str(tmp_path / "s"), batch=16)
    store = first.source.store
    _read(first)
    with headrace.open(tmp_path / "s", mode="a") as w:
        w.append({"x": np.zeros((4, REC), np.uint8), "label": np.arange(4, dtype=np.int64)})
    second = headrace.load(str(tmp_path / "s"), batch=16)
    assert second.source.store is not store and len(second.source) == N + 4
    assert sum(len(x) for x, _ in _read(second)) == N + 4
    assert "closed" in repr(store)  # nobody used it any more


def test_bytes_changed_in_place_are_checked_again(tmp_path, settled):
    _pack(tmp_path / "s")
    time.sleep(0.05)
    _read(headrace.load(str(tmp_path / "s"), batch=16))  # every record verified once
    meta = headrace.open(tmp_path / "s").meta
    x_chunk = next(c for c in meta.chunks if c.field == "x")
    chunk = tmp_path / "s" / _format.chunk_name(x_chunk.id)
    with open(chunk, "r+b") as f:  # same inode, same size: only the times say it changed
        f.seek(5)
        byte = f.read(1)[0]
        f.seek(5)
        f.write(bytes([byte ^ 0xFF]))
    with pytest.raises(LoaderError) as info:
        _read(headrace.load(str(tmp_path / "s"), batch=16))
    assert isinstance(info.value.__cause__, CorruptionError)


def test_files_changed_just_before_the_open_are_not_shared(tmp_path):
    _pack(tmp_path / "s")
    future = time.time() + 3600  # as a write in the same timestamp tick would look
    os.utime(tmp_path / "s" / "meta.json", (future, future))
    first = headrace.load(str(tmp_path / "s"), batch=16)
    store = first.source.store
    _read(first)
    assert "closed" in repr(store)  # closed with its loader, as an unshared store is
    second = headrace.load(str(tmp_path / "s"), batch=16)
    assert second.source.store is not store
    _read(second)


def test_loaders_sharing_a_store_close_independently(tmp_path, settled):
    x = _pack(tmp_path / "s")
    time.sleep(0.05)
    a = headrace.load(str(tmp_path / "s"), batch=16)
    b = headrace.load(str(tmp_path / "s"), batch=16, shuffle=True)
    assert a.source.store is b.source.store
    next(iter(a))
    a.close()
    a.close()  # idempotent: gives the store back once
    got = _read(b)
    ids = np.concatenate([lab for _, lab in got])
    assert sorted(ids.tolist()) == list(range(N))
    assert all((xb == x[lab]).all() for xb, lab in got)


def test_idle_stores_are_bounded(tmp_path, settled):
    paths = [tmp_path / f"s{i}" for i in range(3)]
    for i, p in enumerate(paths):
        _pack(p, seed=i)
    time.sleep(0.05)
    before = shared_store.shared_count()
    stores = []
    for p in paths:
        ld = headrace.load(str(p), batch=16)
        stores.append(ld.source.store)
        _read(ld)
    assert shared_store.shared_count() <= max(before, shared_store._IDLE_MAX)
    assert "closed" in repr(stores[0]) and "closed" not in repr(stores[2])


def test_datasets_of_one_store_share_it(tmp_path, settled):
    x = _pack(tmp_path / "s")
    time.sleep(0.05)
    data = headrace.Dataset(tmp_path / "s", field="x")
    labels = headrace.Dataset(tmp_path / "s", field="label")
    assert data._backend.store is labels._backend.store
    data.close()
    assert (labels[[3, 1]] == [3, 1]).all()  # still open for the other dataset
    loader = headrace.DataLoader(headrace.Dataset(tmp_path / "s", field="x"), labels,
                                 batch_size=8, num_workers=1, mode=1, epochs=1)
    with loader:
        for batch in loader:
            assert (batch["data"] == x[batch["label"]]).all()
    labels.close()


def test_dataloader_over_two_fields_of_one_store(tmp_path, settled):
    x = _pack(tmp_path / "s")
    time.sleep(0.05)

    def make(**kw):
        return headrace.DataLoader(headrace.Dataset(tmp_path / "s", field="x"),
                                   headrace.Dataset(tmp_path / "s", field="label"),
                                   batch_size=8, num_workers=2, mode=2, seed=5,
                                   transform=lambda b: (b[0], b[1] * 2), **kw)

    loader = make()
    assert type(loader.source).__name__ == "_FieldPairSource"  # one gather for both fields
    for _ in range(3):
        batch = next(loader)
        assert (batch["data"] == x[batch["label"] // 2]).all()
    token = loader.checkpoint()
    want = [next(loader)["label"].tolist() for _ in range(4)]
    loader.close()
    resumed = make(resume=token)
    assert [next(resumed)["label"].tolist() for _ in range(4)] == want
    resumed.close()


def test_torch_dataset_over_a_path_keeps_its_store_across_epochs(tmp_path, settled):
    import headrace.torch

    x = _pack(tmp_path / "s")
    time.sleep(0.05)
    ds = headrace.torch.IterableDataset(str(tmp_path / "s"), batch=16, order="shuffle", seed=1)
    stores, epochs = [], []
    for epoch in range(2):
        ds.set_epoch(epoch)
        it = iter(ds)
        first = next(it)
        stores.append(ds.loader.source.store)
        got = [first, *it]
        assert all((b["x"].numpy() == x[b["label"].numpy()]).all() for b in got)
        epochs.append(np.concatenate([b["label"].numpy() for b in got]).tolist())
    assert stores[0] is stores[1]
    assert sorted(epochs[0]) == sorted(epochs[1]) == list(range(N)) and epochs[0] != epochs[1]
    ds.close()


def test_a_dropped_loader_gives_its_store_back(tmp_path, settled):
    import gc

    _pack(tmp_path / "s")
    time.sleep(0.05)
    ld = headrace.load(str(tmp_path / "s"), batch=16)
    store = ld.source.store
    next(iter(ld))
    del ld  # never closed: its finalizer gives the store back
    gc.collect()
    again = headrace.load(str(tmp_path / "s"), batch=16)
    assert again.source.store is store
    assert sum(len(x) for x, _ in _read(again)) == N


_PATH_KINDS = {
    "Loader": lambda p: headrace.Loader(p, batch=16, order="shuffle", seed=3, epochs=1),
    "load": lambda p: headrace.load(p, batch=16, shuffle=True, seed=3),
    "DistributedDataLoader": lambda p: headrace.DistributedDataLoader(p, batch=16, seed=3),
    "run": lambda p: headrace.run(p, batch=16, seed=3),
}


@pytest.mark.parametrize("kind", sorted(_PATH_KINDS))
def test_every_loader_built_from_a_path_reuses_the_unchanged_store(tmp_path, settled, kind):
    _pack(tmp_path / "s")
    time.sleep(0.05)
    path = str(tmp_path / "s")
    key = (os.path.realpath(path), "first")
    make = _PATH_KINDS[kind]
    with make(path) as first:
        a = [b["x"].copy() for _, b in zip(range(4), first, strict=False)]
    store = shared_store._entries[key].store
    with make(path) as second:  # a loader built again (say, each epoch) maps and checks it once
        assert shared_store._entries[key].store is store
        b = [b["x"].copy() for _, b in zip(range(4), second, strict=False)]
    assert all((x == y).all() for x, y in zip(a, b, strict=True))
    assert "closed" not in repr(store)
