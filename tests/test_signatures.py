"""Known-finding signatures match anomaly types and fields. Each UC finding's failure (PaddleFormers is not needed)
is rebuilt from its case file with the records its run gives, judged as the harness judges it: the structured
signature explains it, exactly where the legacy line pattern it replaced did, and still does once the text is
reworded; a failure with other facts is not explained."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest

from harness.fixes import own_fixes
from properties.check import anomalies
from properties.check.anomalies import cites_sut_error
from properties.check.history import check_history
from properties.check.oracle import check_diff, check_oracle
from properties.model.case import Case, read_case_file
from properties.model.outcome import OpRecord, Outcome
from properties.model.verdicts import Judgement
from properties.triage.known import Known, explained_by, explanations, read_known, read_signature
from reference.engine import local_tensors
from reference.tensor import Tensor

REGRESSIONS = Path(__file__).parent / "regressions"
SUT = "paddleformers-uc"
# The line patterns the UC findings carried before their signatures were structured.
LEGACY = {
    "async-only-zero-size-save-fails":
        r"\(save [^)]*\): ValueError: rank \d+: 'size' must be a positive number different from zero",
    "async-zero-size-shape-lost": r"expect shape paddle\.Size\(\[[0-9, ]*\]\), but got paddle\.Size\(\[[0-9, ]*\]\)",
    "bf16-nan-payload-sync-save":
        r"elements differ; first at index \[[0-9, ]*\]: expected 0x[0-9a-f]+ \(nan\), got 0x[0-9a-f]+ \(nan\)$",
    "dp2-fp32-resume-on-one-rank": r"Can't find a optimizer index \([^)]*master_weights\.safetensors\.index\.json\)",
    "empty-model-save": r"\(save [^)]*\): IndexError: rank \d+: list index out of range",
    "killed-writer-deadlocks-next-save": r"\(save [^)]*\): hang: rank \d+ did not finish op \d+",
    "pdc-async-no-checkpoint-found":
        r"\(load latest\): FileNotFoundError: rank \d+: get_last_checkpoint found no checkpoint-N under",
    "zero-size-param-dp2": r"Size of tensor should be greater than 0",
    # Found after the signatures were structured: the line patterns they would have carried.
    "failed-save-breaks-later-saves": r"\(save [^)]*\): (ValueError: rank \d+: 'size' must be a positive number|"
                                      r"AssertionError: rank \d+: checkpoint saving time timer has already started)",
    "missing-checkpoint-wedges-group": r"no longer loads: .*RuntimeError: rank \d+: .*gloo/transport/tcp/pair\.cc",
    "crashed-save-taken-as-latest":
        r"\(load latest\): resume lost: .*ValueError: rank \d+: Can't find a valid checkpoint at \S*checkpoint-\d+",
    "non-merged-optimizer-single-card": r"\(load [^)]*\): KeyError: rank \d+: 'weight_map'",
}
PAIR_TIMEOUT = ("rank 0: [/paddle/third_party/gloo/gloo/transport/tcp/pair.cc:584] TIMEOUT self_rank = 0 pair_rank = 1 "
                "peer_str = [127.0.0.1]:5013")


def _failed(rec: OpRecord, error_type: str, message: str, failure: str | None = None) -> OpRecord:
    return dataclasses.replace(rec, ok=False, error_type=error_type, error=message, failure=failure)


def _state(case: Case, version: int, rank: int = 0) -> dict[str, Tensor]:
    return {n: lt.tensor for n, lt in local_tensors(case.expected(version, "load"), case.layouts("load"), rank).items()}


def _nan_payloads_canonicalised(case: Case, version: int) -> dict[int, dict[str, Tensor]]:
    """What UC's sync save gives back: every BF16 NaN as the canonical quiet NaN."""
    state = _state(case, version)
    for name, t in state.items():
        if t.dtype.name == "BF16":
            bits = t.bits.copy()
            nan = ((bits & 0x7F80) == 0x7F80) & ((bits & 0x7F) != 0)
            bits[nan] = (bits[nan] & 0x8000) | 0x7FC0
            state[name] = Tensor(t.dtype, bits.astype(np.uint16))
    return {0: state}


