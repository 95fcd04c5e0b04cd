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
import math
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Protocol

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.errors import Flaky, Unsatisfiable
from hypothesis.internal.observability import with_observability_callback

from harness.campaign.corpus import replay_corpus, replay_covering
from harness.campaign.guidance import arms, keep_odds, leave_out_weight, note_turn, slice_factor
from harness.campaign.reduce import reduce_case
from harness.campaign.results import Campaign, Finding, shrink_room
from harness.coverage.merge import Tracker
from harness.fixes import FIXED_BY, FIXES, own_fixes
from harness.judging.fault_runs import CrashResult
from harness.judging.fidelity import REAL_MAX, max_world
from harness.judging.judge import Judge
from harness.ranks.runner import PoolFailure
from harness.ranks.runners import Runners
from properties.generate.swarm import swarm, swarm_fixes, swarmable
from properties.model.case import Case, CaseError
from properties.model.outcome import Outcome
from properties.model.verdicts import Judgement
from properties.registry import REGISTRY, property_cases
from properties.triage.buckets import Bucket

# A round that leaves fixes out puts them back once their known bugs explained this many cases: the bugs that need
# a known bug's behaviour were in reach, and the known bug repeating (a rank it kills relaunched case after case)
# only costs the campaign.
LEFT_OUT_HITS = 3
# The explorer's share of each round of a fault campaign (the rest: the properties' turns). Bounded-exhaustive
# exploration finds crash bugs drawn fault cases rarely meet, so it gets time from the first round on.
EXPLORE_SHARE = 0.3
# In a fault campaign the fault properties, as a group, get this many times the seconds of the fault-free ones: a
# fault case costs seconds where a fault-free one costs milliseconds, and the fault-free properties have a job of
# their own (the README's main job); they keep a share, since a fault may set off a bug no fault needs.
FAULT_WEIGHT = 3.0
MIN_SLICE, MAX_SLICE = 5.0, 30.0  # seconds of one property's turn (a quarter of its share of the campaign)
# Seconds of shrinking per new bucket: a tenth of the campaign, within these bounds. A short campaign meeting
# several unknown bugs must not spend itself shrinking them (each failing Paddle case may cost a relaunch); a long
# one can afford small cases.
SHRINK_MIN, SHRINK_MAX = 15.0, 120.0


class _Failed(AssertionError):
    pass


class Exploration(Protocol):
    """What a campaign needs of the explorer taking its share (harness.campaign.exploration.Exploration)."""

    seconds: float  # spent exploring so far

    def turn(self, runners: Runners, confirm: Judge, until: float,
             report: Callable[[Case, CrashResult], bool] | None = None) -> list[tuple[Case, CrashResult]]: ...

    def summary(self) -> dict: ...


@dataclass
class _Run:
    """What every turn of one campaign shares. A virtual campaign's judge on real ranks lives here, not in the
    ``Campaign`` (a result the report reads): started for the first finding that fits real ranks, closed at the end."""

    judge_case: Judge
    campaign: Campaign
    capabilities: frozenset[str]
    progress: bool
    start: float
    deadline: float
    hard_deadline: float  # room past ``deadline`` to finish shrinking a failure
    real: Judge | None = None
    left_out: tuple[str, ...] = ()  # the fixes this round leaves out, while it does
    hits_before: Counter = field(default_factory=Counter)  # the judge's known hits as the round began
    orders: set[str] = field(default_factory=set)  # persistence-order buckets of drawn cases judged so far
    gained: Counter = field(default_factory=Counter)  # prop -> arcs its cases added, read case by case (a corpus)
    features: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())  # the last batch's swarm features kept, left out

    def covered(self) -> int:
        """Read what the processes wrote since the last look: the arcs it adds (0 without coverage)."""
        tracker = self.campaign.coverage
        if tracker is None:
            return 0
        new = tracker.poll()
        self.campaign.coverage_timeline.append((round(time.monotonic() - self.start, 1), tracker.arcs()))
        return new

    def left_out_met(self) -> bool:
        """The round's left-out fixes' known bugs explained LEFT_OUT_HITS cases: time to put them back."""
        return bool(self.left_out) and _left_out_hits(self.judge_case, self.left_out,
                                                        self.hits_before) >= LEFT_OUT_HITS

    def real_judge(self) -> Judge:
        """The judge replaying virtual findings on real ranks under the strict rules (``replay``'s)."""
        if self.real is None:
            runners = self.judge_case.runners
            real = Runners(self.campaign.sut, "pool", runners.op_timeout, device=runners.device)
            real.coverage = runners.coverage  # its replays run the framework's code too
            self.real = Judge(real, known=self.judge_case.known)
        return self.real

    def close(self) -> None:
        if self.real is not None:
            self.real.close()


