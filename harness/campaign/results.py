"""What a campaign was asked and what it met: its findings and their buckets, counts and costs. The report stage reads
these alone, so this module stays below the judging stack (nothing from ``harness.judging`` or ``harness.ranks``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from harness.campaign.corpus import Corpus
from harness.coverage.merge import Tracker
from properties.model.case import Case
from properties.model.verdicts import Judgement
from properties.triage.buckets import Bucket

MAX_EXAMPLES = 50  # cases per turn at most (cheap properties of the reference)


def shrink_room(seconds: float) -> float:
    """Seconds past ``--time`` a campaign may spend finishing the shrinking and proving of a failure it found."""
    return max(60.0, seconds * 0.5)


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
    # Found with fixes applied (--fixes): () where stock code fails the same way too; else the fixes without which
    # it passes (a bug they unmask, or a bug of theirs). None: no fixes were applied.
    needs_fixes: tuple[str, ...] | None = None
    # The fixes applied where it failed, which its replay applies too: the campaign's, less any its round's swarm
    # configuration left out (properties.generate.swarm.swarm_fixes). None: the campaign's.
    fixes: tuple[str, ...] | None = None


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
    fixes: list[str] = field(default_factory=list)  # known bugs patched on every rank (--fixes, harness.fixes)
    skipped: dict[str, str] = field(default_factory=dict)
    wall: float = 0.0
    launches: int = 0
    recovery: dict = field(default_factory=dict)  # Runners.recovery(): launches and seconds lost to failed ranks
    ptrace: bool = True  # fault cases may attach strace (else they use the psutil fallbacks)
    unreplayable: int = 0  # drawn power-loss states skipped: the ranks never interleaved their IO as recorded
    faults: bool = False  # the campaign injects faults (fault properties; P-RESUME may crash a save)
    devices: list[str] = field(default_factory=list)  # where the ranks ran ("cuda:0 (cpu:gloo,cuda:nccl)", "cpu")
    known: dict[str, int] = field(default_factory=dict)  # --skip-known: cases each known finding explained
    known_seconds: dict[str, float] = field(default_factory=dict)  # ... and the seconds those cases took
    known_despite_fix: dict[str, int] = field(default_factory=dict)  # ... of them, matched with their fix applied
    harness_errors: list[str] = field(default_factory=list)  # cases the harness itself failed on (type: message)
    # prop -> swarm batches that drew nothing: every case their configuration allows, the SUT refuses here
    # (a choice whose every value needs more ranks, say)
    idle_batches: Counter = field(default_factory=Counter)
    flaky: list[str] = field(default_factory=list)  # ranks died or hung once; the case passed when run again
    fatal: Exception | None = None  # the ranks could not start: the campaign stopped there (harness.campaign.fuzz)
    swarm: bool = True  # each batch draws from a random subset of the SUT's optional capabilities
    stop_when: Callable[[Finding], bool] | None = None  # end at the first finding this accepts (bench/detect.py)
    stopped: bool = False
    cases_per_property: int | None = None  # --cases: each property stops after this many judged cases
    corpus: Corpus | None = None  # --corpus: its bucket cases replayed first, new buckets kept in it
    corpus_rows: list[dict] = field(default_factory=list)  # each stored bucket: still failing, known, passing
    prop_seconds: Counter = field(default_factory=Counter)  # wall seconds each property's turns took
    observed: dict[str, Counter] = field(default_factory=dict)  # Hypothesis's observations per property (_observer)
    buckets: list[Bucket] = field(default_factory=list)  # the new bugs met, as their shrunk cases show them
    bucket_hits: Counter = field(default_factory=Counter)  # bucket id -> failing cases in it (new buckets)
    bucket_props: dict[str, set[str]] = field(default_factory=dict)  # bucket id -> properties that met it
    swarm_cases: Counter = field(default_factory=Counter)  # swarm feature left out -> cases of batches without it
    swarm_seconds: Counter = field(default_factory=Counter)  # ... and the seconds those batches took
    exploration: dict = field(default_factory=dict)  # the explorer's share (harness.campaign.exploration): its summary
    # Coverage of the framework's checkpoint code (harness.coverage): where every process writes its recording
    # (None: --coverage off), whether turns are weighted by what they add, and what each property's turns added
    coverage_dir: Path | None = None
    coverage_guided: bool = True
    coverage_turns: dict[str, list[tuple[int, float]]] = field(default_factory=dict)  # prop -> (new arcs, seconds)
    # swarm feature or "fix:<id>" -> kept (True) or left out (False) -> what those turns added (new arcs, seconds)
    feature_turns: dict[str, dict[bool, list[tuple[int, float]]]] = field(default_factory=dict)
    guidance: dict[str, dict[str, float]] = field(default_factory=dict)  # where it ended (guidance.arms)
    coverage_timeline: list[tuple[float, int]] = field(default_factory=list)  # (seconds in, arcs so far)
    coverage: Tracker | None = None  # the campaign's recording as read so far (harness.coverage.merge)

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
        """Nothing more to do before the time is up: ranks that cannot start, a first finding was all asked, or
        every property has run the cases asked of it (a campaign of none is the explorer's: only time ends it)."""
        return self.fatal is not None or self.stopped or (
            bool(self.properties) and all(self.capped(p) for p in self.properties))

    def capped(self, prop: str) -> bool:
        """``prop`` has run all the cases ``--cases`` allows it (a count-bounded campaign is the same run on any
        machine, however slow: the time bound then only guards against a hang)."""
        return self.cases_per_property is not None and self.cases_run[prop] >= self.cases_per_property

    def examples_for(self, prop: str, seconds: float) -> int:
        """Cases for one turn of ``prop``: as many as its past cases say fit in ``seconds`` (one at first)."""
        done = self.cases_run[prop]
        if self.cases_per_property is not None:  # not from measured seconds: the same cases on any machine
            return max(1, self.cases_per_property - done)
        if not done:
            return 1
        per_case = self.prop_seconds[prop] / done
        return max(1, min(MAX_EXAMPLES, int(seconds / max(per_case, 1e-3))))
