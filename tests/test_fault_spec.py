"""Typed faults (faults.spec): every fault in a case or finding file parses to its kind's type and serialises back to
exactly the JSON object it came from; every type is armed (harness.judging.inject.ARMING); a malformed fault is one line
naming the problem; the ``corrupt`` op and the ``corrupt`` fault are one mechanism."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from faults.corrupt import corrupt
from faults.errors import FaultSpecError
from faults.spec import FAULT_TYPES, CorruptFault, Fault, KillFault, KillWhenFault, parse_fault
from harness.judging.fault_runs import standard_case
from harness.judging.inject import ARMING
from properties.generate.fault_cases import faults
from properties.model.case import Case, CaseError, Op, read_case_file
from properties.registry import FAULT_PROPERTIES

TESTS = Path(__file__).parent
FILES = sorted((TESTS / "regressions").glob("*.json")) + sorted((TESTS / "fault_cases").glob("*.json"))
WITH_FAULT = [p for p in FILES if "fault" in json.loads(p.read_text()).get("case", json.loads(p.read_text()))]
CASE = standard_case()  # 7 ops; op 1 is the faulted save

EVERY_KIND = [  # every kind with every field it takes, and with only the required ones
    {"kind": "kill", "op": 1, "syscall": "write", "k": 2, "path": "step-1/a.bin"},
    {"kind": "kill", "op": 1, "syscall": "rename", "k": 1},
    {"kind": "error", "op": 1, "syscall": "openat", "k": 2, "path": ".", "errno": "EIO"},
    {"kind": "error", "op": 1, "syscall": "fsync", "k": 1, "errno": "ENOSPC"},
    {"kind": "fsize", "op": 1, "limit": 64},
    {"kind": "kill-when", "op": 1, "rank": 0, "target": "children", "bytes_written": 256},
    {"kind": "kill-when", "op": 1, "file_appears": "step-1/*.tmp"},
    {"kind": "stall", "op": 1, "rank": 1, "duration": 0.5, "delay": 0.0},
    {"kind": "stall", "op": 1, "duration": 3, "bytes_written": 1},
    {"kind": "state", "op": 1, "state": {"kind": "prefix", "prefix": 3}, "schedule": [0, 1, -1]},
    {"kind": "state", "op": 1, "state": {}},
    {"kind": "corrupt", "op": 1, "seed": 3, "corruption": "bitflip", "region": "tail"},
    {"kind": "corrupt", "op": 1, "seed": 0, "corruption": "delete"},
    {"kind": "corrupt", "op": 1, "plan": {"kind": "delete", "path": "step-1/index.json"}},
    {"kind": "point", "op": 1, "index": 7, "syscalls": ["write"], "action": "EDQUOT"},
    {"kind": "point", "op": 1, "index": 0},
    {"kind": "power", "op": 1, "index": 40},
    {"kind": "record", "op": 1, "capture": True, "keep_base": False},
    {"kind": "record", "op": 1},
]


def _fault_of(path: Path) -> tuple[dict, int]:
    data = json.loads(path.read_text())
    case = data.get("case", data)
    return case["fault"], len(case["ops"])


def test_the_checked_in_files_hold_faults() -> None:
    assert len(WITH_FAULT) >= 5 and any(p.parent.name == "fault_cases" for p in WITH_FAULT)


@pytest.mark.parametrize("path", WITH_FAULT, ids=lambda p: p.stem)
def test_every_fault_in_a_case_file_parses_and_serialises_back_exactly(path: Path) -> None:
    raw, n_ops = _fault_of(path)
    fault = parse_fault(raw, n_ops)
    assert type(fault) is FAULT_TYPES[raw["kind"]]
    assert fault.to_json() == raw
    case, _ = read_case_file(path)
    assert case.fault == fault and case.to_json()["fault"] == raw


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_every_case_file_round_trips_byte_for_byte(path: Path) -> None:
    data = json.loads(path.read_text())
    case, finding = read_case_file(path)
    again = {**finding, "case": case.to_json()} if finding else case.to_json()
    assert json.loads(json.dumps(again)) == data
    if path.parent.name == "regressions":  # written by the harness (findings), so byte for byte too
        assert json.dumps(again, indent=1, sort_keys=True) + "\n" == path.read_text()


def test_every_kind_is_covered_here() -> None:
    assert {raw["kind"] for raw in EVERY_KIND} == set(FAULT_TYPES)


@pytest.mark.parametrize("raw", EVERY_KIND, ids=lambda r: f"{r['kind']}-{len(r)}")
def test_every_kind_round_trips(raw: dict) -> None:
    fault = parse_fault(raw, len(CASE.ops))
    assert fault.kind == raw["kind"] and fault.op == raw["op"]
    assert fault.to_json() == raw
    assert parse_fault(fault.to_json(), len(CASE.ops)) == fault
    case = dataclasses.replace(CASE, fault=raw)  # a case made with the JSON object holds the typed fault
    assert case.fault == fault and case.to_json()["fault"] == raw
    assert Case.from_json(json.loads(case.dumps())) == case


def test_an_explicit_null_is_written_back() -> None:
    raw = {"kind": "kill", "op": 1, "syscall": "write", "k": 1, "path": None}
    fault = parse_fault(raw, 6)
    assert fault == KillFault(op=1, syscall="write", k=1) and fault.to_json() == raw


def test_only_point_and_power_are_drawn() -> None:
    assert {kind for kind, cls in FAULT_TYPES.items() if cls.drawn} == {"point", "power"}


def _kinds(cls: type) -> set[type]:
    """Every concrete fault type below ``cls`` (one that names a kind)."""
    out = {cls} if "kind" in vars(cls) else set()
    for sub in cls.__subclasses__():
        out |= _kinds(sub)
    return out


def test_every_fault_type_has_a_kind_and_an_arming() -> None:
    assert _kinds(Fault) == set(FAULT_TYPES.values())
    assert set(ARMING) == _kinds(Fault), "a fault type without an entry in harness.judging.inject.ARMING"


def test_a_case_keeps_working_with_dataclasses_replace() -> None:
    kill = dataclasses.replace(CASE, fault={"kind": "kill", "op": 1, "syscall": "write", "k": 1})
    assert isinstance(kill.fault, KillFault)
    assert dataclasses.replace(kill, fault=None).fault is None
    typed = KillWhenFault(op=1, delay=0.0)
    assert dataclasses.replace(CASE, fault=typed).fault is typed
    assert "fault" not in CASE.to_json()


@pytest.mark.parametrize("make, message", [
    (lambda: KillFault(op=1, syscall="write", k=0), "k must be an int >= 1, got 0"),
    (lambda: KillWhenFault(op=1), "exactly one trigger"),
    (lambda: CorruptFault(op=1, seed=1), "corruption must be one of"),
    (lambda: dataclasses.replace(CASE, fault={"kind": "kill", "op": 7, "syscall": "write", "k": 1}),
     "fault op must be the index of one of the case's 7 ops, got 7"),
])
def test_a_fault_made_in_code_is_checked_like_a_parsed_one(make, message: str) -> None:
    with pytest.raises(FaultSpecError, match=message.replace("(", r"\(")):
        make()


def test_a_case_file_with_a_bad_fault_names_the_file_and_the_problem(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    data = CASE.to_json()
    data["fault"] = {"kind": "error", "op": 1, "syscall": "write", "k": 1, "errno": "EPERM"}
    path.write_text(json.dumps(data))
    with pytest.raises(CaseError) as info:
        read_case_file(path)
    assert str(info.value) == f"{path}: bad fault: errno must be one of ('ENOSPC', 'EIO', 'EDQUOT'), got 'EPERM'"
    data["fault"] = ["kill"]  # not an object at all: a malformed case, as before
    path.write_text(json.dumps(data))
    with pytest.raises(CaseError) as info:
        read_case_file(path)
    assert str(info.value) == f"{path}: malformed case (ValueError: fault must be a JSON object, got list)"


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_drawn_faults_are_typed_and_round_trip(data) -> None:
    prop = data.draw(st.sampled_from(FAULT_PROPERTIES))
    fault = data.draw(faults(prop, 2, data.draw(st.booleans()), data.draw(st.booleans())))
    assert isinstance(fault, Fault) and type(fault) in ARMING
    assert parse_fault(fault.to_json(), len(CASE.ops)) == fault


def _tree(root: Path) -> Path:
    for n in range(3):
        (root / f"step-{n}").mkdir(parents=True)
        (root / f"step-{n}" / "data.bin").write_bytes(bytes(range(256)) * (n + 1))
    return root


@pytest.mark.parametrize("kind", ["bitflip", "truncate", "append", "delete", "stale_marker", "zero_range"])
def test_the_corrupt_op_and_the_corrupt_fault_are_one_mechanism(tmp_path: Path, kind: str) -> None:
    by_op = Op("corrupt", seed=5, corruption=kind).corruption_fault(3).inflict(_tree(tmp_path / "op"))
    by_fault = CorruptFault(op=1, seed=5, corruption=kind).inflict(_tree(tmp_path / "fault"))
    assert by_op == by_fault == corrupt(_tree(tmp_path / "plain"), kind, 5)  # the same seeded draw
    # the concrete plan a finding keeps replays the same damage
    replayed = CorruptFault(op=1, plan=by_fault.to_json()).inflict(_tree(tmp_path / "replay"))
    assert replayed == by_fault
    assert _files(tmp_path / "replay") == _files(tmp_path / "fault")


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
