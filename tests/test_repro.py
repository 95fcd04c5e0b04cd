"""Standalone reproductions (harness/repro): every finding of tests/regressions/ whose repro was verified still
reproduces with nothing but its framework, and the pieces that write them do what they say."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from faults.spec import KillFault
from harness.cli import main
from harness.repro import reported_op
from harness.repro.render import repro_py, run_sh
from harness.repro.scripted_case import ReproUnsupported, script_case
from harness.repro.simplify import simplify
from harness.repro.verify import judge_run
from harness.sut import REGISTRY, framework_available
from properties.model.case import Op, read_case_file

REGRESSIONS = Path(__file__).parent / "regressions"
CASES = sorted(REGRESSIONS.glob("*.json"))
WITH_REPRO = [p for p in CASES if json.loads(p.read_text()).get("standalone_verified")]


def _ci_share(paths: list[Path], kind_of=lambda data: (data["sut"], data["verdict"])) -> list:
    """Every verified repro, run as its reader runs it, takes fresh launches (tens of seconds each): CI runs the
    first of each kind (by default each (SUT, verdict), so every way a script shows a bug is run on every SUT); the
    nightly run runs all."""
    seen: set = set()
    params = []
    for path in paths:
        data = json.loads(path.read_text())
        kind = kind_of(data)
        params.append(pytest.param(path, id=path.stem, marks=() if kind not in seen else pytest.mark.nightly))
        seen.add(kind)
    return params


def _case(stem: str):
    return read_case_file(REGRESSIONS / f"{stem}.json")[0]


def test_a_launch_per_world_and_per_restart() -> None:
    case = _case("paddle-dcp-resave-keeps-stale-metadata")
    scripted = script_case(case)
    kinds = [(p.world, [s.kind for s in p.steps]) for p in scripted.phases]
    restarts = sum(op.kind == "restart" for op in case.ops)
    assert len(scripted.phases) >= restarts + 1
    assert sum(len(steps) for _, steps in kinds) == sum(op.kind != "restart" for op in case.ops)
    assert {w for w, _ in kinds} == {case.world_size(case.op_layouts(i)) for i, op in enumerate(case.ops)
                                     if op.kind != "restart"}


def test_the_tables_hold_each_ranks_exact_bits() -> None:
    case = _case("paddle-dcp-version-cache")
    scripted = script_case(case)
    for (which, version), ranks in scripted.tables.items():
        whole = case.expected(version, which)
        for rank, pieces in ranks.items():
            for name, piece in pieces.items():
                raw = bytes.fromhex(piece.hexbits)
                box = tuple(slice(o, o + n) for o, n in zip(piece.offsets, piece.shape))
                assert raw == whole[name].bits[box].tobytes(), (which, version, rank, name)


@pytest.mark.parametrize(("change", "why"), [
    (lambda c: dataclasses.replace(c, ops=(*c.ops, Op("rotate", keep=1))), "rotate"),
    (lambda c: dataclasses.replace(c, ops=(*c.ops, Op("corrupt", seed=3))), "corrupt"),
])
def test_what_a_script_cannot_show_is_said(change, why: str) -> None:
    with pytest.raises(ReproUnsupported, match=why):
        script_case(change(_case("paddle-dcp-version-cache")))


@pytest.mark.parametrize("stem", ["paddle-dcp-version-cache", "paddle-dcp-async-not-isolated",
                                  "paddle-dcp-flat-cross-rank-load", "paddle-save-fp8-dtype-lost",
                                  "paddle-dcp-moe-ep2-to-ep1-dist-tensor-zeros", "paddle-dcp-power-loss-after-save",
                                  "torch-dcp-metadata-fsync-before-write", "paddle-dcp-metadata-bitflip-zeros"])
def test_the_script_is_python_with_every_step_named(stem: str) -> None:
    case = _case(stem)
    scripted = script_case(case)
    text = repro_py(scripted, "title", "a test")
    compile(text, "repro.py", "exec")
    for index, op in enumerate(case.ops):
        if op.kind != "restart":
            assert f"'step {index}: {op.kind}" in text
    if case.fault is not None:  # a fault becomes file edits after its op, then fresh processes
        assert "damage, [" in text and len(scripted.phases) >= 2
    assert 'if __name__ == "__main__":' in text  # a spawned writer re-imports the script: it must not run it
    shell = run_sh(scripted)
    assert shell.count("\nlaunch ") == len(scripted.phases)
    assert "timeout" in shell


def test_a_kill_at_a_call_ends_its_launch_and_the_load_after_it_may_give_either_save() -> None:
    """A kill at a syscall Python raises an audit event for (open, rename, ...) in a synchronous save: the step arms
    the kill, the launch ends with it (run.sh goes on only if the kill happened), and a load of the name after it
    accepts either the killed re-save or the save before it, whole and the same on every rank."""
    from faults.spec import KillFault

    case = _case("torch-dcp-resave-crash-mixes-versions")
    scripted = script_case(case)
    assert [[s.kind for s in p.steps] for p in scripted.phases] == [["save", "save"], ["load", "save", "load"]]
    killed = scripted.phases[0].steps[1]
    assert (killed.crash.event, killed.crash.path, killed.crash.k) == ("open", "step-0/__1_0.distcp", 1)
    load = scripted.phases[1].steps[0]
    assert {load.table, *load.also} == {("load", 0), ("load", 1)}
    assert scripted.phases[1].steps[2].also == ()  # step-2 was never killed: only its own save is right
    text = repro_py(scripted, "t", "s")
    compile(text, "repro.py", "exec")
    assert "crash_step('step 1: save step-0 (killed at call 1 of openat on step-0/__1_0.distcp)'" in text
    assert "sys.addaudithook" in text and "also=(DATA['load', 0][RANK], )" in text
    assert "launch 0 2; faulted 0 $? || exit $?" in run_sh(scripted)
    assert "crash_step" not in repro_py(script_case(_case("paddle-dcp-version-cache")), "t", "s")

    first = dataclasses.replace(case, fault=KillFault(op=1, syscall="write", k=1, path="step-0/__1_0.distcp"))
    crash = script_case(first).phases[0].steps[1].crash  # nothing between the open and it: killed as the open returns
    assert (crash.event, crash.k, crash.after) == ("open", 1, True)
    assert "'open', 'step-0/__1_0.distcp', 1, None, True, None, None, False)" in repro_py(script_case(first), "t", "s")
    write = dataclasses.replace(case, fault=KillFault(op=1, syscall="write", k=2, path="step-0/__1_0.distcp"))
    with pytest.raises(ReproUnsupported, match="a kill at a write call"):
        script_case(write)
    async_save = dataclasses.replace(case, ops=tuple(dataclasses.replace(op, use_async=True) if i == 1 else op
                                                     for i, op in enumerate(case.ops)))
    with pytest.raises(ReproUnsupported, match="synchronous save only"):
        script_case(async_save)


def test_a_kill_of_one_rank_and_a_load_of_a_never_finished_save() -> None:
    """A kill pinned to one rank's call arms the hook on that rank only; a load of a name whose only save was
    killed part-way may fail (it was never acknowledged) but must not give other bits."""
    from faults.spec import KillFault

    case = _case("torch-dcp-resave-crash-mixes-versions")
    first = dataclasses.replace(case, ops=case.ops[1:], fault=KillFault(op=0, syscall="openat", k=1, rank=1,
                                                                        path="step-0/__1_0.distcp"))
    scripted = script_case(first)
    first_step = scripted.phases[0].steps[0]
    assert first_step.crash.rank == 1 and "rank 1 killed at call 1" in first_step.label
    text = repro_py(scripted, "t", "s")
    assert "'open', 'step-0/__1_0.distcp', 1, None, False, 1, None, False)" in text
    load = scripted.phases[1].steps[0]
    assert load.kind == "load" and load.may_fail and "may_fail=True" in text
    assert not script_case(case).phases[1].steps[0].may_fail  # a re-save: the save before it was acknowledged


def test_a_rank_killed_some_seconds_into_a_save_is_killed_by_a_timer_and_ends_its_launch() -> None:
    """A kill-when fault on a delay (the harness kills rank 0's tree as the save begins): the script kills that
    rank from a timer that many seconds into the step, the launch ends with it, and the load runs in a fresh one."""
    case = _case("paddleformers-uc-crashed-save-taken-as-latest")
    scripted = script_case(case)
    crashed = [s for phase in scripted.phases for s in phase.steps if s.crash is not None]
    assert len(crashed) == 1 and crashed[0].crash.delay == 0.0 and crashed[0].crash.rank == 0
    assert "rank 0 killed 0 s into the step" in crashed[0].label
    load = scripted.phases[1].steps[0]
    assert len(scripted.phases) == 2 and load.kind == "load" and load.name is None
    # "latest" after a save killed part-way: that save whole (version 1), or the newest one acknowledged (0)
    assert load.table[1] == 1 and [t[1] for t in load.also] == [0] and not load.may_fail
    text = repro_py(scripted, "t", "s")
    compile(text, "repro.py", "exec")
    assert "threading.Timer(delay, fault_kill" in text and "('', '', 0, None, False, 0, 0.0, False)" in text
    bytes_case = dataclasses.replace(case, fault=dataclasses.replace(case.fault, delay=None, bytes_written=10))
    with pytest.raises(ReproUnsupported, match="kills on a delay only"):
        script_case(bytes_case)


def test_an_injected_errno_fails_the_call_and_ends_the_launch() -> None:
    """An error fault at a call Python audits becomes the same hook raising OSError(errno) at that call instead of a
    kill, in a synchronous save or load; the launch ends there and a later load accepts either save."""
    from faults.spec import ErrorFault

    base = _case("torch-dcp-resave-crash-mixes-versions")
    case = dataclasses.replace(base, fault=ErrorFault(op=1, syscall="rename", k=1, path="step-0/.metadata.tmp",
                                                      errno="ENOSPC"))
    scripted = script_case(case)
    step = scripted.phases[0].steps[1]
    assert step.crash.errno == "ENOSPC" and step.crash.event == "os.rename"
    assert "ENOSPC at call 1 of rename" in step.label and scripted.phases[1].steps[0].also
    text = repro_py(scripted, "t", "s")
    compile(text, "repro.py", "exec")
    assert "'os.rename', 'step-0/.metadata.tmp', 1, 'ENOSPC', False, None, None, False)" in text
    assert "raise OSError(getattr(errno, error)" in text
    write = dataclasses.replace(case, fault=ErrorFault(op=1, syscall="write", k=1, path="step-0/x", errno="EIO"))
    with pytest.raises(ReproUnsupported, match="an injected EIO at a write call"):
        script_case(write)


def test_a_kill_of_async_writers_becomes_kill_then_wait_and_the_job_restarts() -> None:
    """A kill-when fault on an async save's writers (target "children") becomes the save left running, a kill of
    the writers by the framework's own handle on them, and a wait: the launch ends there, as the harness's job does;
    a framework whose script cannot find its writers says so."""
    case = _case("torch-dcp-killed-process-writer-hangs")
    scripted = script_case(case)
    steps = [(s.index, s.kind, s.detach) for s in scripted.phases[0].steps]
    assert steps[-3:] == [(1, "save", True), (1, "kill", False), (1, "wait", False)]
    assert len(scripted.phases) >= 2 and all(s.index > 1 for p in scripted.phases[1:] for s in p.steps)
    text = repro_py(scripted, "t", "s")
    compile(text, "repro.py", "exec")
    assert "run('step 1: SIGKILL the writers of the detached saves (the trainer goes on)', kill_writers, 256)" in text
    assert "def kill_writers(after_bytes=None, timeout=60):" in text and "multiprocessing.active_children()" in text
    assert "timeout -k 10 180 " in run_sh(scripted)  # its op bound (60 s) twice over plus start-up, not 300 s
    paddle = dataclasses.replace(case, sut="paddle-save", options={})
    with pytest.raises(ReproUnsupported, match="cannot find its writers"):
        repro_py(script_case(paddle), "t", "s")
    sync = dataclasses.replace(case, ops=tuple(dataclasses.replace(op, use_async=False) for op in case.ops))
    with pytest.raises(ReproUnsupported, match="which starts none"):
        script_case(sync)


def test_a_unified_checkpoint_script_builds_the_trainer_state_it_saves() -> None:
    """The UC script holds the case's model/optimizer/master tensors as a Trainer's live state, saves through the
    Trainer and resumes in a fresh one; its async writers' code is there only where a step needs it."""
    for stem, async_code in (("paddleformers-uc-bf16-nan-payload-sync-save", False),
                             ("paddleformers-uc-killed-writer-deadlocks-next-save", True)):
        scripted = script_case(_case(stem))
        text = repro_py(scripted, "t", "s")
        compile(text, "repro.py", "exec")
        assert "trainer._save_checkpoint(" in text and "trainer._load_from_checkpoint(path)" in text
        # the Trainer's end of training (UC ends its writers) and the trainer state the save wrote, .json or .bin
        assert "handler.unlink_shared_memory()" in text and "TrainerState.load(state)" in text
        assert ("def wait(" in text) is async_code and ("def kill_writers(" in text) is async_code
        assert "python -m paddle.distributed.launch" in run_sh(scripted)
    pdc = repro_py(script_case(_case("paddleformers-uc-missing-checkpoint-wedges-group")), "t", "s")
    assert 'os.environ["FLAG_LLM_PDC"] = "True"' in pdc and "KEEP_LAST = 1" in pdc


def test_a_trainer_script_trains_with_the_reference_loop_as_data() -> None:
    """A Trainer job's script runs ``Trainer.train`` itself; the reference loop is data in it (each step's loss and
    each parameter's gradient, the reference's Adam arithmetic), and after each train and load the whole state must
    equal the uninterrupted reference run's."""
    from reference.training import gradient, rng_output, step_loss

    case = _case("paddleformers-trainer-ema-threshold-reads-summed-loss")
    scripted = script_case(case)
    assert [s.kind for phase in scripted.phases for s in phase.steps] == ["train", "save", "load"]
    assert ("save", 0) in scripted.tables  # the job's step-0 state: the model's initial values
    text = repro_py(scripted, "t", "s")
    compile(text, "repro.py", "exec")
    spec = case.spec()
    assert f"LOSSES = {({t: step_loss(spec, t) for t in (1, 2, 3)})!r}" in text  # and one step too many
    w = next(p for p in case.params() if p.name == "w")
    assert gradient(w, rng_output(spec, 2)).tobytes().hex() in text
    assert "trainer.train(resume_from_checkpoint=JOB[1])" in text and "def adam_update(" in text
    assert "run('step 0: train to step 2', train, 2, DATA['save', 2][RANK])" in text
    assert "LOGGING_STEPS = 2" in text and "loss_threshold=1.5" in text
    assert "python -m paddle.distributed.launch" in run_sh(scripted)


def test_what_a_trainer_script_cannot_show_is_said() -> None:
    case = _case("paddleformers-trainer-ema-threshold-reads-summed-loss")
    with pytest.raises(ReproUnsupported, match="on no named path"):
        script_case(dataclasses.replace(case, fault=KillFault(op=1, syscall="rename", k=1)))
    with pytest.raises(ReproUnsupported, match="a record fault in a training case"):
        script_case(_case("paddleformers-zcc-dump-not-durable-at-signal"))
    with pytest.raises(ReproUnsupported, match="training case on paddle-dcp"):
        repro_py(script_case(dataclasses.replace(case, sut="paddle-dcp")), "t", "s")


def test_a_zcc_script_runs_one_live_job_with_zccs_shims_as_text() -> None:
    """A Zero-Cost Checkpointing script trains one live job (trainer_job's, as text) with ZCC's arguments from the
    adapter; ZCC's CPU shims are the harness's own text, the worker's side installed where a spawned worker imports
    the script again; a stalled save holds the worker and the train after it lets it go after the grace."""
    import inspect

    from harness.sut import zcc_shims

    scripted = script_case(_case("paddleformers-zcc-stalled-save-torn"))
    assert [[s.kind for s in phase.steps] for phase in scripted.phases] == [["train", "save", "train", "wait"],
                                                                           ["load"]]
    text = repro_py(scripted, "t", "s")
    compile(text, "repro.py", "exec")
    assert text.startswith('"""t') and "from __future__ import annotations" in text
    assert inspect.getsource(zcc_shims._ipc) in text and "def _adamw(" not in text
    assert 'if __name__ == "__mp_main__":' in text and "class TrainerJob:" in text
    assert "'enable_zero_cost_checkpoint': True" in text and "'gradient_accumulation_steps': 2" in text
    assert "run('step 1: save step-2 (async) (its writers held)', holding, save, 'step-2'" in text
    assert "def holding(" in text and "os.kill(process.pid, signal.SIGSTOP)" in text
    unheld = repro_py(script_case(_case("paddleformers-zcc-sharding-v2-0d-parameter")), "t", "s")
    assert "def holding(" not in unheld and "def owned_range(" in unheld


def test_a_zcc_script_resumed_on_another_world_gets_that_worlds_arguments() -> None:
    """ZCC's arguments depend on the job's world (its sharding degree): a resume on another world runs a launch of
    that world, which builds its job with that world's arguments."""
    from reference.layout import Mesh, replicated

    case = _case("paddleformers-zcc-stalled-save-torn")
    grown = replicated(Mesh((3,))).to_json()
    scripted = script_case(dataclasses.replace(case, load_layout={k: grown for k in case.load_layout}))
    assert sorted({phase.world for phase in scripted.phases}) == [2, 3]
    text = repro_py(scripted, "t", "s")
    compile(text, "repro.py", "exec")
    assert "ZCC_ARGUMENTS = {2: {" in text and ", 3: {" in text
    assert 'ZCC_ARGUMENTS[int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))]' in text


def test_a_kill_in_a_training_job_reaches_the_processes_its_ranks_spawned() -> None:
    """A kill at a syscall in a training case (strace follows the rank's whole tree) is armed in the rank and in the
    processes it spawned (ZCC's worker, which imports the script again, started before the step): they count the
    call only while the rank runs the faulted step. A writer's kill leaves its rank to end the step, so run.sh calls
    the launch's hang the bug, where after a rank's own kill the job restarts and the launch's end is not judged."""
    case = _case("paddleformers-zcc-killed-worker-hangs-rank")
    scripted = script_case(case, upto=3)
    assert [[s.kind for s in p.steps] for p in scripted.phases] == [["train", "save", "train", "save"]]
    crash = scripted.phases[0].steps[3].crash
    assert crash is not None and crash.spawned and (crash.event, crash.path, crash.k, crash.rank) == (
        "open", "checkpoint-2/trainer_state.bin", 1, 0)
    text = repro_py(scripted, "t", "s")
    compile(text, "repro.py", "exec")
    call = "('open', 'checkpoint-2/trainer_state.bin', 1, None, False, 0, None, True)"
    label = "'step 3: save step-2 (rank 0 or a process it spawned killed at call 1 of openat on " \
            "checkpoint-2/trainer_state.bin)'"
    assert f"        crash_step({label}, {call}, save, 'step-2', DATA['save', 2][RANK])" in text
    assert 'if __name__ == "__mp_main__":  # a process a rank spawned' in text
    assert f"    arm_spawned({label}, {call})" in text
    assert text.index('    os.environ["REPRO_RANK"] = str(RANK)') < text.index("run('step 0: train to step 1'")
    assert "open(armed_path(), \"w\").close()" in text and "fault_hook(step, call, armed_path())" in text
    sh = run_sh(scripted)
    assert "launch 0 2; faulted 0 $? || exit $?" in sh
    assert sh.index('grep -qs "^writer " "$WORK/fault-$1"') < sh.index('[ -e "$WORK/fault-$1" ] && return 0')
    rank_only = repro_py(script_case(_case("torch-dcp-resave-crash-mixes-versions")), "t", "s")
    assert "\n    arm_spawned(" not in rank_only and "REPRO_RANK\"] = " not in rank_only  # a rank's kill: its own


def test_a_trainer_script_refuses_the_steps_only_zccs_renders() -> None:
    case = _case("paddleformers-trainer-ema-threshold-reads-summed-loss")
    stalled = _case("paddleformers-zcc-stalled-save-torn")
    with pytest.raises(ReproUnsupported, match=r"save step-2 \(async\).* training case on paddleformers-trainer"):
        repro_py(script_case(dataclasses.replace(stalled, sut=case.sut)), "t", "s")


def test_a_lost_directory_entry_is_undone_where_that_is_exact() -> None:
    """A power loss that loses the last call's directory entry becomes the edit undoing it (a rename moved back, a
    created file or made directory removed), only where that is exact: the last call, a new entry of the save's
    own directory; an unlink, a re-save's entry or one with calls after it are refused with the reason."""
    from faults.spec import StateFault

    case = _case("torch-dcp-directory-never-fsynced")
    scripted = script_case(case)
    (damage,) = [s for p in scripted.phases for s in p.steps if s.kind == "damage"]
    assert damage.edits == ({"kind": "rename_back", "path": "step-0/.metadata", "to": "step-0/.metadata.tmp"},)
    assert "os.rename(path, os.path.join(ROOT, e[\"to\"]))" in repro_py(scripted, "t", "s")

    def lost(what: str, op: int = 14, save_twice: bool = False):
        state = dict(case.fault.state, detail={"op": op, "skipped": [], "what": what})
        ops = (case.ops[0], *case.ops) if save_twice else case.ops
        fault = StateFault(op=1 if save_twice else 0, state=state, schedule=case.fault.schedule)
        return dataclasses.replace(case, ops=ops, fault=fault)

    created = script_case(lost("open step-0/__0_0.distcp (O_CREAT|O_TRUNC)"))
    assert {"kind": "remove", "path": "step-0/__0_0.distcp"} in [e for p in created.phases for s in p.steps
                                                               for e in s.edits]
    assert "shutil.rmtree(path)" in repro_py(script_case(lost("mkdir step-0")), "t", "s")
    for what, op, twice, why in (("unlink step-0/x", 14, False, "cannot bring back"),
                                 ("rename step-0/.metadata.tmp -> step-0/.metadata", 9, False, "later calls"),
                                 ("rename step-0/.metadata.tmp -> step-0/.metadata", 14, True, "re-save"),
                                 ("rename a -> b", 14, False, "outside the save's own directory")):
        with pytest.raises(ReproUnsupported, match=why):
            script_case(lost(what, op, twice))


def test_a_cover_case_checks_what_each_save_recorded() -> None:
    """P-COVER judges the pieces a save records, which a load may never read: its script reads the metadata after
    each save and checks the pieces tile each tensor once; a framework whose script cannot read it says so."""
    case = _case("paddle-dcp-uneven-dist-tensor-4-ranks")
    scripted = script_case(case)
    assert [s.kind for s in scripted.phases[0].steps][:2] == ["save", "check"]
    text = repro_py(scripted, "t", "s")
    compile(text, "repro.py", "exec")
    assert "run('step 0: the pieces save step-1 recorded cover each tensor once', check_recorded, 'step-1')" in text
    assert "check_recorded" not in repro_py(script_case(_case("paddle-dcp-version-cache")), "t", "s")
    torch = dataclasses.replace(_case("torch-dcp-resave-crash-mixes-versions"), property="P-COVER", fault=None)
    with pytest.raises(ReproUnsupported, match="cannot read its metadata"):
        repro_py(script_case(torch), "t", "s")


def test_a_held_writer_is_gated_at_its_start_until_the_resume_step() -> None:
    """A stalled save (its writers held from the start) and the resume that lets them go: where the framework writes
    in a thread of the caller (paddle.async_save) the script gates the threads the call starts, where it spawns a
    writer process (Paddle's flex checkpoint) the script stops it as the call returns; a script that has neither
    says it cannot hold them."""
    case = _case("paddle-save-async-save-no-copy")
    scripted = script_case(case)
    assert [(s.kind, s.hold) for s in scripted.phases[0].steps] == [("save", True), ("resume", False), ("wait", False),
                                                                ("load", False)]
    text = repro_py(scripted, "t", "s")
    compile(text, "repro.py", "exec")
    assert "holding, save, 'step-0'" in text and "run('step 1: let the held writers go', resume)" in text
    assert "threading.Thread.start = held_start" in text
    processes = repro_py(script_case(dataclasses.replace(case, sut="paddle-dcp")), "t", "s")
    assert "os.kill(p.pid, signal.SIGSTOP)" in processes and "threading.Thread.start" not in processes
    with pytest.raises(ReproUnsupported, match="cannot hold its writers"):
        repro_py(script_case(dataclasses.replace(case, sut="torch-dcp")), "t", "s")


def test_a_held_save_that_a_restart_ends_still_needs_its_hold() -> None:
    """A held save need not be resumed: the job may die with its writers held (the next launch is the restart).
    The script still holds them, and kills them as its launch ends, as the crash did."""
    scripted = script_case(_case("paddle-dcp-resave-after-crashed-async-keeps-its-metadata"))
    assert not any(s.kind == "resume" for phase in scripted.phases for s in phase.steps)
    text = repro_py(scripted, "t", "s")
    compile(text, "repro.py", "exec")
    assert "holding, save, 'step-0'" in text and "os.kill(p.pid, signal.SIGKILL)" in text


def test_equal_tables_are_written_once() -> None:
    text = repro_py(script_case(_case("paddle-dcp-version-cache")), "t", "s")
    assert "# the same pieces" in text


@pytest.mark.parametrize(("status", "output", "verdict", "step", "shown", "how"), [
    (0, "rank 0: every step ...", "silent-corruption", None, False, "passed"),
    (1, "BUG: step 2: load x on rank 0\nEXPECTED: ...", "silent-corruption", 2, True, "marked"),
    (1, "BUG: step 1: load x on rank 0", "silent-corruption", 2, False, "another-step"),
    # other bits are how a silent corruption shows: an error at its step is another bug on the way
    (1, "BUG: step 2: load x raised on rank 0\nEXPECTED: it succeeds", "silent-corruption", 2, False, "another-bug"),
    (1, "BUG: step 2: load x raised on rank 0\nACTUAL: E", "loud-failure", 2, True, "marked"),
    (124, "BUG: launch 0 did not finish", "hang", None, True, "hang"),
    (124, "", "loud-failure", None, False, "hang"),
    (134, "terminate called after throwing", "crash", None, True, "crash"),
    (1, "Traceback (most recent call last):\n NameError", "crash", None, False, "script-error"),
])
def test_a_run_shows_the_finding_only_the_way_its_verdict_says(status, output, verdict, step, shown, how) -> None:
    result = judge_run(status, output, verdict, step)
    assert (result.shown, result.how) == (shown, how)


@pytest.mark.parametrize(("status", "output", "shown", "how"), [
    (124, "", True, "hang"),
    (1, "BUG: step 3: save step-2 raised on rank 0", True, "marked"),
    (1, "BUG: step 4: load step-2 raised on rank 0", True, "marked"),  # the data-loss way, at its own op
    (1, "BUG: step 2: load step-1 raised on rank 0", False, "another-step"),
    (0, "", False, "passed"),
])
def test_a_racy_finding_is_shown_by_any_of_its_ways(status, output, shown, how) -> None:
    """A finding whose race decides how it shows (its ``or`` ways: a hang, a loud failure, data loss at a later
    load) is verified by a run that shows any of them, from its reported step on; an earlier step is another bug."""
    result = judge_run(status, output, "hang", 3, ways=("data-loss", "loud-failure"))
    assert (result.shown, result.how) == (shown, how)
    assert not judge_run(1, "BUG: step 4: load step-2 raised on rank 0", "hang", 3).shown  # one way: no


def test_simplification_keeps_only_changes_that_still_fail() -> None:
    case = _case("paddle-dcp-zero-size-safetensors")  # safetensors; pickle loads it
    stays_safetensors = lambda c, f, launch: c.options.get("format") == "safetensors"  # noqa: E731
    simpler, kept, tried = simplify(case, {}, "fresh", stays_safetensors)
    assert simpler == case and kept == [] and "pickle instead of safetensors" in tried
    simpler, kept, _ = simplify(case, {}, "fresh", lambda c, f, launch: True)
    assert simpler.options["format"] == "pickle" and kept == ["pickle instead of safetensors"]


def test_simplification_keeps_the_bug_not_the_verdict(monkeypatch) -> None:
    """A simpler case failing with the finding's verdict and words, but in another bucket (another known bug met
    on the simpler path), is not kept: the repro must show the finding's own bug."""
    import importlib

    from properties.model.verdicts import Judgement, Verdict

    module = importlib.import_module("harness.repro.simplify")  # the package re-exports the function by this name
    def fake(case, launch, fixes=()):
        core = "its-bug" if case.options.get("format") == "safetensors" else "another-bug"
        return Judgement(case.property, Verdict.LOUD_FAILURE, ("op 1 (load): raised",)), None, core

    monkeypatch.setattr(module, "_judged", fake)
    finding = {"verdict": Verdict.LOUD_FAILURE.value, "expect": "raised"}
    case = _case("paddle-dcp-zero-size-safetensors")
    simpler, kept, tried = simplify(case, finding, "fresh")
    assert simpler == case and kept == [] and "pickle instead of safetensors" in tried


def test_a_report_names_no_path_of_the_machine_that_wrote_it() -> None:
    import sys
    import sysconfig

    from harness.repro import portable

    raw = (f"File \"{sysconfig.get_paths()['purelib']}/paddle/x.py\", line 3\n{sys.prefix}/bin/python\n"
           "== /tmp/ckh-tests-ab/tmp.Zx81kQ02aa/log0/workerlog.1")
    shown = portable(raw)
    assert "site-packages/paddle/x.py" in shown and "$WORK/log0/workerlog.1" in shown
    assert sys.prefix not in shown and "/tmp/" not in shown


def test_the_reported_op_is_read_from_the_judgement() -> None:
    assert reported_op(["acknowledged version 1 (op 2) no longer loads: op 4 (load step-1): x"]) == 4
    assert reported_op(["nothing here"]) is None


def test_bad_input_is_one_line(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["repro", str(bad), "--out", str(tmp_path / "out")]) == 2
    assert main(["replay", str(tmp_path)]) == 2  # a folder without run.sh
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("ckpt-harness: error:") for line in err)
    assert "no run.sh" in err[1]


