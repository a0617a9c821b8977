"""The docs keep up with the code: every Python block runs, every public name is in docs/api.md,
and links resolve.

How the Python blocks run (``test_the_python_blocks_run``):

* Every fenced block tagged ``python`` (or ``py``, ``python3``) in README.md and docs/*.md runs. A
  block that is not meant to run is not a python block: signatures, pseudo-code, shell sessions and
  output go in ``text`` (or ``bash``, ``json`` ...) fences. There is no other opt-out.
* A page's blocks run in order, top to bottom, in one namespace (a later block may use what an
  earlier one made, as a reader following the page would), in a fresh temporary working directory.
* Before the first block, the page's fixtures (``PAGES`` below) write the tiny data the page names,
  under the names it uses (``train.hr``, ``imagenet/train/``, ``speech/`` ...), and put a few
  stand-ins for the reader's own code in the namespace (``STAND_INS``: ``train_step``, ``save``
  ...). Nothing else is injected: each block imports what it uses, so it can be pasted.
  A page listing ``"s3"`` runs against a real S3 server (moto, on loopback) holding bucket
  ``bucket``, with the AWS variables pointing at it; link snapshots always go to the test's own
  manifest store.
* Tracebacks point at the page and line: a block is compiled as if it sat at its line in the .md.
* Afterwards every headrace object left in the namespace is closed.

Adding a block: make it run on its own (imports, relative paths, loops that end, outputs that do
not collide with what the page made before); if it reads data, name a fixture for its page in
``PAGES`` (or add one to ``FIXTURES``: tiny, a few milliseconds). The whole test stays in the tens
of seconds.
"""

import contextlib
import gc
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import headrace

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _api_headings() -> set[str]:
    text = (DOCS / "api.md").read_text(encoding="utf-8")
    return set(re.findall(r"^### `([^`]+)`$", text, flags=re.M))


def test_every_public_name_has_an_entry_in_api_md():
    documented = _api_headings()
    missing = [n for n in headrace.__all__ if n != "__version__" and n not in documented]
    assert not missing, (f"add a '### `NAME`' entry (signature, description) to docs/api.md for "
                         f"{missing}")


def test_the_adapters_public_names_are_documented():
    documented = _api_headings()
    # Read __all__ from the source: importing the adapters would import the frameworks.
    for mod in ("jax", "torch"):
        src = (ROOT / "src" / "headrace" / f"{mod}.py").read_text(encoding="utf-8")
        names = re.search(r"^__all__ = \[(.*?)\]", src, flags=re.M | re.S).group(1)
        for name in re.findall(r'"(\w+)"', names):
            assert f"headrace.{mod}.{name}" in documented, name


def test_relative_links_in_docs_and_readme_resolve():
    broken = []
    for page in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]:
        text = page.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)\s#]+)(?:#[^)]*)?\)", text):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.name} -> {target}")
    assert not broken, broken


def test_internals_names_every_module_in_its_stage():
    # docs/internals.md draws the package layout: a table row per stage lists its modules.
    text = (DOCS / "internals.md").read_text(encoding="utf-8")
    rows: dict[str, set[str]] = {}
    stage = ""
    for first, modules in re.findall(r"^\|\s*(`_\w+`)?\s*\|([^|]*)\|", text, flags=re.M):
        stage = first.strip("`") or stage
        rows.setdefault(stage, set()).update(re.findall(r"`(\w+)`", modules))
    src = ROOT / "src" / "headrace"
    missing = [f"{p.parent.name}/{p.stem}" for p in sorted(src.glob("_*/*.py"))
               if p.stem != "__init__" and p.stem not in rows.get(p.parent.name, set())]
    assert not missing, (f"add {missing} to the module column of their stage's rows in "
                         "docs/internals.md (\"Package layout\")")


def test_the_user_guides_exist():
    for name in ("quickstart.md", "api.md", "memory.md", "format.md", "checkpoint.md",
                 "migration-mx8.md", "migration-loaderx.md", "troubleshooting.md"):
        assert (DOCS / name).stat().st_size > 1000, name


# -- the Python blocks run ------------------------------------------------------------------------

