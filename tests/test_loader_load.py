"""``headrace.load``: mx8's spelling over a store, start/end, fields, ragged values + offsets."""

from __future__ import annotations

import numpy as np
import pytest

import headrace
from _loader_util import take
from headrace import ConfigError
from headrace._sources.base import open_source, register_source

pytestmark = pytest.mark.timeout(120)

N = 150


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("load") / "s"
    with headrace.create(path, fields={"img": {"dtype": "uint8", "shape": [4, 3]},
                                       "txt": "bytes", "label": "int64"}) as w:
        w.append({"img": np.arange(N * 12, dtype=np.uint8).reshape(N, 4, 3),
                  "txt": [b"t" * (i % 7) for i in range(N)], "label": np.arange(N)})
        w.commit()
    return path


def test_single_sequential_pass_with_partial_last_batch(store):
    ld = headrace.load(store, batch=64)
    assert iter(ld) is ld
    batches = list(ld)
    assert [len(b["label"]) for b in batches] == [64, 64, 22]
    assert np.concatenate([b["label"] for b in batches]).tolist() == list(range(N))
    b = batches[1]
    assert set(b) == {"img", "txt", "label"}
    assert b["img"].shape == (64, 4, 3) and b["img"].dtype == np.uint8
    assert isinstance(b["txt"], headrace.Ragged)
    assert b["txt"].to_list()[3].tobytes() == b"t" * (67 % 7)
    for _ in range(3):  # exhausted: StopIteration again and again, also after close
        with pytest.raises(StopIteration):
            next(ld)
    ld.close()
    with pytest.raises(StopIteration):
        next(ld)


def test_start_end_and_mx8_validations(store):
    with headrace.load(store, batch=8, start=10, end=30) as ld:
        ids = [i for b in ld for i in b["label"].tolist()]
    assert ids == list(range(10, 30))
    with headrace.load(store, batch=8, start=5, end=5) as ld:
        assert list(ld) == []
    with pytest.raises(ConfigError, match="start and end must be set together"):
        headrace.load(store, start=3)
    with pytest.raises(ConfigError, match=r"invalid range \(start > end\)"):
        headrace.load(store, start=9, end=3)
    with pytest.raises(ConfigError, match="end out of range"):
        headrace.load(store, start=0, end=N + 1)
    with pytest.raises(ConfigError, match="start must be >= 0"):
        headrace.load(store, start=-1, end=3)
    with pytest.raises(ConfigError, match="batch must be >= 1"):
        headrace.load(store, batch=0)


def test_checkpoint_resume_with_start_end(store):
    with headrace.load(store, batch=8, start=10, end=40, shuffle=True, seed=4) as ld:
        first = take(ld, 2)
        token = ld.checkpoint()
        rest = take(ld, None)
    with headrace.load(store, batch=8, start=10, end=40, shuffle=True, seed=4,
                       resume=token) as ld:
        assert take(ld, None) == rest
    assert sorted(i for ids, _ in first + rest for i in ids) == list(range(10, 40))
    with pytest.raises(headrace.CheckpointError, match="end mismatch: token=40 current=50"):
        headrace.load(store, batch=8, start=10, end=50, shuffle=True, seed=4, resume=token)


def test_fields_option_and_kwargs_are_honoured(store):
    with headrace.load(store, batch=32, fields=["label"], inflight=32 * 8, queue=2,
                       prefetch=0, threads=1, profile="safe") as ld:
        b = next(ld)
        s = ld.stats()
    assert set(b) == {"label"}
    assert (s["max_inflight_bytes"], s["max_queue_batches"], s["prefetch_batches"]) == (
        256, 2, 0)


def test_shuffle_epochs_and_endless(store):
    with headrace.load(store, batch=50, shuffle=True, seed=1, epochs=2) as ld:
        labels = [b["label"].tolist() for b in ld]
    assert len(labels) == 6
    assert sorted(i for b in labels[:3] for i in b) == list(range(N))
    with headrace.load(store, batch=100, epochs=None) as ld:
        assert [len(next(ld)["label"]) for _ in range(4)] == [100] * 4


def test_open_source_registry_dispatch(store, tmp_path):
    # A later registration claims its inputs first (how the S3/image modules plug in).
    class Counting:
        fingerprint = "counting"

        def __len__(self):
            return 5

        def nbytes(self, ids):
            return 8 * len(ids)

        def gather(self, ids):
            return {"i": np.asarray(ids)}

        def close(self):
            pass

    register_source("test-scheme", lambda d: isinstance(d, str) and d.startswith("count://"),
                    lambda d, **o: Counting())
    with headrace.load("count://five", batch=2) as ld:
        assert [b["i"].tolist() for b in ld] == [[0, 1], [2, 3], [4]]
    with pytest.raises(ConfigError, match="path does not exist"):
        open_source(tmp_path / "missing")
    with pytest.raises(ConfigError, match="cannot read"):
        open_source(42)
    with pytest.raises(ConfigError, match="do not apply"):
        open_source(np.zeros(3), fields=["x"])
