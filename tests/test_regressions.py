"""Every finding under tests/regressions/ replays and still shows today's verdict.

A finding is a bug in a system under test, not in the harness: these tests assert the bug is still there, so
the day upstream fixes it this test fails and the finding is retired (moved out of FINDINGS.md's open list).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.fixes import covering, resolve
from harness.judging.judge import Judge
from harness.ranks.runners import Runners
from harness.sut import REGISTRY, framework_available
from properties.model.case import Case, CaseError, read_case_file
from properties.model.verdicts import Judgement
from properties.triage.known import explanations, read_known

CASES = sorted((Path(__file__).parent / "regressions").glob("*.json"))


def _judged(case: Case, runners: Runners, attempts: int = 3) -> Judgement:
    """The case judged on ``runners`` (tests/conftest.py WarmRunners: warm ranks, fresh launches nightly, virtual
    ranks for a finding larger than real ranks here). A power-loss state replays only where the ranks interleave
    their IO as recorded (the judge tries several runs), and what a killed rank leaves depends on how far the other
    ranks' IO got when it died: on a loaded machine a whole attempt may miss either, so a few are made."""
    judgement = None
    for attempt in range(attempts):
        judge_case = Judge(runners)
        try:
            judgement = judge_case(case)[0]
        except CaseError as exc:
            if "cannot be replayed on this machine" not in str(exc) or attempt == attempts - 1:
                raise
            continue
        finally:
            judge_case.close(runners=False)
        if not (judgement.ok and case.fault is not None):
            return judgement
    if judgement is None:
        raise AssertionError(f"no attempt made ({attempts})")
    return judgement


@pytest.mark.multirank
@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_finding_still_reproduces(path: Path, warm_runners) -> None:
    case, finding = read_case_file(path)
    info = REGISTRY.get(case.sut)
    if info is not None and not framework_available(info):
        how = ("its own environment (README: PaddleFormers)" if info.framework == "paddleformers"
               else f"pip install -e '.[{info.framework}]'")
        pytest.skip(f"{case.sut} needs {info.framework}: {how}")
    needs = resolve(",".join(finding.get("needs_fixes") or ()))  # shown only behind known bugs' fixes (and theirs)
    runners = warm_runners.get(case.sut, finding.get("launch", "fresh"), needs)
    judgement = _judged(case, runners)
    # A racy bug may show one of several ways; each way is listed with what its failure says ("or").
    ways = [finding, *finding.get("or", [])]
    said = "\n".join(judgement.details)
    way = next((w for w in ways if judgement.verdict.value == w["verdict"] and w["expect"] in said), None)
    expected = [(w["verdict"], w["expect"]) for w in ways]
    assert way is not None, f"{judgement.verdict.value}, expected one of {expected}:\n{said}"
    # What `fuzz --skip-known` recognises explains the real failure: this finding's signature explains some of the
    # anomalies and known findings the others (a case may show several bugs at once: a version cache behind a wrong
    # "latest", a poisoned load after a failed one). A face of a bug recorded elsewhere (``same_root_cause``) has no
    # signature of its own: that finding's must recognise this face too.
    owner = finding.get("same_root_cause", path.name if "signature" in finding else None)
    if owner is not None and way is finding:
        found = explanations(read_known(path.parent), case.sut, judgement)
        if found is None or owner not in found:
            # A racy bug may fail in a way its signature does not name (a kill landing a write later); a campaign
            # then knows it by the patch that fixes it (Judge.prove), and so does this test.
            assert _passes_with_own_fix(case, owner, runners, needs), \
                [a.to_json() for a in judgement.anomalies] or judgement.details


def _passes_with_own_fix(case: Case, owner: str, runners: Runners, needs: tuple[str, ...] = ()) -> bool:
    """Whether the case passes, its fault fired, with the fix that covers finding ``owner`` applied (behind the
    fixes the finding ``needs``)."""
    fixes = covering(owner)
    if not fixes:
        return False
    judge_case = Judge(runners)
    try:
        judged = judge_case.judged_with(case, (*needs, *fixes))
    finally:
        judge_case.close(runners=False)
    return judged is not None and judged[0].ok and (
        case.fault is None or bool((judged[1].fault or {}).get("fired")))


def test_every_finding_is_listed_in_findings_md() -> None:
    listed = (Path(__file__).parent.parent / "FINDINGS.md").read_text()
    for path in CASES:
        data = json.loads(path.read_text())
        assert path.name in listed, f"{path.name} is not in FINDINGS.md"
        assert {"property", "sut", "verdict", "case", "expect"} <= data.keys(), path.name
