"""Audio and video loading benchmark: headrace.audio / headrace.video vs plain decode loops.

Data (made once per run in a temp dir, page cache warm):
* video: ``--videos`` H.264 files (libx264, ``--seconds`` s at 30 fps, 320x240, keyframe every 2 s,
  moving content); clips of 16 frames at fps 8, stride 8 (mx8's defaults), batch 8.
* audio: ``--audio`` stereo FLAC files of 3 s at 44.1 kHz; output 2 s mono at 16 kHz (mix-down +
  resampling), and a second scenario without resampling (16 kHz mono WAV in, 1 s out).

Peers, in one process, interleaved over ``--rounds``; each keeps its best pass:
* ``headrace``: the loader (its threads, default knobs), one epoch in clip/file order.
* ``pyav-seek`` (the ceiling): a plain PyAV loop over the same clips, one at a time: open, seek
  to the keyframe before the clip, decode forward, convert the clip's frames to RGB.
* ``pyav-seek x2``: the same loop on a 2-thread pool (what headrace's threads could reach).
* ``pyav-linear``: each video decoded once front to back, clips cut from the frames (the best
  case of in-order reading, no seeks at all).
* ``sf-loop`` / ``sf-loop x2``: soundfile.read + mix-down + scipy resample_poly + pad/truncate,
  serial and on a 2-thread pool.

Run: ``.venv/bin/python benchmarks/bench_media.py [--videos 12] [--audio 300] [--rounds 2]``
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import headrace

CLIP, STRIDE, FPS, BATCH = 16, 8, 8, 8


def make_videos(root: str, n: int, seconds: float) -> None:
    import av

    rng = np.random.default_rng(0)
    h, w, fps = 240, 320, 30
    yy, xx = np.mgrid[0:h, 0:w]
    for v in range(n):
        with av.open(os.path.join(root, f"v{v:03d}.mp4"), "w") as c:
            s = c.add_stream("libx264", rate=fps)
            s.width, s.height, s.pix_fmt = w, h, "yuv420p"
            s.options = {"preset": "veryfast", "crf": "23", "g": "60"}
            phase = rng.uniform(0, 6.28)
            for i in range(int(seconds * fps)):
                img = np.empty((h, w, 3), np.uint8)
                img[..., 0] = (128 + 100 * np.sin(xx / 17 + i / 5 + phase)).astype(np.uint8)
                img[..., 1] = (128 + 100 * np.cos(yy / 13 - i / 7)).astype(np.uint8)
                img[..., 2] = ((xx + yy + 3 * i) % 256).astype(np.uint8)
                for p in s.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                    c.mux(p)
            for p in s.encode():
                c.mux(p)


def make_audio(root: str, n: int) -> None:
    import soundfile as sf

    rng = np.random.default_rng(0)
    os.makedirs(os.path.join(root, "flac"), exist_ok=True)
    os.makedirs(os.path.join(root, "wav"), exist_ok=True)
    for i in range(n):
        t = np.arange(3 * 44100) / 44100
        x = np.stack([np.sin(2 * np.pi * rng.uniform(100, 4000) * t),
                      0.3 * rng.standard_normal(len(t))], 1) * 0.4
        sf.write(os.path.join(root, "flac", f"a{i:04d}.flac"), x, 44100)
        t16 = np.arange(16000) / 16000
        sf.write(os.path.join(root, "wav", f"a{i:04d}.wav"),
                 0.4 * np.sin(2 * np.pi * rng.uniform(100, 4000) * t16), 16000)


# -- video peers -------------------------------------------------------------------------------------


def clip_plan(root: str, index_dir: str) -> list[tuple[str, np.ndarray, np.ndarray, np.ndarray]]:
    """(path, pts of the clip's frames, keyframe pts before it, all pts) per clip, from the index."""
    with headrace.video(root, clip=CLIP, stride=STRIDE, fps=FPS, index_dir=index_dir) as ld:
        ix = ld.index
        plan = []
        for c in range(len(ix)):
            v = int(ix.video[c])
            pts, key = ix.probe.frames(v)
            frames = ix.frames(c)
            keys = np.flatnonzero(key)
            k = keys[np.searchsorted(keys, frames[0], side="right") - 1]
            plan.append((ld.files.open(v), frames, np.array([pts[k]]), pts))
    return plan


def pyav_clip(item: tuple[str, np.ndarray, np.ndarray, np.ndarray]) -> np.ndarray:
    import av

    path, frames, seek, pts = item
    want = {int(pts[f]) for f in frames}
    got: dict[int, np.ndarray] = {}
    with av.open(path) as c:
        s = c.streams.video[0]
        s.thread_type = "AUTO"
        c.seek(int(seek[0]), stream=s, backward=True)
        last = int(pts[frames[-1]])
        for fr in c.decode(s):
            if fr.pts in want:
                got[fr.pts] = fr.to_ndarray(format="rgb24")
            if fr.pts is not None and fr.pts >= last:
                break
    return np.stack([got[int(pts[f])] for f in frames])


def run_pyav_seek(plan: list, threads: int) -> int:
    out = 0
    if threads == 1:
        for item in plan:
            out += len(pyav_clip(item)) // CLIP
        return out
    with ThreadPoolExecutor(threads) as pool:
        for clip in pool.map(pyav_clip, plan):
            out += len(clip) // CLIP
    return out


def run_pyav_linear(plan: list) -> int:
    import av

    by_video: dict[str, list[np.ndarray]] = {}
    pts_of: dict[str, np.ndarray] = {}
    for path, frames, _seek, pts in plan:
        by_video.setdefault(path, []).append(frames)
        pts_of[path] = pts
    n = 0
    for path, clips in by_video.items():
        pts = pts_of[path]
        want = {int(pts[f]) for fr in clips for f in fr}
        got: dict[int, np.ndarray] = {}
        with av.open(path) as c:
            s = c.streams.video[0]
            s.thread_type = "AUTO"
            for fr in c.decode(s):
                if fr.pts in want:
                    got[fr.pts] = fr.to_ndarray(format="rgb24")
        for frames in clips:
            np.stack([got[int(pts[f])] for f in frames])
            n += 1
    return n


def run_headrace_video(root: str, index_dir: str) -> int:
    with headrace.video(root, clip=CLIP, stride=STRIDE, fps=FPS, batch=BATCH,
                        index_dir=index_dir) as ld:
        return sum(len(b["clip_ids"]) for b in ld)


# -- audio peers -------------------------------------------------------------------------------------


def sf_one(path: str, samples: int, rate_hz: int | None) -> np.ndarray:
    import soundfile as sf
    from scipy.signal import resample_poly

    x, sr = sf.read(path, dtype="float32", always_2d=True)
    x = x.mean(axis=1)
    if rate_hz is not None and sr != rate_hz:
        g = np.gcd(sr, rate_hz)
        x = resample_poly(x, rate_hz // g, sr // g).astype(np.float32)
    out = np.zeros(samples, np.float32)
    out[:min(samples, len(x))] = x[:samples]
    return out


def run_sf(files: list[str], samples: int, rate_hz: int | None, threads: int) -> int:
    if threads == 1:
        return sum(1 for f in files if sf_one(f, samples, rate_hz) is not None)
    with ThreadPoolExecutor(threads) as pool:
        return sum(1 for _ in pool.map(lambda f: sf_one(f, samples, rate_hz), files))


def run_headrace_audio(root: str, samples: int, rate_hz: int | None) -> int:
    with headrace.audio(root, batch=32, samples=samples, rate_hz=rate_hz) as ld:
        return sum(len(x) for x, _ in ld)


def best(fn, rounds: int) -> tuple[float, int]:
    times, n = [], 0
    for _ in range(rounds):
        t = time.perf_counter()
        n = fn()
        times.append(time.perf_counter() - t)
    return min(times), n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--videos", type=int, default=12)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--audio", type=int, default=300)
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        vroot, aroot, idx = (os.path.join(tmp, d) for d in ("v", "a", "idx"))
        os.makedirs(vroot)
        t = time.perf_counter()
        make_videos(vroot, a.videos, a.seconds)
        make_audio(aroot, a.audio)
        print(f"made {a.videos} videos and {2 * a.audio} audio files in "
              f"{time.perf_counter() - t:.1f}s", file=sys.stderr)
        t = time.perf_counter()
        plan = clip_plan(vroot, idx)
        print(f"video index (probe) of {a.videos} videos: {time.perf_counter() - t:.2f}s, "
              f"{len(plan)} clips", file=sys.stderr)
        rows: list[tuple[str, str, float, str]] = []
        vpeers = {"headrace": lambda: run_headrace_video(vroot, idx),
                  "pyav-seek": lambda: run_pyav_seek(plan, 1),
                  "pyav-seek x2": lambda: run_pyav_seek(plan, 2),
                  "pyav-linear": lambda: run_pyav_linear(plan)}
        res = {}
        for _ in range(a.rounds):  # interleaved rounds, best per peer
            for name, fn in vpeers.items():
                s, n = best(fn, 1)
                if name not in res or s < res[name][0]:
                    res[name] = (s, n)
        ceil = res["pyav-seek"][1] / res["pyav-seek"][0]
        for name, (s, n) in res.items():
            rows.append(("video", name, n / s, f"{n / s / ceil:.2f}"))
        flac = sorted(os.path.join(aroot, "flac", f) for f in os.listdir(os.path.join(aroot, "flac")))
        wav = sorted(os.path.join(aroot, "wav", f) for f in os.listdir(os.path.join(aroot, "wav")))
        for label, root, files, samples, rate in (
                ("audio 44.1k->16k", os.path.join(aroot, "flac"), flac, 32000, 16000),
                ("audio 16k wav", os.path.join(aroot, "wav"), wav, 16000, None)):
            seconds_out = samples / 16000
            apeers = {"headrace": lambda r=root, s=samples, z=rate: run_headrace_audio(r, s, z),
                      "sf-loop": lambda f=files, s=samples, z=rate: run_sf(f, s, z, 1),
                      "sf-loop x2": lambda f=files, s=samples, z=rate: run_sf(f, s, z, 2)}
            res = {}
            for _ in range(a.rounds):
                for name, fn in apeers.items():
                    s, n = best(fn, 1)
                    if name not in res or s < res[name][0]:
                        res[name] = (s, n)
            ceil = res["sf-loop"][1] / res["sf-loop"][0]
            for name, (s, n) in res.items():
                rows.append((label, name, n * seconds_out / s, f"{n / s / ceil:.2f}"))
    print(f"{'scenario':<18} {'peer':<14} {'rate':>12} {'vs plain loop':>14}")
    for scen, name, rate_v, ratio in rows:
        unit = "clips/s" if scen == "video" else "audio-s/s"
        print(f"{scen:<18} {name:<14} {rate_v:>8.1f} {unit:<9} {ratio:>8}")


if __name__ == "__main__":
    main()