@dataclass
class _Turn:
    """One turn of one property, as Hypothesis's calls of the body leave it: the new bucket being shrunk, its
    smallest case so far, and the other new buckets met meanwhile."""

    prop: str
    left_out: tuple[str, ...]  # the turn's swarm configuration
    turn_end: float
    began: float
    cases_before: int
    target: Bucket | None = None  # the new bucket being shrunk (the turn's first)
    smallest: Finding | None = None  # Hypothesis re-runs the shrunk example last: the last one kept is the smallest
    others: dict[str, Finding] = field(default_factory=dict)  # bucket core -> another new bug, kept unshrunk
    shrink_until: float | None = None  # set at the first failure: shrinking gets a bounded budget
    first_seen: dict[str, float] = field(default_factory=dict)  # bucket core -> seconds into the campaign

    def spent(self, run: _Run) -> bool:
        """Later attempts count as passes to Hypothesis (the smallest failure is kept): the campaign stopped, the
        shrink budget ran out, or no failure yet and the slice is spent (its cases grew costly)."""
        now = time.monotonic()
        if run.campaign.fatal is not None or now > run.hard_deadline or (
                self.shrink_until is not None and now > self.shrink_until):
            return True
        return self.shrink_until is None and (now > self.turn_end or run.campaign.capped(self.prop)
                                              or run.left_out_met())

    def met(self, bucket: Bucket, finding: Finding, campaign: Campaign) -> None:
        """Shrink, count or keep a failure; raising ``_Failed`` makes it the case Hypothesis shrinks. It is raised
        from one place only: Hypothesis tells bugs apart by where they were raised, and shrinks a failure only
        into cases that fail at the same place."""
        if self.target is not None and bucket.core == self.target.core:  # shrinking: features may go
            self.smallest = finding
        elif campaign.counted(bucket, self.prop):
            return  # a bug this campaign already has a case of: counted, not shrunk again
        elif self.target is not None:
            self.others.setdefault(bucket.core, finding)  # another new bug, met while shrinking the first
            return
        else:
            self.target = bucket
            self.first_seen[bucket.core] = finding.found_at  # the shrunk case keeps when its bucket was first met
            self.smallest = finding
            self.shrink_until = time.monotonic() + _shrink_budget(campaign)
        raise _Failed("; ".join(finding.judgement.details))

    def count_swarm(self, campaign: Campaign) -> None:
        """What the turn's swarm configuration cost and ran (the report's swarm table)."""
        for feature in self.left_out or ("(none left out)",):
            campaign.swarm_cases[feature] += campaign.cases_run[self.prop] - self.cases_before
            campaign.swarm_seconds[feature] += time.monotonic() - self.began

    def findings(self) -> list[Finding]:
        return ([self.smallest] if self.smallest is not None else []) + list(self.others.values())


