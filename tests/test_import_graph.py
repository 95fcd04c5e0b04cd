"""The layers import one way only, and no module imports itself back through others (docs/design.md §14).

reference/ and faults/ import no other project package (reference imports no framework; faults knows processes,
syscalls and files, never a checkpoint format) <- properties/ (strategies, cases, pure checkers) <- harness/ (the
only package that launches processes and imports a framework) <- bench/. Every import counts, wherever it is
written: inside a function, under ``if TYPE_CHECKING:`` or in a ``try``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYER = {"reference": 0, "faults": 0, "properties": 1, "harness": 2, "bench": 3}
FRAMEWORKS = ("paddle", "paddleformers", "torch")


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str] | frozenset[str] = frozenset()) -> set[str]:
    """Absolute names of everything ``path`` imports (relative imports resolved against its package); ``from pkg
    import name`` imports the module ``pkg.name`` where one of ``modules`` is called that, else ``pkg`` itself."""
    module = _module(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                out.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return out


def _graph() -> dict[str, set[str]]:
    files = [p for top in LAYER for p in (ROOT / top).rglob("*.py")]
    modules = {_module(p): p for p in files}
    graph = {}
    for name, path in modules.items():
        graph[name] = {m for m in _imports(path, modules.keys()) if m in modules and m != name}
    return graph


GRAPH = _graph()


def _layer(module: str) -> int:
    return LAYER[module.split(".")[0]]


def test_the_graph_sees_the_project() -> None:
    assert {"harness.judge", "harness.campaign", "harness.report", "properties.atomic", "reference.engine"} <= \
        GRAPH.keys()
    assert "harness.judge" in GRAPH["harness.campaign"]


def _against(module: str, imported: set[str]) -> list[str]:
    """Imports of ``module`` that point up the layers, or sideways between reference/ and faults/."""
    return sorted(m for m in imported if _layer(m) > _layer(module)
                  or (_layer(m) == _layer(module) == 0 and m.split(".")[0] != module.split(".")[0]))


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components: any component of more than one module is a cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_the_checks_catch_what_they_are_for() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    assert _against("properties.case", {"harness.run", "reference.tensor"}) == ["harness.run"]
    assert _against("faults.corrupt", {"reference.stio", "faults.errors"}) == ["reference.stio"]


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_imports_point_down_the_layers(module: str) -> None:
    wrong = _against(module, GRAPH[module])
    assert not wrong, f"{module} imports against reference/faults <- properties <- harness <- bench: {wrong}"


@pytest.mark.parametrize("module", sorted(m for m in GRAPH if _layer(m) < LAYER["harness"]))
def test_only_the_harness_imports_a_framework(module: str) -> None:
    path = ROOT / (module.replace(".", "/") + ".py")
    if not path.exists():
        path = ROOT / module.replace(".", "/") / "__init__.py"
    frameworks = sorted(m for m in _imports(path) if m.split(".")[0] in FRAMEWORKS)
    assert not frameworks, f"{module} imports {frameworks}"


def test_no_import_cycles() -> None:
    cycles = _cycles(GRAPH)
    assert not cycles, f"import cycles: {cycles}"
