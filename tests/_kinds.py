"""Every public loader kind as one factory over tiny generated data (for tests/test_conformance.py).

A kind is ``Kind(name, make, ...)`` where ``make(data, **kw)`` builds a fresh loader of that kind
reading the same stream every time: ``kw`` holds the core keywords a check varies (``resume``,
``epochs``, ``timeline``, ...). ``Data`` builds the files once per test session. A new loader
kind is one more entry of ``KINDS``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import headrace

N_RECORDS = 40  # arrays, and the DataLoader's dataset
BATCH = 4


def ints(text: str) -> list[int]:
    """A whitespace-separated-ints "tokenizer": each document says which token ids it holds."""
    return [int(x) for x in text.split()]


ints.bos_id = 1  # type: ignore[attr-defined]
ints.eos_id = 2  # type: ignore[attr-defined]


@dataclass
class Data:
    """Paths of the tiny datasets, each small enough that a whole epoch takes milliseconds."""

    root: Path
    create: bool = True  # False: the files are already there (a torchrun worker's view)
    store: Path = field(init=False)
    npy_x: Path = field(init=False)
    npy_y: Path = field(init=False)
    images: Path = field(init=False)
    tokens: Path = field(init=False)
    tokens_b: Path = field(init=False)
    audio: Path = field(init=False)
    video: Path = field(init=False)
    empty_store: Path = field(init=False)
    empty_tokens: Path = field(init=False)
    empty_npy: tuple[Path, Path] = field(init=False)

    def __post_init__(self) -> None:
        r = self.root
        self.store = r / "arrays.hr"
        self.npy_x, self.npy_y = r / "x.npy", r / "y.npy"
        self.images, self.audio, self.video = r / "images", r / "audio", r / "video"
        self.tokens, self.tokens_b = r / "tokens.hr", r / "tokens_b.hr"
        self.empty_store, self.empty_tokens = r / "empty.hr", r / "empty_tokens.hr"
        self.empty_npy = (r / "empty_x.npy", r / "empty_y.npy")
        if self.create:
            self._write()

    def _write(self) -> None:
        headrace.pack_arrays(self.store, x=np.arange(N_RECORDS, dtype=np.int64),
                             y=np.arange(N_RECORDS, dtype=np.float32) * 0.5, progress=False)
        np.save(self.npy_x, np.arange(N_RECORDS * 3, dtype=np.float32).reshape(N_RECORDS, 3))
        np.save(self.npy_y, np.arange(N_RECORDS, dtype=np.int64))
        from _images import imagefolder

        imagefolder(self.images, {"cat": 6, "dog": 6}, h=12, w=16)
        self._token_store(self.tokens, tag=1)
        self._token_store(self.tokens_b, tag=2)
        from _media import sine, write_audio, write_video

        for i in range(8):
            write_audio(str(self.audio / ("lo" if i < 4 else "hi") / f"{i}.wav"),
                        sine(200 + 100 * i, 8000, 400 + 40 * i), 8000)
        for i in range(2):
            write_video(str(self.video / f"v{i}.mp4"), 24, fps=24, size=(16, 16), gop=6)
        # nothing to yield: no records (the media kinds get a folder of another kind's files)
        headrace.pack_arrays(self.empty_store, x=np.zeros(0, np.int64), progress=False)
        with headrace.create(str(self.empty_tokens),
                             fields={"tokens": {"dtype": "int32", "shape": None}}) as w:
            w.commit()
        np.save(self.empty_npy[0], np.zeros((0, 3), np.float32))
        np.save(self.empty_npy[1], np.zeros(0, np.int64))

    def _token_store(self, out: Path, *, tag: int) -> None:
        """12 documents of 3..14 tokens; token values say the store, document and position."""
        src = self.root / f"{out.name}.jsonl"
        docs = [" ".join(str(tag * 10_000 + 100 * d + j) for j in range(3 + d)) for d in range(12)]
        src.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs))
        headrace.pack_text(str(src), str(out), tokenizer=ints)


Make = Callable[..., Any]


@dataclass(frozen=True)
class Kind:
    """One loader kind.

    Attributes:
        name: the test id.
        make: ``make(data, **kw) -> loader``; ``kw`` are core keywords (``resume``, ``epochs``,
            ``seed``, ``timeline`` ...) passed through to the loader's constructor.
        empty: ``empty(data, epochs=...) -> loader`` of this kind with nothing to yield.
        endless: the kind has no epochs (loaderx's DataLoader): checks read ``take`` batches.
        take: batches a check reads (for an endless kind, and to keep the others short).
    """

    name: str
    make: Make
    empty: Make
    endless: bool = False
    take: int | None = None

    def __repr__(self) -> str:
        return self.name


def _loader(d: Data, **kw: Any) -> Any:
    kw = {"order": "shuffle", "seed": 3, "threads": 2, **kw}
    return headrace.Loader(str(d.store), batch=BATCH, **kw)


def _load(d: Data, **kw: Any) -> Any:
    kw = {"shuffle": True, "seed": 3, "threads": 2, **kw}
    return headrace.load(str(d.store), batch=BATCH, **kw)


def _image(d: Data, **kw: Any) -> Any:
    kw = {"shuffle": True, "seed": 3, "threads": 2, **kw}
    return headrace.image(str(d.images), batch=BATCH, resize=(8, 8), flip_p=0.5, **kw)


def _text(d: Data, **kw: Any) -> Any:
    kw = {"shuffle": True, "seed": 3, "threads": 2, **kw}
    return headrace.text(str(d.tokens), batch=BATCH, seq_len=8, **kw)


def _audio(d: Data, **kw: Any) -> Any:
    kw = {"shuffle": True, "seed": 3, "threads": 2, **kw}
    return headrace.audio(str(d.audio), batch=2, samples=256, **kw)


def _video(d: Data, **kw: Any) -> Any:
    kw = {"shuffle": True, "seed": 3, "threads": 2, **kw}
    return headrace.video(str(d.video), clip=4, stride=4, fps=24, batch=BATCH,
                          index_dir=str(d.root / "video-index"), progress=False, **kw)


def _mix(d: Data, **kw: Any) -> Any:
    """Two text sources (an LLM data mixture) and an array loader, 2:1:1, dropped as they end."""
    src_kw = {k: kw[k] for k in ("epoch", "epochs") if k in kw}
    kw.pop("epochs", None)
    sources = [headrace.text(str(d.tokens), batch=BATCH, seq_len=8, shuffle=True, seed=1,
                             threads=1, **src_kw),
               headrace.text(str(d.tokens_b), batch=BATCH, seq_len=8, shuffle=True, seed=2,
                             threads=1, **src_kw)]
    kw = {"weights": [2, 1], "seed": 3, "on_source_exhausted": "drop", **kw}
    return headrace.mix(sources, **kw)


def _mix_arrays(d: Data, **kw: Any) -> Any:
    """Two array loaders over halves of one store, 2:1, dropped as they end."""
    src_kw = {k: kw[k] for k in ("epoch", "epochs") if k in kw}
    kw.pop("epochs", None)
    sources = [headrace.load(str(d.store), batch=BATCH, start=0, end=24, shuffle=True, seed=1,
                             threads=1, **src_kw),
               headrace.load(str(d.store), batch=BATCH, start=24, end=40, shuffle=True, seed=2,
                             threads=1, **src_kw)]
    kw = {"weights": [2, 1], "seed": 3, "on_source_exhausted": "drop", **kw}
    return headrace.mix(sources, **kw)


def _dataloader(d: Data, **kw: Any) -> Any:
    kw = {"seed": 3, "threads": 2, **kw}
    if "order" not in kw and "shuffle" not in kw:
        kw["mode"] = 2  # loaderx's spelling of order="shuffle"
    return headrace.DataLoader(headrace.Dataset(str(d.npy_x)), headrace.Dataset(str(d.npy_y)),
                               batch_size=BATCH, **kw)


def _distributed(d: Data, **kw: Any) -> Any:
    """Rank 1 of 2, named explicitly (the torchrun case launches real ranks: ``launched``)."""
    kw = {"order": "shuffle", "seed": 3, "threads": 2, "rank": 1, "world_size": 2, "check": False,
          **kw}
    return headrace.DistributedDataLoader(str(d.store), batch=BATCH, **kw)


def launched(kind: Kind, d: Data, **kw: Any) -> Any:
    """``kind`` as a training script under a launcher builds it: rank and world size unsaid."""
    if kind.name == "DistributedDataLoader":
        return headrace.DistributedDataLoader(str(d.store), batch=BATCH, order="shuffle", seed=3,
                                              threads=2, **kw)
    return kind.make(d, **kw)


def _empty_mix(d: Data, *, epochs: int | None) -> Any:
    """Endless (``epochs=None``): a source that never yields, restarted for ever by the mix."""
    sources = [headrace.load(str(d.empty_store), batch=BATCH),
               headrace.load(str(d.store), batch=BATCH)]
    return headrace.mix(sources, on_source_exhausted="restart" if epochs is None else "drop")


KINDS: dict[str, Kind] = {k.name: k for k in [
    Kind("Loader", _loader, lambda d, **kw: headrace.Loader(str(d.empty_store), batch=BATCH, **kw)),
    Kind("load", _load, lambda d, **kw: headrace.load(str(d.empty_store), batch=BATCH, **kw)),
    Kind("image", _image, lambda d, **kw: headrace.image(str(d.audio), batch=BATCH, **kw)),
    Kind("text", _text, lambda d, **kw: headrace.text(str(d.empty_tokens), batch=BATCH, seq_len=8,
                                                      eos_id=2, **kw)),
    Kind("audio", _audio, lambda d, **kw: headrace.audio(str(d.images), batch=BATCH, **kw)),
    Kind("video", _video, lambda d, **kw: headrace.video(
        str(d.audio), batch=BATCH, index_dir=str(d.root / "video-index"), progress=False, **kw)),
    Kind("mix", _mix, _empty_mix),
    Kind("mix-arrays", _mix_arrays, _empty_mix),
    Kind("DataLoader", _dataloader, lambda d, **kw: headrace.DataLoader(
        headrace.Dataset(str(d.empty_npy[0])), headrace.Dataset(str(d.empty_npy[1])),
        batch_size=BATCH, **kw), endless=True, take=25),
    Kind("DistributedDataLoader", _distributed, lambda d, **kw: headrace.DistributedDataLoader(
        str(d.empty_store), batch=BATCH, rank=1, world_size=2, check=False, **kw)),
]}
