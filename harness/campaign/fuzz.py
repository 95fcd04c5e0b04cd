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
import hashlib
import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.errors import Flaky
from hypothesis.internal.observability import with_observability_callback

from harness.campaign.corpus import Corpus, replay_corpus
from harness.campaign.reduce import reduce_case
from harness.judging.fidelity import REAL_MAX, max_world
from harness.judging.judge import Judge
from harness.ranks.runner import PoolFailure
from harness.ranks.runners import Runners
from properties.generate.swarm import swarm
from properties.model.case import Case
from properties.model.verdicts import Judgement
from properties.registry import REGISTRY, property_cases
from properties.triage.buckets import Bucket

MIN_SLICE, MAX_SLICE = 5.0, 30.0  # seconds of one property's turn (a quarter of its share of the campaign)
MAX_EXAMPLES = 50  # cases per turn at most (cheap properties of the reference)
# Seconds of shrinking per new bucket: a tenth of the campaign, within these bounds. A short campaign meeting
# several unknown bugs must not spend itself shrinking them (each failing Paddle case may cost a relaunch); a long
# one can afford small cases.
SHRINK_MIN, SHRINK_MAX = 15.0, 120.0


class _Failed(AssertionError):
    pass


@dataclass
class Finding:
    case: Case
    judgement: Judgement
    shims: tuple[str, ...] = ()
    traceback: str | None = None
    fault: dict | None = None  # what the fault did in the failing run (mechanism, whether and where it fired)
    bucket: Bucket | None = None  # its root cause (properties.triage.buckets): one finding per bucket and campaign
    left_out: tuple[str, ...] = ()  # the swarm configuration of its batch: the capabilities it could not draw
    found_at: float = 0.0  # seconds into the campaign when its bucket's first case failed (bench/detect.py)
    # Found on virtual ranks: "yes" (the case fails the same way on real ranks), "no" (it does not: the virtual
    # world differs from a real launch there, itself a bug to report), "virtual-only" (its worlds are larger than
    # real ranks are launched for here); None: found on real ranks.
    confirmed_real: str | None = None
    io_map: dict | None = None  # a fault finding judged at every crash point of its op: the crash-point map


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
    recovery: dict = field(default_factory=dict)  # Runners.recovery(): launches and seconds lost to failed ranks
    ptrace: bool = True  # fault cases may attach strace (else they use the psutil fallbacks)
    unreplayable: int = 0  # drawn power-loss states skipped: the ranks never interleaved their IO as recorded
    faults: bool = False  # the campaign injects faults (fault properties; P-RESUME may crash a save)
    devices: list[str] = field(default_factory=list)  # where the ranks ran ("cuda:0 (cpu:gloo,cuda:nccl)", "cpu")
    known: dict[str, int] = field(default_factory=dict)  # --skip-known: cases each known finding explained
    harness_errors: list[str] = field(default_factory=list)  # cases the harness itself failed on (type: message)
    flaky: list[str] = field(default_factory=list)  # ranks died or hung once; the case passed when run again
    fatal: Exception | None = None  # the ranks could not start: the campaign stopped there (module docstring)
    swarm: bool = True  # each batch draws from a random subset of the SUT's optional capabilities
    stop_when: Callable[[Finding], bool] | None = None  # end at the first finding this accepts (bench/detect.py)
    stopped: bool = False
    corpus: Corpus | None = None  # --corpus: its bucket cases replayed first, new buckets kept in it
    corpus_rows: list[dict] = field(default_factory=list)  # each stored bucket: still failing, known, passing
    real_judge: Judge | None = None  # virtual campaigns: replays findings on real ranks (Finding.confirmed_real)
    prop_seconds: Counter = field(default_factory=Counter)  # wall seconds each property's turns took
    observed: dict[str, Counter] = field(default_factory=dict)  # Hypothesis's observations per property (_observer)
    buckets: list[Bucket] = field(default_factory=list)  # the new bugs met, as their shrunk cases show them
    bucket_hits: Counter = field(default_factory=Counter)  # bucket id -> failing cases in it (new buckets)
    bucket_props: dict[str, set[str]] = field(default_factory=dict)  # bucket id -> properties that met it
    swarm_cases: Counter = field(default_factory=Counter)  # swarm feature left out -> cases of batches without it
    swarm_seconds: Counter = field(default_factory=Counter)  # ... and the seconds those batches took

    def counted(self, bucket: Bucket, prop: str) -> bool:
        """Count a failure in the campaign's bucket that covers it; False when none does (a new bug)."""
        seen = next((b for b in self.buckets if b.covers(bucket)), None)
        if seen is None:
            return False
        self.bucket_hits[seen.id] += 1
        self.bucket_props.setdefault(seen.id, set()).add(prop)
        return True

    def register(self, bucket: Bucket, prop: str) -> None:
        """A new bucket, as its smallest case shows it (found by ``prop``)."""
        self.buckets.append(bucket)
        self.bucket_hits[bucket.id] += 1
        self.bucket_props.setdefault(bucket.id, set()).add(prop)

    def done(self) -> bool:
        """Nothing more to do before the time is up: ranks that cannot start, or a first finding was all asked."""
        return self.fatal is not None or self.stopped

    def examples_for(self, prop: str, seconds: float) -> int:
        """Cases for one turn of ``prop``: as many as its past cases say fit in ``seconds`` (one at first)."""
        done = self.cases_run[prop]
        if not done:
            return 1
        per_case = self.prop_seconds[prop] / done
        return max(1, min(MAX_EXAMPLES, int(seconds / max(per_case, 1e-3))))


