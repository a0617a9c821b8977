"""Damaged stores: only HeadraceErrors, in bounded time and memory, from every way of opening one.

Each case is damage a crash, a bad disk or a stray edit leaves: a store without meta.json, meta.json
that does not parse, that parses but was altered, chunk ids that would size memory, store files
replaced by a directory or a FIFO, absurd sizes in the aux file.
"""

import gc
import json
import os
import subprocess
import sys
import threading
import tracemalloc

import numpy as np
import pytest

import headrace
from headrace._store import format as _format
from headrace._store.format import AUX_DTYPE, INDEX_DTYPE, meta_bytes

N = 24


def _store(path):
    with headrace.create(path, fields={"x": {"dtype": "uint8", "shape": [4]}, "b": "bytes",
                                       "z": {"dtype": "bytes", "codec": "zstd"}},
                         chunk_mb=0.0001) as w:  # ~100-byte chunks: several per field
        w.append({"x": np.arange(4 * N, dtype=np.uint8).reshape(N, 4),
                  "b": [bytes([i]) * (i % 7) for i in range(N)],
                  "z": [b"zz" * (i + 1) for i in range(N)]})
    return str(path)


def _read(path, name="meta.json"):
    with open(os.path.join(path, name), "rb") as f:
        return f.read()


def _doc(path):
    return json.loads(_read(path))


def _write_doc(path, doc):
    with open(os.path.join(path, "meta.json"), "wb") as f:
        f.write(meta_bytes(doc))


def _openers(path):
    """Every public way to open a path, each reading everything it can."""
    def loader():
        with headrace.Loader(path, batch=8, epochs=1) as ld:
            return list(ld)

    def load():
        with headrace.load(path, batch=8) as ld:
            return [b for _, b in zip(range(10), ld, strict=False)]

    def store():
        with headrace.open(path) as st:
            return st.gather(np.arange(len(st)))

    return {"open": store, "open-a": lambda: headrace.open(path, mode="a").close(),
            "Loader": loader, "load": load}


# -- a store without meta.json ---------------------------------------------------------------------


def test_a_store_without_meta_json_is_refused_by_every_opener(tmp_path):
    path = _store(tmp_path / "s")
    os.unlink(os.path.join(path, "meta.json"))  # what a pack killed before its commit leaves
    more = {"link": lambda: headrace.load(path + "@refresh"),
            "text": lambda: headrace.text(path, batch=2, seq_len=4, field="b"),
            "Dataset": lambda: headrace.Dataset(path, field="b"),
            "image": lambda: headrace.image(path, batch=2)}
    for name, call in {**_openers(path), **more}.items():
        with pytest.raises(headrace.CorruptionError, match=r"no meta\.json") as e:
            call()
        assert "chunks/" in str(e.value), name
    report = headrace.verify(path)
    assert not report.ok and "no meta.json" in report.problems[0]


def test_a_plain_folder_is_still_read_as_raw_files(tmp_path):
    d = tmp_path / "files"
    (d / "chunks").mkdir(parents=True)
    (d / "chunks" / "notes.txt").write_bytes(b"hello")  # not a chunk: a data folder
    (d / "a.index").write_bytes(b"1")
    with headrace.load(str(d), batch=4) as ld:
        keys = sorted(k for b in ld for k in b["key"].tolist())
    assert keys == ["a.index", "chunks/notes.txt"]


# -- memory follows the chunks that exist -----------------------------------------------------------


def _renumber_chunks(path, base):
    """Gives every chunk the id ``base + k``: a consistent store whose ids are far apart."""
    doc = _doc(path)
    old = sorted(c["id"] for c in doc["chunks"])
    new = {cid: base + k * 7919 for k, cid in enumerate(old)}
    for c in doc["chunks"]:
        os.rename(os.path.join(path, "chunks", f"{c['id']}.zr"),
                  os.path.join(path, "chunks", f"tmp{new[c['id']]}"))
        c["id"] = new[c["id"]]
    for c in doc["chunks"]:
        os.rename(os.path.join(path, "chunks", f"tmp{c['id']}"),
                  os.path.join(path, "chunks", f"{c['id']}.zr"))
    for f in doc["fields"]:
        ent = np.fromfile(os.path.join(path, f["index"]), INDEX_DTYPE)
        present = ent["length"] > 0
        ent["chunk"][present] = [new[c] for c in ent["chunk"][present].tolist()]
        ent.tofile(os.path.join(path, f["index"]))
    _write_doc(path, doc)


