"""A verdict of "pass" says when it is not a plain pass: a failure a known finding explains, a fault case that
fails without its fault too, a case that could not run here. The hidden failure's anomalies stay attached."""

from __future__ import annotations

import json
from pathlib import Path

from harness.judging.judge import Judge
from harness.ranks.runners import Runners
from properties.generate.fault_cases import fault_ops
from properties.model.case import Case, Op, TensorCase
from properties.model.verdicts import Excuse, Verdict
from properties.triage.known import read_known
from reference.layout import Mesh, Replicate, Sharded

FLIPS = "tests.suts.buggy:FlipsLastElementSut"


def _case(prop: str, ops: tuple[Op, ...], fault: dict | None = None, world: int = 1) -> Case:
    layout = {"model/w": Sharded(Mesh((world,)), (Replicate(),)).to_json()}
    return Case(prop, FLIPS, (TensorCase("model/w", "F32", (4,), 7),), layout, layout, ops, {}, 0, fault=fault)


def test_a_plain_failure_and_a_plain_pass_carry_no_excuse() -> None:
    judge = Judge(Runners(FLIPS, mode="in-process"))
    try:
        judgement, _ = judge(_case("P-ROUNDTRIP", (Op("save", "a", 0), Op("load", "a", 0))))
    finally:
        judge.close()
    assert judgement.verdict is Verdict.SILENT_CORRUPTION and judgement.excuse is None
    assert [a.kind for a in judgement.anomalies] == ["tensor-differs"]


def test_a_known_failure_passes_excused_as_known(tmp_path: Path) -> None:
    signature = {"anomaly": "tensor-differs"}
    (tmp_path / "flips.json").write_text(json.dumps({"sut": FLIPS, "verdict": "silent-corruption",
                                                     "signature": signature}))
    judge = Judge(Runners(FLIPS, mode="in-process"), known=read_known(tmp_path))
    try:
        judgement, _ = judge(_case("P-ROUNDTRIP", (Op("save", "a", 0), Op("load", "a", 0))))
    finally:
        judge.close()
    assert judgement.ok and judgement.excuse is Excuse.KNOWN
    assert judgement.details[0].startswith("known finding flips.json: ")
    assert [a.kind for a in judgement.anomalies] == ["tensor-differs"]
    assert judge.known_hits == {"flips.json": 1}


def test_a_fault_case_that_fails_without_its_fault_passes_excused_as_unattributed() -> None:
    fault = {"kind": "corrupt", "op": 1, "seed": 3, "corruption": "append", "region": "tail"}
    judge = Judge(Runners(FLIPS, mode="pool"))
    try:
        judgement, _ = judge(_case("P-CORRUPT", fault_ops(latest=True), fault, world=2))
    finally:
        judge.close()
    assert judgement.ok and judgement.excuse is Excuse.UNATTRIBUTED, judgement
    assert judgement.details[0].startswith("not attributed to the fault: the case fails without it too")
    assert judgement.anomalies  # what the faulted run saw, kept for triage
