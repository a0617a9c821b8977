"""S3 read benchmark on a loopback S3 server (moto), with peak RSS per scenario.

    .venv/bin/python benchmarks/bench_s3.py                  # 3,000 objects of ~20 KB (~60 MB)
    .venv/bin/python benchmarks/bench_s3.py --objects 20000 --kb 100

Setup (not timed): a moto S3 server in a child process on 127.0.0.1; ``--objects`` random files of
``0.5..1.5 x --kb`` KB written to a local folder and uploaded to ``s3://bench/raw/``; both packed
into headrace stores (``headrace.pack``: local folder -> local store, S3 prefix -> S3 store) with
``--chunk-mb`` chunks (2 MB by default: moto reads a whole object to answer a range GET, so large
chunks would measure moto, not the client; real S3 stores use 256 MB chunks).

Each scenario runs in its own process, so its peak RSS (``ru_maxrss``) is its own; the import-only
baseline is printed first. Scenarios, one epoch each (every record once):

* ``local store``: ``headrace.load(local_store, shuffle=True)``, batches of 256.
* ``s3 store shuffled`` / ``s3 store sequential``: the same store on S3 (``RemoteStore``: index
  fetched once, coalesced byte-range GETs, 32 requests in flight).
* ``s3 raw prefix``: zero-manifest ``headrace.load("s3://bench/raw/")``: one GET per object, 32 in
  flight.
* ``naive GET loop (boto3|obstore)``: ``for key in keys: get_object(key)``, one at a time.
* client comparison: the same request list through obstore, boto3 and s3fs with 16 threads:
  ``ranges`` = 1 MiB byte ranges of the store's chunk files, ``objects`` = whole small objects.

Loopback moto is a Python server, so absolute numbers are bounded by it (and it shares the 2 CPUs
with the client); ratios between scenarios are what carries over to real S3.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

BUCKET = "bench"
CREDS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
         "AWS_DEFAULT_REGION": "us-east-1"}


def peak_rss_mb() -> float:
    """This process's peak RSS. VmHWM, not ru_maxrss: Linux carries ru_maxrss across exec, so a
    child would report its parent's peak."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# -- children ---------------------------------------------------------------------------------------

def _epoch(data: str, **kw: object) -> tuple[int, int]:
    import headrace

    n = nbytes = 0
    with headrace.load(data, batch=256, **kw) as loader:  # type: ignore[arg-type]
        for batch in loader:
            n += len(batch["bytes"])
            nbytes += int(batch["bytes"].offsets[-1])
    return n, nbytes


def _keys(endpoint: str, prefix: str) -> list[tuple[str, int]]:
    from headrace._remote.objstore import ObjectStore, S3Options

    c = ObjectStore(BUCKET, options=S3Options(endpoint=endpoint))
    return [(i.key, i.size) for i in c.list(prefix)]


def _ranges(endpoint: str) -> list[tuple[str, int, int]]:
    from headrace._remote.objstore import ObjectStore, S3Options

    c = ObjectStore(BUCKET, options=S3Options(endpoint=endpoint))
    out = []
    for key, size in ((i.key, i.size) for i in c.list("store/chunks/")):
        out += [(key, s, min(size, s + (1 << 20))) for s in range(0, size, 1 << 20)]
    return out


def child(name: str, endpoint: str, data_dir: str) -> dict[str, float]:
    os.environ.update(CREDS)
    os.environ["AWS_ENDPOINT_URL"] = endpoint

    t0 = time.perf_counter()  # imports are not timed
    n = nbytes = 0
    if name == "baseline":
        pass
    elif name == "local store":
        n, nbytes = _epoch(os.path.join(data_dir, "store"), shuffle=True)
    elif name == "s3 store shuffled":
        n, nbytes = _epoch(f"s3://{BUCKET}/store/", shuffle=True,
                           store=os.path.join(data_dir, "ms"))
    elif name == "s3 store sequential":
        n, nbytes = _epoch(f"s3://{BUCKET}/store/", store=os.path.join(data_dir, "ms"))
    elif name == "s3 raw prefix":
        n, nbytes = _epoch(f"s3://{BUCKET}/raw/", shuffle=True, store=os.path.join(data_dir, "ms"))
    elif name.startswith("naive GET loop"):
        keys = _keys(endpoint, "raw/")
        t0 = time.perf_counter()
        if "boto3" in name:
            import boto3

            s3 = boto3.client("s3", endpoint_url=endpoint)
            for key, _ in keys:
                nbytes += len(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())
        else:
            import obstore
            from obstore.store import S3Store

            st = S3Store(BUCKET, endpoint=endpoint, client_options={"allow_http": True})
            for key, _ in keys:
                nbytes += len(obstore.get(st, key).bytes())
        n = len(keys)
    elif name.startswith("client "):
        _, client_name, workload = name.split()
        if workload == "ranges":
            reqs = _ranges(endpoint)
        else:
            reqs = [(k, 0, s) for k, s in _keys(endpoint, "raw/")]
        fetch = _client_fetch(client_name, endpoint)
        t0 = time.perf_counter()
        with cf.ThreadPoolExecutor(16) as pool:
            for got in pool.map(lambda r: fetch(*r), reqs):
                nbytes += got
        n = len(reqs)
    else:
        raise SystemExit(f"unknown scenario {name!r}")
    dt = time.perf_counter() - t0
    return {"n": n, "bytes": nbytes, "seconds": dt, "peak_rss_mb": peak_rss_mb()}


