"""A writer driven by random operation sequences always matches a plain-Python model of the store."""

import shutil
import tempfile

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import headrace

FIELDS = {"v": "int64", "b": {"dtype": "bytes", "codec": "lz4"},
          "x": {"dtype": "uint8", "shape": [3]}}


def _rec(v):
    return {"v": v, "b": bytes([v % 256]) * (v % 7), "x": [v % 256, 1, 2]}


class StoreModel(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="headrace-model-")
        self.path = f"{self.dir}/s"
        self.w = headrace.create(self.path, fields=FIELDS, chunk_mb=0.0002)
        self.pending: list[dict] = []  # the writer's view: one dict per record, None = absent
        self.committed: list[dict] = []
        self.generation = 0
        self.rewrote = False
        self.reader = headrace.open(self.path)
        self.next = 1

    def teardown(self):
        self.w.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule(k=st.integers(1, 4), leave_out=st.sampled_from([None, "b", "x"]))
    def append(self, k, leave_out):
        recs = [_rec(v) for v in range(self.next, self.next + k)]
        self.next += k
        batch = {"v": np.array([r["v"] for r in recs]), "b": [r["b"] for r in recs],
                 "x": np.array([r["x"] for r in recs], np.uint8)}
        if leave_out:
            del batch[leave_out]
            for r in recs:
                r[leave_out] = None
        self.w.append(batch)
        self.pending += recs

    @precondition(lambda self: self.pending)
    @rule(data=st.data(), fields=st.sets(st.sampled_from(["v", "b", "x"]), min_size=1))
    def modify(self, data, fields):
        i = data.draw(st.integers(0, len(self.pending) - 1))
        new = _rec(self.next)
        self.next += 1
        self.w.modify(i, {f: new[f] for f in fields})
        self.pending[i] = {**self.pending[i], **{f: new[f] for f in fields}}
        self.rewrote |= i < len(self.committed)

    @precondition(lambda self: self.pending)
    @rule(data=st.data())
    def delete(self, data):
        i = data.draw(st.integers(0, len(self.pending) - 1))
        self.w.delete(i)
        self.rewrote |= i < len(self.committed)
        self.pending[i] = self.pending[-1]
        self.pending.pop()

    @rule()
    def compact(self):
        before, after = self.w.compact()
        assert 0 <= before <= 1 and after == 1.0
        # a store with no dead bytes is left as it is (no new generation)
        self.rewrote = self.rewrote or before < 1.0

    @rule()
    def commit(self):
        changed = self.pending != self.committed or self.rewrote
        self.w.commit()
        if self.rewrote:
            self.generation += 1
        self.committed = list(self.pending)
        self.rewrote = False
        assert self.w.generation == self.generation or not changed

    @rule()
    def rollback(self):
        self.w.rollback()
        self.pending = list(self.committed)
        self.rewrote = False

    @rule()
    def reopen(self):
        self.w.close()  # discards pending changes
        self.pending = list(self.committed)
        self.rewrote = False
        self.w = headrace.open(self.path, mode="a")

    @invariant()
    def store_matches_last_commit(self):
        assert len(self.w) == len(self.pending)
        s = headrace.open(self.path, verify="always")
        assert len(s) == len(self.committed) and s.generation == self.generation
        got = s.gather(np.arange(len(s)))
        for i, r in enumerate(self.committed):
            assert got["v"][i] == (r["v"] or 0)
            assert got["b"][i].tobytes() == (r["b"] or b"")
            assert got["x"][i].tolist() == (r["x"] or [0, 0, 0])
        # a reader opened earlier sees its old commit until refresh, then this one
        self.reader.gather(np.arange(len(self.reader)))
        self.reader.refresh()
        assert len(self.reader) == len(self.committed)


StoreModel.TestCase.settings = settings(max_examples=25, stateful_step_count=25, deadline=None)
test_store_model = StoreModel.TestCase