def fuzz(judge_case: Judge, campaign: Campaign, capabilities: frozenset[str], progress: bool = False,
         exploration: Exploration | None = None) -> Campaign:
    """Properties take turns in short time slices from the first second until the time is up. A failure in a
    bucket not seen yet is shrunk once and becomes a finding; later failures in a seen bucket are only counted,
    and the property goes on looking for other bugs. With an ``exploration``, the explorer opens every round with
    its share (``EXPLORE_SHARE`` of the round, on every fix)."""
    if campaign.corpus is not None:  # before the clock starts: the budget is for exploring
        campaign.corpus_rows, still = replay_corpus(campaign.corpus, campaign.sut, judge_case)
        campaign.buckets += still
        if campaign.coverage_dir is not None:
            campaign.corpus_rows += replay_covering(campaign.corpus, campaign.sut, judge_case)
    judge_case.runners.spare_lost = True  # a lost pool's replacement starts at once, in the background
    start = time.monotonic()
    deadline = start + campaign.seconds
    run = _Run(judge_case, campaign, capabilities, progress, start, deadline, deadline + shrink_room(campaign.seconds))
    judge_case.prove_until = run.hard_deadline
    if campaign.coverage_dir is not None:
        campaign.coverage = Tracker(campaign.coverage_dir)
        run.covered()  # what the corpus replay ran is not the first turn's
    turn = 0
    if exploration is not None and not campaign.properties:  # an exploration of its own: the explorer has it all
        _explore(run, exploration, None)
    while campaign.properties and time.monotonic() < deadline and not campaign.done():
        if exploration is not None:
            _explore(run, exploration, _round_seconds(campaign))
        run.left_out, run.hits_before = _round_fixes(campaign, judge_case.runners, turn), Counter(judge_case.known_hits)
        with ExitStack() as round_fixes:
            round_fixes.enter_context(_fixes_left_out(judge_case, run.left_out))
            for n, prop in enumerate(_round_order(campaign)):
                if time.monotonic() >= deadline or campaign.done():
                    break
                if campaign.capped(prop):
                    continue
                if run.left_out_met():
                    round_fixes.close()  # their bugs were met: the rest of the round runs with every fix
                    run.left_out = ()
                _turn(run, prop, campaign.seed + turn * len(campaign.properties) + n, reuse=turn == 0)
        run.left_out = ()
        turn += 1
    if exploration is not None:
        campaign.exploration = exploration.summary()
    campaign.guidance = arms(campaign)
    campaign.wall = time.monotonic() - start
    run.close()
    run.covered()  # (what processes still running write as they end, the caller reads once it closed them)
    _tally(judge_case, campaign)
    if progress:
        sys.stderr.write("\n")
    return campaign


def _explore(run: _Run, exploration: Exploration, turns_seconds: float | None) -> None:
    """The explorer's share of a round whose property turns take about ``turns_seconds`` (None: no properties, the
    whole campaign is the explorer's): its failures (each replayed as its own case in fresh processes, known bugs
    excused there) become findings in their buckets like any other."""
    campaign = run.campaign
    if time.monotonic() >= run.deadline or campaign.done():
        return
    now = time.monotonic()
    # Its share of the time so far and of the round ahead, less what it had; never past its share of what is left.
    if turns_seconds is None:
        share = run.deadline - now
    else:
        owed = (EXPLORE_SHARE * (now - run.start + turns_seconds) - exploration.seconds) / (1 - EXPLORE_SHARE)
        share = min(EXPLORE_SHARE * (run.deadline - now), max(MIN_SLICE, owed))

    def report(case: Case, result: CrashResult) -> bool:
        assert result.judgement is not None
        if result.confirmed:  # a failure not replayed in fresh processes opens no bucket
            _found_apart(run, case, result.judgement, result.report)
        return campaign.done()

    try:
        exploration.turn(run.judge_case.runners, run.judge_case, min(run.deadline, time.monotonic() + share), report)
    except Exception as exc:  # the harness's own failure: counted, and the campaign goes on
        campaign.harness_errors.append(f"explorer: {type(exc).__name__}: {exc}")
        if is_fatal(exc):
            campaign.fatal = exc