def fuzz(judge_case: Judge, campaign: Campaign, capabilities: frozenset[str], progress: bool = False) -> Campaign:
    """Properties take turns in short time slices from the first second until the time is up. A failure in a
    bucket not seen yet is shrunk once and becomes a finding; later failures in a seen bucket are only counted,
    and the property goes on looking for other bugs."""
    if campaign.corpus is not None:  # before the clock starts: the budget is for exploring
        campaign.corpus_rows, still = replay_corpus(campaign.corpus, campaign.sut, judge_case)
        campaign.buckets += still
    judge_case.runners.spare_lost = True  # a lost pool's replacement starts at once, in the background
    start = time.monotonic()
    deadline = start + campaign.seconds
    hard_deadline = deadline + max(60.0, campaign.seconds * 0.5)  # room to finish shrinking a failure
    turn = 0
    while campaign.properties and time.monotonic() < deadline and not campaign.done():
        for n, prop in enumerate(campaign.properties):
            if time.monotonic() >= deadline or campaign.done():
                break
            began = time.monotonic()
            examples = campaign.examples_for(prop, _slice(campaign))
            seed = campaign.seed + turn * len(campaign.properties) + n
            turn_end = min(deadline, began + _slice(campaign))
            for finding in _batch(judge_case, campaign, capabilities, prop, seed, examples, hard_deadline, progress,
                                  start, turn_end, reuse=turn == 0):
                campaign.findings.append(finding)
                campaign.stopped |= campaign.stop_when is not None and campaign.stop_when(finding)
            campaign.prop_seconds[prop] += time.monotonic() - began
        turn += 1
    campaign.wall = time.monotonic() - start
    if campaign.real_judge is not None:
        campaign.real_judge.close()
    campaign.launches = judge_case.runners.launches
    campaign.recovery = judge_case.runners.recovery()
    campaign.devices = sorted(judge_case.runners.devices)
    campaign.unreplayable = judge_case.unreplayable
    campaign.known = dict(judge_case.known_hits)
    campaign.flaky = list(judge_case.flaky)
    if progress:
        sys.stderr.write("\n")
    return campaign


def _slice(campaign: Campaign) -> float:
    """Seconds per property turn: short enough that every property gets several turns in a short campaign."""
    return max(MIN_SLICE, min(MAX_SLICE, campaign.seconds / (4 * max(1, len(campaign.properties)))))


