"""The stages import one way only, no module imports itself back through others, and only the stages that must
start processes do (docs/design.md §14).

Every import counts, wherever it is written: inside a function, under ``if TYPE_CHECKING:`` or in a ``try``. A
module belongs to the longest stage whose name prefixes its own; it may import its own stage and the stages below it
(``BELOW``, closed transitively), never one above or beside it.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOPS = ("reference", "faults", "properties", "harness", "bench")
FRAMEWORKS = ("paddle", "paddleformers", "torch")

#: The stage graph: each stage and the stages it imports directly (docs/design.md §14 draws it).
BELOW: dict[str, set[str]] = {
    "reference": set(),
    "faults": set(),
    "properties.model": {"reference", "faults"},
    "properties.generate": {"properties.model"},
    "properties.check": {"properties.model"},
    "properties.triage": {"properties.check"},
    "properties": {"properties.generate", "properties.triage"},
    "harness.ranks.virtual": {"properties"},
    "harness.fixes": set(),
    "harness.coverage": set(),
    "harness.sut": {"harness.ranks.virtual", "harness.fixes"},
    "harness.ranks": {"harness.sut", "harness.coverage"},
    "harness.judging": {"harness.ranks"},
    "harness.campaign": {"harness.judging"},
    "harness.repro": {"harness.judging"},
    "harness.report": {"harness.campaign"},
    "harness.fleet": {"harness.report"},
    "harness": {"harness.fleet", "harness.repro"},
    "bench": {"harness"},
}

#: The stages that may start a process, and why (docs/design.md §14).
STARTS_PROCESSES = {
    "reference.async_save": "the reference engine's async save writes in a process of its own",
    "faults.procs": "the process trees injectors act on",
    "faults.strace": "strace itself",
    "harness.ranks": "ranks, virtual hosts and fork servers",
    "harness.sut": "a framework's own writer processes, where an adapter drives them",
    "harness.fleet": "a shard is a `fuzz` process of its own",
    "harness.repro": "a standalone repro is verified in fresh processes",
    "bench": "baselines run as processes",
}
PROCESS_CALLS = {
    "subprocess": {"Popen", "run", "call", "check_call", "check_output", "getoutput", "getstatusoutput"},
    "os": {"fork", "forkpty", "system", "popen", "posix_spawn", "posix_spawnp", "spawnv", "spawnve", "spawnl",
           "spawnle", "execv", "execve", "execvp", "execvpe", "execl", "execle", "execlp", "execlpe"},
    "multiprocessing": {"Process", "Pool", "get_context"},
    "procs": {"popen"},
}


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


def _files() -> list[Path]:
    return [p for top in TOPS for p in (ROOT / top).rglob("*.py")]


def _graph() -> dict[str, set[str]]:
    modules = {_module(p): p for p in _files()}
    return {name: {m for m in _imports(path, modules.keys()) if m in modules and m != name}
            for name, path in modules.items()}


GRAPH = _graph()


def stage(module: str) -> str:
    """The longest stage whose name is ``module`` or a package above it."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in BELOW:
            return ".".join(parts[:n])
    raise KeyError(f"{module} belongs to no stage of BELOW")


@functools.cache
def reachable(name: str) -> frozenset[str]:
    """The stages ``name`` may import: itself and everything below it."""
    return frozenset({name}.union(*(reachable(s) for s in BELOW[name])))


def _against(module: str, imported: set[str]) -> list[str]:
    """Imports of ``module`` that point up or sideways in the stage graph."""
    return sorted(m for m in imported if stage(m) not in reachable(stage(module)))


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


def floors(graph: dict[str, set[str]], prefix: str) -> list[str]:
    """The longest import chain among the modules under ``prefix``, top first."""
    inside = {m: {d for d in deps if d.startswith(prefix)} for m, deps in graph.items() if m.startswith(prefix)}

    @functools.cache
    def chain(m: str) -> tuple[str, ...]:
        return (m, *max((chain(d) for d in sorted(inside[m])), key=len, default=()))

    return list(max((chain(m) for m in sorted(inside)), key=len, default=()))