def _found_apart(run: _Run, case: Case, judgement: Judgement, fault: dict | None = None) -> None:
    """A failure found apart from Hypothesis's draws (the explorer's, a drawn fault case's save order), already
    judged as its own case: a finding in its bucket where the campaign has not seen that bucket, counted in it
    where it has. Nothing to shrink: its case is the explorer's smallest, or the drawn case's own."""
    campaign, judge_case = run.campaign, run.judge_case
    bucket = judge_case.bucket(case, judgement, Outcome(case.sut))
    if campaign.counted(bucket, case.property):
        return
    finding = Finding(case, judgement, fault=fault, bucket=bucket, found_at=time.monotonic() - run.start)
    campaign.register(bucket, case.property)
    finding.fixes = tuple(judge_case.runners.fixes)
    if judge_case.runners.fixes:
        finding.needs_fixes = judge_case.fixes_needed(case, bucket.core)
    campaign.findings.append(finding)
    campaign.stopped |= campaign.stop_when is not None and campaign.stop_when(finding)


def _order(run: _Run, prop: str, outcome: Outcome) -> None:
    """A drawn fault case whose traced save broke the durability contract: its persistence-order case is judged as
    its own case (known bugs excused there) the first time its bucket comes up in the campaign, and counted in it
    after that."""
    if outcome.order is None:
        return
    case, broken = outcome.order
    bucket = run.judge_case.bucket(case, broken, Outcome(case.sut))
    if bucket.id in run.orders:
        run.campaign.counted(bucket, case.property)
        return
    run.orders.add(bucket.id)
    judged = _judged(run, prop, case)
    if judged is not None and not judged[0].ok:
        _found_apart(run, case, judged[0])


def _round_fixes(campaign: Campaign, runners: Runners, turn: int) -> tuple[str, ...]:
    """The fixes round ``turn`` leaves out (properties.generate.swarm.swarm_fixes): none in the first round, so a
    short campaign spends its time past every known bug."""
    if not (campaign.swarm and turn and runners.fixes):
        return ()
    return swarm_fixes(runners.fixes, f"{campaign.seed}|fixes|{turn}",
                       lambda fix_id: [k for k, f in FIXES.items() if fix_id in f.requires],
                       lambda fix_id: leave_out_weight(campaign, fix_id))


def _left_out_hits(judge_case: Judge, left_out: tuple[str, ...], before: Counter) -> int:
    """Cases since ``before`` explained by the known bugs of the fixes a round left out: by a row whose own fix is
    out, or proven by a patched replay with one of them."""
    hits = 0
    for key, count in judge_case.known_hits.items():
        fixes = (key.removeprefix(FIXED_BY).split("+") if key.startswith(FIXED_BY) else own_fixes(key))
        if set(fixes) & set(left_out):
            hits += count - before[key]
    return hits


@contextmanager
def _fixes_left_out(judge_case: Judge, left_out: tuple[str, ...]) -> Iterator[None]:
    """A round on ranks patched without ``left_out``; a failure that passes with them put back is known
    (Judge.suspects). The round's pools are closed at its end: the next round's ranks carry every fix again."""
    if not left_out:
        yield
        return
    runners = judge_case.runners
    before = judge_case.suspects
    judge_case.suspects = left_out
    try:
        with runners.patched(tuple(f for f in runners.fixes if f not in left_out)):
            yield
    finally:
        judge_case.suspects = before


def _tally(judge_case: Judge, campaign: Campaign) -> None:
    """What the judge and its runners counted over the campaign, kept in its results."""
    campaign.launches = judge_case.runners.launches
    campaign.fixes = list(judge_case.runners.fixes)
    campaign.recovery = judge_case.runners.recovery()
    campaign.devices = sorted(judge_case.runners.devices)
    campaign.unreplayable = judge_case.unreplayable
    campaign.known = dict(judge_case.known_hits)
    campaign.known_seconds = dict(judge_case.known_seconds)
    campaign.known_despite_fix = dict(judge_case.despite_fix)
    campaign.flaky = list(judge_case.flaky)


def _slice(campaign: Campaign, prop: str | None = None) -> float:
    """Seconds per property turn: short enough that every property gets several turns (about four rounds) in a
    short campaign; a fault campaign's fault properties get ``_weight`` of them."""
    weights = sum(_weight(campaign, p) for p in campaign.properties) or 1.0
    base = max(MIN_SLICE, min(MAX_SLICE, campaign.seconds / (4 * weights)))
    return base * (_weight(campaign, prop) * slice_factor(campaign, prop) if prop is not None else 1.0)


