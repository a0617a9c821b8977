"""Sampler speed: 8,192 record ids out of 1,000,000 per call, side by side in one process.

Peers:

* ``headrace`` ``Sampler(1_000_000, 8192, mode).next()`` for IID, SEQUENTIAL and SHUFFLE.
* NumPy ``np.random.randint(0, N, 8192)`` (what loaderx's own ``bench()`` compares against) and
  ``np.random.default_rng().integers(0, N, 8192)``.
* loaderx 0.4.1's Zig sampler (``loaderx/lib/libsampler.so`` through cffi, exactly as
  ``loaderx._sampler.Sampler.next()`` calls it: fill a ``uint64`` buffer, return a copy), IID and
  SEQUENTIAL. loaderx 0.4.1 declares ``Requires-Python ==3.13`` (its sampler is a plain C ABI
  library and runs on any CPython), so its wheel is fetched with
  ``pip download --python-version 3.13`` into ``benchmarks/_data/`` (gitignored) and only the
  ``.so`` is loaded; nothing is installed.

Also shown: other sizes (ImageNet's 1,281,167 records; 2**31, past the shuffle's memoized round
tables), and the loader's shape, batches of 256 out of 200,000 (``Order.range`` amortizes a
memoized block of 8,192 positions over 32 batches).

Each peer runs ``--calls`` calls per round; rounds go round-robin over the peers (so machine noise
hits all of them alike) and the best round is reported, in µs per call and as a ratio to the Zig
IID sampler (``x zig`` > 1 is slower).

Run::

    .venv/bin/python benchmarks/bench_sampler.py            # ~20 s on 2 cores
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from headrace import Sampler

LENGTH = 1_000_000
BATCH = 8_192
LOADERX = "loaderx==0.4.1"
CACHE = Path(__file__).resolve().parent / "_data" / "loaderx-0.4.1"
CDEF = """
typedef struct Sampler Sampler;
Sampler* cinit(uint64_t length, uint64_t batch_size, uint8_t mode, uint64_t seed);
void cdeinit(Sampler* s);
void cnext(Sampler* s, uint64_t* indices_ptr, size_t indices_len);
"""


def fetch_libsampler() -> Path | None:
    """Path to loaderx 0.4.1's ``libsampler.so``, downloading its wheel once; None if unreachable."""
    so = CACHE / "libsampler.so"
    if so.exists():
        return so
    CACHE.mkdir(parents=True, exist_ok=True)
    wheels = sorted(CACHE.glob("loaderx-0.4.1-*.whl"))
    if not wheels:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--python-version", "3.13",
               "--only-binary=:all:", LOADERX, "-d", str(CACHE), "-q"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        wheels = sorted(CACHE.glob("loaderx-0.4.1-*.whl"))
        if done.returncode != 0 or not wheels:
            print(f"NOTE: could not download {LOADERX} (registry unreachable?); the Zig sampler "
                  f"is left out.\n  {' '.join(cmd)}\n  {done.stderr.strip()[-400:]}")
            return None
    with zipfile.ZipFile(wheels[0]) as z:
        so.write_bytes(z.read("loaderx/lib/libsampler.so"))
    return so


def zig_peers(so: Path) -> dict[str, Callable[[], object]]:
    """``next()`` of loaderx 0.4.1's Sampler, IID (mode 1) and SEQUENTIAL (mode 0)."""
    from cffi import FFI

    ffi = FFI()
    ffi.cdef(CDEF)
    lib = ffi.dlopen(str(so))
    peers: dict[str, Callable[[], object]] = {}
    for name, mode in (("loaderx 0.4.1 Zig IID", 1), ("loaderx 0.4.1 Zig SEQUENTIAL", 0)):
        handle = ffi.gc(lib.cinit(LENGTH, BATCH, mode, 42), lib.cdeinit)
        buf = np.zeros(BATCH, dtype=np.uint64)

        def nxt(handle=handle, buf=buf) -> np.ndarray:  # loaderx._sampler.Sampler.next
            lib.cnext(handle, ffi.cast("uint64_t *", buf.ctypes.data), buf.size)
            return buf.copy()

        peers[name] = nxt
    return peers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=1000, help="calls per peer per round")
    ap.add_argument("--rounds", type=int, default=9, help="round-robin rounds (best is kept)")
    args = ap.parse_args()

    rng = np.random.default_rng()
    peers: dict[str, Callable[[], object]] = {}
    so = fetch_libsampler()
    if so is not None:
        peers.update(zig_peers(so))
    for mode in (Sampler.Mode.IID, Sampler.Mode.SEQUENTIAL, Sampler.Mode.SHUFFLE):
        peers[f"headrace {mode.name}"] = Sampler(LENGTH, BATCH, mode, seed=42).next
    peers["numpy np.random.randint"] = lambda: np.random.randint(0, LENGTH, size=BATCH)
    peers["numpy default_rng().integers"] = lambda: rng.integers(0, LENGTH, size=BATCH)
    small = {f"headrace {m.name} (256 of 200k)": Sampler(200_000, 256, m, seed=42).next
             for m in (Sampler.Mode.IID, Sampler.Mode.SEQUENTIAL, Sampler.Mode.SHUFFLE)}
    # other sizes, 8,192 a call: ImageNet's N takes IID's full-word path; 2**31 is past the
    # shuffle's memoized round tables (per-element round functions)
    other = {f"headrace {m.name} (8192 of {n:,})": Sampler(n, BATCH, m, seed=42).next
             for m, n in ((Sampler.Mode.IID, 1_281_167), (Sampler.Mode.SHUFFLE, 1_281_167),
                          (Sampler.Mode.SHUFFLE, 2**31))}

    best: dict[str, float] = dict.fromkeys([*peers, *small, *other], float("inf"))
    for _ in range(args.rounds):
        for name, fn in [*peers.items(), *small.items(), *other.items()]:
            calls = args.calls * (8 if name in small else 1) // (4 if name in other else 1)
            fn()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            best[name] = min(best[name], (time.perf_counter() - t0) / calls * 1e6)

    ref = best.get("loaderx 0.4.1 Zig IID")
    print(f"\n{BATCH:,} ids of {LENGTH:,} per call, best of {args.rounds} rounds x {args.calls} "
          f"calls (numpy {np.__version__}, Python {sys.version.split()[0]})\n")
    print(f"{'peer':<40} {'us/call':>9} {'x zig':>7} {'ns/id':>7}")
    for name in peers:
        ratio = f"{best[name] / ref:7.2f}" if ref else "      -"
        print(f"{name:<40} {best[name]:9.2f} {ratio} {best[name] * 1e3 / BATCH:7.2f}")
    print()
    for name in other:
        ratio = f"{best[name] / ref:7.2f}" if ref else "      -"
        print(f"{name:<40} {best[name]:9.2f} {ratio} {best[name] * 1e3 / BATCH:7.2f}")
    print()
    for name in small:
        print(f"{name:<40} {best[name]:9.2f} {'':>7} {best[name] * 1e3 / 256:7.2f}")
    if ref is None:
        print("\n(the Zig sampler was not measured: see the note above)")


if __name__ == "__main__":
    main()
