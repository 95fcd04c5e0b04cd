"""Time-bounded fuzzing: draw cases per property with Hypothesis, have the judge run and judge each, shrink
failures, and hand the findings to ``report`` (docs/design.md §8, a contract).

The harness's own failures, by one rule: a case the harness fails on (any exception out of the judge) is recorded
in ``Campaign.harness_errors`` and the campaign goes on, since the next case may well run — except ranks that
cannot start (a ``PoolFailure`` of kind "setup": the adapter does not import or set up on a rank, a rank dies or
is late during start-up, a launcher fails). That one ends the campaign at once (``Campaign.fatal``): ranks are
started with what does not depend on the case (SUT, world size, device, shims) and the pool was already relaunched
for this very case, so every later case would fail the same way, each after a launch attempt, and the campaign
would read as clean. The CLI then exits 2 with that one error (after writing the results of the cases that ran).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed

from properties.case import Case
from properties.registry import property_cases
from properties.verdicts import Judgement

from .judge import Judge
from .runner import PoolFailure

BATCH = 10  # examples per Hypothesis run; properties take turns between batches
SHRINK_BUDGET = 60.0  # seconds of shrinking per finding (at least): a failing Paddle case can cost a relaunch


class _Failed(AssertionError):
    pass


@dataclass
class Finding:
    case: Case
    judgement: Judgement
    shims: tuple[str, ...] = ()
    traceback: str | None = None
    fault: dict | None = None  # what the fault did in the failing run (mechanism, whether and where it fired)


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
    harness_errors: list[str] = field(default_factory=list)  # cases the harness itself failed on (type: message)
    flaky: list[str] = field(default_factory=list)  # ranks died or hung once; the case passed when run again
    fatal: Exception | None = None  # the ranks could not start: the campaign stopped there (module docstring)


def fuzz(judge_case: Judge, campaign: Campaign, capabilities: frozenset[str], progress: bool = False) -> Campaign:
    start = time.monotonic()
    deadline = start + campaign.seconds
    hard_deadline = deadline + max(60.0, campaign.seconds * 0.5)  # room to finish shrinking a failure
    pending = list(campaign.properties)
    batch = 0
    while pending and time.monotonic() < deadline and campaign.fatal is None:
        for prop in list(pending):
            if time.monotonic() >= deadline or campaign.fatal is not None:
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
    campaign.flaky = list(judge_case.flaky)
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
        if campaign.fatal is not None or now > hard_deadline or (shrink_until and now > shrink_until[0]):
            return  # stopped or out of time: remaining attempts count as passes, the smallest failure is kept
        try:
            judgement, outcome = judge_case(case)
        except Exception as exc:  # the harness's own failure: never a finding; the campaign's end only if fatal
            campaign.harness_errors.append(f"{prop}: {type(exc).__name__}: {exc}")
            if is_fatal(exc):
                campaign.fatal = exc
            return
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


def is_fatal(exc: BaseException) -> bool:
    """Whether a harness failure on one case ends the campaign: ranks that cannot start (module docstring)."""
    return isinstance(exc, PoolFailure) and exc.kind == "setup"


def _strategy(campaign: Campaign, prop: str, capabilities: frozenset[str]):
    return property_cases(prop, campaign.sut, campaign.ranks, capabilities, faults=campaign.faults,
                          ptrace=campaign.ptrace)


def _progress(campaign: Campaign, prop: str, start: float) -> None:
    left = max(0.0, campaign.seconds - (time.monotonic() - start))
    total = sum(campaign.cases_run.values())
    sys.stderr.write(f"\r{prop:<18} cases {total:>6}  findings {len(campaign.findings):>3}  {left:6.0f}s left ")
    sys.stderr.flush()


def default_seed() -> int:
    return int.from_bytes(os.urandom(4), "little")