@pytest.mark.parametrize("base", [2**28, 2**32 - 10**6])
def test_memory_follows_the_chunks_not_their_ids(tmp_path, base):
    path = _store(tmp_path / "s")
    with headrace.open(path) as st:
        want = st.gather(np.arange(N))
    _renumber_chunks(path, base)
    tracemalloc.start()
    try:
        with headrace.open(path) as st:
            got = st.gather(np.arange(N))
            again = st.gather(np.arange(N)[::-1])  # the steady (verified) path too
        report = headrace.verify(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"{peak} bytes traced for a store of {N} records"
    assert report.ok, report.problems
    np.testing.assert_array_equal(got["x"], want["x"])
    np.testing.assert_array_equal(again["x"], want["x"][::-1])
    assert got["z"].to_list()[5].tobytes() == want["z"].to_list()[5].tobytes()


def test_a_stray_huge_chunk_id_costs_nothing(tmp_path):
    path = _store(tmp_path / "s")
    doc = _doc(path)
    doc["chunks"].append({"id": 2**31, "field": "x", "size": 0})
    _write_doc(path, doc)
    tracemalloc.start()
    try:
        with headrace.open(path) as st:
            st.gather(np.arange(N))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20


# -- meta.json that does not parse, or not as meta.json ---------------------------------------------


def _expect_corrupt(path):
    for name, call in _openers(path).items():
        with pytest.raises(headrace.CorruptionError, match=r"meta\.json"):
            call()
        assert name
    report = headrace.verify(path)
    assert not report.ok and "meta.json" in report.problems[0]
    out = subprocess.run([sys.executable, "-m", "headrace", "info", path], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert "meta.json" in out.stderr


@pytest.mark.parametrize("damage", ["deep", "digits", "chunk-not-object", "fields-not-list",
                                    "shape-strings", "dtype-object"])
def test_unparseable_meta_json_is_corruption(tmp_path, damage):
    path = _store(tmp_path / "s")
    raw = _read(path)
    doc = _doc(path)
    if damage == "deep":
        raw = b"[" * 100_000 + b"]" * 100_000
    elif damage == "digits":
        raw = raw.replace(b'"length": %d' % N, b'"length": ' + b"7" * 5000)
    else:
        if damage == "chunk-not-object":
            doc["chunks"] = [1]
        elif damage == "fields-not-list":
            doc["fields"] = {"x": 1}
        elif damage == "shape-strings":
            doc["fields"][0]["shape"] = ["4"]
        else:
            doc["fields"][0]["dtype"] = {"names": ["a"], "formats": ["i4"]}
        raw = meta_bytes(doc)  # well-formed and signed: the content itself is wrong
    with open(os.path.join(path, "meta.json"), "wb") as f:
        f.write(raw)
    _expect_corrupt(path)


def test_a_valid_but_altered_meta_json_is_detected(tmp_path):
    path = _store(tmp_path / "s")
    meta = os.path.join(path, "meta.json")
    good = _read(path)
    # a duplicated key (JSON keeps the last one), and a changed number: both still valid JSON
    dup = good.replace(b'"length": %d,' % N, b'"length": %d,\n "length": %d,' % (N, N - 3))
    changed = good.replace(b'"length": %d,' % N, b'"length": %d,' % (N - 3))
    for raw in (dup, changed):
        assert raw != good
        json.loads(raw)
        with open(meta, "wb") as f:
            f.write(raw)
        with pytest.raises(headrace.CorruptionError, match="checksum"):
            headrace.open(path)
        assert not headrace.verify(path).ok
    with open(meta, "wb") as f:
        f.write(good)
    assert headrace.verify(path).ok


def test_version_1_stores_without_a_checksum_still_open(tmp_path):
    path = _store(tmp_path / "s")
    with headrace.open(path) as st:
        want = st.gather(np.arange(N))
    doc = _doc(path)
    del doc["checksum"]
    doc["version"] = 1
    with open(os.path.join(path, "meta.json"), "w") as f:  # as headrace 1.x wrote it
        json.dump(doc, f, indent=1)
    with headrace.open(path) as st:
        np.testing.assert_array_equal(st.gather(np.arange(N))["x"], want["x"])
    assert headrace.verify(path).ok
    with headrace.open(path, mode="a") as w:  # its next commit writes the current version
        w.append({"x": np.zeros((1, 4), np.uint8)})
    assert _doc(path)["version"] == _format.BASE_VERSION == 2  # 3 only with a zstd_dict field


def test_a_version_2_meta_json_without_its_checksum_is_corruption(tmp_path):
    path = _store(tmp_path / "s")
    doc = _doc(path)
    del doc["checksum"]
    with open(os.path.join(path, "meta.json"), "w") as f:
        json.dump(doc, f, indent=1)
    with pytest.raises(headrace.CorruptionError, match="lost its checksum"):
        headrace.open(path)


def test_an_absurd_length_is_bounded_by_the_index_files(tmp_path):
    path = _store(tmp_path / "s")
    doc = _doc(path)
    doc["length"] = 2**60  # re-signed: only the bound can catch it
    _write_doc(path, doc)
    for name, call in _openers(path).items():
        if name == "open-a":
            continue  # the writer truncates to the committed length: it refuses below
        with pytest.raises(headrace.CorruptionError, match="no field's index"):
            call()


def test_an_absurd_aux_size_is_reported_as_corruption(tmp_path):
    path = _store(tmp_path / "s")
    aux_name = next(f["aux"] for f in _doc(path)["fields"] if f["name"] == "z")
    aux = np.fromfile(os.path.join(path, aux_name), AUX_DTYPE)
    aux["nbytes"][3:6] = 2**32 - 1  # ~12.9 GB for three records of a few bytes
    aux.tofile(os.path.join(path, aux_name))
    with headrace.open(path) as st:
        with pytest.raises(headrace.CorruptionError, match=r"field 'z', record ids \[3, 4, 5\]"):
            st.nbytes(np.arange(N), ["z"])
        with pytest.raises(headrace.CorruptionError, match="'z'"):
            st.gather(np.arange(N))
    with pytest.raises(headrace.HeadraceError) as e, \
            headrace.Loader(path, batch=N, epochs=1, order="sequential") as ld:
        list(ld)
    assert "inflight" not in str(e.value) and "'z'" in str(e.value)
    assert headrace.verify(path).bad == {"z": [3, 4, 5]}


# -- store files that are not regular files ---------------------------------------------------------


def _replace(path, name, kind):
    full = os.path.join(path, name)
    os.unlink(full)
    if kind == "dir":
        os.mkdir(full)
    else:
        os.mkfifo(full)


def _bounded(call, fifo_paths, seconds=20):
    """Runs ``call`` in a thread; fails (and unblocks it by opening the FIFOs) if it hangs."""
    box = {}

    def run():
        try:
            box["value"] = call()
        except BaseException as e:
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        for p in fifo_paths:
            fd = os.open(p, os.O_WRONLY | os.O_NONBLOCK) if os.path.exists(p) else None
            if fd is not None:
                os.close(fd)
        t.join(5)
        pytest.fail(f"{call} blocked for {seconds} s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


@pytest.mark.parametrize("kind", ["dir", "fifo"])
@pytest.mark.parametrize("which", ["meta.json", "index", "aux", "chunk"])
def test_store_files_replaced_by_a_directory_or_fifo(tmp_path, kind, which):
    path = _store(tmp_path / "s")
    doc = _doc(path)
    entry = next(f for f in doc["fields"] if f["name"] == "b")
    first_chunk = min(c["id"] for c in doc["chunks"] if c["field"] == "b")
    name = {"meta.json": "meta.json", "index": entry["index"], "aux": entry["aux"],
            "chunk": f"chunks/{first_chunk}.zr"}[which]
    _replace(path, name, kind)
    fifos = [os.path.join(path, name)] if kind == "fifo" else []
    for opener, call in _openers(path).items():
        if opener == "open-a" and which == "chunk":
            _bounded(call, fifos)  # a writer opens (its recovery leaves the damage alone)
            continue
        with pytest.raises(headrace.CorruptionError) as e:
            _bounded(call, fifos)
        assert (name if which != "chunk" else "'b'") in str(e.value), (opener, str(e.value))
    report = _bounded(lambda: headrace.verify(path), fifos)
    assert not report.ok
    out = subprocess.run([sys.executable, "-m", "headrace", "verify", path],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    if which != "meta.json":  # the rest of the store is still there to read
        with headrace.open(path) as st:
            assert len(st.gather(np.arange(N), ["x"])["x"]) == N


def test_cli_exit_codes_for_damage_and_for_no_store(tmp_path):
    path = _store(tmp_path / "s")
    with open(os.path.join(path, "meta.json"), "ab") as f:
        f.write(b"x")
    for cmd in ("info", "verify", "compact"):
        out = subprocess.run([sys.executable, "-m", "headrace", cmd, path], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 1 and "Traceback" not in out.stderr, (cmd, out.stderr)
    (tmp_path / "empty").mkdir()
    for target in (tmp_path / "empty", tmp_path / "missing"):
        out = subprocess.run([sys.executable, "-m", "headrace", "info", str(target)],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr


def test_a_writer_refused_on_a_damaged_store_closes_its_lock_fd_exactly_once(tmp_path):
    # The refused writer is still referenced by the error's traceback; when that is collected, its
    # finalizer must not close the lock fd's number again: by then another file may own it.
    path = _store(tmp_path / "s")
    entry = next(f for f in _doc(path)["fields"] if f["name"] == "b")
    _replace(path, entry["index"], "fifo")
    with pytest.raises(headrace.CorruptionError) as e:
        headrace.open(path, mode="a")
    with open(os.path.join(path, "meta.json"), "rb") as f:  # takes the lowest free fd numbers
        others = [os.open(os.path.join(path, "meta.json"), os.O_RDONLY) for _ in range(8)]
        del e
        gc.collect()
        for fd in [f.fileno(), *others]:
            os.fstat(fd)  # EBADF if the writer closed a number it no longer owned
        for fd in others:
            os.close(fd)