def _batch(
    judge_case: Judge,
    campaign: Campaign,
    capabilities: frozenset[str],
    prop: str,
    seed: int,
    examples: int,
    hard_deadline: float,
    progress: bool,
    start: float,
    turn_end: float,
    reuse: bool = False,
) -> list[Finding]:
    """One turn of ``prop``: ``examples`` drawn cases. The first failure in a new bucket is shrunk (staying in that
    bucket: smaller cases that fail otherwise count as passes to the shrinker); failures in seen buckets are
    counted; another new bucket met while shrinking is kept as its own finding, unshrunk.

    With a corpus, Hypothesis's database keeps every example a shrink went through, and the property's first turn
    (``reuse``) replays them first. Hypothesis drops an example that no longer fails there, and to the body a
    failure in a bucket already counted (known, or replayed from the corpus's cases) is a pass: the database holds
    what is not yet explained. Later turns do not replay it (each would drop what the first one counted)."""
    target: list[Bucket] = []
    smallest: list[Finding] = []
    others: dict[str, Finding] = {}
    shrink_until: list[float] = []  # set when the first failure appears: shrinking gets a bounded budget
    drawable, left_out = _configured(campaign, prop, capabilities, seed)
    first_seen: dict[str, float] = {}
    began, cases_before = time.monotonic(), campaign.cases_run[prop]

    database = campaign.corpus.database() if campaign.corpus is not None else None

    @settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.reuse, Phase.generate, Phase.shrink] if database and reuse else [Phase.generate, Phase.shrink],
        report_multiple_bugs=False,
    )
    @given(_strategy(campaign, prop, drawable))
    def body(case: Case) -> None:
        now = time.monotonic()
        if campaign.fatal is not None or now > hard_deadline or (shrink_until and now > shrink_until[0]):
            return  # stopped or out of time: remaining attempts count as passes, the smallest failure is kept
        if not shrink_until and now > turn_end:
            return  # the turn's slice is spent (its cases grew costly): the next property's turn, not more of these
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
        if judgement.ok:
            return
        concrete = dataclasses.replace(case, fault=outcome.resolved_fault) if outcome.resolved_fault else case
        try:
            bucket = judge_case.bucket(concrete, judgement, outcome)
        except Exception as exc:  # the harness's own failure: counted as one, the case as a pass to Hypothesis
            campaign.harness_errors.append(f"{prop}: bucketing a failure: {type(exc).__name__}: {exc}")
            return
        finding = Finding(concrete, judgement, outcome.shims, outcome.traceback, outcome.fault, bucket, left_out,
                          first_seen.get(bucket.core, time.monotonic() - start), io_map=outcome.io_map)
        if target and bucket.core == target[0].core:  # shrinking: the same kind of failure, features may go
            smallest[:] = [finding]  # Hypothesis re-runs the shrunk example last: the last one kept is the smallest
            raise _Failed("; ".join(judgement.details))
        if campaign.counted(bucket, prop):
            return  # a bug this campaign already has a case of: counted, not shrunk again
        if target:
            others.setdefault(bucket.core, finding)  # another new bug, met while shrinking the first: kept as is
            return
        target.append(bucket)
        first_seen[bucket.core] = finding.found_at  # the shrunk case keeps when its bucket was first met
        smallest[:] = [finding]
        shrink_until.append(time.monotonic() + _shrink_budget(campaign))
        raise _Failed("; ".join(judgement.details))

    try:
        with with_observability_callback(_observer(campaign.observed.setdefault(prop, Counter()))):
            _seeded(body, seed, database, f"{campaign.sut}|{prop}")()
    except Exception as exc:
        if not smallest and not isinstance(exc, Flaky):
            raise
        if not smallest:  # an error of the body's own that Hypothesis's replay did not meet again (its slice ran
            # out): the harness's failure, counted as one with what was raised, never the campaign's end
            first = next(iter(getattr(exc, "exceptions", ())), exc)
            campaign.harness_errors.append(f"{prop}: {type(first).__name__} once, not on Hypothesis's replay: "
                                           f"{str(first)[:300]}")
    finally:
        for feature in left_out or ("(none left out)",):  # what each swarm configuration cost and ran
            campaign.swarm_cases[feature] += campaign.cases_run[prop] - cases_before
            campaign.swarm_seconds[feature] += time.monotonic() - began
    found = smallest + list(others.values())
    for finding in found:
        campaign.register(finding.bucket, prop)
    if campaign.mode == "virtual":
        found = [_reduced(judge_case, finding, min(hard_deadline, time.monotonic() + _shrink_budget(campaign)))
                 for finding in found]
        for finding in found:
            finding.confirmed_real = _confirm_real(campaign, judge_case, finding)
    return found


def _shrink_budget(campaign: Campaign) -> float:
    return min(SHRINK_MAX, max(SHRINK_MIN, campaign.seconds * 0.1))


def _reduced(judge_case: Judge, finding: Finding, deadline: float) -> Finding:
    """A virtual finding too big for real ranks, reduced past Hypothesis (harness.campaign.reduce: a smaller world, then
    fewer ops) to the smallest case that still fails in its bucket core before ``deadline``; at 20-odd virtual
    ranks Hypothesis's own budget buys few runs, and a case real ranks can hold can be confirmed on them."""
    if max_world(finding.case) <= REAL_MAX:
        return finding
    assert finding.bucket is not None
    core = finding.bucket.core
    kept: list[Finding] = []

    def still_fails(case: Case) -> bool:
        try:
            judgement, outcome = judge_case(case)
        except Exception:  # e.g. a layout the SUT rejects before running: not the same failure
            return False
        if judgement.ok:
            return False
        bucket = judge_case.bucket(case, judgement, outcome)
        if bucket.core != core:
            return False
        kept[:] = [Finding(case, judgement, outcome.shims, outcome.traceback, outcome.fault, bucket,
                           finding.left_out, finding.found_at, io_map=outcome.io_map)]
        return True

    smallest = reduce_case(finding.case, still_fails, deadline)
    return kept[0] if kept and kept[0].case is smallest else finding