def test_a_sut_without_scripts_gets_a_report_saying_so(tmp_path: Path, capsys) -> None:
    finding = tmp_path / "f.json"
    data = json.loads((REGRESSIONS / "paddle-dcp-version-cache.json").read_text())
    data["case"]["sut"] = data["sut"] = "reference"
    finding.write_text(json.dumps(data))
    assert main(["repro", str(finding), "--out", str(tmp_path / "r")]) == 1
    assert "no standalone script for reference" in (tmp_path / "r" / "REPORT.md").read_text()
    updated = json.loads(finding.read_text())
    assert updated["standalone_verified"] is False and updated["repro"] == "r"


def test_a_repro_the_harness_fails_to_write_never_costs_the_campaigns_results(tmp_path: Path, monkeypatch,
                                                                           capsys) -> None:
    import harness.repro as repro
    from harness.cli import _repro_of

    def broken(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(repro, "make_repro", broken)
    row = _repro_of(tmp_path / "000-P-X-sut.json", "pool")
    assert row == {"standalone_verified": False, "repro_error": "internal error of the harness (not a finding): "
                   "RuntimeError: disk full (--debug shows the traceback)"}
    assert "the harness failed writing it" in capsys.readouterr().err


def test_a_repro_past_the_campaigns_time_is_left_with_its_command(tmp_path: Path, monkeypatch, capsys) -> None:
    """--time bounds the job a user waits for: once it and the shrinking room are spent, a new bucket's repro is
    not written; the row and the terminal give the command that writes it."""
    import time

    import harness.repro as repro
    from harness.cli import _repro_of

    monkeypatch.setattr(repro, "make_repro", lambda *a, **k: pytest.fail("written past the time"))
    path = tmp_path / "findings" / "000-P-X-sut.json"
    row = _repro_of(path, "pool", until=time.monotonic() - 1)
    assert row["standalone_verified"] is False
    assert row["repro_deferred"] == f"ckpt-harness repro {path} --out {tmp_path / 'repro' / '000-P-X-sut'}"
    assert row["repro_deferred"] in capsys.readouterr().err


@pytest.mark.skipif(not framework_available(REGISTRY["paddle-dcp"]), reason="a diff reads paddle")
def test_a_repro_gets_its_candidate_fix_once(tmp_path: Path) -> None:
    """A repro written before its bug's fix existed gets it (repro --candidate-only): fix.py and fix.diff beside the
    script, run.sh's --with-fix and repro.py's hook each once however often it is refreshed, and REPORT.md's
    "Candidate fix" with the patch and the other rows the fix resolves; a finding no fix covers gets none."""
    import shutil

    from harness.fixes import FIXES, covering
    from harness.repro import refresh_candidate

    stem = "paddle-dcp-version-cache"
    data = json.loads((REGRESSIONS / f"{stem}.json").read_text())
    shutil.copy(REGRESSIONS / f"{stem}.json", tmp_path / f"{stem}.json")
    folder = shutil.copytree(REGRESSIONS / data["repro"], tmp_path / "repro")
    for name in ("fix.py", "fix.diff"):
        (folder / name).unlink(missing_ok=True)
    for _ in range(2):
        summary = refresh_candidate(tmp_path / f"{stem}.json", folder, verify=False)
    (own,) = summary["fix"]["own"]
    assert summary["fix"]["ids"] == list(covering(stem)) and stem in FIXES[own].covers
    run_text, script = (folder / "run.sh").read_text(), (folder / "repro.py").read_text()
    assert run_text.count("--with-fix") == 2 and script.count("fix.apply()") == 1  # run.sh: its comment, its test
    report = (folder / "REPORT.md").read_text()
    assert "## Candidate fix" in report and f"`{own}`" in report and (folder / "fix.diff").read_text() in report
    assert all(f"`{s}`" in report for s in FIXES[own].covers if s != stem)
    assert "PATCHES = [" in (folder / "fix.py").read_text()

    other = "paddle-save-resave-crash-mixes-versions"  # a row no fix covers
    if not covering(other):
        shutil.copy(REGRESSIONS / f"{other}.json", tmp_path / f"{other}.json")
        bare = shutil.copytree(REGRESSIONS / json.loads((REGRESSIONS / f"{other}.json").read_text())["repro"],
                               tmp_path / "bare")
        assert "fix" not in refresh_candidate(tmp_path / f"{other}.json", bare, verify=False)
        assert not (bare / "fix.py").exists() and "Candidate fix" not in (bare / "REPORT.md").read_text()


@pytest.mark.skipif(not framework_available(REGISTRY["paddle-dcp"]), reason="needs paddle")
def test_a_bug_shown_only_behind_a_fix_gets_a_repro_that_applies_it(tmp_path: Path, monkeypatch, capsys) -> None:
    """A finding that stock code does not show (its ``needs_fixes``: here a fix that breaks loads of more than one
    tensor, as a campaign with it applied shrank it) gets a repro that applies those fixes in every process
    (needs.py), so ``run.sh`` shows the finding's own failure, and REPORT.md says why."""
    import inspect

    from paddle.distributed.flex_checkpoint.dcp import load_state_dict as loading

    from harness.fixes import FIXES
    from harness.fixes.patch import Fix, Hunk, source_digest

    func = loading._load_state_dict
    line = "    resharder.reshard()\n"
    broken = Fix("test-unmask", "fix", "paddle", "0", "_load_state_dict: a fix that breaks loads", (Hunk(
        loading.__name__, "_load_state_dict", source_digest(inspect.getsource(func)),
        ((line, line + "    if len(target_state_dict) > 1:\n        raise ValueError('broken by a fix')\n"),)),), ())
    monkeypatch.setitem(FIXES, broken.id, broken)
    whole = {"kind": "sharded", "mesh": {"dim_names": ["d0"], "shape": [1]}, "owner": [], "placements": ["R"]}
    case = {"property": "P-ROUNDTRIP", "sut": "paddle-dcp", "seed": 0, "version": 1,
            "tensors": [{"dtype": "F32", "name": n, "seed": 0, "shape": []} for n in ("model/w", "model/b")],
            "save_layout": {"model/w": whole, "model/b": whole}, "load_layout": {"model/w": whole, "model/b": whole},
            "ops": [{"kind": k, "name": "step-1"} for k in ("save", "load")],
            "options": {"format": "safetensors", "tensor_kind": "dist_from_local"}}
    path = tmp_path / "finding.json"
    path.write_text(json.dumps({"case": case, "verdict": "error", "property": "P-ROUNDTRIP", "sut": "paddle-dcp",
                                "error": "op 1 (load step-1): ValueError: rank 0: broken by a fix",
                                "launch": "in-process", "fixes": [broken.id], "needs_fixes": [broken.id]}))
    folder = tmp_path / "repro"
    assert main(["repro", str(path), "--out", str(folder), "--no-simplify"]) == 0, capsys.readouterr()
    assert loading._load_state_dict is func  # the in-process ranks took the fix back
    assert "import needs" in (folder / "repro.py").read_text() and (folder / "needs.py").is_file()
    assert "broken by a fix" in (folder / "needs.diff").read_text()
    assert "Shows only behind known bugs' fixes" in (folder / "REPORT.md").read_text()
    summary = json.loads((folder / "repro.json").read_text())
    assert summary["needs_fixes"] == [broken.id] and summary["standalone_verified"], summary
    assert "broken by a fix" in summary["output"]


def test_repro_fixes_replace_the_fixes_a_finding_was_shown_behind(tmp_path: Path, monkeypatch, capsys) -> None:
    """``repro --fixes`` names the known bugs' fixes the script applies first (with what they require), 'none' for
    stock code; by default the finding's own needs_fixes. Bad ids, and 'all' (no bug left to show), are one line."""
    import harness.repro

    seen = []
    monkeypatch.setattr(harness.repro, "make_repro", lambda *a, **k: seen.append(k["needs"]) or {
        "standalone_verified": False, "unsupported": "x"})
    case = str(REGRESSIONS / "paddle-dcp-failed-load-poisons-next.json")
    for spec in (None, "none", "paddle-dcp-empty-overlap-no-read"):
        main(["repro", case, "--out", str(tmp_path), *(["--fixes", spec] if spec else [])])
    assert seen == [None, (), ("paddle-dcp-balanced-split", "paddle-dcp-empty-overlap-no-read")]
    capsys.readouterr()
    for bad, said in (("all", "with every fix the script would show no known bug"), ("nope", "unknown fixes")):
        assert main(["repro", case, "--out", str(tmp_path), "--fixes", bad]) == 2
        err = capsys.readouterr().err
        assert said in err and err.count("\n") == 1


def test_a_report_offers_the_fix_and_says_when_it_does_not_pass() -> None:
    from harness.repro.report import report_md

    fix = {"ids": ["a-first", "b-own"], "own": ["b-own"], "kinds": {"a-first": "fix", "b-own": "workaround"},
           "summaries": {"a-first": "first this", "b-own": "then that"}, "written_against": ["paddle 3.3.1"],
           "resolves": ["row-two"],
           "with_fix": {"passed": False, "how": "failed", "status": 1, "output": "BUG: step 2: it still fails"}}
    summary = {"source": "row-one.json", "sut": "paddle-dcp", "verdict": "data-loss", "fix": fix,
               "standalone_verified": True, "how": "marked", "status": 1, "launches": [], "output": "BUG: x"}
    report = report_md(summary, {"property": "P-ROUNDTRIP"}, "--- a/x.py\n+++ b/x.py\n")
    section = report.split("## Candidate fix", 1)[1]
    assert "`a-first` (needed first" in section and "- `b-own`: a workaround" in section
    assert "`row-two`" in section and "```diff\n--- a/x.py\n+++ b/x.py\n```" in section
    assert "does not pass (failed, exit status 1)" in section and "BUG: step 2: it still fails" in section
    fix["with_fix"] = {"passed": True, "how": "passed", "status": 0}
    assert "it exits 0 with the fix" in report_md(summary, {}, "d")
    fix["with_fix_not_run"] = "the script makes the power loss itself"
    assert "`bash run.sh --with-fix` is not offered here: the script makes the power loss itself." in report_md(
        summary, {}, "d")


@pytest.mark.parametrize("needed", [(), (3,), (0, -1), (5, 6, 20)])
def test_a_repro_that_meets_other_known_bugs_gets_the_fewest_fixes_that_pass_it(needed) -> None:
    """With its own fix alone a run may still meet another known bug on its way: the candidate then carries the
    fewest other fixes that make the run pass, found by binary search in about k·log2(n) runs, not n."""
    from harness.fixes import covering, resolve
    from harness.repro.companions import RUNS, fewest, others

    stem = "paddle-dcp-failed-load-poisons-next"
    pool = others(stem)
    assert not set(pool) & set(covering(stem)) and len(pool) > 20
    wanted = {pool[i] for i in needed}
    calls: list[tuple[str, ...]] = []

    def passes(ids: tuple[str, ...]) -> bool:
        calls.append(ids)
        assert set(covering(stem)) <= set(ids)  # its own fix is in every run
        return wanted <= set(ids)

    got = fewest(stem, passes)
    assert set(got) == set(resolve(",".join(wanted))) - set(covering(stem))
    # a binary search per needed fix, and one run to see the needed ones pass alone
    assert len(calls) <= RUNS and len(calls) <= 2 + len(wanted) * (math.ceil(math.log2(len(pool) + 1)) + 1)
    assert fewest(stem, lambda ids: False) is None  # not even every fix passes it: no companions
    for runs in range(1, RUNS):  # cut short anywhere, the answer is a set some run showed to pass
        calls.clear()
        short = fewest(stem, passes, runs)
        assert resolve(",".join((*covering(stem), *short))) in [c for c in calls if wanted <= set(c)], runs


def test_a_report_names_the_other_bugs_fixes_a_run_needed_and_what_its_own_fix_alone_met() -> None:
    from harness.repro.report import report_md

    fix = {"ids": ["a-other", "b-own"], "own": ["b-own"], "companions": ["a-other"],
           "kinds": {"a-other": "fix", "b-own": "fix"}, "summaries": {"a-other": "x", "b-own": "y"},
           "written_against": ["paddle 3.3.1"], "resolves": [],
           "alone": {"passed": False, "how": "failed", "status": 1, "output": "BUG: step 3: the 0-d error"},
           "with_fix": {"passed": True, "how": "passed", "status": 0}}
    summary = {"source": "row.json", "sut": "paddle-dcp", "verdict": "loud-failure", "fix": fix,
               "standalone_verified": True, "how": "marked", "status": 1, "launches": [], "output": "BUG: x"}
    section = report_md(summary, {}, "d").split("## Candidate fix", 1)[1]
    assert "`a-other` (another known bug's fix" in section and "it exits 0 with the fix" in section
    assert "With its own fix (`b-own`) alone" in section and "BUG: step 3: the 0-d error" in section


def test_a_load_of_a_damaged_checkpoint_may_raise_but_never_give_other_bits() -> None:
    """P-CORRUPT: a damaged checkpoint must load whole or fail loudly, so the script accepts an error there (a fix
    that makes the load refuse passes) while wrong bits still show the bug; a load of an undamaged save may not."""
    case, _ = read_case_file(REGRESSIONS / "paddle-dcp-safetensors-missing-metadata-read-as-hf.json")
    plan = case.fault.plan
    steps = [s for phase in script_case(case).phases for s in phase.steps if s.kind == "load"]
    assert steps and all(s.may_fail for s in steps), plan
    clean = dataclasses.replace(case, fault=None)
    assert not any(s.may_fail for phase in script_case(clean).phases for s in phase.steps)
    text = repro_py(script_case(case), "t", "s")
    assert "may_fail=True" in text and "or its files were damaged" in text


def test_every_open_row_says_whether_it_has_a_verified_repro() -> None:
    listed = (REGRESSIONS.parent.parent / "FINDINGS.md").read_text()
    for path in CASES:
        data = json.loads(path.read_text())
        assert "standalone_verified" in data, f"{path.name}: run `ckpt-harness repro` on it"
        if data["standalone_verified"]:
            assert (path.parent / data["repro"] / "run.sh").is_file(), path.name
            assert data["repro"] in listed, f"FINDINGS.md does not link {data['repro']}"


@pytest.mark.multirank
@pytest.mark.parametrize("path", _ci_share(WITH_REPRO))
def test_standalone_repro_still_reproduces(path: Path) -> None:
    """Each verified repro, run as its reader runs it (bash run.sh, fresh processes, no harness), still shows the bug
    at the reported step; the day it passes, upstream fixed it: its row moves to "Fixed upstream"."""
    from harness.repro import check_repro

    data = json.loads(path.read_text())
    info = REGISTRY[data["sut"]]
    if not framework_available(info):
        pytest.skip(f"{data['sut']} needs {info.framework}")
    result = check_repro(path.parent / data["repro"])
    assert result.shown, f"{result.how} (exit {result.status}):\n{result.output[-3000:]}"


def _fix_passed(path: Path) -> bool:
    """The repro's candidate fix was seen to make every launch pass (repro.json, written by its verification)."""
    meta = path.parent / json.loads(path.read_text())["repro"] / "repro.json"
    fix = json.loads(meta.read_text()).get("fix", {}) if meta.is_file() else {}
    return bool(fix.get("with_fix", {}).get("passed"))


WITH_FIX = [p for p in WITH_REPRO if _fix_passed(p)]


@pytest.mark.multirank
@pytest.mark.parametrize("path", _ci_share(WITH_FIX, lambda data: "one in CI"))
def test_standalone_repro_passes_with_its_candidate_fix(path: Path) -> None:
    """``run.sh --with-fix`` applies the candidate fix (fix.py) in every process, writers included, and every launch
    exits 0: the fix a report offers fixes the bug outside the harness too. It is checked for every repro whose fix
    was seen to pass (a fix whose run then meets another known bug says so in its REPORT.md instead); CI runs the
    first, the nightly run all."""
    from harness.repro import check_fix

    data = json.loads(path.read_text())
    info = REGISTRY[data["sut"]]
    if not framework_available(info):
        pytest.skip(f"{data['sut']} needs {info.framework}")
    fixed = check_fix(path.parent / data["repro"])
    assert fixed.shown, f"run.sh --with-fix: {fixed.how} (exit {fixed.status}):\n{fixed.output[-3000:]}"


def test_a_candidate_fix_leaves_out_the_fixes_its_script_applies_first() -> None:
    """A finding shown behind another bug's fix applies that fix in needs.py; fix.py applying it again would find
    its source changed (a stale fix) and the run would end before the finding's call."""
    from harness.repro.candidate import candidate_fixes

    stem = "paddleformers-trainer-async-saver-killed-writer-hangs"
    needed = "paddleformers-sharding-io-saves-what-it-resumes"
    assert [f.id for f in candidate_fixes(stem)] == [needed, "paddleformers-async-saver-dead-writer"]
    assert [f.id for f in candidate_fixes(stem, needs=(needed,))] == ["paddleformers-async-saver-dead-writer"]


@pytest.mark.parametrize(("status", "expected"), [(0, 0), (1, 1)])
def test_a_run_with_its_fix_passes_without_the_faulted_call_only_if_it_finished(status: int, expected: int,
                                                                                 tmp_path: Path) -> None:
    """With the fix, a launch whose ranks never made the faulted call passes only if it ended well: one that failed
    first (a stale fix, another bug) is no proof the fix works."""
    import subprocess

    sh = run_sh(script_case(_case("paddleformers-zcc-killed-worker-hangs-rank")))
    start = sh.index("faulted() {")
    function = sh[start:sh.index("\n}\n", start) + 3]
    script = f'WORK={tmp_path}\n{function}faulted 0 {status}\n'
    done = subprocess.run(["bash", "-c", script], env={"REPRO_WITH_FIX": "1", "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == expected, done.stdout + done.stderr


def test_a_repro_run_leaves_no_process_behind(tmp_path: Path) -> None:
    """A rank that crashed leaves its writer (a ZCC worker) to init, out of run.sh's tree and session: the run
    still ends it."""
    import time

    import psutil

    from harness.repro.verify import run_repro

    pidfile = tmp_path / "orphan.pid"
    # in its own session (as a launcher's rank is) before run.sh ends
    orphan = f"import os, time; os.setsid(); open('{pidfile}', 'w').write(str(os.getpid())); time.sleep(60)"
    (tmp_path / "run.sh").write_text(f'python -c "{orphan}" > /dev/null 2>&1 &\n'
                                     f"while [ ! -s {pidfile} ]; do sleep 0.05; done\nexit 0\n")
    status, _ = run_repro(tmp_path, 1, timeout=30)
    assert status == 0
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def _unbound_globals(text: str) -> set[str]:
    """The names a script reads as globals that neither it (at module level, or through ``global`` in a function)
    nor Python's builtins bind: each is a NameError when that line runs."""
    import builtins
    import symtable

    top = symtable.symtable(text, "repro.py", "exec")
    tables, bound, read = [top], set(dir(builtins)) | {"__file__"}, set()
    while tables:
        table = tables.pop()
        tables.extend(table.get_children())
        for sym in table.get_symbols():
            name = sym.get_name()
            binds = sym.is_assigned() or sym.is_imported() or sym.is_namespace()
            if binds and (table is top or sym.is_declared_global()):
                bound.add(name)
            if sym.is_referenced() and (table is top or sym.is_global()):
                read.add(name)
    return read - bound


def test_every_script_binds_every_global_it_reads() -> None:
    """A script is text put together from parts (an emitter's settings, another emitter's helpers): a name one part
    reads and no part defines passes ``compile`` and fails only when the script runs. Every regression case that
    scripts is checked, so a part that moves breaks here, not in a maintainer's hands."""
    checked = 0
    for path in sorted(REGRESSIONS.glob("*.json")):
        case = read_case_file(path)[0]
        try:
            text = repro_py(script_case(case), "t", "s")
        except ReproUnsupported:
            continue
        assert _unbound_globals(text) == set(), path.stem
        checked += 1
    assert checked >= 40


def test_an_unbound_global_is_named() -> None:
    text = "import os\nX = 1\n\ndef f():\n    global Y\n    Y = os.sep\n    return X + Z + len(Y)\n"
    assert _unbound_globals(text) == {"Z"}
