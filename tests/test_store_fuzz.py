"""Fuzzed damage to meta.json, index and aux files: only HeadraceErrors, and quickly.

Hypothesis mutates the files of a small store (bit flips, overwritten spans, truncation, appended
garbage; for meta.json also edited JSON values, re-signed half of the time so that the checks past
the checksum are reached too), then opens it, reads every record, asks ``nbytes``, runs ``verify``
and a loader epoch. Whatever happens must be a result or a ``HeadraceError``, within the deadline.
"""

import json
import os
import shutil
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import headrace
from headrace._store.format import meta_bytes

N = 12


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("fuzz") / "s")
    with headrace.create(path, fields={"x": {"dtype": "uint8", "shape": [4]}, "b": "bytes",
                                       "z": {"dtype": "bytes", "codec": "zstd"},
                                       "f": {"dtype": "float32", "shape": [2], "codec": "lz4"}},
                         chunk_mb=0.0001) as w:
        w.append({"x": np.arange(4 * N, dtype=np.uint8).reshape(N, 4),
                  "b": [bytes([i]) * (i % 5) for i in range(N)],
                  "z": [b"zz" * (i + 1) for i in range(N)],
                  "f": np.arange(2 * N, dtype=np.float32).reshape(N, 2)})
    return path


def _targets(path):
    with open(os.path.join(path, "meta.json"), "rb") as f:
        doc = json.loads(f.read())
    return ["meta.json"] + [f[k] for f in doc["fields"] for k in ("index", "aux")]


def _exercise(path):
    """Everything a user does with a store; returns normally or raises a HeadraceError."""
    try:
        with headrace.open(path) as s:
            ids = np.arange(len(s))
            for name in s.fields:
                s.nbytes(ids, [name])
                s.gather(ids, [name])
                s.gather(ids[::-1], [name])  # the verified (steady) path
    except headrace.HeadraceError:
        pass
    try:
        report = headrace.verify(path)  # reports damage; raises for "not a store" and the like
        assert isinstance(report.ok, bool)
    except headrace.HeadraceError:
        pass
    try:
        with headrace.Loader(path, batch=5, epochs=1, threads=1) as ld:
            for _ in ld:
                pass
    except headrace.HeadraceError:
        pass


_VALUES = st.one_of(st.integers(-2**70, 2**70), st.none(), st.booleans(), st.text(max_size=8),
                    st.floats(allow_nan=True), st.lists(st.integers(-3, 2**33), max_size=3),
                    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


def _json_edit(doc, data):
    """One edit of a value somewhere in the parsed document."""
    node = doc
    for _ in range(data.draw(st.integers(0, 3))):
        if isinstance(node, dict) and node:
            key = data.draw(st.sampled_from(sorted(node)))
            if not isinstance(node[key], dict | list):
                break
            node = node[key]
        elif isinstance(node, list) and node:
            child = node[data.draw(st.integers(0, len(node) - 1))]
            if not isinstance(child, dict | list):
                break
            node = child
    if isinstance(node, dict) and node:
        key = data.draw(st.sampled_from(sorted(node)))
        if data.draw(st.booleans()):
            node[key] = data.draw(_VALUES)
        else:
            del node[key]
    elif isinstance(node, list) and node:
        node[data.draw(st.integers(0, len(node) - 1))] = data.draw(_VALUES)


def _byte_edit(raw, data):
    raw = bytearray(raw)
    kind = data.draw(st.sampled_from(["flip", "span", "truncate", "append"]))
    if kind == "flip" and raw:
        for _ in range(data.draw(st.integers(1, 4))):
            i = data.draw(st.integers(0, len(raw) - 1))
            raw[i] ^= 1 << data.draw(st.integers(0, 7))
    elif kind == "span" and raw:
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i:i + 8] = data.draw(st.binary(min_size=1, max_size=8))
    elif kind == "truncate":
        raw = raw[:data.draw(st.integers(0, max(0, len(raw) - 1)))]
    else:
        raw += data.draw(st.binary(min_size=1, max_size=64))
    return bytes(raw)


@settings(max_examples=30, deadline=3000, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_fuzzed_files_give_only_headrace_errors(pristine, data):
    work = tempfile.mkdtemp(prefix="headrace-fuzz-")
    try:
        path = os.path.join(work, "s")
        shutil.copytree(pristine, path)
        for _ in range(data.draw(st.integers(1, 2))):
            name = data.draw(st.sampled_from(_targets(pristine)))
            full = os.path.join(path, name)
            with open(full, "rb") as f:
                raw = f.read()
            try:  # (already damaged by an earlier edit: bytes only)
                doc = json.loads(raw) if name == "meta.json" else None
            except ValueError:
                doc = None
            if doc is not None and data.draw(st.booleans()):
                _json_edit(doc, data)
                try:
                    raw = (meta_bytes(doc) if data.draw(st.booleans())  # re-signed
                           else json.dumps(doc, indent=1).encode())
                except (TypeError, ValueError):
                    continue  # not expressible as JSON (a float key, NaN in strict mode)
            else:
                raw = _byte_edit(raw, data)
            with open(full, "wb") as f:
                f.write(raw)
        _exercise(path)
    finally:
        shutil.rmtree(work, ignore_errors=True)