def _records(stem: str, case: Case) -> list[OpRecord]:
    """The records a run of the finding's case gives on UC (its failure as FINDINGS.md describes it)."""
    recs = [OpRecord(i, op.kind, op.name) for i, op in enumerate(case.ops)]
    if stem == "async-only-zero-size-save-fails":
        recs[0] = _failed(recs[0], "ValueError", "rank 1: 'size' must be a positive number different from zero")
        recs[1] = _failed(recs[1], "FileNotFoundError", "rank 0: no checkpoint-1 under the output dir")
    elif stem == "async-zero-size-shape-lost":
        recs[1] = _failed(recs[1], "ValueError", "rank 0: (InvalidArgument) expect shape paddle.Size([0, 4]), but "
                                                 "got paddle.Size([0])")
    elif stem == "bf16-nan-payload-sync-save":
        recs[1].loaded = _nan_payloads_canonicalised(case, case.ops[1].version)
    elif stem == "dp2-fp32-resume-on-one-rank":
        recs[1] = _failed(recs[1], "ValueError", "rank 0: Can't find a optimizer index (out/checkpoint-1/"
                                                 "master_weights.safetensors.index.json)")
    elif stem == "empty-model-save":
        recs[0] = _failed(recs[0], "IndexError", "rank 0: list index out of range")
        recs[1] = _failed(recs[1], "FileNotFoundError", "rank 0: no checkpoint-1")
    elif stem == "killed-writer-deadlocks-next-save":
        recs[3] = _failed(recs[3], "hang", "rank 0 did not finish op 3", "hang")
        recs = recs[:4]  # the harness stops the ranks after a hang
    elif stem == "pdc-async-no-checkpoint-found":
        recs[2] = _failed(recs[2], "FileNotFoundError", "rank 0: get_last_checkpoint found no checkpoint-N under out")
    elif stem == "zero-size-param-dp2":
        recs[1] = _failed(recs[1], "OSError", "rank 1: (PreconditionNotMet) Size of tensor should be greater than 0.")
    elif stem == "failed-save-breaks-later-saves":
        recs[0] = _failed(recs[0], "ValueError", "rank 0: 'size' must be a positive number different from zero")
        recs[1] = _failed(recs[1], "AssertionError", "rank 0: checkpoint saving time timer has already started")
    elif stem == "missing-checkpoint-wedges-group":
        recs[1] = _failed(recs[1], "ValueError", "rank 0: Can't find a valid checkpoint at out/checkpoint-999 -- "
                                                 "out/checkpoint-999/model_state.pdparams")
        recs[2] = _failed(recs[2], "RuntimeError", PAIR_TIMEOUT)
        recs[4].loaded = {rank: {n: lt.tensor for n, lt in local_tensors(  # after the restart it loads
            case.expected(0, "save"), case.layouts("save"), rank).items()} for rank in (0, 1)}
    elif stem == "crashed-save-taken-as-latest":  # rank 0 killed in the second save, both directories listed
        recs[0] = dataclasses.replace(recs[0], complete=("step-0",))
        recs[1] = dataclasses.replace(_failed(recs[1], "crash", "rank 0 died", "crash"), dead=(0,), restarted=True,
                                      complete=("step-0", "step-1"))
        recs[2] = _failed(recs[2], "ValueError", "rank 0: Can't find a valid checkpoint at out/checkpoint-1 -- "
                                                 "out/checkpoint-1/model_state.pdparams")
    elif stem == "non-merged-optimizer-single-card":
        recs[1] = _failed(recs[1], "KeyError", "rank 0: 'weight_map'")
    return recs


def _judged(case: Case, recs: list[OpRecord]) -> Judgement:
    """As harness.fuzz.Judge judges a case (a fault case by its history, the fault excusing the faulted op)."""
    outcome = Outcome(SUT, recs)
    if case.sequence or case.fault is not None or case.property == "P-ATOMIC":
        return check_history(case, outcome, None)
    return check_oracle(case, outcome)


# The UC findings that carry a signature; those recorded since a known bug is identified by its fix carry none.
FINDINGS = [p for p in sorted(REGRESSIONS.glob(f"{SUT}-*.json")) if "signature" in json.loads(p.read_text())]


def test_a_uc_finding_without_a_signature_is_known_by_its_fix() -> None:
    unsigned = [p.stem for p in sorted(REGRESSIONS.glob(f"{SUT}-*.json")) if p not in FINDINGS]
    assert unsigned and all(own_fixes(stem) for stem in unsigned), unsigned


@pytest.fixture(scope="module")
def known() -> list[Known]:
    return read_known(REGRESSIONS)


@pytest.mark.parametrize("path", FINDINGS, ids=[p.stem for p in FINDINGS])
def test_the_structured_signature_explains_what_the_legacy_pattern_did(path: Path, known: list[Known]) -> None:
    case, finding = read_case_file(path)
    stem = path.stem.removeprefix(f"{SUT}-")
    assert isinstance(finding["signature"], dict), "UC findings carry structured signatures"
    j = _judged(case, _records(stem, case))
    assert j.verdict.value == finding["verdict"] and finding["expect"] in "\n".join(j.details), j
    assert all(re.search(LEGACY[stem], line) for line in j.details), j.details  # the failure it stood for
    assert path.name in (explanations(known, SUT, j) or ())  # beside the known bug that set it off, if any
    legacy = Known(path.name, SUT, finding["verdict"], read_signature(LEGACY[stem]))
    assert explained_by([legacy], SUT, j) == path.name  # the legacy string form explains it too


