"""The bounded-exhaustive explorer (harness.campaign.explore) as a participant of a fault campaign: it takes turns
with the properties from the first round on, judges crash points and power-loss states a turn at a time from where
it stopped, and keeps its place in the corpus, so the nightly job goes on where the last night stopped.

The order is the explorer's: shapes shortest first, each op of a shape in turn the fault op, and for each op its
recorded IO judged against the durability contract (persistence order, harness.judging.persistence_order), its
crash points (a SIGKILL at each call), its power-loss states, then each call failing with each of ``ERRNOS``. A
turn that ends inside an op traces the op again next time (one run) and resumes at the next point. Once every
shape of ``max_len`` ops is judged, the next pass explores one op longer, up to ``MAX_LEN``; then it starts over
(the framework or the fixes may have changed since). A place is kept per SUT, world size and fix set: another of
those is another exploration.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from faults.spec import RecordFault
from harness.campaign.corpus import safe_name
from harness.campaign.explore import COMMIT_TIMEOUT, shape_case, shape_writes, shapes, without_failing_tensor
from harness.judging.fault_runs import CaseJudge, CrashResult, at_most, judge_crash_states, judge_points, traced
from harness.judging.judge import charge_to_fault
from harness.judging.run import run_case
from harness.ranks.runners import Runners
from properties.check.history import check_history
from properties.model.case import Case
from properties.model.verdicts import Judgement

KINDS = ("kill", "state")  # every op's crash points, then its power-loss states
ERRNOS = ("ENOSPC", "EIO")  # then each call failing with each of these
EVERY = (*KINDS, *ERRNOS)
CONFIRMS = 2  # failures per op and kind replayed in fresh processes
START_LEN, MAX_LEN = 2, 3  # ops per shape: the first pass, and the longest (ACE: most crash bugs need <= 3 ops)


@dataclass
class Place:
    """Where the exploration stands: the pass's shape length, the shape, its fault op, the fault kind, the point
    or state within it; and what was judged so far (per shape: judged / total, failing)."""

    max_len: int = START_LEN
    shape: int = 0
    op: int = 0
    kind: int = 0
    index: int = 0
    passes: int = 0  # complete passes over every length
    at: str = ""  # the shape ``shape`` counts to: a list of shapes that changed (a letter added) is found again
    judged: dict[str, dict[str, int]] = field(default_factory=dict)  # shape -> kind -> judged count
    totals: dict[str, dict[str, int]] = field(default_factory=dict)  # shape -> kind -> enumerated count

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> Place:
        """A kept place; TypeError or ValueError where it is not one this version wrote."""
        fields = {f.name: f.type for f in dataclasses.fields(cls)}
        place = cls(**{k: v for k, v in data.items() if k in fields})
        counts = (place.shape, place.op, place.kind, place.index, place.passes)
        if not all(type(n) is int and n >= 0 for n in (*counts, place.max_len)) or not isinstance(place.at, str):
            raise TypeError("a place's counters are whole numbers, its shape a string")
        if not START_LEN <= place.max_len <= MAX_LEN or not isinstance(place.judged, dict) \
                or not isinstance(place.totals, dict):
            raise ValueError(f"not a place of this explorer: {data}")
        return place


class Exploration:
    """One campaign's share of the explorer: ``turn`` judges points and states until its deadline."""

    def __init__(self, sut: str, capabilities: frozenset[str], world: int, *, kinds: tuple[str, ...] | None = None,
                 place: Place | None = None, options: dict | None = None, part: tuple[int, int] = (0, 1)) -> None:
        self.sut, self.capabilities, self.world = sut, capabilities, world
        self.part = check_part(part)  # (k, n): this explorer takes every n-th shape from the k-th (fleet shards)
        self.kinds = kinds or EVERY  # "kill", "state" or an errno name
        self.options = {"commit_timeout": COMMIT_TIMEOUT, **(options or {})}
        self.place = place or Place()
        self.seconds = 0.0
        self.points = self.states = 0  # judged this campaign
        self.orders = 0  # ops whose recorded IO was judged against the durability contract
        self.failing: list[tuple[Case, CrashResult]] = []
        self.errors: list[str] = []
        self._controls: dict[str, tuple[Case, Judgement]] = {}
        self._report: Callable[[Case, CrashResult], bool] | None = None
        self._stop = False  # the report asked the turn to end
        self._realign()

    def _realign(self) -> None:
        """A kept place counts into the list of shapes it was written with: where the list changed (the SUT claims
        an op it did not, or the explorer learnt a letter), it resumes at its shape, or starts that length over."""
        place, every = self.place, self.shapes()
        if place.shape < len(every) and place.at in ("", every[place.shape]):  # "": a place of no shape yet
            return
        if place.at in every:
            place.shape = every.index(place.at)
        else:
            place.shape = place.op = place.kind = place.index = 0

    def shapes(self) -> list[str]:
        k, n = self.part
        every = shapes(self.capabilities, self.place.max_len)
        return every[k::n] or every[:1]  # more parts than shapes: the spare parts go over the first one again

    def turn(self, runners: Runners, confirm: CaseJudge | None, until: float,
             report: Callable[[Case, CrashResult], bool] | None = None) -> list[tuple[Case, CrashResult]]:
        """Judge from where the exploration stands until ``until`` (a point or state started before it runs to
        its end); returns the failures found, each a concrete fault case and its result. ``report`` hears of each
        failure as it is found (so a campaign dates it truly) and ends the turn by returning True."""
        began, found = time.monotonic(), []
        self._report, self._stop = report, False
        try:
            with runners.warm():
                while time.monotonic() < until and not self._stop:
                    found += self._op(runners, confirm, until)
        finally:
            self.seconds += time.monotonic() - began
        self.failing += found
        return found

    def _found(self, found: list[tuple[Case, CrashResult]], case: Case, result: CrashResult) -> None:
        found.append((case, result))
        if self._report is not None and self._report(case, result):
            self._stop = True

    def _op(self, runners: Runners, confirm: CaseJudge | None, until: float) -> list[tuple[Case, CrashResult]]:
        """The current op's current kind, from the current index until done or ``until``; then the place moves."""
        place = self.place
        shape = place.at = self.shapes()[place.shape]
        case, control = self._control(shape, runners)
        kind = self.kinds[place.kind]
        key = f"op {place.op} {kind}"
        found: list[tuple[Case, CrashResult]] = []
        checked = place.judged.setdefault(shape, {})
        if f"op {place.op} order" not in checked and confirm is not None and control.ok:
            checked[f"op {place.op} order"] = 1
            for failure in self._order(case, shape_writes(case, shape)[place.op], confirm):
                self._found(found, *failure)
            if self._stop:
                return found
        # Each op and kind replays its first CONFIRMS failures in fresh processes; later ones (mostly the same bug
        # at the next point) stay unconfirmed: they count in a known bucket but open none.
        confirm = at_most(confirm if control.ok else None, CONFIRMS)
        fcase = dataclasses.replace(case, fault=RecordFault(op=shape_writes(case, shape)[place.op]))
        try:
            with traced(fcase, runners) as t:
                items = list(t.states()) if kind == "state" else t.points(None if kind == "kill" else kind)
                place.totals.setdefault(shape, {})[key] = len(items)
                while place.index < len(items) and time.monotonic() < until and not self._stop:
                    item = items[place.index]
                    result = (judge_crash_states(t, [item], runners, confirm) if kind == "state"
                              else judge_points(t, [item], runners, confirm))[0]
                    place.index += 1
                    if kind == "state":
                        self.states += 1
                    else:
                        self.points += 1
                    if result.judged:
                        counts = place.judged.setdefault(shape, {})
                        counts[key] = counts.get(key, 0) + 1
                    concrete = dataclasses.replace(case, fault=result.fault)
                    if result.judged and not result.judgement.ok and not control.ok:
                        result.judgement = charge_to_fault(concrete, result.judgement, control)
                    if result.failing:
                        self._found(found, concrete, result)
                    elif not result.judged:
                        self.errors.append(f"{shape} op {place.op} {kind}: {result.error}")
                if place.index < len(items):
                    return found
        except Exception as exc:  # the op could not be traced: it stays unjudged, and the exploration moves on
            self.errors.append(f"{shape} op {place.op} {kind}: {type(exc).__name__}: {exc}")
        self._advance(len(shape))
        return found

    def _order(self, case: Case, op: int, judge: CaseJudge) -> list[tuple[Case, CrashResult]]:
        """The op's recorded IO judged against the durability contract (harness.judging.persistence_order), once
        per op: a failure is a finding whether or not a crash point or state exposes it."""
        concrete = dataclasses.replace(case, fault=RecordFault(op=op, capture=True))
        self.orders += 1
        try:
            judgement, outcome = judge(concrete)
        except Exception as exc:  # the op could not be recorded: the check stays undone, and says why
            self.errors.append(f"op {self.place.op} persistence order: {type(exc).__name__}: {exc}")
            return []
        if judgement.ok:
            return []
        if outcome.resolved_fault is not None:  # with the interleaving it was found under
            concrete = dataclasses.replace(concrete, fault=outcome.resolved_fault)
        return [(concrete, CrashResult(concrete.fault, "persistence order", judgement, confirmed=True))]

    def _control(self, shape: str, runners: Runners) -> tuple[Case, Judgement]:
        """The shape's case and its fault-free judgement (failures the plain shape has are not the fault's)."""
        if shape not in self._controls:
            case = shape_case(self.sut, self.capabilities, self.world, shape, self.options)
            control = check_history(case, run_case(case, runners), runners.cls.clear_errors)
            if not control.ok:  # a tensor the SUT cannot save would excuse every fault: explore without it
                smaller, _, passing = without_failing_tensor(case, runners)
                if passing is not None:
                    case, control = smaller, passing
            self._controls[shape] = case, control
        return self._controls[shape]

    def _advance(self, ops: int) -> None:
        place = self.place
        place.index = 0
        place.kind += 1
        if place.kind < len(self.kinds):
            return
        place.kind, place.op = 0, place.op + 1
        if place.op < ops:
            return
        place.op, place.shape = 0, place.shape + 1
        if place.shape >= len(self.shapes()):
            place.shape = 0
            if place.max_len < MAX_LEN:
                place.max_len += 1
            else:
                place.max_len, place.passes = START_LEN, place.passes + 1
                place.judged, place.totals = {}, {}
        place.at = self.shapes()[place.shape]  # a kept place names the shape it stands at, not the one it left

    def summary(self) -> dict:
        """What the summary and report show: this campaign's judged points and states, their rate, where the
        exploration stands, and its judged / total per shape so far."""
        minutes = self.seconds / 60 or 1.0
        place = self.place
        shape = self.shapes()[place.shape]
        return {
            "seconds": round(self.seconds, 1), "points": self.points, "states": self.states,
            "orders": self.orders,
            "points_per_minute": round(self.points / minutes, 1), "states_per_minute": round(self.states / minutes, 1),
            "failing": len(self.failing), "errors": self.errors[:20],
            "at": f"max_len {place.max_len}, shape {shape} op {place.op} {self.kinds[place.kind]} #{place.index}",
            "passes": place.passes, "part": f"{self.part[0]}/{self.part[1]}",
            "shapes": {s: {k: f"{place.judged.get(s, {}).get(k, 0)}/{n}" for k, n in kinds.items()}
                       for s, kinds in place.totals.items()},
        }