def _confirm_real(campaign: Campaign, judge_case: Judge, finding: Finding) -> str:
    """Replay a virtual finding on real ranks under the strict rules (what ``replay`` does), where its worlds fit."""
    if max_world(finding.case) > REAL_MAX:
        return "virtual-only"
    if campaign.real_judge is None:
        campaign.real_judge = Judge(Runners(campaign.sut, "pool", judge_case.runners.op_timeout,
                                            device=judge_case.runners.device), known=judge_case.known)
    try:
        judgement, outcome = campaign.real_judge(finding.case)
    except Exception as exc:  # the real ranks could not run it: unconfirmed, and the table says why
        campaign.harness_errors.append(f"confirming on real ranks: {type(exc).__name__}: {exc}")
        return "no"
    if judgement.ok:
        return "no"
    assert finding.bucket is not None
    return "yes" if campaign.real_judge.bucket(finding.case, judgement, outcome).core == finding.bucket.core else "no"


def _observer(counts: Counter) -> Callable[[object], None]:
    """Hypothesis's observations of one property's test cases, summed: how many it drew, replayed from the
    database or ran while shrinking, how many it gave up on (a draw the strategies rejected), and the seconds it
    spent drawing cases against running them (the harness's own ``cases_run`` counts only the cases judged)."""
    for key in ("test_cases", "passed", "failed", "gave_up", "from_database", "while_shrinking"):
        counts.setdefault(key, 0)
    for key in ("generate_s", "execute_s"):
        counts.setdefault(key, 0.0)

    def observe(observation) -> None:
        if getattr(observation, "type", None) != "test_case":
            return
        how = observation.how_generated
        counts["test_cases"] += 1
        counts[observation.status] += 1  # passed, failed, gave_up
        counts["from_database"] += "reuse" in how
        counts["while_shrinking"] += "shrink" in how
        counts["generate_s"] += sum(v for k, v in observation.timing.items() if k.startswith("generate:"))
        counts["execute_s"] += observation.timing.get("execute:test", 0.0)
    return observe


def _seeded(test, seed: int, database, key: str):
    """``test`` drawing from ``seed`` (a campaign is replayable), with ``database`` under ``key``. ``hypothesis.seed``
    turns the database off, and a nested test's default key is its source's digest (the same for every property):
    both are set back through the attributes Hypothesis's own decorators set (hypothesis 6.x)."""
    test = hypothesis_seed(seed)(test)
    if database is not None:
        test._hypothesis_internal_use_settings = settings(test._hypothesis_internal_use_settings, database=database)
        test._hypothesis_internal_database_key = hashlib.sha256(key.encode()).digest()
    return test


def is_fatal(exc: BaseException) -> bool:
    """Whether a harness failure on one case ends the campaign: ranks that cannot start (module docstring)."""
    return isinstance(exc, PoolFailure) and exc.kind == "setup"


def _strategy(campaign: Campaign, prop: str, capabilities: frozenset[str]):
    """Virtual ranks (``mode`` "virtual") draw each case's world up to ``ranks``; a fault property's cases run on
    real ranks (harness.judging.run), so they stay within the worlds real ranks are launched for here."""
    if campaign.mode != "virtual":
        return property_cases(prop, campaign.sut, campaign.ranks, capabilities, faults=campaign.faults,
                              ptrace=campaign.ptrace)
    if REGISTRY[prop].fault:
        return property_cases(prop, campaign.sut, min(campaign.ranks, REAL_MAX), capabilities, faults=True,
                              ptrace=campaign.ptrace, worlds="drawn")
    return property_cases(prop, campaign.sut, campaign.ranks, capabilities, faults=campaign.faults,
                          ptrace=campaign.ptrace, worlds="drawn")


def _configured(campaign: Campaign, prop: str, capabilities: frozenset[str], seed: int
                ) -> tuple[frozenset[str], tuple]:
    """The batch's swarm configuration (properties.generate.swarm): what it may draw, and what it leaves out."""
    return swarm(capabilities, seed, REGISTRY[prop].drawable) if campaign.swarm else (capabilities, ())


def _progress(campaign: Campaign, prop: str, start: float) -> None:
    left = max(0.0, campaign.seconds - (time.monotonic() - start))
    total = sum(campaign.cases_run.values())
    sys.stderr.write(f"\r{prop:<18} cases {total:>6}  findings {len(campaign.findings):>3}  {left:6.0f}s left ")
    sys.stderr.flush()


def default_seed() -> int:
    return int.from_bytes(os.urandom(4), "little")
