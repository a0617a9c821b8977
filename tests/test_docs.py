"""The docs keep up with the code: every public name is in docs/api.md, and links resolve."""

import re
from pathlib import Path

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


def test_the_user_guides_exist():
    for name in ("quickstart.md", "api.md", "memory.md", "format.md", "checkpoint.md",
                 "migration-mx8.md", "migration-loaderx.md", "troubleshooting.md"):
        assert (DOCS / name).stat().st_size > 1000, name
