"""Packing Parquet / HF datasets: headrace.pack_arrow vs ``datasets``' own conversion and
``save_to_disk``, rows/s, MB/s and peak RSS, with the headrace Parquet pack run under a RAM cap
smaller than the file.

loaderx 2.8.19's converter (the peer the issue names first) needs Python 3.12+; this venv runs
3.11, so the peer is what ``datasets`` itself does with the same input.

Data: one Parquet file (made once under ``benchmarks/_data/``, uncompressed so its size is its
data) of rows ``id`` int64, ``vec`` fixed_size_list<float32, 256> (1 KiB), ``tokens``
list<int32> (16-240 ids) and ``text`` string (50-400 B): about 1.9 KB a row; row groups of
``--rg-mb``. Every peer runs in a fresh child process (one at a time) that reports its own peak
RSS (``VmHWM``, and the same after its imports); the page cache is warmed by one read of the file first.

Peers:
* ``headrace parquet``: ``pack_arrow(file, out, workers=1)``, in a child whose address space may
  grow by at most ``--cap-mb`` (default: a quarter of the file) past what its imports mapped
  (``RLIMIT_AS``, with Arrow on the system allocator and one glibc arena so that every
  allocation counts and none is reserved ahead): it cannot hold the table.
* ``datasets parquet``: ``Dataset.from_parquet(file)`` (Parquet -> its Arrow cache file) then
  ``save_to_disk(out)``: what a ``datasets`` user runs to get a loadable copy. No cap (it would
  not fit one: it memory-maps the whole cache file).
* ``headrace dataset`` / ``datasets save_to_disk``: from the same memory-mapped ``Dataset``
  (``load_from_disk`` of a saved copy, not timed): ``pack_arrow(ds, out)`` vs ``ds.save_to_disk``.

MB/s is of the table's Arrow bytes (``table.nbytes``), the same numerator for every peer.

Run: ``.venv/bin/python benchmarks/bench_pack_arrow.py [--mb 1024] [--rounds 2]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")


def make_parquet(path: str, mb: int, rg_mb: int) -> tuple[int, int]:
    """Writes the benchmark file; returns (rows, Arrow bytes)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    rows_per_rg = max(1, rg_mb * (1 << 20) // 1900)
    total_rows, nbytes = 0, 0
    words = np.array([b"lorem", b"ipsum", b"dolor", b"sit", b"amet", b"headrace", b"arrow"])
    schema = pa.schema([("id", pa.int64()), ("vec", pa.list_(pa.float32(), 256)),
                        ("tokens", pa.list_(pa.int32())), ("text", pa.string())])
    tmp = path + ".tmp"
    with pq.ParquetWriter(tmp, schema, compression="none") as w:
        while nbytes < mb * (1 << 20):
            n = rows_per_rg
            vec = rng.random((n, 256), dtype=np.float32)
            lens = rng.integers(16, 241, n)
            offs = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
            toks = rng.integers(0, 50_000, int(offs[-1]), dtype=np.int32)
            text = [b" ".join(rng.choice(words, int(k))).decode()
                    for k in rng.integers(8, 60, n)]
            t = pa.table({
                "id": pa.array(np.arange(total_rows, total_rows + n, dtype=np.int64)),
                "vec": pa.FixedSizeListArray.from_arrays(vec.reshape(-1), 256),
                "tokens": pa.ListArray.from_arrays(pa.array(offs), pa.array(toks)),
                "text": pa.array(text, pa.string())}, schema=schema)
            w.write_table(t)
            total_rows += n
            nbytes += t.nbytes
    os.replace(tmp, path)
    return total_rows, nbytes


_CHILD = textwrap.dedent("""
    import json, os, resource, sys, time
    spec = json.loads(sys.argv[1])
    import headrace, datasets, pyarrow.parquet
    import headrace._pack.arrow, headrace._store.writer, headrace._store.reader
    datasets.disable_progress_bars()
    if spec.get("cap_mb"):
        # The cap is on what packing may add: the address space after the imports (shared
        # libraries, thread stacks) plus cap_mb.
        with open("/proc/self/status") as f:
            vm = next(int(l.split()[1]) for l in f if l.startswith("VmSize:")) << 10
        cap = vm + (spec["cap_mb"] << 20)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    def hwm_mb():  # this process's peak RSS (ru_maxrss would carry the parent's over exec)
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) for l in f if l.startswith("VmHWM:")) / 1024
    base = hwm_mb()
    peer, src, out = spec["peer"], spec["src"], spec["out"]
    if peer in ("headrace dataset", "datasets save_to_disk"):
        ds = datasets.load_from_disk(src)
    t = time.perf_counter()
    if peer == "headrace parquet":
        info = headrace.pack_arrow(src, out, workers=1)
        rows = info["samples"]
    elif peer == "datasets parquet":
        ds = datasets.Dataset.from_parquet(src, cache_dir=spec["cache"])
        ds.save_to_disk(out)
        rows = len(ds)
    elif peer == "headrace dataset":
        rows = headrace.pack_arrow(ds, out, workers=1)["samples"]
    else:
        ds.save_to_disk(out)
        rows = len(ds)
    dt = time.perf_counter() - t
    print(json.dumps({"seconds": dt, "rows": rows, "peak_mb": hwm_mb(), "base_mb": base}))
""")


def run_child(spec: dict) -> dict:
    env = {**os.environ, "PYTHONPATH": SRC, "HF_DATASETS_OFFLINE": "1"}
    if spec.get("cap_mb"):
        # jemalloc reserves address space up front, which would let RSS grow under the cap
        # unseen; with the system allocator every allocation counts against RLIMIT_AS.
        env["ARROW_DEFAULT_MEMORY_POOL"] = "system"
        env["MALLOC_ARENA_MAX"] = "1"  # glibc reserves 64 MiB of address space per arena
    out = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(spec)], capture_output=True,
                         text=True, env=env)
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else
                f"exit {out.returncode}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mb", type=int, default=1024, help="Arrow size of the table in MiB")
    p.add_argument("--rg-mb", type=int, default=32, help="row group size in MiB")
    p.add_argument("--cap-mb", type=int, default=None,
                   help="address space the headrace Parquet child may add (RLIMIT_AS; "
                        "default: a quarter of the file)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--tmp", default=None, help="scratch folder for outputs")
    args = p.parse_args()

    data = os.path.join(HERE, "_data", f"bench_pack_arrow-{args.mb}-{args.rg_mb}")
    os.makedirs(data, exist_ok=True)
    pq_path = os.path.join(data, "table.parquet")
    meta_path = os.path.join(data, "meta.json")
    if not os.path.isfile(meta_path):
        t = time.perf_counter()
        rows, nbytes = make_parquet(pq_path, args.mb, args.rg_mb)
        with open(meta_path, "w") as f:
            json.dump({"rows": rows, "nbytes": nbytes}, f)
        print(f"made {pq_path} in {time.perf_counter() - t:.0f}s", file=sys.stderr)
    with open(meta_path) as f:
        meta = json.load(f)
    file_mb = os.path.getsize(pq_path) / (1 << 20)
    cap = args.cap_mb or int(file_mb // 4)
    saved = os.path.join(data, "saved")
    if not os.path.isdir(saved):
        sys.path.insert(0, SRC)
        import datasets

        datasets.disable_progress_bars()
        with tempfile.TemporaryDirectory() as cache:
            datasets.Dataset.from_parquet(pq_path, cache_dir=cache).save_to_disk(saved)
    with open(pq_path, "rb") as f:  # warm the page cache
        while f.read(64 << 20):
            pass

    scratch = tempfile.mkdtemp(dir=args.tmp, prefix="bench_pack_arrow-")
    peers = [("headrace parquet", pq_path, cap), ("datasets parquet", pq_path, None),
             ("headrace dataset", saved, None), ("datasets save_to_disk", saved, None)]
    best: dict[str, dict] = {}
    try:
        for r in range(args.rounds):
            for name, src, peer_cap in peers:
                out = os.path.join(scratch, f"out-{r}-{name.replace(' ', '_')}")
                cache = os.path.join(scratch, f"cache-{r}")
                res = run_child({"peer": name, "src": src, "out": out, "cap_mb": peer_cap,
                                 "cache": cache})
                shutil.rmtree(out, ignore_errors=True)
                shutil.rmtree(cache, ignore_errors=True)
                if "error" in res:
                    best.setdefault(name, res)
                    continue
                if name not in best or "error" in best[name] or \
                        res["seconds"] < best[name]["seconds"]:
                    best[name] = res
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    print(f"Parquet file {file_mb:.0f} MiB on disk, {meta['rows']} rows, "
          f"{meta['nbytes'] / 2**20:.0f} MiB as Arrow, row groups of {args.rg_mb} MiB; "
          f"{os.cpu_count()} cores; best of {args.rounds}")
    print(f"{'peer':24} {'rows/s':>10} {'MB/s':>7} {'peak RSS':>9} {'imports':>8}  RAM cap")
    for name, _src, peer_cap in peers:
        res = best[name]
        capped = f"+{peer_cap} MiB address space (RLIMIT_AS)" if peer_cap else "-"
        if "error" in res:
            print(f"{name:24} failed: {res['error'][:90]}  {capped}")
            continue
        rows_s = res["rows"] / res["seconds"]
        mb_s = meta["nbytes"] / res["seconds"] / 1e6
        print(f"{name:24} {rows_s:10.0f} {mb_s:7.0f} {res['peak_mb']:7.0f}MB "
              f"{res['base_mb']:6.0f}MB  {capped}")


if __name__ == "__main__":
    main()
