"""Run one case and judge it: the one entry point ``fuzz``, ``replay``, ``crashpoints`` and the tests share.

The judge picks the checker (the oracle, P-DIFF against the reference engine, or the history checker for fault
cases and sequences), turns a drawn crash point or power-loss state into the concrete fault it names, charges a
fault case's failure to the fault only if the same ops pass without it, and excuses failures that a known finding
explains. A judgement of verdict ``pass`` carries its excuse where it is not a plain pass.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Callable

from faults.errors import TraceMismatch
from faults.spec import PowerFault, RecordFault, StateFault
from harness.fixes import FIXED_BY, FIXES, own_fixes
from harness.judging.fault_runs import Traced, crashstates, judge_alone, judge_crash_states, judge_points, traced
from harness.judging.iomap import place, timeline
from harness.judging.persistence_order import found_under, order_judgement
from harness.judging.run import run_case
from harness.ranks.runners import Runners
from harness.sut import REGISTRY
from properties.check.anomalies import ranks_stopped
from properties.check.history import check_history
from properties.check.oracle import check_diff, check_oracle
from properties.model.case import Case, CaseError
from properties.model.outcome import Outcome
from properties.model.verdicts import Excuse, Judgement, Verdict, worst
from properties.registry import Checker, checker_for
from properties.triage.buckets import Bucket, bucket_of
from properties.triage.known import Known, explained_by

STATE_ATTEMPTS = 8  # runs tried for a power-loss state whose recorded IO interleaving must recur
EXHAUSTIVE_BOUND = 0  # fuzz: a drawn crash point or state is judged alone (every one of them: the explorer's job)


def charge_to_fault(case: Case, judgement: Judgement, plain: Judgement) -> Judgement:
    """A fault case's failing ``judgement``, given ``plain``, the same ops judged without the fault: it stands if
    those pass, else it is a pass excused as not attributed to the fault."""
    if plain.ok:
        return judgement
    return Judgement(case.property, Verdict.PASS,
                     (f"not attributed to the fault: the case fails without it too ({plain.verdict.value}: "
                      f"{'; '.join(plain.details)[:300]})",), judgement.anomalies, Excuse.UNATTRIBUTED)


class Unreplayable(TraceMismatch):
    """A drawn power-loss state whose IO interleaving did not recur in any of the runs tried (fuzzing skips it;
    replay reports it)."""


class Judge:
    """Runs a case and judges it; P-DIFF also runs the reference engine on the same case, in-process."""

    def __init__(self, runners: Runners, *, exploring: bool = False, known: list[Known] | None = None,
                 exhaustive: int = 0, prove: tuple[str, ...] = ()) -> None:
        self.runners = runners
        self.exhaustive = exhaustive  # a drawn point or state: judge all of them where there are at most this many
        self.exploring = exploring  # fuzzing: a power-loss state that cannot be replayed is skipped, not an error
        self.unreplayable = 0
        self.known = known or []  # fuzz --skip-known: failures these explain pass, and are counted here
        self.known_hits: Counter = Counter()
        self.known_seconds: Counter = Counter()  # the same names -> seconds their cases took, proofs included
        # signature names that matched a failure although the fix of their row is applied: the signature and the
        # fix disagree (a variant the fix misses, or a broad signature over another bug); the report says so
        self.despite_fix: Counter = Counter()
        self.flaky: list[str] = []  # exploring: failures (ranks died or hung) that a second run did not repeat
        # exploring: the bucket core of a judgement cut short -> (the known finding, the bucket) its waited-out run
        # found (Judge._rerun_waiting)
        self.waited_out: dict[str, tuple[str | None, Bucket]] = {}
        # prove: fixes (harness.fixes) a failure no signature explains is replayed with; where it passes with them
        # it is known, by the smallest set of them it needs (``fixed_by``: bucket core -> that set, or None)
        self.prove = prove
        # suspects: fixes left out of the runners for a while (a swarm round): tried before ``prove``, since the
        # known bug a failure shows is most likely one of theirs
        self.suspects: tuple[str, ...] = ()
        # (bucket core, fixes applied) -> the fixes proving that core known there, or None
        self.fixed_by: dict[tuple[str, tuple[str, ...]], tuple[str, ...] | None] = {}
        self.prove_until: float | None = None  # a campaign's hard deadline: no proof starts or narrows past it
        runners.fast_failures = exploring
        self._reference: Runners | None = None

    def __call__(self, case: Case) -> tuple[Judgement, Outcome]:
        began = time.monotonic()
        judgement, outcome = self._judge(case)
        if outcome.cut_short and not judgement.ok:
            judgement, outcome, known = self._rerun_waiting(case, judgement, outcome)
        else:
            known = explained_by(self.known, self.family(case), judgement)
        if known is not None:
            self.known_hits[known] += 1
            self.known_seconds[known] += time.monotonic() - began
            own = set(own_fixes(known))
            if own and own <= set(self.runners.fixes):  # its own fix on (not merely one it requires)
                self.despite_fix[known] += 1
            return self._known(case, known, judgement), outcome
        if not outcome.cut_short and self._flaky(case, judgement):
            first = f"flaky: {judgement.details[0]}; the case passed when run again"
            return Judgement(case.property, Verdict.PASS, (first, *judgement.details[1:]), judgement.anomalies,
                             Excuse.FLAKY), outcome
        fixes = self._proven(case, judgement, outcome) if not judgement.ok else None
        if fixes:
            self.known_hits[FIXED_BY + "+".join(fixes)] += 1
            self.known_seconds[FIXED_BY + "+".join(fixes)] += time.monotonic() - began
            return Judgement(case.property, Verdict.PASS, (
                f"known: passes with fixes {', '.join(fixes)}: {judgement.details[0]}",), judgement.anomalies,
                Excuse.KNOWN), outcome
        return judgement, outcome

    def _proven(self, case: Case, judgement: Judgement, outcome: Outcome) -> tuple[str, ...] | None:
        """The smallest set of ``prove``'s fixes with which the case passes, the first case of each bucket core
        deciding for its core (under the fixes applied); None when it fails with all of them too. ``suspects``
        are tried alone first, then with ``prove``. The set must pass twice (a racy failure can pass once by
        chance); then each fix is left out in turn, with the fixes that require it, where the case still passes.
        A fault case passes only where its fault fired: a fix may pass one by no longer making the faulted call."""
        if not (self.prove or self.suspects) or self._late():
            return None
        key = (self._bucket(case, judgement, outcome).core, tuple(self.runners.fixes))
        if key not in self.fixed_by:
            self.fixed_by[key] = self._smallest_fix_set(case)
        return self.fixed_by[key]

    def _late(self) -> bool:
        return self.prove_until is not None and time.monotonic() > self.prove_until

    def _smallest_fix_set(self, case: Case) -> tuple[str, ...] | None:
        def passes(fixes: tuple[str, ...]) -> bool:
            if isinstance(case.fault, StateFault):
                return self.states_pass_with(case, (*self.runners.fixes, *fixes))
            judged = self.judged_with(case, (*self.runners.fixes, *fixes))
            return judged is not None and judged[0].ok and fault_fired(case, judged[1])

        groups = [tuple(self.suspects), tuple(dict.fromkeys((*self.suspects, *self.prove)))]
        for kept in dict.fromkeys(g for g in groups if g):
            if passes(kept) and passes(kept):
                break
        else:
            return None
        return _narrowed(kept, passes, self._late) or None  # passing with none: nothing is proven

    def judged_with(self, case: Case, fixes: tuple[str, ...]) -> tuple[Judgement, Outcome] | None:
        """The case judged with exactly these fixes applied on fresh runners; None where they could not run it."""
        with self.runners.patched(tuple(sorted(set(fixes)))):
            try:
                return self._judge(case)
            except Exception:
                return None

    def states_pass_with(self, case: Case, fixes: tuple[str, ...]) -> bool:
        """Whether every power-loss state of the case's fault op passes with exactly these fixes applied. A state
        names the IO of one trace, and a fix that changes the save's IO (an fsync, data before metadata) leaves a
        trace in which that state does not exist: a power-loss failure is explained by fixes where the fixed
        save has no failing state at all (what tests/test_fixes.py proves of each durability fix). A state that
        could not be run proves nothing."""
        with self.runners.patched(tuple(sorted(set(fixes)))):
            try:
                results, _ = crashstates(case, self.runners)
            except Exception:
                return False
        return bool(results) and all(r.judged and r.judgement.ok for r in results)

    def fixes_needed(self, case: Case, core: str) -> tuple[str, ...]:
        """A failure (bucket ``core``) met with fixes applied counts as a bug of stock code only where stock code
        fails the same way: then (). Where stock code passes twice, or fails in another bucket (a known bug met
        first), the smallest set of the applied fixes with which it still fails: a bug they unmask, or a bug of
        theirs; the report says which fixes."""
        applied = tuple(self.runners.fixes)

        def fails_alike(fixes: tuple[str, ...]) -> bool:  # a case these fixes cannot run (a state their IO lacks)
            judged = self.judged_with(case, fixes)     # shows nothing of the bug
            return judged is not None and not judged[0].ok and self.bucket(case, *judged).core == core

        if not applied or fails_alike(()) or fails_alike(()):
            return ()
        return _narrowed(applied, fails_alike, self._late)

    @staticmethod
    def _known(case: Case, known: str, judgement: Judgement) -> Judgement:
        return Judgement(case.property, Verdict.PASS, (f"known finding {known}: {judgement.details[0]}",),
                         judgement.anomalies, Excuse.KNOWN)

    def bucket(self, case: Case, judgement: Judgement, outcome: Outcome) -> Bucket:
        """A failure's root-cause bucket (properties.triage.buckets). A failure that shows a known bug and a new one is
        the new one's: its bucket is read past the known. A judgement cut short (ranks stuck behind a raiser) goes
        to the bucket its waited-out run found for the same shortcut."""
        bucket = self._bucket(case, judgement, outcome)
        return self.waited_out.get(bucket.core, (None, bucket))[1] if outcome.cut_short else bucket

    def _bucket(self, case: Case, judgement: Judgement, outcome: Outcome) -> Bucket:
        family = self.family(case)
        unknown = [a for a in judgement.anomalies if not any(k.matches(family, a) for k in self.known)]
        return bucket_of(case, unknown or judgement.anomalies, outcome.tracebacks) or Bucket(
            f"{judgement.verdict.value}|{judgement.details[0] if judgement.details else ''}")

    def _rerun_waiting(self, case: Case, judgement: Judgement, outcome: Outcome
                ) -> tuple[Judgement, Outcome, str | None]:
        """A fuzzing judgement cut short where ranks sat stuck behind one that raised: the first of its bucket is
        run again waiting every wait out (as ``replay`` does), and that run's judgement stands and tells what the
        shortcut's bucket is (a known finding, or the waited-out failure's bucket); later ones of the bucket are
        judged by the shortcut alone. Returns the judgement, its outcome and the known finding explaining it."""
        short = self._bucket(case, judgement, outcome)
        if short.core in self.waited_out:
            known = self.waited_out[short.core][0]
            return judgement, outcome, known
        with self.runners.waiting():
            full, full_outcome = self._judge(case)
        known = explained_by(self.known, self.family(case), full)
        if not full.ok:
            self.waited_out[short.core] = (known, self.bucket(case, full, full_outcome))
        return full, full_outcome, known

    def family(self, case: Case) -> str:
        """The SUT whose known findings apply: an adapter that subclasses a registered SUT and keeps its ``name``
        (a wrapper, a build with a planted defect) inherits that SUT's findings; any other goes by ``case.sut``."""
        name = getattr(self.runners.cls, "name", None)
        return name if name in REGISTRY else case.sut

    def _flaky(self, case: Case, judgement: Judgement) -> bool:
        """While fuzzing, a fault-free case whose only failure is ranks that died or hung runs once more: a crash
        the same ops do not repeat (a race in the runtime's own teardown, a wedged collective) is reported as
        flaky instead of failing the campaign and being shrunk towards nothing; one that repeats stands. Virtual
        ranks are not asked: their schedule is fixed (one rank at a time, in rank order), so the same ops repeat the
        same crash by construction and a second run only costs a relaunch."""
        if not self.exploring or judgement.ok or case.fault is not None or not ranks_stopped(judgement.anomalies):
            return False
        if self.runners.virtual:  # fault-free cases, the only ones asked, run on virtual ranks there
            return False
        again, _ = self._judge(case)
        if not again.ok:
            return False
        self.flaky.append(f"{case.property}: {judgement.details[0][:300]}")
        return True

    def _judge(self, case: Case) -> tuple[Judgement, Outcome]:
        if case.fault is not None and case.fault.drawn:
            return self._drawn(case)
        checker = checker_for(case)
        outcome = self._run(case)
        if checker is Checker.HISTORY:
            judgement = check_history(case, outcome, self.runners.cls.clear_errors)
            order = order_judgement(case, outcome)  # a recorded save: its IO judged against the contract
            if order is not None:
                judgement = worst([judgement, order]) or order
                outcome.resolved_fault = found_under(case, outcome)
            faulted = case.fault is not None and not judgement.ok
            return (self._charge_to_fault(case, judgement) if faulted else judgement), outcome
        if checker is Checker.ORACLE:
            return check_oracle(case, outcome), outcome
        if self._reference is None:
            self._reference = Runners("reference", mode="in-process")
        ref = run_case(dataclasses.replace(case, sut="reference"), self._reference)
        return check_diff(case, outcome, ref), outcome

    def _drawn(self, case: Case) -> tuple[Judgement, Outcome]:
        """A drawn fault, judged as the concrete fault it picks from a recording of this very case, on that
        recording (fault_runs.judge_alone: the ops before it and the traced op are not run again); only a failure
        there is replayed as its own case, which decides. Where the case has at most ``exhaustive`` crash points
        (or states) of that kind, every one of them is judged on warm ranks (from the drawn one on) and the first
        whose replay as its own case fails is the finding. The recording is also judged against the durability
        contract (``Outcome.order``), apart from the verdict."""
        with traced(case, self.runners) as t:
            record = dataclasses.replace(case, fault=RecordFault(op=t.op, capture=True))
            broken = order_judgement(record, t.outcome)
            if broken is not None:
                record = dataclasses.replace(record, fault=found_under(record, t.outcome))
            judgement, outcome = self._drawn_traced(case, t)
        outcome.order = (record, broken) if broken is not None else None
        return judgement, outcome

    def _drawn_traced(self, case: Case, t: Traced) -> tuple[Judgement, Outcome]:
        faults = t.concrete(case.fault)
        if not faults:
            return Judgement(case.property, Verdict.PASS, ("the op makes no IO under the root",),
                             excuse=Excuse.SKIPPED), Outcome(case.sut)
        first = case.fault.index % len(faults)
        if len(faults) > self.exhaustive:
            alone = judge_alone(t, faults[first], first, self.runners)
            if alone.judged and alone.judgement.ok:
                return alone.judgement, Outcome(case.sut, resolved_fault=faults[first])
            return self._concrete(dataclasses.replace(case, fault=faults[first]))  # a failure decides as its own case
        if isinstance(case.fault, PowerFault):
            states = t.all_states
            results = judge_crash_states(t, states[first:] + states[:first], self.runners)
        else:
            results = judge_points(t, faults[first:] + faults[:first], self.runners)
        unjudged = [r for r in results if not r.judged]
        for r in results:
            if r.judged and not r.judgement.ok:
                judgement, outcome = self._concrete(dataclasses.replace(case, fault=r.fault))
                if not judgement.ok or judgement.excuse is Excuse.UNATTRIBUTED:  # the same for every fault here
                    if not judgement.ok:  # where in the op the SUT is unsafe, point by point
                        outcome.io_map = place(timeline(t, case.sut), results, list(t.recording.all_calls), t.root)
                    return judgement, outcome
        what = "crash states" if isinstance(case.fault, PowerFault) else "crash points"
        note = f"; {len(unjudged)} could not be run: {unjudged[0].error}" if unjudged else ""
        return Judgement(case.property, Verdict.PASS, (f"every one of {len(results)} {what} judged, "
                                                       f"{len(results) - len(unjudged)} ran, none failing{note}",)
                         ), Outcome(case.sut)

    def _concrete(self, concrete: Case) -> tuple[Judgement, Outcome]:
        """Judge a drawn fault's concrete case; the outcome names the concrete fault (the finding carries it)."""
        try:
            judgement, outcome = self(concrete)
        except Unreplayable as exc:
            skipped = Judgement(concrete.property, Verdict.PASS, (f"skipped: {exc}",), excuse=Excuse.SKIPPED)
            return skipped, Outcome(concrete.sut)
        outcome.resolved_fault = concrete.fault
        return judgement, outcome

    def _charge_to_fault(self, case: Case, judgement: Judgement) -> Judgement:
        """A fault case's failure counts only if the fault caused it: the same ops without the fault must pass.
        Otherwise the SUT fails the case anyway (a fault-free property finds that bug) and it is not reported
        here, so fault campaigns are not swamped by, and do not shrink towards, bugs that need no fault."""
        control = dataclasses.replace(case, fault=None)
        control_outcome = run_case(control, self.runners)
        # The same history rules as the faulted run (rotation, latest, ...), only without the fault.
        plain = check_history(control, control_outcome, self.runners.cls.clear_errors)
        return charge_to_fault(case, judgement, plain)

    def _run(self, case: Case) -> Outcome:
        """Run the case; a power-loss state needs the save's IO in the order it was enumerated from, and ranks
        interleave differently from run to run, so such a case is retried a bounded number of times."""
        for attempt in range(STATE_ATTEMPTS):
            try:
                return run_case(case, self.runners)
            except TraceMismatch as exc:
                if attempt == STATE_ATTEMPTS - 1 and self.exploring:
                    self.unreplayable += 1
                    raise Unreplayable(str(exc)) from None
                if attempt == STATE_ATTEMPTS - 1:
                    raise CaseError(f"{exc} (in {STATE_ATTEMPTS} runs the ranks never interleaved their IO as "
                                    "recorded; the state cannot be replayed on this machine)") from None
        raise AssertionError("unreachable")

    def close(self, runners: bool = True) -> None:
        """Close what the judge started, and its runners unless they are shared (``runners`` False)."""
        if runners:
            self.runners.close()
        if self._reference is not None:
            self._reference.close()