def _client_fetch(name: str, endpoint: str):  # type: ignore[no-untyped-def]
    if name == "obstore":
        import obstore
        from obstore.store import S3Store

        st = S3Store(BUCKET, endpoint=endpoint, client_options={"allow_http": True})
        return lambda key, s, e: len(obstore.get_range(st, key, start=s, end=e))
    if name == "boto3":
        import boto3
        import botocore.config

        s3 = boto3.client("s3", endpoint_url=endpoint,
                          config=botocore.config.Config(max_pool_connections=16))
        return lambda key, s, e: len(s3.get_object(Bucket=BUCKET, Key=key,
                                                   Range=f"bytes={s}-{e - 1}")["Body"].read())
    if name == "s3fs":
        import s3fs

        fs = s3fs.S3FileSystem(endpoint_url=endpoint, key="testing", secret="testing")
        return lambda key, s, e: len(fs.cat_file(f"{BUCKET}/{key}", start=s, end=e))
    raise SystemExit(f"unknown client {name!r}")


# -- parent -----------------------------------------------------------------------------------------

SCENARIOS = [
    "baseline", "local store", "s3 store shuffled", "s3 store sequential", "s3 raw prefix",
    "naive GET loop (obstore)", "naive GET loop (boto3)",
    "client obstore ranges", "client boto3 ranges", "client s3fs ranges",
    "client obstore objects", "client boto3 objects", "client s3fs objects",
]


def setup(server_endpoint: str, data_dir: str, objects: int, kb: float, chunk_mb: float) -> None:
    import headrace
    from headrace._remote.objstore import ObjectStore, S3Options

    rng = np.random.default_rng(0)
    raw = os.path.join(data_dir, "raw")
    client = ObjectStore(BUCKET, options=S3Options(endpoint=server_endpoint))
    files = []
    for i in range(objects):
        rel = f"class{i % 10}/{i:06d}.bin"
        size = int(kb * 1000 * rng.uniform(0.5, 1.5))
        path = os.path.join(raw, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(rng.integers(0, 256, size, np.uint8).tobytes())
        files.append(rel)
    with cf.ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda rel: client.put(f"raw/{rel}",
                                             Path(raw, rel)), files))
    ms = os.path.join(data_dir, "ms")
    t0 = time.perf_counter()
    headrace.pack(raw, out=os.path.join(data_dir, "store"), store=ms, chunk_mb=chunk_mb)
    t1 = time.perf_counter()
    headrace.pack(f"s3://{BUCKET}/raw/", out=f"s3://{BUCKET}/store/", store=ms, chunk_mb=chunk_mb,
                  endpoint=server_endpoint)
    t2 = time.perf_counter()
    total = sum(os.path.getsize(os.path.join(raw, r)) for r in files)
    print(f"data: {objects} objects, {total / 1e6:.1f} MB; pack local->local "
          f"{total / 1e6 / (t1 - t0):.0f} MB/s, s3->s3 {total / 1e6 / (t2 - t1):.0f} MB/s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--objects", type=int, default=3000)
    ap.add_argument("--kb", type=float, default=20.0, help="mean object size in KB")
    ap.add_argument("--chunk-mb", type=float, default=2.0,
                    help="store chunk size (small by default: moto reads a whole object per range GET)")
    ap.add_argument("--only", nargs="*", default=None, help="scenario names to run")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--endpoint", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        import faulthandler

        faulthandler.dump_traceback_later(int(os.environ.get("BENCH_HANG_S", "300")), exit=True)  # a hung scenario reports where
        print(json.dumps(child(args.child, args.endpoint, args.data)))
        return
    from _s3_server import MotoS3Server

    os.environ.update(CREDS)
    server = MotoS3Server()
    data_dir = tempfile.mkdtemp(prefix="headrace-bench-s3-")
    try:
        server.make_bucket(BUCKET)
        setup(server.endpoint, data_dir, args.objects, args.kb, args.chunk_mb)
        rows = {}
        for name in SCENARIOS:
            if args.only and name not in args.only and name != "baseline":
                continue
            out = subprocess.run([sys.executable, __file__, "--child", name, "--endpoint",
                                  server.endpoint, "--data", data_dir],
                                 capture_output=True, text=True, check=False)
            if out.returncode != 0:
                print(f"{name}: FAILED\n{out.stderr[-2000:]}", file=sys.stderr)
                continue
            rows[name] = json.loads(out.stdout.strip().splitlines()[-1])
        _table(rows)
    finally:
        server.close()
        shutil.rmtree(data_dir, ignore_errors=True)


def _table(rows: dict[str, dict[str, float]]) -> None:
    base = rows.get("baseline", {}).get("peak_rss_mb", 0.0)
    ref = rows.get("s3 store shuffled")
    print(f"\n{'scenario':30s} {'items':>7s} {'items/s':>9s} {'MB/s':>8s} {'vs s3 store':>11s} "
          f"{'peak RSS MB':>11s}")
    for name, r in rows.items():
        if name == "baseline":
            print(f"{'baseline (import only)':30s} {'':>7s} {'':>9s} {'':>8s} {'':>11s} "
                  f"{r['peak_rss_mb']:11.0f}")
            continue
        mbs = r["bytes"] / 1e6 / r["seconds"]
        ratio = f"{mbs / (ref['bytes'] / 1e6 / ref['seconds']):.2f}x" if ref else "-"
        print(f"{name:30s} {int(r['n']):7d} {r['n'] / r['seconds']:9.0f} {mbs:8.1f} {ratio:>11s} "
              f"{r['peak_rss_mb']:11.0f}")
    print(f"(items = records, or requests for the client rows; RSS baseline {base:.0f} MB)")


if __name__ == "__main__":
    main()
