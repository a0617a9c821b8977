"""The package shows the data flow: stage subpackages import only downward, and no module cycles.

Lazy imports inside functions count too: a cycle hidden in a function is still a cycle a reader
has to untangle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import headrace

ROOT = Path(headrace.__file__).parent

# Lowest first: a stage may import its own modules and those of the stages before it.
STAGES = ["_base", "_store", "_order", "_remote", "_sources", "_pack", "_engine", "_modal",
          "_multi", "_compat", "_cli"]


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = [p for p in rel.parts if p != "__init__"]
        out[".".join(["headrace", *parts])] = path
    return out


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            targets = [f"{mod}.{a.name}" for a in node.names] + [mod]
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != "headrace" and t != name:
                found.add(t)
    return found


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    known = set(mods)
    return {name: _imports(name, path, known) for name, path in mods.items()}


def _stage(name: str) -> int | None:
    parts = name.split(".")
    return STAGES.index(parts[1]) if len(parts) > 1 and parts[1] in STAGES else None


def test_every_private_module_sits_in_a_stage():
    loose = [n for n in _modules() if n.count(".") == 1 and n.split(".")[1].startswith("_")
             and n.split(".")[1] not in STAGES and n != "headrace.__main__"]
    assert loose == [], f"modules outside the stage subpackages: {loose}"
    assert {p.name for p in ROOT.iterdir() if p.is_dir() and p.name.startswith("_")
            and p.name != "__pycache__"} == set(STAGES)


def test_stages_import_only_downward():
    upward = []
    for name, deps in _graph().items():
        mine = _stage(name)
        if mine is None:
            continue
        for dep in deps:
            theirs = _stage(dep)
            if theirs is None and dep.count(".") == 1 and dep not in ("headrace._cshuffle",):
                upward.append(f"{name} -> {dep} (a public module)")
            elif theirs is not None and theirs > mine:
                upward.append(f"{name} -> {dep}")
    assert sorted(upward) == []


def test_no_import_cycles():
    graph = _graph()
    cycles = set()

    def visit(node: str, stack: list[str], on_stack: set[str], done: set[str]) -> None:
        on_stack.add(node)
        stack.append(node)
        for dep in graph.get(node, ()):
            if dep in on_stack:
                cycle = stack[stack.index(dep):]
                start = cycle.index(min(cycle))
                cycles.add(" -> ".join(cycle[start:] + cycle[:start]))
            elif dep not in done:
                visit(dep, stack, on_stack, done)
        stack.pop()
        on_stack.discard(node)
        done.add(node)

    done: set[str] = set()
    for node in sorted(graph):
        if node not in done:
            visit(node, [], set(), done)
    assert sorted(cycles) == []
