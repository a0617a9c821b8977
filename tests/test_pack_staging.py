"""Packs build in a private staging folder: a failure commits nothing, and the folders that killed
packs leave behind are removed by the next pack to the same ``out``, never a live writer's."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import headrace
from headrace._base.staging import _host, _start_time, make_staging

pytestmark = pytest.mark.timeout(120)


def _partials(out: Path) -> list[str]:
    return sorted(n for n in os.listdir(out.parent) if n.startswith(f".{out.name}.partial-"))


def _corpus(tmp_path: Path, bad_at: int | None = None) -> Path:
    src = tmp_path / "docs.jsonl"
    lines = [f'{{"text": "document {i} " }}' for i in range(2000)]
    if bad_at is not None:
        lines[bad_at] = "not json"
    src.write_text("\n".join(lines) + "\n")
    return src


@pytest.mark.parametrize("made", [False, True])
def test_a_failed_text_pack_commits_nothing(tmp_path, made):
    out = tmp_path / "t.hr"
    if made:
        out.mkdir()  # an empty folder given as out stays an empty folder
    seen: list[bool] = []

    def tokenizer(text: str) -> list[int]:
        seen.append(out.exists() and any(out.iterdir()))  # nothing appears at out while packing
        return [len(text)]

    # batch_mb tiny: documents are appended (to the staging store) before the bad line
    with pytest.raises(headrace.DecodeError, match="document 1500"):
        headrace.pack_text(str(_corpus(tmp_path, bad_at=1500)), str(out), tokenizer=tokenizer,
                           batch_mb=0.001, progress=False)
    assert len(seen) > 100 and not any(seen)
    assert (out.is_dir() and not any(out.iterdir())) if made else not out.exists()
    assert _partials(out) == []
    # and a good pack to the same out then succeeds
    info = headrace.pack_text(str(_corpus(tmp_path)), str(out), tokenizer=tokenizer,
                              progress=False)
    assert info["documents"] == 2000 and len(headrace.open(str(out))) == 2000
    assert _partials(out) == []


def test_a_text_pack_refuses_a_non_empty_out_before_reading(tmp_path):
    out = tmp_path / "t.hr"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    with pytest.raises(headrace.StoreExistsError, match="not an empty directory"):
        headrace.pack_text(str(_corpus(tmp_path)), str(out), progress=False)
    assert os.listdir(out) == ["keep.txt"] and _partials(out) == []


_WRITER = textwrap.dedent("""
    import os, sys, time
    from headrace._base.staging import make_staging
    d = make_staging(sys.argv[1])
    with open(os.path.join(d, "half-written"), "wb") as f:
        f.write(b"x" * 1000)
    print(d, flush=True)
    time.sleep(600)
""")


def _writer(out: Path) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(out)], stdout=subprocess.PIPE,
                            text=True, env=env)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    proc.stdout.close()
    return proc, line


@pytest.mark.parametrize("pack", ["arrays", "text"])
def test_the_next_pack_removes_a_killed_writers_staging_but_never_a_live_ones(tmp_path, pack):
    out = tmp_path / "s.hr"
    live, live_dir = _writer(out)
    killed, killed_dir = _writer(out)
    try:
        killed.send_signal(signal.SIGKILL)  # as a pack killed mid-way: it cleans up nothing
        killed.wait()
        assert os.path.isdir(killed_dir) and os.path.isdir(live_dir)
        if pack == "arrays":
            headrace.pack_arrays(out, x=np.arange(10), progress=False)
        else:
            headrace.pack_text(str(_corpus(tmp_path)), str(out), progress=False)
        assert not os.path.exists(killed_dir)
        assert os.path.isdir(live_dir)  # its writer still runs
        assert os.path.isfile(os.path.join(live_dir, "half-written"))
    finally:
        live.kill()
        live.wait()
    # gone now: the next pack to that out removes it
    headrace.pack_arrays(tmp_path / "t.hr", x=np.arange(3), progress=False)
    assert os.path.isdir(live_dir)  # a pack to another out leaves it alone
    headrace.pack_text(str(_corpus(tmp_path)), str(tmp_path / "s2.hr"), progress=False)
    shutil.rmtree(out)
    headrace.pack_text(str(_corpus(tmp_path)), str(out), progress=False)
    assert _partials(out) == []


def test_staging_it_cannot_attribute_is_kept_and_a_reused_pid_is_not_its_writer(tmp_path):
    out = tmp_path / "s.hr"
    me, start = os.getpid(), _start_time(os.getpid())
    keep = [f".s.hr.partial-{_host()}.{me}.{start}.mine0000",  # a live writer: this process
            f".s.hr.partial-otherhost.{me}.1.aaaa0000",  # another machine's
            ".s.hr.partial-abc123"]  # an older version's name: whose is unknown
    drop = [f".s.hr.partial-{_host()}.{me}.{int(start) + 1}.reused00"]  # pid reused since
    for name in keep + drop:
        (tmp_path / name).mkdir()
    mine = make_staging(str(out))
    assert sorted([*keep, os.path.basename(mine)]) == _partials(out)
