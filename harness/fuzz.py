"""Time-bounded fuzzing: draw cases per property with Hypothesis, run them on real ranks, judge them, shrink
failures, and write findings, a summary and a report (DESIGN.md §8, a contract)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed

from faults.errors import TraceMismatch
from properties.atomic import judge_history
from properties.case import Case, CaseError
from properties.drawing import property_cases
from properties.judge import judge, judge_diff
from properties.known import Known, explained_by
from properties.outcome import Outcome
from properties.verdicts import Judgement, Verdict

from .run import Runners, run_case

STATE_ATTEMPTS = 8  # runs tried for a power-loss state whose recorded IO interleaving must recur
BATCH = 10  # examples per Hypothesis run; properties take turns between batches
SHRINK_BUDGET = 60.0  # seconds of shrinking per finding (at least): a failing Paddle case can cost a relaunch


class _Failed(AssertionError):
    pass


class _Unreplayable(Exception):
    """A drawn power-loss state whose IO interleaving did not recur (fuzzing skips it; replay reports it)."""


@dataclass
class Finding:
    case: Case
    judgement: Judgement
    shims: tuple[str, ...] = ()
    traceback: str | None = None
    fault: dict | None = None  # what the fault did in the failing run (mechanism, whether and where it fired)

    def to_json(self, replay: str) -> dict:
        details = list(self.judgement.details)
        return {
            "property": self.judgement.property,
            "sut": self.case.sut,
            "verdict": self.judgement.verdict.value,
            "error": details[0] if details else "",
            "details": details,
            "shims": list(self.shims),
            "traceback": self.traceback,
            "fault": self.fault,
            "case": self.case.to_json(),
            "replay": replay,
        }


@dataclass
class Campaign:
    sut: str
    ranks: int
    properties: list[str]
    seconds: float
    seed: int
    mode: str = "pool"
    cases_run: Counter = field(default_factory=Counter)
    sut_seconds: float = 0.0
    findings: list[Finding] = field(default_factory=list)
    shims: set[str] = field(default_factory=set)
    skipped: dict[str, str] = field(default_factory=dict)
    wall: float = 0.0
    launches: int = 0
    ptrace: bool = True  # fault cases may attach strace (else they use the psutil fallbacks)
    unreplayable: int = 0  # drawn power-loss states skipped: the ranks never interleaved their IO as recorded
    faults: bool = False  # the campaign injects faults (fault properties; P-RESUME may crash a save)
    devices: list[str] = field(default_factory=list)  # where the ranks ran ("cuda:0 (cpu:gloo,cuda:nccl)", "cpu")
    known: dict[str, int] = field(default_factory=dict)  # --skip-known: cases each known finding explained


class Judge:
    """Runs a case and judges it; P-DIFF also runs the reference engine on the same case, in-process."""

    def __init__(self, runners: Runners, *, exploring: bool = False, known: list[Known] | None = None) -> None:
        self.runners = runners
        self.exploring = exploring  # fuzzing: a power-loss state that cannot be replayed is skipped, not an error
        self.unreplayable = 0
        self.known = known or []  # fuzz --skip-known: failures these explain pass, and are counted here
        self.known_hits: Counter = Counter()
        self._reference: Runners | None = None

    def __call__(self, case: Case) -> tuple[Judgement, Outcome]:
        judgement, outcome = self._judge(case)
        known = explained_by(self.known, case.sut, judgement)
        if known is None:
            return judgement, outcome
        self.known_hits[known] += 1
        return Judgement(case.property, Verdict.PASS, (f"known finding {known}: {judgement.details[0]}",)), outcome

    def _judge(self, case: Case) -> tuple[Judgement, Outcome]:
        if case.fault is not None and case.fault.get("kind") in ("point", "power"):
            from .faultrun import resolve

            concrete = resolve(case, self)
            if concrete is None:
                return Judgement(case.property, Verdict.PASS, ("the op makes no IO under the root",)), Outcome(case.sut)
            try:
                judgement, outcome = self(concrete)
            except _Unreplayable as exc:
                return Judgement(case.property, Verdict.PASS, (f"skipped: {exc}",)), Outcome(case.sut)
            outcome.resolved_fault = concrete.fault
            return judgement, outcome
        outcome = self._run(case)
        if case.fault is not None:
            judgement = judge_history(case, outcome, self.runners.cls.clear_errors)
            return (judgement if judgement.ok else self._attributed(case, judgement)), outcome
        if case.sequence or case.property == "P-ATOMIC":  # a job's life: saves, waits, kills, restarts, ...
            return judge_history(case, outcome, self.runners.cls.clear_errors), outcome
        if case.property != "P-DIFF":
            return judge(case, outcome), outcome
        if self._reference is None:
            self._reference = Runners("reference", mode="in-process")
        ref = run_case(dataclasses.replace(case, sut="reference"), self._reference)
        return judge_diff(case, outcome, ref), outcome

    def _attributed(self, case: Case, judgement: Judgement) -> Judgement:
        """A fault case's failure counts only if the fault caused it: the same ops without the fault must pass.
        Otherwise the SUT fails the case anyway (a fault-free property finds that bug) and it is not reported
        here, so fault campaigns are not swamped by, and do not shrink towards, bugs that need no fault."""
        control = dataclasses.replace(case, fault=None)
        control_outcome = run_case(control, self.runners)
        # The same history rules as the faulted run (rotation, latest, ...), only without the fault.
        plain = judge_history(control, control_outcome, self.runners.cls.clear_errors)
        if plain.ok:
            return judgement
        return Judgement(case.property, Verdict.PASS,
                         (f"not attributed to the fault: the case fails without it too ({plain.verdict.value}: "
                          f"{'; '.join(plain.details)[:300]})",))

    def _run(self, case: Case) -> Outcome:
        """Run the case; a power-loss state needs the save's IO in the order it was enumerated from, and ranks
        interleave differently from run to run, so such a case is retried a bounded number of times."""
        for attempt in range(STATE_ATTEMPTS):
            try:
                return run_case(case, self.runners)
            except TraceMismatch as exc:
                if attempt == STATE_ATTEMPTS - 1 and self.exploring:
                    self.unreplayable += 1
                    raise _Unreplayable(str(exc)) from None
                if attempt == STATE_ATTEMPTS - 1:
                    raise CaseError(f"{exc} (in {STATE_ATTEMPTS} runs the ranks never interleaved their IO as "
                                    "recorded; the state cannot be replayed on this machine)") from None
        raise AssertionError("unreachable")

    def close(self) -> None:
        self.runners.close()
        if self._reference is not None:
            self._reference.close()


def fuzz(judge_case: Judge, campaign: Campaign, capabilities: frozenset[str], progress: bool = False) -> Campaign:
    start = time.monotonic()
    deadline = start + campaign.seconds
    hard_deadline = deadline + max(60.0, campaign.seconds * 0.5)  # room to finish shrinking a failure
    pending = list(campaign.properties)
    batch = 0
    while pending and time.monotonic() < deadline:
        for prop in list(pending):
            if time.monotonic() >= deadline:
                break
            finding = _batch(
                judge_case, campaign, capabilities, prop, campaign.seed + batch, hard_deadline, progress, start
            )
            if finding is not None:
                campaign.findings.append(finding)
                pending.remove(prop)  # one shrunk finding per property and campaign
        batch += 1
    campaign.wall = time.monotonic() - start
    campaign.launches = judge_case.runners.launches
    campaign.devices = sorted(judge_case.runners.devices)
    campaign.unreplayable = judge_case.unreplayable
    campaign.known = dict(judge_case.known_hits)
    if progress:
        sys.stderr.write("\n")
    return campaign


def _batch(
    judge_case: Judge,
    campaign: Campaign,
    capabilities: frozenset[str],
    prop: str,
    seed: int,
    hard_deadline: float,
    progress: bool,
    start: float,
) -> Finding | None:
    last_failure: list[Finding] = []
    shrink_until: list[float] = []  # set when the first failure appears: shrinking gets a bounded budget

    @settings(
        max_examples=BATCH,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.generate, Phase.shrink],
        report_multiple_bugs=False,
    )
    @given(_strategy(campaign, prop, capabilities))
    def body(case: Case) -> None:
        now = time.monotonic()
        if now > hard_deadline or (shrink_until and now > shrink_until[0]):
            return  # out of time: remaining attempts count as passes, the smallest failure so far is kept
        judgement, outcome = judge_case(case)
        campaign.cases_run[prop] += 1
        campaign.sut_seconds += outcome.sut_seconds
        campaign.shims.update(outcome.shims)
        if progress:
            _progress(campaign, prop, start)
        if not judgement.ok:
            # Hypothesis re-runs the shrunk example last, so the last failure kept is the smallest.
            concrete = dataclasses.replace(case, fault=outcome.resolved_fault) if outcome.resolved_fault else case
            last_failure[:] = [Finding(concrete, judgement, outcome.shims, outcome.traceback, outcome.fault)]
            if not shrink_until:
                shrink_until.append(time.monotonic() + max(SHRINK_BUDGET, campaign.seconds * 0.1))
            raise _Failed("; ".join(judgement.details))

    try:
        hypothesis_seed(seed)(body)()
    except Exception:
        if not last_failure:
            raise
    return last_failure[0] if last_failure else None


def _strategy(campaign: Campaign, prop: str, capabilities: frozenset[str]):
    return property_cases(prop, campaign.sut, campaign.ranks, capabilities, faults=campaign.faults,
                          ptrace=campaign.ptrace)


def _progress(campaign: Campaign, prop: str, start: float) -> None:
    left = max(0.0, campaign.seconds - (time.monotonic() - start))
    total = sum(campaign.cases_run.values())
    sys.stderr.write(f"\r{prop:<18} cases {total:>6}  findings {len(campaign.findings):>3}  {left:6.0f}s left ")
    sys.stderr.flush()


def write_results(campaign: Campaign, out: Path) -> list[dict]:
    findings_dir = out / "findings"
    findings_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for n, finding in enumerate(campaign.findings):
        safe_sut = re.sub(r"[^A-Za-z0-9._-]", "_", campaign.sut)
        path = findings_dir / f"{n:03d}-{finding.judgement.property}-{safe_sut}.json"
        data = finding.to_json(f"ckpt-harness replay {path}")
        path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        rows.append(data)
    verdicts = Counter(f.judgement.verdict.value for f in campaign.findings)
    summary = {
        "sut": campaign.sut,
        "ranks": campaign.ranks,
        "seed": campaign.seed,
        "cases_run": dict(sorted(campaign.cases_run.items())),
        "skipped_properties": campaign.skipped,
        "findings": {v.value: verdicts.get(v.value, 0) for v in Verdict if v is not Verdict.PASS},
        "wall_time_s": round(campaign.wall, 3),
        "sut_share": round(campaign.sut_seconds / campaign.wall, 3) if campaign.wall else 0.0,
        "launch_mode": campaign.mode,
        "launches": campaign.launches,
        "shims": sorted(campaign.shims),
        "devices": campaign.devices,
        "unreplayable_states": campaign.unreplayable,
        "known_findings_skipped": campaign.known,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    (out / "report.md").write_text(report(summary, rows), encoding="utf-8")
    return rows


def report(summary: dict, rows: list[dict]) -> str:
    shims = ", ".join(summary["shims"]) or "none"
    lines = [
        f"# ckpt-harness report: {summary['sut']}",
        "",
        f"{sum(summary['cases_run'].values())} cases in {summary['wall_time_s']} s on {summary['ranks']} rank(s), "
        f"launch mode {summary['launch_mode']} ({summary['launches']} launches), seed {summary['seed']}, "
        f"shims: {shims}, devices: {', '.join(summary.get('devices', [])) or 'unknown'}.",
        "",
        "| property | cases |",
        "|---|---|",
        *[f"| {p} | {n} |" for p, n in summary["cases_run"].items()],
        *[f"| {p} | skipped: {why} |" for p, why in summary["skipped_properties"].items()],
        "",
        *[f"Cases explained by the known finding `{k}` (not shrunk): {n}." for k, n in
          summary.get("known_findings_skipped", {}).items()],
        "",
    ]
    lines += findings_table(rows)
    return "\n".join(lines) + "\n"


def findings_table(rows: list[dict]) -> list[str]:
    if not rows:
        return ["No findings."]
    out = ["| property | SUT | verdict | error | replay |", "|---|---|---|---|---|"]
    for r in rows:
        error = r["error"].replace("|", "\\|").replace("\n", " ")
        if len(error) > 160:
            error = error[:157] + "..."
        out.append(f"| {r['property']} | {r['sut']} | {r['verdict']} | {error} | `{r['replay']}` |")
    return out


def default_seed() -> int:
    return int.from_bytes(os.urandom(4), "little")
