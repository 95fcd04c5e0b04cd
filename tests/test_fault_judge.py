"""The one rule fault cases are judged by (properties.check.history.check_history), on synthetic outcomes, and the typed
errors a malformed fault gets (faults.spec.parse_fault, the CLI)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from faults.errors import FaultSpecError
from faults.spec import parse_fault
from harness.judging.fault_runs import standard_case
from properties.check.history import check_history
from properties.model.outcome import OpRecord, Outcome
from reference.engine import local_tensors

REPO = Path(__file__).resolve().parent.parent
CASE = standard_case()  # save 0, save 1 (faulted), load latest, load step-1, load step-0, save 2, load step-2


def _loaded(version: int) -> dict:
    layouts = CASE.layouts("load")
    return {r: {n: lt.tensor for n, lt in local_tensors(CASE.state(version), layouts, r).items()} for r in (0, 1)}


OLD, NEW = _loaded(0), _loaded(1)
NOT_FOUND = ("CheckpointNotFound", None)


def _mixed() -> dict:
    out = _loaded(0)
    out[1] = _loaded(1)[1]  # rank 1's half from the new save, rank 0's from the old one
    return out


def _outcome(save1_ok: bool, latest, step0, *, fault_report: dict | None = None, save2_ok: bool = True) -> Outcome:
    def load(index: int, name, result) -> OpRecord:
        if isinstance(result, tuple):  # (error type, failure kind)
            return OpRecord(index, "load", name, ok=False, error_type=result[0], error="x", failure=result[1])
        return OpRecord(index, "load", name, loaded=result)

    recs = [
        OpRecord(0, "save", "step-0"),
        OpRecord(1, "save", "step-1", ok=save1_ok, failure=None if save1_ok else "crash"),
        load(2, None, latest),
        load(3, "step-1", NOT_FOUND if latest is OLD else latest),  # step-1 by name: absent unless it won
        load(4, "step-0", step0),
        OpRecord(5, "save", "step-2", ok=save2_ok, error_type=None if save2_ok else "OSError"),
        load(6, "step-2", _loaded(2)),
    ]
    return Outcome("reference", recs, fault=fault_report or {"kind": "kill", "fired": True})


KILL = dataclasses.replace(CASE, fault={"kind": "kill", "op": 1, "syscall": "write", "k": 1, "path": "x"})
CLEAR = {"CheckpointIncomplete", "CheckpointNotFound"}


@pytest.mark.parametrize("latest, step0, verdict, prop", [
    (OLD, OLD, "pass", "P-ATOMIC"),  # the crash left the old checkpoint as latest
    (NEW, OLD, "pass", "P-ATOMIC"),  # ... or the new one, complete
    # latest fails while step-0 sits intact (op 4 loads it): the job cannot resume, clear error or not
    (("CheckpointIncomplete", None), OLD, "data-loss", "P-NOLOSS"),
    (("KeyError", None), OLD, "data-loss", "P-NOLOSS"),
    (_mixed(), OLD, "silent-corruption", "P-ATOMIC"),  # a mix of the two
    (OLD, ("CheckpointNotFound", None), "data-loss", "P-NOLOSS"),  # the acknowledged one is gone
    (OLD, NEW, "silent-corruption", "P-NOLOSS"),  # ... or now loads other data
    (OLD, ("hang", "hang"), "hang", "P-LIVENESS"),
])
def test_crash_during_save(latest, step0, verdict: str, prop: str) -> None:
    j = check_history(KILL, _outcome(False, latest, step0), CLEAR)
    assert j.verdict.value == verdict, j
    if verdict != "pass":
        assert j.property == prop


def test_acknowledged_save_must_load_back() -> None:
    # an injected ENOSPC the SUT swallowed: the save said yes, so older data or an error is data loss
    err = dataclasses.replace(CASE, fault={"kind": "error", "op": 1, "syscall": "write", "k": 1, "errno": "ENOSPC"})
    assert check_history(err, _outcome(True, NEW, OLD), CLEAR).ok
    older = check_history(err, _outcome(True, OLD, OLD), CLEAR)
    assert older.verdict.value == "data-loss" and "older checkpoint" in older.details[0]
    gone = check_history(err, _outcome(True, ("CheckpointIncomplete", None), OLD), CLEAR)
    assert gone.verdict.value == "data-loss"


def test_power_loss_before_the_save_returned_is_not_an_acknowledgement() -> None:
    state = dataclasses.replace(CASE, fault={"kind": "state", "op": 1, "state": {}})
    report = {"kind": "state", "fired": True, "acknowledged": False}
    assert check_history(state, _outcome(True, OLD, OLD, fault_report=report), CLEAR).ok
    report["acknowledged"] = True  # all of the save's IO was issued: it had returned
    assert check_history(state, _outcome(True, OLD, OLD, fault_report=report), CLEAR).verdict.value \
        == "data-loss"


def test_corruption_may_fail_clearly_but_never_load_wrong_data() -> None:
    corrupt = dataclasses.replace(CASE, fault={"kind": "corrupt", "op": 1, "seed": 1, "corruption": "bitflip"})
    assert check_history(corrupt, _outcome(True, ("ChecksumMismatch", None), OLD), CLEAR | {
        "ChecksumMismatch"}).ok
    wrong = check_history(corrupt, _outcome(True, NEW, _mixed()), CLEAR)
    assert wrong.verdict.value == "silent-corruption" and wrong.property == "P-CORRUPT"
    unclear = check_history(corrupt, _outcome(True, ("UnicodeDecodeError", None), OLD), CLEAR)
    assert unclear.verdict.value == "loud-failure" and unclear.property == "P-CORRUPT"


def test_a_sut_without_typed_errors_gets_any_error_as_clear() -> None:
    outcome = _outcome(False, OLD, OLD)
    outcome.records[3] = OpRecord(3, "load", "step-1", ok=False, error_type="EOFError", error="x")
    assert check_history(KILL, outcome, None).ok
    assert not check_history(KILL, outcome, CLEAR).ok  # with typed errors, an EOFError is not one of them


def test_recovery_save_must_work() -> None:
    j = check_history(KILL, _outcome(False, OLD, OLD, save2_ok=False), CLEAR)
    assert j.verdict.value == "loud-failure" and "after the fault" in j.details[0]


def test_a_non_kill_fault_must_not_kill_a_rank() -> None:
    err = dataclasses.replace(CASE, fault={"kind": "error", "op": 1, "syscall": "write", "k": 1, "errno": "EIO"})
    j = check_history(err, _outcome(False, OLD, OLD), CLEAR)
    assert j.verdict.value == "crash" and j.property == "P-LIVENESS"


@pytest.mark.parametrize("fault, message", [
    ([], "must be an object"),
    ({"kind": "meteor", "op": 1}, "not one of"),
    ({"kind": "kill", "op": 9, "syscall": "write", "k": 1}, "index of one of the case's"),
    ({"kind": "kill", "op": 1, "syscall": "write"}, "missing ['k']"),
    ({"kind": "kill", "op": 1, "syscall": "write", "k": 0}, "k must be an int >= 1"),
    ({"kind": "kill", "op": 1, "syscall": "wr ite", "k": 1}, "syscall name"),
    ({"kind": "kill", "op": 1, "syscall": "write", "k": 1, "path": "../etc/passwd"}, "checkpoint dir"),
    ({"kind": "kill", "op": 1, "syscall": "write", "k": 1, "path": "/abs"}, "absolute"),
    ({"kind": "error", "op": 1, "syscall": "write", "k": 1, "errno": "EPERM"}, "errno must be one of"),
    ({"kind": "kill-when", "op": 1, "delay": 1, "bytes_written": 3}, "exactly one trigger"),
    ({"kind": "stall", "op": 1, "delay": 0, "duration": -1}, "stall duration"),
    ({"kind": "corrupt", "op": 1, "seed": 1}, "corruption must be one of"),
    ({"kind": "corrupt", "op": 1, "plan": {}, "seed": 1, "corruption": "bitflip"}, "either a plan"),
    ({"kind": "point", "op": 1, "index": 0, "action": "EPERM"}, "point action"),
    ({"kind": "kill", "op": 1, "syscall": "write", "k": 1, "colour": "red"}, "unknown ['colour']"),
])
def test_malformed_faults_are_typed_errors(fault, message: str) -> None:
    with pytest.raises(FaultSpecError, match=message.replace("[", r"\[").replace("(", r"\(")):
        parse_fault(fault, 6)


def test_cli_names_a_malformed_fault_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    data = CASE.to_json()
    data["fault"] = {"kind": "kill", "op": 1, "syscall": "write", "k": -3}
    path.write_text(json.dumps(data))
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "replay", str(path)], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert proc.returncode == 2, proc.stderr
    expected = f"ckpt-harness: error: {path}: bad fault: k must be an int >= 1, got -3"
    assert proc.stderr.strip().splitlines() == [expected]