def _process_starts(path: Path) -> list[str]:
    """The calls in ``path`` that start a process: ``subprocess.Popen(…)``, ``os.fork()``, ``popen`` of
    faults.procs, and the same names imported bare (``from subprocess import run``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    bare = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
            for alias in node.names
            if (node.module or "").split(".")[-1] in PROCESS_CALLS
            and alias.name in PROCESS_CALLS[(node.module or "").split(".")[-1]]}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.attr in PROCESS_CALLS.get(
                f.value.id, ()):
            found.append(f"{f.value.id}.{f.attr}")
        elif isinstance(f, ast.Name) and f.id in bare:
            found.append(f.id)
    return found


def test_the_graph_sees_the_project() -> None:
    assert {"harness.judging.judge", "harness.campaign.fuzz", "harness.report.summary", "properties.check.history",
            "reference.engine"} <= GRAPH.keys()
    assert "harness.judging.judge" in GRAPH["harness.campaign.fuzz"]
    assert all(stage(m) for m in GRAPH)


def test_the_checks_catch_what_they_are_for(tmp_path: Path) -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    assert _against("properties.model.case", {"harness.judging.run", "reference.tensor"}) == ["harness.judging.run"]
    assert _against("faults.corrupt", {"reference.disk.stio", "faults.errors"}) == ["reference.disk.stio"]
    assert _against("properties.generate.cases", {"properties.check.oracle"}) == ["properties.check.oracle"]
    assert _against("harness.ranks.virtual.scheduler", {"harness.sut.base"}) == ["harness.sut.base"]
    assert _against("harness.report.summary", {"harness.campaign.fuzz", "harness.sut"}) == []
    assert floors({"x.a": {"x.b"}, "x.b": {"x.c"}, "x.c": set(), "y": {"x.a"}}, "x") == ["x.a", "x.b", "x.c"]
    script = tmp_path / "starts.py"
    script.write_text("import os, subprocess\nfrom subprocess import run as go\nsubprocess.Popen(['true'])\n"
                      "go(['true'])\nos.fork()\nos.getpid()\n")
    assert _process_starts(script) == ["subprocess.Popen", "go", "os.fork"]


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_imports_point_down_the_stages(module: str) -> None:
    wrong = _against(module, GRAPH[module])
    assert not wrong, f"{module} (stage {stage(module)}) imports above or beside its stage: {wrong}"


#: The stages that may import Paddle, PaddleFormers or torch: the adapters (on the ranks, and ``launch_gpus`` in the
#: controller of a framework-launched SUT), the emulator that runs Paddle's ranks as threads, the fixes that patch
#: a framework's known bugs, and bench/.
IMPORTS_FRAMEWORKS = ("harness.sut", "harness.ranks.virtual", "harness.fixes", "bench")


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_only_adapters_and_the_emulator_import_a_framework(module: str) -> None:
    path = ROOT / (module.replace(".", "/") + ".py")
    if not path.exists():
        path = ROOT / module.replace(".", "/") / "__init__.py"
    frameworks = sorted(m for m in _imports(path) if m.split(".")[0] in FRAMEWORKS)
    if stage(module) in IMPORTS_FRAMEWORKS:
        return
    assert not frameworks, f"{module} imports {frameworks}; only {IMPORTS_FRAMEWORKS} may"


def test_only_the_named_stages_start_processes() -> None:
    starters = {_module(p): calls for p in _files() if (calls := _process_starts(p))}
    wrong = {m: calls for m, calls in starters.items()
             if not any(m == s or m.startswith(s + ".") for s in STARTS_PROCESSES)}
    assert not wrong, f"modules starting processes outside STARTS_PROCESSES: {wrong}"
    assert any(m.startswith("harness.ranks.") for m in starters)  # the rule sees the launcher


def test_no_import_cycles() -> None:
    cycles = _cycles(GRAPH)
    assert not cycles, f"import cycles: {cycles}"


def test_stages_are_small_and_shallow() -> None:
    """A folder a reader can hold (about 15 modules: 16 at most) and a harness whose import chain has fewer than ten
    floors."""
    folders: dict[Path, int] = {}
    for p in _files():
        if p.name != "__init__.py":
            folders[p.parent] = folders.get(p.parent, 0) + 1
    crowded = {str(d.relative_to(ROOT)): n for d, n in folders.items() if n > 16}
    assert not crowded, f"folders over 16 modules: {crowded}"
    chain = floors(GRAPH, "harness")
    assert len(chain) < 10, f"{len(chain)} floors: {' -> '.join(chain)}"
