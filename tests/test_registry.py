"""The property registry is the one definition of each property: what users see of it (ids, descriptions, default
runs, skip reasons, the docs) stays pinned here, every property's strategy draws valid cases, and the properties
package has no import cycle."""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from harness.cli import _faults_note, main
from harness.sut import adapter_class
from harness.sut.reference import ReferenceSut
from properties.model.case import Case, Op, TensorCase
from properties.registry import (
    FAULT_PROPERTIES,
    NO_TRAINING_STATE,
    REGISTRY,
    Checker,
    checker_for,
    default_properties,
    drawable_properties,
    property_cases,
)
from reference.layout import Mesh, Shard, Sharded

ROOT = Path(__file__).resolve().parent.parent
IDS = ("P-ROUNDTRIP", "P-RESHARD", "P-EDGE", "P-COVER", "P-MOE", "P-FLAT", "P-AOA", "P-MODEL", "P-REPEAT",
       "P-DIFF", "P-ASYNC-ISOLATION", "P-LIFECYCLE", "P-ATOMIC", "P-NOLOSS", "P-CORRUPT", "P-LIVENESS", "P-EMA",
       "P-RESUME")
REFERENCE_CAPS = frozenset(adapter_class("reference").capabilities)


def test_registry_holds_every_id_in_catalogue_order() -> None:
    assert tuple(REGISTRY) == IDS
    assert all(spec.id == pid and spec.description for pid, spec in REGISTRY.items())


def test_default_properties_are_pinned() -> None:
    fault_free = ["P-ROUNDTRIP", "P-RESHARD", "P-EDGE", "P-COVER", "P-MOE", "P-FLAT", "P-AOA", "P-MODEL", "P-REPEAT",
                  "P-DIFF", "P-ASYNC-ISOLATION", "P-LIFECYCLE", "P-EMA", "P-RESUME"]
    assert default_properties(faults=False) == fault_free
    assert default_properties(faults=True) == [*fault_free, "P-ATOMIC", "P-NOLOSS", "P-CORRUPT", "P-LIVENESS"]
    assert FAULT_PROPERTIES == ("P-ATOMIC", "P-NOLOSS", "P-CORRUPT", "P-LIVENESS")


def test_skip_reasons_are_pinned() -> None:
    bare = frozenset({"dtype:F32"})  # no capability, and no I64: no training state either
    assert {p: REGISTRY[p].skip_reason(bare) for p in default_properties(faults=True)
            if REGISTRY[p].skip_reason(bare)} == {
        "P-RESHARD": "SUT does not claim 'reshard'",
        "P-MOE": "SUT does not claim 'moe'",
        "P-FLAT": "SUT does not claim 'flat'",
        "P-AOA": "SUT does not claim 'aoa'",
        "P-MODEL": "SUT does not claim any 'producer:' capability",
        "P-REPEAT": "SUT does not claim 'repeat'",
        "P-ASYNC-ISOLATION": "SUT does not claim 'async'",
        "P-EMA": NO_TRAINING_STATE,
        "P-RESUME": NO_TRAINING_STATE,
    }
    assert NO_TRAINING_STATE == "SUT cannot hold a training state (needs F32, I64 and a parameter dtype)"
    assert drawable_properties(REFERENCE_CAPS, faults=True) == default_properties(faults=True)


class ClaimsLittleSut(ReferenceSut):
    """The reference claiming F32 tensors and nothing else: ``fuzz`` must skip what it cannot be given."""

    capabilities = frozenset({"dtype:F32"})


def test_fuzz_skips_and_refuses_as_before(tmp_path: Path, capsys) -> None:
    sut = f"{__name__}:ClaimsLittleSut"
    argv = ["fuzz", "--sut", sut, "--ranks", "1", "--time", "1", "--out", str(tmp_path), "--launch", "in-process",
            "--seed", "1"]
    assert main([*argv, "--property", "P-RESHARD", "--property", "P-EMA", "--property", "P-ROUNDTRIP"]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text(encoding="utf-8"))
    assert summary["skipped_properties"] == {"P-RESHARD": "SUT does not claim 'reshard'", "P-EMA": NO_TRAINING_STATE}
    capsys.readouterr()
    assert main([*argv, "--property", "P-ROUNDTRIP", "--property", "P-ATOMIC"]) == 2
    assert capsys.readouterr().err == "ckpt-harness: error: properties ['P-ATOMIC'] inject faults: add --faults\n"
    assert main([*argv, "--property", "P-NOPE"]) == 2
    assert capsys.readouterr().err == ("ckpt-harness: error: unknown property IDs ['P-NOPE']; see `ckpt-harness "
                                       "list`\n")