def _round_order(campaign: Campaign) -> list[str]:
    """The properties in the order of a round: in a fault campaign the fault properties first (what it was started
    for; a round the deadline cuts short cuts the fault-free ones, which have a job of their own), those with the
    fewest judged cases so far first among them: a short campaign has two or three rounds, and the one the deadline
    cuts short then cuts a property that already had its cases, not the same last one every time."""
    if not campaign.faults:
        return list(campaign.properties)
    return sorted(campaign.properties,
                  key=lambda p: (not REGISTRY[p].fault, campaign.cases_run[p] if REGISTRY[p].fault else 0))


def _weight(campaign: Campaign, prop: str) -> float:
    """In a fault campaign the fault properties, as a group, get ``FAULT_WEIGHT`` times the time its fault-free
    properties get: fault cases are the slow ones, and what the campaign was started for. 1 for every other
    property."""
    fault = [p for p in campaign.properties if REGISTRY[p].fault]
    if not campaign.faults or prop not in fault:
        return 1.0
    return max(1.0, FAULT_WEIGHT * (len(campaign.properties) - len(fault)) / len(fault))


def _round_seconds(campaign: Campaign) -> float:
    """About how long a round of property turns takes (each its slice)."""
    return sum(_slice(campaign, p) for p in campaign.properties)


def _turn(run: _Run, prop: str, seed: int, reuse: bool) -> None:
    """One turn of ``prop``, as many cases as fit its slice; its findings join the campaign's."""
    campaign = run.campaign
    began = time.monotonic()
    fixes_out = run.left_out
    examples = campaign.examples_for(prop, _slice(campaign, prop))
    # Bounded by cases, a property's turn runs them all: no time slice decides which cases are drawn.
    turn_end = run.deadline if campaign.cases_per_property else min(run.deadline, began + _slice(campaign, prop))
    for finding in _batch(run, prop, seed, examples, turn_end, reuse=reuse):
        campaign.findings.append(finding)
        campaign.stopped |= campaign.stop_when is not None and campaign.stop_when(finding)
    campaign.prop_seconds[prop] += time.monotonic() - began
    if campaign.coverage is not None:
        gained = run.covered() + run.gained.pop(prop, 0)
        kept, left_out = run.features
        fixes = run.judge_case.runners.fixes
        note_turn(campaign, prop, gained, time.monotonic() - began,
                  (*kept, *(f"fix:{f}" for f in fixes if f not in fixes_out)),
                  (*left_out, *(f"fix:{f}" for f in fixes_out)))


def _batch(run: _Run, prop: str, seed: int, examples: int, turn_end: float, reuse: bool = False) -> list[Finding]:
    """One turn of ``prop``: ``examples`` drawn cases. The first failure in a new bucket is shrunk (staying in that
    bucket: smaller cases that fail otherwise count as passes to the shrinker); failures in seen buckets are
    counted; another new bucket met while shrinking is kept as its own finding, unshrunk.

    With a corpus, Hypothesis's database keeps every example a shrink went through, and the property's first turn
    (``reuse``) replays them first. Hypothesis drops an example that no longer fails there, and to the body a
    failure in a bucket already counted (known, or replayed from the corpus's cases) is a pass: the database holds
    what is not yet explained. Later turns do not replay it (each would drop what the first one counted)."""
    campaign = run.campaign
    drawable, left_out = _configured(campaign, prop, run.capabilities, seed)
    run.features = (tuple(f for f in swarmable(run.capabilities) if f in drawable), left_out)  # fixes: by _turn
    left_out += tuple(f"fix:{f}" for f in run.judge_case.suspects)
    turn = _Turn(prop, left_out, turn_end, time.monotonic(), campaign.cases_run[prop])
    database = campaign.corpus.database() if campaign.corpus is not None else None
    test = _test(run, turn, drawable, examples, reused=bool(database and reuse))
    try:
        with with_observability_callback(_observer(campaign.observed.setdefault(prop, Counter()))):
            _seeded(test, seed, database, f"{campaign.sut}|{prop}")()
    except Unsatisfiable:  # the batch's swarm configuration leaves no case the SUT runs here: the next one may
        campaign.idle_batches[prop] += 1
    except Exception as exc:
        if turn.smallest is None and not isinstance(exc, Flaky):
            raise
        if turn.smallest is None:
            _unreplayed(campaign, prop, exc)
    finally:
        turn.count_swarm(campaign)
    return _found(run, turn)