def check_part(part: tuple[int, int]) -> tuple[int, int]:
    """``(k, n)``: part k (from 0) of n; ValueError where it is not one."""
    k, n = part
    if not (type(k) is int and type(n) is int and 0 <= k < n):
        raise ValueError(f"explorer part {k}/{n}: needs 0 <= K < N")
    return k, n


def parse_part(text: str) -> tuple[int, int]:
    """``K/N`` (``--explore-part``) as a part; ValueError naming the text where it is not one."""
    k, sep, n = text.partition("/")
    if not sep or not k.strip().isdigit() or not n.strip().isdigit():
        raise ValueError(f"explorer part {text!r}: expected K/N, e.g. 0/2")
    return check_part((int(k), int(n)))


def place_file(corpus_root: Path, sut: str, world: int, fixes: tuple[str, ...], kinds: tuple[str, ...] = EVERY,
               part: tuple[int, int] = (0, 1)) -> Path:
    """Where a corpus keeps the exploration of ``sut`` on ``world`` ranks with these fixes and fault kinds (and,
    split between fleet shards, this part of it)."""
    name = safe_name(sut)
    fixed = hashlib.sha256(",".join(sorted(fixes)).encode()).hexdigest()[:10] if fixes else "stock"
    split = f"-part{part[0]}of{part[1]}" if part[1] > 1 else ""
    return corpus_root / "explore" / f"{name}-{world}-{fixed}-{'+'.join(kinds)}{split}.json"


def read_place(path: Path) -> Place | None:
    """A kept place, or None (none kept, or one this version cannot read: the exploration starts over)."""
    try:
        return Place.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        return None


def keep_place(path: Path, place: Place) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(place.to_json(), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(path)

