"""The layering of ``src/parlab`` as ``docs/architecture.md`` states it, held against the code.

Every import under ``src/parlab`` -- at the top of a file and inside functions, relative ones
resolved -- is an edge from one module to another. No edge may go up a layer of the rule, and
no loop of edges may form. The imports known to break the rule today are listed in ``ALLOWED``
with the issue that removes each; an entry that no longer matches an import fails the test
too, so the list can only shrink. An import inside a function says on its line which heavy
module it keeps off a start-up path (``# lazy: <module>``).
"""

from __future__ import annotations

import ast
import fnmatch
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "parlab"

ALLOWED: dict[tuple[str, str], str] = {
    # (importer, imported) as module-name patterns: why the import is there, and who ends it
    ("parlab.cli.*", "parlab.cli"): "issue 25: every command module takes `app` from the "
    "package that imports it back (a module of its own ends the loop)",
}


@dataclass(frozen=True)
class Edge:
    """One import: ``importer`` (a module) takes something from ``imported`` (a module)."""

    importer: str
    imported: str
    where: str


def _module(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> list[Edge]:
    """Every edge between parlab's own modules (``from pkg import mod`` names the module)."""
    files = {_module(p): p for p in SRC.rglob("*.py")}
    edges = []
    for mod, path in files.items():
        package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*up, base] if base else up)
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names
                ]
            for t in targets:
                if t.startswith("parlab") and t != mod:
                    while t not in files:  # ``import parlab.x.y`` names a module or its parent
                        t = t.rsplit(".", 1)[0]
                    edges.append(Edge(mod, t, f"{path.relative_to(ROOT)}:{node.lineno}"))
    return edges


def layers() -> dict[str, int]:
    """The rule of ``docs/architecture.md``: package (or top-level module) -> its layer, the
    ground floor 0."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    rule = re.search(r"^`(cli →[^`]+)`$", text, re.M)
    assert rule, "docs/architecture.md states the rule on a line of its own, in backticks"
    floors = [f.split(",") for f in rule.group(1).split("→")]
    out = {name.strip(): len(floors) - 1 - i for i, f in enumerate(floors) for name in f}
    # the package's own face (its version) is ground floor; ``python -m parlab`` the top
    return {**out, "parlab": 0, "__main__": len(floors)}


def _package(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else "parlab"


def _allowed(e: Edge) -> bool:
    return any(
        fnmatch.fnmatchcase(e.importer, a) and fnmatch.fnmatchcase(e.imported, b)
        for a, b in ALLOWED
    )


def _loops(edges: list[Edge]) -> list[list[str]]:
    """The import loops (Tarjan's strongly connected components of more than one module)."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.importer, set()).add(e.imported)
        graph.setdefault(e.imported, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while (w := stack.pop()) != v:
                comp.append(w)
            if comp:
                out.append(sorted([v, *comp]))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


@pytest.fixture(scope="module")
def edges() -> list[Edge]:
    return import_graph()


def test_every_package_has_a_layer(edges: list[Edge]) -> None:
    known = layers()
    missing = {_package(m) for e in edges for m in (e.importer, e.imported)} - set(known)
    assert not missing, f"give these a layer in docs/architecture.md: {sorted(missing)}"


def test_no_import_goes_up_a_layer(edges: list[Edge]) -> None:
    known = layers()
    up = [e for e in edges if known[_package(e.imported)] > known[_package(e.importer)]]
    bad = [f"{e.where}: {e.importer} -> {e.imported}" for e in up if not _allowed(e)]
    assert not bad, "imports that go up a layer:\n" + "\n".join(bad)


def test_no_import_loop(edges: list[Edge]) -> None:
    loops = _loops([e for e in edges if not _allowed(e)])
    assert not loops, "import loops:\n" + "\n".join(" <-> ".join(c) for c in loops)


def test_the_allowed_list_only_shrinks(edges: list[Edge]) -> None:
    """An entry of ``ALLOWED`` that no import needs any more must go."""
    stale = [
        f"{a} -> {b} ({why})"
        for (a, b), why in ALLOWED.items()
        if not any(
            fnmatch.fnmatchcase(e.importer, a) and fnmatch.fnmatchcase(e.imported, b) for e in edges
        )
    ]
    assert not stale, "remove from ALLOWED, nothing imports this way now:\n" + "\n".join(stale)


def test_the_walk_sees_function_level_and_relative_imports(tmp_path: Path) -> None:
    """The graph is not empty, and counts the imports inside functions (the demo's steps are
    imported by ``cli/demo.py`` at its top; ``projects/figure.py`` loads matplotlib in one)."""
    found = {(e.importer, e.imported) for e in import_graph()}
    assert ("parlab.cli.demo", "parlab.projects.training_state") in found
    assert ("parlab.cli.core", "parlab.cli.demo") in found  # inside ``demo_cmd``
    assert len(found) > 300


# What an import inside a function may keep off a start-up path (``parlab --help`` and the
# formula-only commands load none of these): torch, matplotlib and the other heavy or optional
# libraries, and the parts of parlab that every ``parlab`` command would otherwise load at start
# (``parlab.cli`` imports every command module) though only a few commands use them.
HEAVY = (
    "torch",
    "matplotlib",
    "numpy",
    "aiohttp",
    "deepspeed",
    "triton",
    "tokenizers",
    "safetensors",
    "pynvml",
    "jsonschema_rs",
    "parlab.doctor",
    "parlab.plan.decide",
    "parlab.plan.decision_text",
    "parlab.report",
    "parlab.serve",
)
LAZY_MARK = re.compile(r"# lazy: (?P<module>[a-z_.]+)$")


def function_imports() -> list[tuple[str, str]]:
    """Every import inside a function under ``src/parlab``: (``path:line``, its first line)."""
    out = []
    for path in sorted(SRC.rglob("*.py")):
        text = path.read_text()
        lines = text.splitlines()
        for fn in ast.walk(ast.parse(text)):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    where = f"{path.relative_to(SRC)}:{node.lineno}"
                    out.append((where, lines[node.lineno - 1]))
    return sorted(set(out))


def _marked(line: str) -> bool:
    mark = LAZY_MARK.search(line.rstrip())
    name = mark["module"] if mark else ""
    return any(name == h or name.startswith(f"{h}.") for h in HEAVY)


def test_an_import_inside_a_function_names_the_heavy_module_it_keeps_lazy() -> None:
    """Imports sit at the top of a file; one inside a function says ``# lazy: <module>``, the
    heavy module (``HEAVY``) that it keeps off the start-up path of whoever imports the file."""
    found = function_imports()
    bad = [f"{where}: {line.strip()}" for where, line in found if not _marked(line)]
    assert not bad, (
        "move these imports to the top of their file, or mark why they wait "
        f"(`# lazy: <module>`, one of {sorted(HEAVY)}):\n" + "\n".join(bad)
    )


def test_the_lazy_mark_names_a_heavy_module() -> None:
    assert _marked("    import torch  # lazy: torch")
    assert _marked("    import triton  # noqa: F401  # lazy: triton")
    assert not _marked("    import torch  # lazy: the analytic commands never launch")
    assert _marked("    from parlab.doctor.cases import BY_ID  # lazy: parlab.doctor.cases")
    assert not _marked("    from parlab.units import GiB  # lazy: parlab.units")
    assert not _marked("    import torchvision  # lazy: torchvision")