def _test(run: _Run, turn: _Turn, drawable: frozenset[str], examples: int, reused: bool) -> Callable[..., None]:
    """The turn's Hypothesis test: Hypothesis draws and shrinks, the body judges (``_case``)."""

    @settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.reuse, Phase.generate, Phase.shrink] if reused else [Phase.generate, Phase.shrink],
        report_multiple_bugs=False,
    )
    @given(_strategy(run.campaign, turn.prop, drawable, run.judge_case.runners))
    def body(case: Case) -> None:
        _case(run, turn, case)

    return body


def _case(run: _Run, turn: _Turn, case: Case) -> None:
    """One drawn case, judged; a failure raises ``_Failed`` where Hypothesis is to shrink it (``_Turn.met``)."""
    if turn.spent(run):
        return
    judged = _judged(run, turn.prop, case)
    if judged is not None:
        _order(run, turn.prop, judged[1])
        _covering(run, turn.prop, case, judged[0])
    if judged is not None and not judged[0].ok:
        _failed(run, turn, case, *judged)


def _covering(run: _Run, prop: str, case: Case, judgement: Judgement) -> None:
    """With a corpus, coverage is read case by case: a passing case that reached new code joins the corpus (the
    next campaign replays it first). Without one, a turn's coverage is read once, as the turn ends."""
    campaign = run.campaign
    if campaign.corpus is None or campaign.coverage is None:
        return
    new = run.covered()
    run.gained[prop] += new
    if new and judgement.ok:
        campaign.corpus.keep_covering(campaign.sut, case)


def _judged(run: _Run, prop: str, case: Case) -> tuple[Judgement, Outcome] | None:
    """The judge's verdict on ``case``, its costs counted; None where the harness failed on it (module docstring)."""
    campaign = run.campaign
    try:
        judgement, outcome = run.judge_case(case)
    except Exception as exc:  # the harness's own failure: never a finding; the campaign's end only if fatal
        campaign.harness_errors.append(f"{prop}: {type(exc).__name__}: {exc}")
        if is_fatal(exc):
            campaign.fatal = exc
        return None
    campaign.cases_run[prop] += 1
    campaign.sut_seconds += outcome.sut_seconds
    campaign.shims.update(outcome.shims)
    if run.progress:
        _progress(campaign, prop, run.start)
    return judgement, outcome


def _failed(run: _Run, turn: _Turn, case: Case, judgement: Judgement, outcome: Outcome) -> None:
    """A failing case as a finding in its bucket, for the turn to shrink, count or keep."""
    concrete = dataclasses.replace(case, fault=outcome.resolved_fault) if outcome.resolved_fault else case
    try:
        bucket = run.judge_case.bucket(concrete, judgement, outcome)
    except Exception as exc:  # the harness's own failure: counted as one, the case as a pass to Hypothesis
        run.campaign.harness_errors.append(f"{turn.prop}: bucketing a failure: {type(exc).__name__}: {exc}")
        return
    finding = Finding(concrete, judgement, outcome.shims, outcome.traceback, outcome.fault, bucket, turn.left_out,
                      turn.first_seen.get(bucket.core, time.monotonic() - run.start), io_map=outcome.io_map)
    turn.met(bucket, finding, run.campaign)


