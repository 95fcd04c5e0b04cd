"""A training job as a Hypothesis state machine on 2 in-process ranks: P-LIFECYCLE's grammar
(properties.generate.lifecycle.JobModel: train, sync / async / detached / held saves, waits, resumes, writer kills,
restarts, loads of the latest, of a name and of a name never saved, rotation, corruption) driven one step per rule.

Invariant (checked after every step that loads, over the whole history so far by
properties.check.history.check_history): the
latest checkpoint loads back as the last acknowledged state bitwise (or a save whose fate was still open), or
fails clearly where a crash or a corruption explains it; never a mix, never an older state, never wrong data.
The machine's ops are a Case: a failing sequence is written as a case file (``CKPT_HARNESS_CASE_DIR`` or the test's
tmp dir) that ``ckpt-harness replay`` reproduces. Broken SUTs (tests/suts/buggy.py) prove the machine has teeth.
Also here: the judge's sequence rules on synthetic outcomes, and the case language's new ops.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule, run_state_machine_as_test

from harness.judging.fault_runs import standard_case
from harness.judging.judge import Judge
from harness.judging.run import run_ops
from harness.ranks.runners import Runners
from harness.sut import adapter_class
from properties.check.history import check_history
from properties.generate.cases import Caps, tensor_cases
from properties.generate.fault_cases import has_latest
from properties.generate.layouts import sharded_layouts
from properties.generate.lifecycle import JobModel
from properties.model.case import Case, CaseError, Op
from properties.model.outcome import OpRecord, Outcome
from reference.engine import local_tensors
from reference.layout import Mesh

REPO = Path(__file__).resolve().parent.parent
NIGHTLY = settings.default.max_examples >= 1000  # the nightly profile scales the machine up
EXAMPLES, STEPS = (300, 30) if NIGHTLY else (15, 12)
MESH = Mesh((2,))
# Detached saves in flight at once. The reference's saver makes a second one wait for the first writer (about
# 0.4 s of process start-up here), which would dominate the CI run; nightly explores two.
MAX_PENDING = 2 if NIGHTLY else 1


@st.composite
def job_states(draw, caps: frozenset[str]) -> tuple[tuple, dict]:
    """1-3 small seeded tensors, each sharded or replicated over a 2-rank mesh."""
    tensors = draw(tensor_cases(Caps(caps), max_tensors=3, min_tensors=1))
    layout = {t.name: draw(sharded_layouts(MESH, len(t.shape))).to_json() for t in tensors}
    return tensors, layout


def write_case(case: Case, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    text = case.dumps()
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", case.sut)
    path = directory / f"stateful-{safe}-{hashlib.sha1(text.encode()).hexdigest()[:12]}.json"
    path.write_text(text + "\n", encoding="utf-8")
    return path


def job_machine(sut: str, case_dir: Path, stats: dict | None = None) -> type[RuleBasedStateMachine]:
    """The machine for ``sut``: a thin driver of P-LIFECYCLE's grammar (properties.generate.lifecycle.JobModel),
    one drawn step per rule, each run at once (harness.judging.run.run_ops, incrementally, on one root and live
    in-process
    ranks) so a detached save is really in flight, or held, while later steps run. After every step that loads
    the whole history so far is judged."""
    caps = frozenset(adapter_class(sut).capabilities)
    stats = {} if stats is None else stats
    options = {"commit_timeout": 10}  # a rank whose writer was killed turns into an error within 10 s

    class TrainingJob(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.runners = Runners(sut, "in-process")
            self.tmp = Path(tempfile.mkdtemp(prefix="ckh-job-"))
            self.root = self.tmp / "ckpt"
            self.root.mkdir()
            self.outcome = Outcome(sut)
            self.live: list = []  # runners begun on this job's case (run_ops keeps them across calls)
            self.tensors: tuple = ()
            self.layout: dict = {}
            self.model = JobModel(caps, has_latest(caps, options), two_layouts=False, max_pending=MAX_PENDING)
            self.failed = False

        def case(self) -> Case:
            return Case("P-LIFECYCLE", sut, self.tensors, self.layout, self.layout, tuple(self.model.ops), options)

        def run_new(self) -> None:
            """Run the ops the model added since the last call; judge the history if one of them loads."""
            first = len(self.outcome.records)
            case = self.case()
            self.root = run_ops(case, self.runners, self.root, range(first, len(case.ops)), self.outcome, self.live)
            if any(op.kind == "load" for op in case.ops[first:]):
                self.check(case)

        def check(self, case: Case) -> None:
            judgement = check_history(case, self.outcome, self.runners.cls.clear_errors)
            stats["loads"] = stats.get("loads", 0) + 1
            stats["loaded"] = stats.get("loaded", 0) + bool(self.outcome.records[-1].ok)
            stats.setdefault("kinds", set()).update(
                op.kind + "-detached" * op.detach + "-held" * op.stall for op in case.ops)
            if not judgement.ok:
                self.failed = True
                path = write_case(case, case_dir)
                details = "\n  ".join(judgement.details)
                raise AssertionError(f"{judgement.verdict.value} ({judgement.property}):\n  {details}\n"
                                     f"reproduce: python3 -m harness.cli replay {path}")

        @initialize(state=job_states(caps))
        def start(self, state) -> None:
            self.tensors, self.layout = state
            self.model.save()  # a job's first checkpoint
            self.run_new()

        @rule(data=st.data())
        def step(self, data) -> None:
            kinds = [k for k in self.model.enabled() if k != "burst"]  # bursts are P-LIFECYCLE's (many saves)
            self.model.step(data.draw, data.draw(st.sampled_from(kinds), label="step"))
            self.run_new()

        def teardown(self) -> None:
            """Every run ends as a resuming job does: whatever is in flight settled, then the latest loaded."""
            try:
                if not self.failed and self.model.latest:
                    if self.model.held:
                        self.model.settle("resume")
                    if self.model.pending:
                        self.model.settle("wait")
                    self.model.load(None)
                    self.run_new()
            finally:
                for runner in self.live:  # kills what is still in flight
                    with contextlib.suppress(Exception):
                        runner.end()
                self.runners.close()
                shutil.rmtree(self.tmp, ignore_errors=True)

    TrainingJob.__name__ = f"TrainingJob[{sut}]"
    return TrainingJob


def _case_dir(tmp_path: Path) -> Path:
    return Path(os.environ.get("CKPT_HARNESS_CASE_DIR") or tmp_path / "cases")


def test_reference_keeps_the_last_acknowledged_state(tmp_path: Path) -> None:
    stats: dict = {}
    machine = job_machine("reference", _case_dir(tmp_path), stats)
    run_state_machine_as_test(machine, settings=settings(max_examples=EXAMPLES, stateful_step_count=STEPS,
                                                         deadline=None, suppress_health_check=[HealthCheck.too_slow]))
    assert stats.get("loads", 0) >= EXAMPLES // 2 and stats.get("loaded", 0) > 0, stats  # not vacuous


BUGGY = [  # (SUT, verdict, shrink): shrinking re-runs the machine many times, so only where that is cheap
    pytest.param("tests.suts.buggy:AcksDeadWriterSut", "data-loss", True, id="acks-dead-writer"),
    pytest.param("tests.suts.buggy:RotatesAwayNewestSut", "data-loss", False, id="rotates-away-newest"),
    # an older checkpoint back is data loss, or silent corruption where a corruption came first in the history
    pytest.param("tests.suts.buggy:LoadsOldestSut", "data-loss|silent-corruption", False, id="loads-oldest"),
    pytest.param("tests.suts.buggy:SnapshotsInWriterSut", "silent-corruption", False, id="snapshots-in-writer"),
]


@pytest.mark.parametrize(("sut", "verdict", "shrink"), BUGGY)
def test_machine_catches_a_broken_sut_and_its_case_replays(tmp_path: Path, sut: str, verdict: str,
                                                           shrink: bool) -> None:
    case_dir = tmp_path / "cases"
    # An explicit seed, not derandomize: Hypothesis derives a derandomized seed from the machine's source text, so
    # any edit of the machine would move the search (and the shrunk case) somewhere else.
    machine = seed(0)(job_machine(sut, case_dir))
    phases = [Phase.generate, Phase.shrink] if shrink else [Phase.generate]
    with pytest.raises(AssertionError) as failure:
        run_state_machine_as_test(machine, settings=settings(
            max_examples=200, stateful_step_count=8, deadline=None, database=None, phases=phases,
            suppress_health_check=list(HealthCheck), print_blob=False))
    message = str(failure.value)
    assert re.search(verdict, message), message
    path = Path(re.search(r"replay (\S+\.json)", message).group(1))
    case = Case.load(path)
    assert case.sut == sut and case.property == "P-LIFECYCLE", case
    if shrink:
        assert len(case.ops) <= 4, case.ops  # async save, wait, load (and perhaps one more)
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "replay", str(path)], capture_output=True,
                          text=True, cwd=REPO, timeout=120)  # fresh launch: real rank processes
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert re.search(verdict, proc.stdout), proc.stdout
    fixed = path.with_name("fixed.json")
    fixed.write_text(json.dumps({**case.to_json(), "sut": "reference"}))
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "replay", "--launch", "in-process", str(fixed)],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)  # the same sequence passes on the reference


@pytest.mark.parametrize(("sut", "verdict"), [("reference", "pass"),
                                              ("tests.suts.buggy:SnapshotsInWriterSut", "silent-corruption")])
def test_a_held_writer_decides_the_race_with_training(sut: str, verdict: str) -> None:
    """A writer that copies the caller's tensors late usually still wins the race with the next training step;
    held (``stall``) until after the step, it loses it every time, so the case is a deterministic finding."""
    ops = (Op("save", "step-0", 0), Op("save", "step-1", 1, use_async=True, mutate_after=True, detach=True,
                                       stall=True), Op("resume"), Op("wait"), Op("load", None, 1))
    case = dataclasses.replace(BASE, sut=sut, ops=ops, property="P-LIFECYCLE")
    judge = Judge(Runners(sut, "in-process"))
    try:
        for _ in range(3):
            judgement, _ = judge(case)
            assert judgement.verdict.value == verdict, judgement.details
    finally:
        judge.close()


def test_reference_detects_a_bit_flip_in_its_latest_pointer(tmp_path: Path) -> None:
    """One flipped bit can turn the pointer's "step-001" into "step-000", and load-latest would return the older
    checkpoint silently; so the pointer carries a checksum, and every single-bit flip of it must give the newest
    checkpoint or a clear error."""
    from reference import CheckpointError, load_global, save

    states = [BASE.state(v) for v in (0, 1)]
    layouts = BASE.layouts("save")
    for v, state in enumerate(states):
        save(tmp_path, state, layouts, name=f"step-00{v}")
    pointer = tmp_path / "latest"
    original = pointer.read_bytes()
    for bit in range(len(original) * 8):
        flipped = bytearray(original)
        flipped[bit // 8] ^= 1 << (bit % 8)
        pointer.write_bytes(bytes(flipped))
        try:
            got = load_global(tmp_path)
        except CheckpointError:
            continue
        assert all(got[k] == t for k, t in states[1].items()), f"bit {bit}: an older or wrong checkpoint loaded"


# --- the judge's sequence rules on synthetic outcomes ------------------------------------------------------------

BASE = standard_case()
CLEAR = {"CheckpointIncomplete", "CheckpointNotFound", "ChecksumMismatch", "AsyncWriterError"}


def _state(version: int) -> dict:
    layouts = BASE.layouts("load")
    return {r: {n: lt.tensor for n, lt in local_tensors(BASE.state(version), layouts, r).items()} for r in (0, 1)}


def _mix(a: int, b: int) -> dict:
    return {0: _state(a)[0], 1: _state(b)[1]}


def _judge(steps: list, **changes) -> str:
    """Judge a history given as (op, result) pairs: result True (ok), a loaded state, or an error type name;
    ``changes`` replace fields of the case (options, fault)."""
    ops, recs = [], []
    for i, (op, result) in enumerate(steps):
        rec = OpRecord(i, op.kind, op.name)
        if isinstance(result, str):
            rec.ok, rec.error_type, rec.error = False, result, "x"
        elif isinstance(result, dict):
            rec.loaded = result
        ops.append(op)
        recs.append(rec)
    case = dataclasses.replace(BASE, ops=tuple(ops), **changes)
    j = check_history(case, Outcome("reference", recs), CLEAR)
    return j.verdict.value if j.ok else f"{j.verdict.value}/{j.property}"


def save(version: int, detach: bool = False, name: str | None = None) -> Op:
    return Op("save", name or f"step-{version}", version, use_async=detach, detach=detach)


LATEST = Op("load")


@pytest.mark.parametrize("latest, verdict", [
    (_state(1), "pass"),
    (_state(0), "data-loss/P-ATOMIC"),  # an older checkpoint came back
    ("CheckpointNotFound", "data-loss/P-ATOMIC"),  # nothing explains a failure
    (_mix(0, 1), "silent-corruption/P-ATOMIC"),
])
def test_a_waited_detached_save_is_acknowledged(latest, verdict: str) -> None:
    assert _judge([(save(0), True), (save(1, True), True), (Op("wait"), True), (LATEST, latest)]) == verdict


@pytest.mark.parametrize("settle", [None, "kill", "restart", "failed-wait"])
@pytest.mark.parametrize("latest, verdict", [
    (_state(0), "pass"),  # the pending or lost save never committed
    (_state(1), "pass"),  # ... or it did, complete
    ("CheckpointIncomplete", "pass"),  # ... or the newest is incomplete, clearly
    ("KeyError", "loud-failure/P-ATOMIC"),
    (_mix(0, 1), "silent-corruption/P-ATOMIC"),
])
def test_an_unacknowledged_detached_save_may_or_may_not_have_committed(settle, latest, verdict: str) -> None:
    steps = [(save(0), True), (save(1, True), True)]
    if settle == "failed-wait":
        steps.append((Op("wait"), "AsyncWriterError"))
    elif settle is not None:
        steps.append((Op(settle), True))
    got = _judge([*steps, (LATEST, latest)])
    if settle == "failed-wait":  # a writer error with nothing to explain it is a finding of its own
        assert got.startswith("loud-failure") or got == verdict
    else:
        assert got == verdict


def test_a_save_issued_after_the_last_acknowledgement_decides_nothing_old() -> None:
    killed_then_saved = [(save(0), True), (save(1, True), True), (Op("kill"), True), (save(2), True)]
    assert _judge([*killed_then_saved, (LATEST, _state(2))]) == "pass"
    assert _judge([*killed_then_saved, (LATEST, _state(1))]) == "data-loss/P-ATOMIC"  # settled before save 2
    assert _judge([*killed_then_saved, (LATEST, "CheckpointIncomplete")]) == "data-loss/P-ATOMIC"
    assert _judge([*killed_then_saved, (Op("restart"), True), (LATEST, "CheckpointIncomplete")]) \
        == "data-loss/P-NOLOSS"  # acknowledged, then the job crashed: the restart lost it


def test_concurrent_saves_either_may_be_latest() -> None:
    steps = [(save(0), True), (save(1, True), True), (save(2), True), (Op("wait"), True)]
    assert _judge([*steps, (LATEST, _state(1))]) == "pass"  # the async one committed last
    assert _judge([*steps, (LATEST, _state(2))]) == "pass"
    assert _judge([*steps, (LATEST, _state(0))]) == "data-loss/P-ATOMIC"


def test_rotation_may_delete_only_what_keep_newer_saves_cover() -> None:
    steps = [(save(0), True), (save(1), True), (save(2), True), (Op("rotate", keep=2), True)]
    assert _judge([*steps, (Op("load", "step-0"), "CheckpointNotFound")]) == "pass"  # two newer: may be gone
    assert _judge([*steps, (Op("load", "step-1"), "CheckpointNotFound")]) == "data-loss/P-NOLOSS"  # one newer
    assert _judge([*steps, (LATEST, "CheckpointIncomplete")]) == "data-loss/P-NOLOSS"  # never the latest
    assert _judge([*steps, (Op("load", "step-0"), _state(1))]) == "silent-corruption/P-ATOMIC"  # wrong data
    assert _judge([*steps, (Op("rotate", keep=1), True), (LATEST, _state(2))]) == "pass"
    assert _judge([*steps[:2], (Op("rotate", keep=1), "KeyError")]) == "loud-failure/P-ATOMIC"


def test_rotation_inside_every_save_counts_the_save_itself() -> None:
    """keep_last (a Trainer's save_total_limit): each save rotates, counting itself finished or not. Losing the
    older checkpoint is allowed only while a newer one loads; a fault that leaves neither is P-NOLOSS data loss."""
    keep1 = {"options": {"keep_last": 1}}
    acked = [(save(0), True), (save(1), True)]
    assert _judge([*acked, (Op("load", "step-0"), "CheckpointNotFound"), (LATEST, _state(1))], **keep1) == "pass"
    assert _judge([*acked, (Op("load", "step-0"), "CheckpointNotFound")]) == "data-loss/P-ATOMIC"  # no keep_last
    faulted = {**keep1, "fault": {"kind": "kill", "op": 1, "path": "x", "syscall": "openat", "k": 1}}
    crashed = [(save(0), True), (save(1), "Killed")]
    assert _judge([*crashed, (Op("load", "step-1"), _state(1)), (Op("load", "step-0"), "CheckpointNotFound")],
                  **faulted) == "pass"  # the newer one committed before the crash
    assert _judge([*crashed, (Op("load", "step-1"), "CheckpointIncomplete"), (Op("load", "step-0"), _state(0))],
                  **faulted) == "pass"  # the rotation had not run yet
    assert _judge([*crashed, (Op("load", "step-1"), "CheckpointIncomplete"),
                   (Op("load", "step-0"), "CheckpointNotFound")], **faulted) == "data-loss/P-NOLOSS"
    assert _judge([*crashed, (Op("load", "step-0"), "CheckpointNotFound")], **faulted) == "pass"  # step-1 untried


def test_corruption_may_fail_clearly_but_never_load_wrong_data() -> None:
    steps = [(save(0), True), (save(1), True), (Op("corrupt", seed=3), True)]
    assert _judge([*steps, (LATEST, "ChecksumMismatch")]) == "pass"
    assert _judge([*steps, (Op("load", "step-0"), "CheckpointNotFound")]) == "pass"
    assert _judge([*steps, (LATEST, "UnicodeDecodeError")]) == "loud-failure/P-CORRUPT"
    assert _judge([*steps, (LATEST, _mix(0, 1))]) == "silent-corruption/P-CORRUPT"
    assert _judge([*steps, (LATEST, _state(0))]) == "silent-corruption/P-CORRUPT"  # an older one is wrong too
    after = [*steps, (save(2), True)]  # saved after the corruption: must load
    assert _judge([*after, (LATEST, _state(2))]) == "pass"
    assert _judge([*after, (LATEST, "ChecksumMismatch")]) == "data-loss/P-ATOMIC"
    assert _judge([*steps, (save(2), "CheckpointIncomplete")]) == "pass"  # a clear refusal over a damaged root
    assert _judge([(save(0), True), (save(1), "CheckpointIncomplete")]) == "loud-failure/P-ATOMIC"


def test_a_machine_that_never_saved_must_not_load_data() -> None:
    assert _judge([(LATEST, "CheckpointNotFound")]) == "pass"
    assert _judge([(LATEST, _state(0))]) == "silent-corruption/P-ATOMIC"


# --- the case language --------------------------------------------------------------------------------------------


def test_sequence_ops_round_trip_and_old_cases_read_as_before() -> None:
    ops = (save(0), save(1, True), Op("wait"), Op("kill"), Op("restart"), Op("rotate", keep=2),
           Op("corrupt", seed=9, corruption="truncate"), LATEST)
    case = dataclasses.replace(BASE, ops=ops)
    again = Case.from_json(json.loads(case.dumps()))
    assert again == case and again.sequence and not BASE.sequence
    assert set(BASE.to_json()["ops"][0]) == {"kind", "name", "version", "use_async", "mutate_after"}
    for path in sorted((REPO / "tests" / "regressions").glob("*.json")):
        data = json.loads(path.read_text())
        data = data.get("case", data)
        assert Case.from_json(data).to_json()["ops"] == data["ops"], path


@pytest.mark.parametrize("op, message", [
    ({"kind": "teleport"}, "unknown operations"),
    ({"kind": "rotate"}, "'keep' must be at least 1"),
    ({"kind": "rotate", "keep": "2"}, "'keep' must be a non-negative integer"),
    ({"kind": "corrupt", "corruption": "melt"}, "'corruption' 'melt' is not one of"),
    ({"kind": "corrupt", "seed": -1}, "'seed' must be a non-negative integer"),
    ({"kind": "save", "name": "a", "detach": True}, "'detach' is for async saves"),
    ({"kind": "save", "name": "a", "use_async": True, "detach": "yes"}, "'detach' must be true or false"),
    ({"kind": "wait", "until": 3}, "unexpected keyword argument 'until'"),
])
def test_malformed_sequence_ops_are_case_errors(op: dict, message: str) -> None:
    data = BASE.to_json()
    data["ops"] = [data["ops"][0], op]
    with pytest.raises(CaseError, match=re.escape(message)):
        Case.from_json(data, "x.json")