@pytest.mark.parametrize("path", FINDINGS, ids=[p.stem for p in FINDINGS])
def test_a_reworded_message_is_still_recognised(path: Path, known: list[Known],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    case, _ = read_case_file(path)
    for cls in anomalies.TYPES.values():
        monkeypatch.setattr(cls, "render", lambda self: f"reworded {self.kind}")
        monkeypatch.setattr(cls, "lines", lambda self: (f"reworded {self.kind}",))
    j = _judged(case, _records(path.stem.removeprefix(f"{SUT}-"), case))
    assert all(line.startswith("reworded") for line in j.details)
    assert path.name in (explanations(known, SUT, j) or ())


def _judged_by_diff(case: Case, recs: list[OpRecord]) -> Judgement:
    """The same run seen by P-DIFF: the reference engine's run of the case succeeds and loads what it must."""
    diff = dataclasses.replace(case, property="P-DIFF")
    ref = [OpRecord(r.index, r.kind, r.name, loaded={0: _state(case, op.version)} if op.kind == "load" else {})
           for r, op in zip(recs, case.ops)]
    return check_diff(diff, Outcome(SUT, recs), Outcome("reference", ref))


def _names_an_error(path: Path) -> bool:
    sig = read_signature(json.loads(path.read_text(encoding="utf-8"))["signature"])
    return any(way.names_error for way in (sig if isinstance(sig, tuple) else (sig,)))


# P-DIFF draws no faults: a fault case's failure is the history checker's alone.
ERROR_FINDINGS = [p for p in FINDINGS if _names_an_error(p) and "fault" not in json.loads(p.read_text())["case"]]


@pytest.mark.parametrize("path", ERROR_FINDINGS, ids=[p.stem for p in ERROR_FINDINGS])
def test_p_diff_sees_the_finding_too(path: Path, known: list[Known]) -> None:
    """P-DIFF reports a failing op as a disagreement with the reference; a signature that names the SUT's error
    recognises it there too, whatever verdict P-DIFF gives it (the error names the bug, not the rule that caught
    it), where the line pattern it replaced could not (P-DIFF words the lines its own way)."""
    case, _ = read_case_file(path)
    stem = path.stem.removeprefix(f"{SUT}-")
    j = _judged_by_diff(case, _records(stem, case))
    assert not j.ok
    finding = next(k for k in known if k.case_file == path.name)
    assert any(finding.matches(SUT, a) for a in j.anomalies if cites_sut_error(a)), j


def test_the_zero_size_shape_loss_is_known_by_either_check_that_sees_it(known: list[Known]) -> None:
    """UC's async save loses an empty tensor's shape; the resume fails in the optimizer's check ("expect shape")
    or, for an all-zero shape, in the model's own ("receives a shape"): one bug, one signature."""
    path = REGRESSIONS / f"{SUT}-async-zero-size-shape-lost.json"
    case, _ = read_case_file(path)
    recs = _records("async-zero-size-shape-lost", case)
    message = ("rank 0: Error(s) in loading state dict for HarnessModel: ['Skip loading for b. b receives a shape "
               "[0], but the expected shape is [0, 0].']")
    recs[1] = _failed(recs[1], "RuntimeError", message)
    assert explained_by(known, SUT, _judged(case, recs)) == path.name


def test_other_facts_are_not_explained(known: list[Known]) -> None:
    path = REGRESSIONS / f"{SUT}-empty-model-save.json"
    case, _ = read_case_file(path)
    recs = _records("empty-model-save", case)
    assert explained_by(known, SUT, _judged(case, recs)) == path.name
    for change in ({"error_type": "KeyError"}, {"error": "rank 0: list assignment index out of range"}):
        other = [dataclasses.replace(recs[0], **change), *recs[1:]]
        assert explained_by(known, SUT, _judged(case, other)) is None, change
    load_failed = [OpRecord(0, "save", "step-1"), recs[1]]  # only the load fails: another op
    assert explained_by(known, SUT, _judged(case, load_failed)) is None
    nan = REGRESSIONS / f"{SUT}-bf16-nan-payload-sync-save.json"
    case, _ = read_case_file(nan)
    rec = OpRecord(1, "load", "step-1", loaded={0: _state(case, 1)})  # a stale version: not NaN payloads
    assert explained_by(known, SUT, _judged(case, [OpRecord(0, "save", "step-1"), rec])) is None