def _unreplayed(campaign: Campaign, prop: str, exc: Exception) -> None:
    """An error of the body's own that Hypothesis's replay did not meet again (its slice ran out): the harness's
    failure, counted as one with what was raised, never the campaign's end."""
    first = next(iter(getattr(exc, "exceptions", ())), exc)
    campaign.harness_errors.append(f"{prop}: {type(first).__name__} once, not on Hypothesis's replay: "
                                   f"{str(first)[:300]}")


def _found(run: _Run, turn: _Turn) -> list[Finding]:
    """The turn's new buckets, registered; on virtual ranks each reduced and replayed on real ranks."""
    found = turn.findings()
    for finding in found:
        run.campaign.register(finding.bucket, turn.prop)
    if run.judge_case.runners.virtual:
        found = [_reduced(run.judge_case, finding,
                          min(run.hard_deadline, time.monotonic() + _shrink_budget(run.campaign)))
                 for finding in found]
        for finding in found:
            finding.confirmed_real = _confirm_real(run, finding)
    for finding in found:
        finding.fixes = tuple(run.judge_case.runners.fixes)
    if run.judge_case.runners.fixes:
        for finding in found:
            assert finding.bucket is not None
            finding.needs_fixes = run.judge_case.fixes_needed(finding.case, finding.bucket.core)
    return found


def _shrink_budget(campaign: Campaign) -> float:
    """Seconds of shrinking per new bucket; bounded by cases, as long as Hypothesis shrinks (the hard deadline
    still ends it), so the smallest case does not depend on the machine's speed."""
    if campaign.cases_per_property is not None:
        return math.inf
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


def _confirm_real(run: _Run, finding: Finding) -> str:
    """Replay a virtual finding on real ranks under the strict rules (what ``replay`` does), where its worlds fit."""
    if max_world(finding.case) > REAL_MAX:
        return "virtual-only"
    real = run.real_judge()
    try:
        judgement, outcome = real(finding.case)
    except Exception as exc:  # the real ranks could not run it: unconfirmed, and the table says why
        run.campaign.harness_errors.append(f"confirming on real ranks: {type(exc).__name__}: {exc}")
        return "no"
    if judgement.ok:
        return "no"
    assert finding.bucket is not None
    return "yes" if real.bucket(finding.case, judgement, outcome).core == finding.bucket.core else "no"


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


def _strategy(campaign: Campaign, prop: str, capabilities: frozenset[str], runners: Runners):
    """The cases of ``_drawn`` the case format accepts (a shrinker's step may break a rule only the format checks,
    which the ranks would meet as a failure to set the case up), the SUT does not refuse (SutAdapter.refuses: a
    combination its adapter cannot hand the framework) and, on virtual ranks, that either the virtual world plays or
    real ranks here can launch (a case it does not play runs on real ranks: harness.judging.run)."""
    cls, virtual = runners.cls, runners.virtual

    def runnable(case: Case) -> bool:
        return (_well_formed(case) and cls.refuses(case) is None
                and (not virtual or cls.virtual_plays(case) or max_world(case) <= REAL_MAX))

    return _drawn(campaign, prop, capabilities, virtual).filter(runnable)


def _well_formed(case: Case) -> bool:
    try:
        Case.from_json(case.to_json())
    except CaseError:
        return False
    return True


def _drawn(campaign: Campaign, prop: str, capabilities: frozenset[str], virtual: bool):
    """On virtual ranks each case draws its world up to ``ranks``; a fault property's cases run on real ranks
    (harness.judging.run), so they stay within the worlds real ranks are launched for here."""
    if not virtual:
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
    if not campaign.swarm:
        return capabilities, ()
    return swarm(capabilities, seed, REGISTRY[prop].drawable, lambda feature: keep_odds(campaign, feature))


def _progress(campaign: Campaign, prop: str, start: float) -> None:
    left = max(0.0, campaign.seconds - (time.monotonic() - start))
    total = sum(campaign.cases_run.values())
    sys.stderr.write(f"\r{prop:<18} cases {total:>6}  findings {len(campaign.findings):>3}  {left:6.0f}s left ")
    sys.stderr.flush()


def default_seed() -> int:
    return int.from_bytes(os.urandom(4), "little")
