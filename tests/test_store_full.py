"""A full disk during a write: StoreFullError, nothing committed, the last commit still opens.

The disk is really full: a 2 MiB tmpfs when this process may mount one (root), and in any case a
child process whose RLIMIT_FSIZE makes writes past 1 MiB fail with EFBIG.
"""

import json
import os
import subprocess
import sys
import textwrap
import uuid

import numpy as np
import pytest

import headrace

# Appends 64 KiB records, committing after each, until the disk is full; prints what it saw.
_FILL = textwrap.dedent("""
    import json, sys
    import numpy as np
    import headrace
    path = sys.argv[1]
    committed, error = 0, None
    w = headrace.create(path, fields={"b": "bytes", "n": "int64"}, chunk_mb=64)
    try:
        for i in range(1000):
            w.append({"b": [bytes([i % 251]) * 65536], "n": [i]})
            w.commit()
            committed = i + 1
    except headrace.StoreError as e:
        error = (type(e).__name__, isinstance(e, OSError), str(e))
    try:
        w.append({"n": [0]})
        closed = False
    except headrace.WriterClosedError:
        closed = True
    print(json.dumps({"committed": committed, "error": error, "closed": closed}))
""")


def _check_after_full(path, result):
    assert result["error"] is not None, "the disk never filled up"
    name, is_oserror, message = result["error"]
    assert name == "StoreFullError" and is_oserror
    assert "nothing was committed" in message and path in message
    assert result["closed"]  # the failed writer rolled back and closed
    k = result["committed"]
    assert k > 0
    s = headrace.open(path)
    assert len(s) == k
    got = s.gather(np.arange(k))
    assert got["n"].tolist() == list(range(k))
    assert all(r.tobytes() == bytes([i % 251]) * 65536 for i, r in enumerate(got["b"].to_list()))
    assert headrace.verify(path).ok
    # the next writer recovers (truncates the partial write) and can commit small records
    with headrace.open(path, mode="a") as w:
        w.append({"n": [-1]})
    s = headrace.open(path)
    assert len(s) == k + 1 and s.gather([k])["n"].tolist() == [-1]


def _limited(code, fsize_limit):
    """``code`` preceded by a file-size limit on the child itself (set there, not through
    preexec_fn: a fork of this process would trip JAX's at-fork warning once JAX is imported)."""
    if not fsize_limit:
        return code
    return (  # SIGXFSZ ignored: writes past the limit fail with EFBIG instead of killing us
        "import resource, signal\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        f"resource.setrlimit(resource.RLIMIT_FSIZE, ({fsize_limit}, {fsize_limit}))\n" + code)


def _run_child(path, *, fsize_limit=None):
    out = subprocess.run([sys.executable, "-c", _limited(_FILL, fsize_limit), path],
                         capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout)


def _mount_tmpfs(where, size):
    if os.geteuid() != 0:
        return False
    os.makedirs(where, exist_ok=True)
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", where],
                         capture_output=True)
    return res.returncode == 0


def test_disk_full_on_small_tmpfs(tmp_path):
    mnt = str(tmp_path / f"mnt-{uuid.uuid4().hex[:6]}")
    mounted = _mount_tmpfs(mnt, "2m")
    try:
        path = os.path.join(mnt, "s")
        os.makedirs(mnt, exist_ok=True)
        # without the privilege to mount, a per-process file-size limit fills the "disk"
        result = _run_child(path) if mounted else _run_child(path, fsize_limit=1 << 20)
        assert result["committed"] < 40  # 2 MiB holds fewer than 32 records of 64 KiB
        _check_after_full(path, result)
    finally:
        if mounted:
            subprocess.run(["umount", "-l", mnt], check=False)


def test_file_size_limit_gives_store_full(tmp_path):
    path = str(tmp_path / "s")
    result = _run_child(path, fsize_limit=1 << 20)
    assert result["committed"] < 17
    _check_after_full(path, result)


@pytest.mark.parametrize("n_before", [0, 3])
def test_full_disk_during_compaction_keeps_last_commit(tmp_path, n_before):
    # compaction needs room for a second copy of the live records; a 1 MiB tmpfs holding ~830 KiB
    # of records cannot give it, so compact() itself hits ENOSPC.
    mnt = str(tmp_path / "mnt")
    mounted = _mount_tmpfs(mnt, "1m")
    try:
        base = mnt if mounted else str(tmp_path)
        path = os.path.join(base, "s")
        w = headrace.create(path, fields={"b": "bytes"}, chunk_mb=64)
        for i in range(13):
            w.append({"b": [bytes([i]) * 65536]})
        w.commit()
        for i in range(n_before):
            w.modify(i, {"b": b"m" * 10})
        w.commit()
        if not n_before:  # nothing to reclaim: compact() writes nothing, so needs no room
            assert w.compact() == (1.0, 1.0)
            w.commit()
        elif mounted:
            with pytest.raises(headrace.StoreFullError):
                w.compact()
            with pytest.raises(headrace.WriterClosedError):
                w.commit()
        else:  # no tmpfs: compaction simply succeeds
            w.compact()
            w.commit()
        w.close()
        s = headrace.open(path)
        assert len(s) == 13
        got = [r.tobytes() for r in s.gather(np.arange(13))["b"].to_list()]
        assert got[:n_before] == [b"m" * 10] * n_before
        assert got[n_before:] == [bytes([i]) * 65536 for i in range(n_before, 13)]
        assert headrace.verify(path).ok
    finally:
        if mounted:
            subprocess.run(["umount", "-l", mnt], check=False)


@pytest.mark.parametrize("existing_dir", [False, True])
def test_create_on_a_full_disk_leaves_nothing_behind(tmp_path, existing_dir):
    path = str(tmp_path / "s")
    if existing_dir:
        os.mkdir(path)
    code = textwrap.dedent(f"""
        import headrace
        try:
            headrace.create({path!r}, fields={{"b": "bytes"}})
        except headrace.StoreFullError as e:
            print("full:", e)
    """)
    out = _run_code(code, fsize_limit=1)  # not even meta.json fits
    assert out.startswith("full:") and "nothing was committed" in out
    assert os.path.isdir(path) == existing_dir
    if existing_dir:
        assert os.listdir(path) == []
    headrace.create(path, fields={"b": "bytes"}).close()  # and it can simply be retried
    assert len(headrace.open(path)) == 0


def _run_code(code, *, fsize_limit):
    return subprocess.run([sys.executable, "-c", _limited(code, fsize_limit)],
                          capture_output=True, text=True, timeout=60, check=True).stdout