_FENCE = re.compile(r"^```([^\s`]*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
_PYTHON = {"python", "py", "python3"}


def python_blocks(page: Path) -> list[tuple[int, str]]:
    """``(line of the first code line, code)`` of each python block on ``page``."""
    text = page.read_text(encoding="utf-8")
    return [(text.count("\n", 0, m.start(2)) + 1, m.group(2)) for m in _FENCE.finditer(text)
            if m.group(1).lower() in _PYTHON]


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


# Stand-ins for the reader's own code that the examples call (a model step, a save function).
def _train_step(*args: Any, **kwargs: Any) -> float:
    return 0.0


def _save(*args: Any, **kwargs: Any) -> None:
    return None


STAND_INS: dict[str, Any] = {"train_step": _train_step, "save": _save,
                             "save_checkpoint": _save}


def _arrays_store(path: str, n: int = 1024) -> None:
    rng = np.random.default_rng(0)
    headrace.pack_arrays(path, image=rng.integers(0, 255, (n, 8, 8, 3), dtype=np.uint8),
                         label=rng.integers(0, 10, n))


def _npy_files() -> None:
    rng = np.random.default_rng(1)
    np.save("images.npy", rng.integers(0, 255, (512, 8, 8, 3), dtype=np.uint8))
    np.save("labels.npy", rng.integers(0, 10, 512))


def _image_folder(root: str, per_class: int = 8) -> None:
    from _images import imagefolder

    imagefolder(Path(root), {"cat": per_class, "dog": per_class}, h=32, w=40)


def _image_store(path: str) -> None:
    _image_folder("_photos")
    headrace.pack_dir("_photos", out=path, workers=1)


def _corpus(root: str = "corpus") -> None:
    rng = np.random.default_rng(2)
    words = [f"w{i}" for i in range(200)]
    Path(root).mkdir()
    for i in range(4):
        text = " ".join(rng.choice(words, 3000))
        Path(root, f"{i}.txt").write_text(text + "\n", encoding="utf-8")


def _tokenizer(path: str = "tokenizer.json") -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "<|endoftext|>": 1, **{f"w{i}": i + 2 for i in range(200)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(path)


def _speech(root: str = "speech", rate: int = 16_000) -> None:
    from _media import sine, write_audio

    for i in range(6):
        write_audio(f"{root}/{'ab'[i % 2]}/{i}.wav", sine(200 + 50 * i, rate, rate), rate)


def _videos(root: str = "videos") -> None:
    from _media import write_video

    for i in range(2):
        write_video(f"{root}/{i}.mp4", 72, size=(32, 48))


def _files(root: str = "files") -> None:
    for i in range(8):
        path = Path(root, "ab"[i % 2], f"{i}.bin")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(bytes([i]) * (100 + i))


def _parquet(root: str = "parquet") -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    Path(root).mkdir()
    for i in range(2):
        table = pa.table({"x": np.arange(64, dtype=np.float32) + 64 * i,
                          "label": np.arange(64) % 4})
        pq.write_table(table, f"{root}/part-{i}.parquet")


def _shards(root: str = "shards") -> None:
    import io
    import tarfile

    from _images import encode, gradient

    Path(root).mkdir()
    for shard in range(2):
        with tarfile.open(f"{root}/shard-{shard:06d}.tar", "w") as tar:
            for i in range(8):
                key = f"{shard:02d}{i:04d}"
                for ext, data in (("jpg", encode(gradient(32, 40, phase=i), "JPEG")),
                                  ("cls", str(i % 2).encode())):
                    member = tarfile.TarInfo(f"{key}.{ext}")
                    member.size = len(data)
                    tar.addfile(member, io.BytesIO(data))


def _b2nd() -> None:
    import blosc2

    rng = np.random.default_rng(3)
    blosc2.asarray(rng.integers(0, 255, (1024, 16), dtype=np.uint8), urlpath="train_data.b2nd",
                   mode="w")
    blosc2.asarray(rng.integers(0, 10, 1024), urlpath="train_label.b2nd", mode="w")


def _npy_xy() -> None:
    rng = np.random.default_rng(4)
    np.save("x.npy", rng.standard_normal((2048, 4)).astype(np.float32))
    np.save("y.npy", rng.integers(0, 10, 2048))


@contextlib.contextmanager
def _s3_bucket() -> Iterator[None]:
    """A real S3 server (moto, on loopback) with bucket ``bucket``: an ImageFolder under
    ``raw-prefix/`` and ``train/``, and the AWS variables pointing at it."""
    from _images import encode, gradient
    from _s3_server import MotoS3Server, s3_env
    from headrace._remote.objstore import ObjectStore, S3Options

    server = MotoS3Server()
    try:
        server.make_bucket("bucket")
        client = ObjectStore("bucket", options=S3Options(
            endpoint=server.endpoint, access_key_id="testing", secret_access_key="testing"))
        for i in range(8):
            jpeg = encode(gradient(32, 40, phase=3 * i), "JPEG")
            for prefix in ("raw-prefix", "train"):
                client.put(f"{prefix}/{'ab'[i % 2]}/{i}.jpg", jpeg)
        with s3_env(server.endpoint):
            yield
    finally:
        server.close()


FIXTURES: dict[str, Callable[[], None]] = {
    "train.hr": lambda: _arrays_store("train.hr"),
    "npy": _npy_files,
    "imagenet/train": lambda: _image_folder("imagenet/train"),
    "imagenet.hr": lambda: _image_store("imagenet.hr"),
    "corpus": _corpus,
    "tokenizer.json": _tokenizer,
    "speech": _speech,
    "videos": _videos,
    "b2nd": _b2nd,
    "parquet": _parquet,
    "shards": _shards,
    "x.npy": _npy_xy,
    "imagefolder": lambda: _image_folder("imagefolder"),
    "files": _files,
}
CONTEXTS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {"s3": _s3_bucket}

# page -> the fixtures its blocks need (pages not listed need none).
PAGES: dict[str, list[str]] = {
    "quickstart.md": ["npy", "imagenet/train"],
    "adapters.md": ["train.hr", "imagenet.hr"],
    "api.md": ["train.hr", "npy", "imagenet/train", "corpus", "tokenizer.json", "speech",
               "videos", "parquet", "shards"],
    "checkpoint.md": ["train.hr"],
    "distributed.md": ["train.hr"],
    "images.md": ["imagefolder", "s3"],
    "media.md": ["speech", "videos"],
    "migration-loaderx.md": ["b2nd"],
    "packing.md": ["imagenet/train", "x.npy"],
    "s3.md": ["files", "s3"],
    "text.md": ["corpus", "tokenizer.json"],
    "troubleshooting.md": ["train.hr"],
}


def _close_all(namespace: dict[str, Any]) -> None:
    for value in list(namespace.values()):
        close = getattr(value, "close", None)
        if callable(close) and type(value).__module__.startswith("headrace"):
            with contextlib.suppress(Exception):
                close()
    namespace.clear()
    gc.collect()


@contextlib.contextmanager
def _in_dir(path: Path) -> Iterator[None]:
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


_WITH_BLOCKS = [p for p in _pages() if python_blocks(p)]


@pytest.mark.parametrize("page", _WITH_BLOCKS, ids=[p.name for p in _WITH_BLOCKS])
def test_the_python_blocks_run(page: Path, tmp_path: Path,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    namespace: dict[str, Any] = {"__name__": "__main__", **STAND_INS}
    # Link snapshots go to this test's own manifest store, never the user's cache.
    monkeypatch.setenv("HEADRACE_MANIFEST_STORE", str(tmp_path / "_manifests"))
    with _in_dir(tmp_path), contextlib.ExitStack() as stack:
        for name in PAGES.get(page.name, []):
            if name in CONTEXTS:
                stack.enter_context(CONTEXTS[name]())
            else:
                FIXTURES[name]()
        try:
            for line, code in python_blocks(page):
                # Padded so that a traceback names the page's own line numbers.
                try:
                    compiled = compile("\n" * (line - 1) + code, str(page), "exec")
                except SyntaxError as exc:
                    pytest.fail(f"{page.name}:{exc.lineno}: not Python ({exc.msg}); a signature "
                                "or pseudo-code goes in a ```text fence", pytrace=False)
                exec(compiled, namespace)
        finally:
            _close_all(namespace)


def test_blocks_are_found_with_their_lines(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("# t\n\n```python\nx = 1\n```\n\n```text\nnot run\n```\n"
                    "```py\ny = 2\nz = 3\n```\n", encoding="utf-8")
    assert python_blocks(page) == [(4, "x = 1\n"), (11, "y = 2\nz = 3\n")]