def test_checkers() -> None:
    assert {p for p, s in REGISTRY.items() if s.checker is Checker.HISTORY} == {"P-LIFECYCLE", *FAULT_PROPERTIES}
    assert [p for p, s in REGISTRY.items() if s.checker is Checker.DIFF] == ["P-DIFF"]
    plain = Case("P-DIFF", "reference", (), {}, {}, (Op("save", "a", 0), Op("load", "a", 0)))
    assert checker_for(plain) is Checker.DIFF
    # a fault or a job's life makes any case a history case
    corrupt = {"kind": "corrupt", "op": 0, "seed": 1, "corruption": "bitflip"}
    assert checker_for(Case("P-DIFF", "reference", (), {}, {}, plain.ops, fault=corrupt)) is Checker.HISTORY
    assert checker_for(Case("P-ROUNDTRIP", "reference", (), {}, {}, (*plain.ops, Op("restart")))) is Checker.HISTORY


def test_list_note_names_the_fault_properties() -> None:
    assert _faults_note() == ("(P-ATOMIC, P-NOLOSS, P-CORRUPT and P-LIVENESS run with --faults, which also lets "
                              "P-LIFECYCLE and P-RESUME crash a save)")


@pytest.mark.parametrize("prop", IDS)
def test_strategy_draws_valid_cases_for_the_reference(prop: str) -> None:
    @settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(property_cases(prop, "reference", 2, REFERENCE_CAPS, faults=REGISTRY[prop].fault))
    def check(case: Case) -> None:
        assert case.property == prop and case.sut == "reference"
        assert (case.fault is not None) == REGISTRY[prop].fault
        assert Case.from_json(case.to_json()) == case  # a valid, replayable case file

    check()


def test_unknown_property_has_no_strategy() -> None:
    with pytest.raises(ValueError, match="no strategy draws property 'P-NOPE'"):
        property_cases("P-NOPE", "reference", 2)


def test_descriptions_fit_a_table_cell() -> None:
    assert not [p for p, spec in REGISTRY.items() if "|" in spec.description or "\n" in spec.description]


# --- the docs ----------------------------------------------------------------------------------------------------

def _needs(prop: str) -> str:
    spec = REGISTRY[prop]
    return f"`{spec.requires}`" if spec.requires else ("a training state" if spec.training else "—")


def _faults(prop: str) -> str:
    spec = REGISTRY[prop]
    return "needed" if spec.fault else ("may crash a save" if spec.crashes_with_faults else "—")


def test_docs_table_is_the_registry() -> None:
    rows = [line for line in (ROOT / "docs" / "properties.md").read_text(encoding="utf-8").splitlines()
            if line.startswith("| P-")]
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
    assert cells == [[p, s.description, s.checker.value, _needs(p), _faults(p)] for p, s in REGISTRY.items()]


def test_readme_names_the_fault_properties() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    named = re.search(r"--faults` adds the fault properties ([^:]+):", readme)
    assert named is not None
    assert re.split(r", | and ", named.group(1)) == list(FAULT_PROPERTIES)


# --- imports -----------------------------------------------------------------------------------------------------

def _imports(path: Path) -> set[str]:
    """Modules of the properties package that a module of it imports, anywhere in the file."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            module = "properties" + (f".{node.module}" if node.module else "") if node.level else node.module or ""
            if module == "properties":  # from . import x
                out.update(f"properties.{a.name}" for a in node.names)
            elif module.startswith("properties."):
                out.add(module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("properties."))
    return out


def test_properties_package_has_no_import_cycle() -> None:
    graph = {f"properties.{p.stem}": _imports(p) for p in (ROOT / "properties").glob("*.py")}
    state: dict[str, str] = {}

    def visit(node: str, path: tuple[str, ...]) -> None:
        if state.get(node) == "done":
            return
        assert state.get(node) != "open", f"import cycle: {' -> '.join((*path, node))}"
        state[node] = "open"
        for dep in sorted(graph.get(node, ())):
            visit(dep, (*path, node))
        state[node] = "done"

    for module in sorted(graph):
        visit(module, ())
    assert "properties.registry" not in set().union(*(graph[m] for m in graph if m != "properties.registry"))


def test_a_case_names_the_world_and_tensor_kinds_of_each_op() -> None:
    two, one = Sharded(Mesh((2,)), (Shard(0),)).to_json(), Sharded(Mesh((1,)), (Shard(0),)).to_json()
    ops = (Op("save", "a", 0), Op("restart"), Op("load", "a", 0))
    case = Case("P-ROUNDTRIP", "reference", (TensorCase("w", "F32", (4,), 1),), {"w": two}, {"w": one}, ops,
                {"tensor_kinds": {"model": "dist_from_local", "optimizer": "sharded_weight"}})
    assert [case.op_world(i) for i in range(3)] == [2, None, 1]
    assert case.tensor_kinds() == ("dist_from_local", "sharded_weight")
    assert dataclasses.replace(case, options={}).tensor_kinds() == ()