def _without(fixes: tuple[str, ...], left_out: tuple[str, ...]) -> tuple[str, ...]:
    """``fixes`` less ``left_out`` and the fixes that require any of them."""
    return tuple(k for k in fixes if k not in left_out and not set(left_out) & set(FIXES[k].requires))


def _narrowed(kept: tuple[str, ...], passes: Callable[[tuple[str, ...]], bool],
              late: Callable[[], bool]) -> tuple[str, ...]:
    """The fixes of ``kept`` (with which the case passes) that it cannot pass without: halves, then quarters, ...
    of them are left out at once where the case still passes, down to single fixes. A case known by a fix or two
    among many is proven in a few dozen runs, not one run per fix; the last round leaves each fix out alone, so
    no single fix of the result can go. Past ``late`` the set is kept as it stands (proven, if not the smallest)."""
    size = max(1, len(kept) // 2)
    while True:
        start = 0
        while start < len(kept) and not late():
            trial = _without(kept, kept[start:start + size])
            if trial != kept and passes(trial):
                kept = trial
            else:
                start += size
        if size == 1 or late():
            return kept
        size = max(1, size // 2)


def fault_fired(case: Case, outcome: Outcome) -> bool:
    """Whether a run shows anything of its fault: a fault case shows its bug, or its fix, only where the fault
    fired (a fix may no longer make the faulted call); a recording of the op's IO fires whenever the op ran."""
    return case.fault is None or isinstance(case.fault, RecordFault) or bool((outcome.fault or {}).get("fired"))
