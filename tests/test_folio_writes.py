"""Chunk appends go out in whole 2 MiB-aligned spans; the tail waits for the next append or a flush."""

from __future__ import annotations

import os

import numpy as np

import headrace
from headrace._store.folio_writes import FOLIO_BYTES, FolioWrites


def test_appends_reach_the_file_exactly_and_only_whole_spans_are_written_early(tmp_path):
    path = tmp_path / "c"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fw = FolioWrites()
        rng = np.random.default_rng(0)
        expect = bytearray()
        flushed = 0  # end of the last explicit flush
        for k in range(60):
            size = int(rng.choice([0, 1, 4095, 70_000, FOLIO_BYTES - 3, 3 * FOLIO_BYTES + 11]))
            data = rng.integers(0, 256, size, dtype=np.uint8)
            fw.write(0, fd, data, len(expect))
            expect += data.tobytes()
            on_disk = os.fstat(fd).st_size
            # everything up to the last 2 MiB boundary is written, nothing past it is
            boundary = len(expect) - len(expect) % FOLIO_BYTES
            assert on_disk == max(boundary, flushed), (k, on_disk, len(expect))
            if k % 17 == 16:
                fw.flush(0)
                flushed = len(expect)
                assert os.fstat(fd).st_size == len(expect)
        fw.flush_all()
        assert os.pread(fd, len(expect) + 1, 0) == bytes(expect)
    finally:
        os.close(fd)


def test_a_write_that_does_not_continue_the_held_tail_flushes_it_first(tmp_path):
    fd = os.open(tmp_path / "c", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fw = FolioWrites()
        fw.write(0, fd, b"a" * 10, 0)
        fw.write(0, fd, b"b" * 5, 100)  # a gap: the held tail goes out as it is
        fw.flush_all()
        assert os.pread(fd, 200, 0) == b"a" * 10 + b"\0" * 90 + b"b" * 5
    finally:
        os.close(fd)


def test_discarded_tails_never_reach_the_file_and_rollback_keeps_the_last_commit(tmp_path):
    with headrace.create(tmp_path / "s", fields={"b": "bytes"}) as w:
        w.append({"b": [b"kept"]})
    w = headrace.open(tmp_path / "s", mode="a")
    w.append({"b": [b"x" * 1000]})  # held in memory: under 2 MiB
    w.rollback()
    w.append({"b": [b"y" * 10]})
    w.commit()
    w.close()
    st = headrace.open(tmp_path / "s")
    assert [r.tobytes() for r in st.gather([0, 1])["b"].to_list()] == [b"kept", b"y" * 10]
    assert headrace.verify(tmp_path / "s").ok
