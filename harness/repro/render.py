"""A scripted case as two files a maintainer runs without the harness: ``repro.py`` (named steps, explicit data) and
``run.sh`` (the launches, each with fresh processes, bounded by a timeout)."""

from __future__ import annotations

import importlib
from types import ModuleType

from harness.repro.scripted_case import Piece, ReproUnsupported, ScriptedCase, Step

EMITTERS = {"paddle-dcp": "paddle_dcp", "paddle-save": "paddle_save", "torch-dcp": "torch_dcp",
            "paddleformers-uc": "paddleformers_uc", "paddleformers-trainer": "paddleformers_trainer",
            "paddleformers-zcc": "paddleformers_zcc"}
STEP_TIMEOUT_S = 300  # per launch in run.sh: a hang shows as exit 124
START_S = 60  # a launch's start-up (imports, the collective) on top of a case's own op bound
MARK = "BUG"  # the first word of the lines a script prints when it shows the bug

CHECK = f'''def check(step, got, pieces, also=(), should="what was saved"):
    """Every loaded piece must have the dtype and the exact bits that were saved: by one save as a whole (``also``:
    the other saves it may rightly give, after a kill in the middle of a re-save of the name). ``should`` says what
    the pieces are."""
    def held(key, p):
        dtype, shape, bits = bits_of(got[key])
        return (dtype, shape, bits) == (DTYPE_NAMES[p.dtype], list(p.shape), p.bits), (dtype, shape, bits)

    keys = [key for key in pieces if key in got]  # not in got: an empty flattened slice, nothing was asked for
    gave = {{i for i, saved in enumerate((pieces, *also)) if all(held(key, saved[key])[0] for key in keys)}}
    if also and dist.is_initialized():  # one save as a whole: every rank must have given the same one
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, sorted(gave))
        everyone = [g for g in everyone if g is not None]  # torch fills the list in place, Paddle appends to it
        common = set.intersection(*(set(g) for g in everyone))
        if gave and not common:
            print(f"{MARK}: {{step}} on rank {{RANK}}: the ranks gave different saves' data (by rank: {{everyone}}), "
                  "a state no save wrote")
            print(f"EXPECTED: one of the {{1 + len(also)}} saves it may give, on every rank")
            print(f"ACTUAL:   saves by rank (0: the save this step names, 1 on: the others) {{everyone}}")
            sys.exit(1)
        gave = common
    if gave:
        return
    for key in keys:
        p = pieces[key]
        same, (dtype, shape, bits) = held(key, p)
        if not same:
            print(f"{MARK}: {{step}} on rank {{RANK}}: {{key}} does not hold {{should}}"
                  + (f" (by any of the {{1 + len(also)}} saves it may give)" if also else ""))
            print(f"EXPECTED: {{DTYPE_NAMES[p.dtype]}} {{list(p.shape)}} bits {{p.bits}}")
            print(f"ACTUAL:   {{dtype}} {{shape}} bits {{bits}}")
            sys.exit(1)


class Failed(Exception):
    """A failure this script detects itself (the framework only logged it)."""


def run(step, action, *args, expect_error=False, tolerate=False, may_fail=False, also=(), **kwargs):
    """Run one step; an error where none is due (or none where one is), or a load that gives back other bits than
    were saved, shows the bug. ``may_fail``: the save it reads was killed part-way, never acknowledged, or its files
    were damaged since: an error is a right answer there, other bits are not."""
    try:
        result = action(*args, **kwargs)
    except BaseException as exc:  # torch's CheckpointException is a BaseException
        if isinstance(exc, (SystemExit, KeyboardInterrupt)):
            raise
        if traceback.extract_tb(exc.__traceback__)[-1].filename == __file__ and not isinstance(exc, Failed):
            raise  # a mistake of this script, not the framework's failure
        if tolerate:
            print(f"{{step}} fails on rank {{RANK}} too ({{type(exc).__name__}}: {{exc}}): another known bug this case "
                  "passes through on the way to the one reported; going on")
            return None
        if expect_error:
            print(f"{{step}}: raised as it should ({{type(exc).__name__}})")
            return None
        if may_fail:
            print(f"{{step}}: raised ({{type(exc).__name__}}), a right answer: the save it reads was killed part-way "
                  "or its files were damaged")
            return None
        print(f"{MARK}: {{step}} raised on rank {{RANK}}")
        print("EXPECTED: it succeeds")
        lines = str(exc).strip().splitlines() or [""]
        last = f" ... {{lines[-1].strip()}}" if len(lines) > 1 else ""
        print(f"ACTUAL:   {{type(exc).__name__}}: {{lines[0]}}{{last}}")
        sys.exit(1)
    if expect_error:
        print(f"{MARK}: {{step}} succeeded on rank {{RANK}}")
        print("EXPECTED: an error (the checkpoint it reads is not there or not whole)")
        print("ACTUAL:   no error")
        sys.exit(1)
    if action.__name__ in ("load", "train") and not tolerate:  # a job that trains: its state after the step
        check(step, result, args[-1], also, "what was saved" if action is load else "the uninterrupted run's state")
'''


RETURNED = '''PENDING = []  # the writers (threads, processes or futures) of async saves not waited for yet


def returned(writer, tensors, mutate_after, detach):
    """An async save returned: the caller overwrites its tensors (where the step says so), then waits for the
    writer unless the step leaves it running."""
    if writer is not None:
        PENDING.append(writer)
{mutate}    if not detach:
        wait()
'''
MUTATE = '''    if mutate_after:
        for t in tensors:
            scribble(t)
'''  # in ``returned`` where a step overwrites its tensors (the script then has ``scribble``)


CRASH = '''import errno  # noqa: E402
import multiprocessing  # noqa: E402
import signal  # noqa: E402
import threading  # noqa: E402

SPAWNED = False  # this process is one a rank spawned (this file imported again, as __mp_main__), not a rank


def who():
    return f"rank {RANK}" if not SPAWNED else f"process {os.getpid()} (spawned by rank {RANK})"


def fault_mark(what):
    """run.sh's sign that the fault happened (``what``, printed too), and whom it hit: a rank, or a process a rank
    spawned (a writer), whose rank must still finish its step."""
    with open(os.path.join(os.path.dirname(os.path.abspath(ROOT)), f"fault-{PHASE}"), "w") as f:
        f.write(f"{'writer' if SPAWNED else 'rank'} {what}")
    print(what, flush=True)


def armed_path():
    """The file whose presence arms the fault in the processes this rank spawned: while its faulted step runs."""
    return os.path.join(os.path.dirname(os.path.abspath(ROOT)), f"armed-{PHASE}-{RANK}")


def fault_kill(step, how):
    fault_mark(f"{step}: {who()} killed {how}")
    os.kill(os.getpid(), signal.SIGKILL)


def fault_hook(step, call, armed=None):
    """The audit hook that meets the fault at ``call`` (see crash_step) in this process, counting its own calls
    (as strace counts each process's); ``armed``: a file without which it counts nothing (a spawned process)."""
    event, path, k, error, after, rank = call[:6]
    target, seen = os.path.abspath(os.path.join(ROOT, path)), [0]

    def hook(name, hook_args):
        if rank not in (None, RANK) or name != event or not hook_args:
            return
        if not isinstance(hook_args[0], (str, bytes, os.PathLike)):
            return
        if os.path.abspath(os.fsdecode(hook_args[0])) != target:
            return
        if armed is not None and not os.path.exists(armed):
            return
        seen[0] += 1
        if seen[0] != k:
            return
        if error is not None:
            fault_mark(f"{step}: call {k} of {event} on {path} fails with {error} in {who()}")
            raise OSError(getattr(errno, error), os.strerror(getattr(errno, error)), os.fsdecode(hook_args[0]))
        if after:  # the open itself (creating or truncating the file as the framework asked), then the kill
            os.close(os.open(hook_args[0], hook_args[2], 0o666))
        fault_kill(step, f"{'after' if after else 'before'} call {k} of {event} on {path}")

    return hook


def crash_step(step, call, action, *args, **kwargs):
    """Run a step in which the rank making ``call`` (an audit event, a path under ROOT, which of its calls, an errno
    or None, whether the call runs first, which rank: None for whichever makes it, a delay or None, and whether the
    processes the rank spawned meet it too) meets the fault at that call: SIGKILLed (no errno) — no clean-up, as a
    machine failure or the OOM killer ends a job — before it runs, or right after (an open: the kill lands before
    the file's first write), or the call fails with that errno, as a full disk or a failing device makes it. With a
    delay the rank (every rank for None) is killed that many seconds into the step, whatever it is doing. A process
    the rank spawned that meets it (a writer: the rank lives on) leaves the rank to end its step, or to hang.
    Every rank's launch ends with the step (the job restarts); the next launch starts fresh on what it left."""
    rank, delay, spawned = call[5:]
    if delay is None:
        sys.addaudithook(fault_hook(step, call))  # for the rest of this process, which the step ends
        if spawned and rank in (None, RANK):
            open(armed_path(), "w").close()  # the processes this rank spawned count from now on (arm_spawned)
    elif rank in (None, RANK):
        if delay <= 0:
            fault_kill(step, "as the step began")
        timer = threading.Timer(delay, fault_kill, (step, f"{delay} s into the step"))
        timer.daemon = True
        timer.start()
    try:
        action(*args, **kwargs)
        if call[3] is not None:
            print(f"{step}: rank {RANK} finished the step despite the error (what it left is judged next)")
    except BaseException as exc:  # the injected error, or a peer killed in the middle of a collective
        if isinstance(exc, KeyboardInterrupt):
            raise
        print(f"{step}: rank {RANK} stopped ({type(exc).__name__}: {str(exc)[:200]}); the launch ends")
    sys.stdout.flush()
    for child in multiprocessing.active_children():  # the job is over: nothing of it outlives the restart
        os.kill(child.pid, signal.SIGKILL)
    os._exit(0)  # the job is over: no framework teardown waits for a dead or failed rank


def arm_spawned(step, call):
    """In a process a rank spawned (this file imported again, as __mp_main__: a standing writer, such as a training
    job's checkpoint worker, started before the faulted step) the fault's hook too, as strace follows the rank's
    whole tree: armed only while the rank runs the faulted step of this launch (its armed_path)."""
    global ROOT, PHASE, RANK, SPAWNED
    if len(sys.argv) < 3 or "REPRO_RANK" not in os.environ:
        return
    ROOT, PHASE, RANK, SPAWNED = sys.argv[1], int(sys.argv[2]), int(os.environ["REPRO_RANK"]), True
    sys.addaudithook(fault_hook(step, call, armed_path()))
'''


HOLD_THREADS = '''import threading  # noqa: E402

HELD = []  # the gates of held writer threads, opened by resume()


def holding(action, *args, **kwargs):
    """Run ``action`` with every thread it starts held at its start until resume(): its writer has not written a
    byte when the call returns, where otherwise the caller races it (the thread usually wins with small tensors)."""
    gate, start = threading.Event(), threading.Thread.start

    def held_start(thread):
        run = thread.run

        def held_run():
            gate.wait()
            run()

        thread.run = held_run
        start(thread)

    threading.Thread.start = held_start
    try:
        return action(*args, **kwargs)
    finally:
        threading.Thread.start = start
        HELD.append(gate)


def resume():
    for gate in HELD:
        gate.set()
    HELD.clear()


'''


HOLD_PROCESSES = '''import atexit  # noqa: E402
import multiprocessing  # noqa: E402
import signal  # noqa: E402

HELD = []  # writer processes stopped by holding(), let go by resume()


def holding(action, *args, **kwargs):
    """Run ``action`` and stop the writer processes it leaves behind (SIGSTOP, while a spawned interpreter is still
    starting up) until resume(): the writer has not written a byte when the call returns."""
    before = {p.pid for p in multiprocessing.active_children()}
    try:
        return action(*args, **kwargs)
    finally:
        for p in multiprocessing.active_children():
            if p.pid not in before:
                os.kill(p.pid, signal.SIGSTOP)
                HELD.append(p)


def resume():
    for p in HELD:
        os.kill(p.pid, signal.SIGCONT)
    HELD.clear()


@atexit.register
def crash_held():
    """A launch that ends with its writers still held ends as a crash of them (the next launch is the restart):
    they die unwritten, and multiprocessing's own exit hook does not wait on a stopped process forever."""
    for p in HELD:
        os.kill(p.pid, signal.SIGKILL)


'''

def emitter(sut: str, training: bool = False) -> ModuleType:
    """The module that writes ``sut``'s scripts; ``training``: for a job that trains itself, which only an emitter
    that renders train steps (``TRAINS``) can script."""
    if sut not in EMITTERS:
        raise ReproUnsupported(f"no standalone script for {sut} yet (it needs its framework's set-up spelled out)")
    module = importlib.import_module(f"{__package__}.emitters.{EMITTERS[sut]}")
    if training and not getattr(module, "TRAINS", False):
        raise ReproUnsupported(f"a training case on {sut} (its state is computed by the harness's training loop, "
                               "which the script does not spell out)")
    return module


# repro.py's hook for ``run.sh --with-fix``: at import, so writer processes the framework spawns (which import this
# file again) run with the fix too.
WITH_FIX = """
if os.environ.get("REPRO_WITH_FIX"):  # bash run.sh --with-fix: the candidate fix (fix.py) before any step
    import fix

    fix.apply()
"""

# repro.py's hook for a bug that shows only with known fixes applied first (a finding's ``needs_fixes``): always, at
# import, so every process and writer runs them.
NEEDS = """
import needs  # noqa: E402  known bugs' fixes this bug shows behind (needs.py): applied in every process

needs.apply()
"""

# run.sh's reading of its argument; the launches inherit REPRO_WITH_FIX.
WITH_FIX_ARG = """# bash run.sh --with-fix: the same, with the candidate fix (fix.py; fix.diff as a patch) applied.
if [ "${1:-}" = "--with-fix" ]; then  # the candidate fix (fix.py) in every process: then it exits 0
  export REPRO_WITH_FIX=1
fi
"""


# run.sh's faulted(): the fault fired at the finding's call; with the fix, a call the fixed code no longer makes (it
# writes no lock file, it renames a temporary) cannot be hit, and the run goes on to judge what the save left.
FAULT_HIT = '  [ -e "$WORK/fault-$1" ] && return 0\n'
# Before it: a fault that hit a process the rank spawned (a writer) left the rank alive, to end its step; a launch that
# then hangs is the bug (after a rank's own kill the harness restarts the job, so what its peers do is not judged).
FAULT_HUNG = ('  [ "${2:-0}" -eq 124 ] && grep -qs "^writer " "$WORK/fault-$1" && echo "EXPECTED: its rank ends the '
              'step (it returns, or raises the failure)" && echo "ACTUAL:   $(cut -d" " -f2- "$WORK/fault-$1"); its '
              'rank never finished the step" && return 124\n')
FAULT_CALL_GONE = ('  [ -n "${REPRO_WITH_FIX:-}" ] && [ "${2:-0}" -eq 0 ] && echo "launch $1: WITH FIX: no rank made '
                   'the call the finding\'s fault hit (the fixed code no longer makes it)" && return 0\n'
                   '  [ -n "${REPRO_WITH_FIX:-}" ] && echo "launch $1: WITH FIX: it failed (status ${2:-0}) and no '
                   'rank made the call the finding\'s fault hit" && return "${2:-1}"\n')


def repro_py(scripted: ScriptedCase, title: str, source: str, with_fix: bool = False, needs: bool = False) -> str:
    """The script; ``with_fix``: the folder has a candidate fix (fix.py) that ``run.sh --with-fix`` applies;
    ``needs``: the bug shows only with known bugs' fixes applied first (needs.py), which it always applies."""
    module = emitter(scripted.sut, scripted.training is not None)
    text = module.TEXT
    helpers = module.helpers(scripted)  # a save() that can go async calls returned() even in a sync-only script
    dtypes = {p.dtype for table in scripted.tables.values() for pieces in table.values() for p in pieces.values()}
    parts = [
        f'"""{title}\n\nStandalone reproduction written by ckpt-harness from {source}. Run ``bash run.sh``: it starts '
        f"each launch below with fresh processes. The script prints {MARK} / EXPECTED / ACTUAL and exits 1 while the "
        'bug is there; every rank exits 0 once it is fixed.\n"""\n',
        text.IMPORTS,
        "from collections import namedtuple\n",
        NEEDS if needs else "",
        WITH_FIX if with_fix else "",
        "ROOT, PHASE, RANK = None, None, 0  # the checkpoint directory, which launch of run.sh this is, this rank\n",
        module.settings(scripted),
        text.carriers(dtypes),
        f"DTYPE_NAMES = {({d: text.DTYPE_NAMES[d] for d in sorted(dtypes)})!r}  # as the framework prints them\n",
        "# One rank's piece of a tensor: dtype, global shape, offsets and shape of its box (or the [start, stop) of a\n"
        "# flattened slice), its bits as hex, and for a dist tensor its mesh shape, placements and owner coordinates.\n"
        'Piece = namedtuple("Piece", "dtype global_shape offsets shape flat bits mesh placements owner")\n',
        _tables(scripted),
        text.TENSORS,
        text.SCRIBBLE if scripted.uses("mutate_after") else "",
        RETURNED.format(mutate=MUTATE if scripted.uses("mutate_after") else "")
        if scripted.uses("use_async") or scripted.has("wait") or "returned(" in helpers else "",
        helpers,
        _optional(module, scripted.sut, scripted.has("kill"), "KILL_WRITERS",
                  "a kill of async writers (the {} script cannot find its writers yet)"),
        _optional(module, scripted.sut, scripted.has("resume") or scripted.uses("hold"), "HOLD",
                  "held writers (the {} script cannot hold its writers yet)"),
        _optional(module, scripted.sut, scripted.has("check"), "CHECK_RECORDED",
                  "a check of what a save recorded (the {} script cannot read its metadata yet)"),
        damage(scripted.edit_kinds()) if scripted.edit_kinds() else "",
        CRASH if scripted.crash_phases() else "",
        _spawned_arming(scripted),
        CHECK,
        _main(scripted, text.SETUP, getattr(text, "TEARDOWN", "")),
    ]
    return "\n".join(parts)


def _optional(module: ModuleType, sut: str, needed: bool, attr: str, refusal: str) -> str:
    """The script text some steps need, from the emitter's ``attr`` (the framework's own way to do it: find its
    writers, hold them, read its metadata); a scripted case without such steps needs none, an emitter without it refuses
    (a held save needs the hold whether a resume follows or a restart discards its writers)."""
    if not needed:
        return ""
    text = getattr(module, attr, None)
    if text is None:
        raise ReproUnsupported(refusal.format(sut))
    return text


def _tables(scripted: ScriptedCase) -> str:
    """One entry per (layout, version), one line per rank; a table equal to one already written refers to it."""
    lines = ["# What each rank saves, and what each load must give back: (layout, version) -> rank -> tensor -> piece",
             "DATA = {}"]
    written: dict[tuple[str, int], str] = {}
    for key, ranks in sorted(scripted.tables.items()):
        body = "\n".join(f"    {rank}: {{{', '.join(f'{n!r}: {_piece(p)}' for n, p in sorted(pieces.items()))}}},"
                         for rank, pieces in sorted(ranks.items()))
        if body in written.values():
            same = next(k for k, v in written.items() if v == body)
            lines.append(f"DATA[{key[0]!r}, {key[1]}] = DATA[{same[0]!r}, {same[1]}]  # the same pieces")
            continue
        written[key] = body
        lines += [f"DATA[{key[0]!r}, {key[1]}] = {{", body, "}"]
    return "\n".join(lines) + "\n"


def _piece(p: Piece) -> str:
    return (f"Piece({p.dtype!r}, {p.global_shape}, {p.offsets}, {p.shape}, {p.flat}, {p.hexbits!r}, {p.mesh}, "
            f"{p.placements}, {p.owner})")


def _main(scripted: ScriptedCase, setup: str, teardown: str = "") -> str:
    """Set-up, steps and the framework's own end of a job (``teardown``) inside ``main()``, run only as the
    program: a writer process the framework starts with multiprocessing's "spawn" imports this file again, and must
    not set up or run the steps a second time."""
    lines = ["def main():", "    global ROOT, PHASE, RANK",
             "    ROOT, PHASE = sys.argv[1], int(sys.argv[2])",
             *(f"    {line}" if line else "" for line in setup.splitlines())]
    if _spawned(scripted) is not None:
        lines.append('    os.environ["REPRO_RANK"] = str(RANK)  # the processes this rank spawns know whose they are')
    for number, phase in enumerate(scripted.phases):
        lines.append(f"    {'if' if number == 0 else 'elif'} PHASE == {number}:  # {phase.world} process(es)")
        for step in phase.steps:
            lines.append(f"        {_call(step)}")
    lines += [f"    {line}" for line in teardown.splitlines()]
    lines += ['    print(f"rank {RANK}: every step of launch {PHASE} behaved as it should")', "", "",
              'if __name__ == "__main__":', "    main()"]
    return "\n".join(lines) + "\n"


def _call(step: Step) -> str:
    """The step's line: ``run`` judges it; a step with a kill or an injected error runs through ``crash_step``,
    which judges none."""
    if step.crash is not None:
        return f"crash_step({step.label!r}, {_crash_call(step)!r}, {_action(step)})"
    err = "".join(f", {flag}=True" for flag in ("expect_error", "tolerate", "may_fail") if getattr(step, flag))
    also = "".join(f"DATA[{t[0]!r}, {t[1]}][RANK], " for t in step.also)
    return f"run({step.label!r}, {_action(step)}{err}" + (f", also=({also})" if also else "") + ")"


def _crash_call(step: Step) -> tuple:
    """The fault as crash_step and arm_spawned take it."""
    crash = step.crash
    assert crash is not None
    return (crash.event, crash.path, crash.k, crash.errno, crash.after, crash.rank, crash.delay, crash.spawned)


def _spawned(scripted: ScriptedCase) -> Step | None:
    """The step whose fault the processes a rank spawned meet too (a training job's standing writers), if any."""
    return next((s for p in scripted.phases for s in p.steps if s.crash is not None and s.crash.spawned), None)


def _spawned_arming(scripted: ScriptedCase) -> str:
    """repro.py's arming of the processes a rank spawns (they import this file again, as ``__mp_main__``), where
    the fault may hit one of them: a process started before the faulted step carries the hook from its start."""
    step = _spawned(scripted)
    if step is None:
        return ""
    return ('if __name__ == "__mp_main__":  # a process a rank spawned: it meets the fault too, as the harness\'s '
            "strace\n    # follows the rank's whole tree\n"
            f"    arm_spawned({step.label!r}, {_crash_call(step)!r})\n")


def _action(step: Step) -> str:
    """The step's action and its arguments, as ``run`` and ``crash_step`` both take them."""
    if step.kind == "kill":
        return "kill_writers" + (f", {step.after_bytes}" if step.after_bytes is not None else "")
    if step.kind == "check":
        return f"check_recorded, {step.name!r}"
    if step.kind == "resume":
        return "resume"
    if step.kind == "wait":
        return "wait"
    if step.kind == "damage":
        return f"damage, {list(step.edits)!r}"
    data = f"DATA[{step.table[0]!r}, {step.table[1]}][RANK]" if step.table else "{}"
    if step.kind == "train" and step.table:
        return f"train, {step.table[1]}, {data}"
    if step.kind != "save":
        return f"load, {step.name!r}, {data}"
    keywords = (("use_async", "async_save"), ("mutate_after", "mutate_after"), ("detach", "detach"))
    flags = "".join(f", {kw}=True" for field, kw in keywords if getattr(step, field))
    return ("holding, " if step.hold else "") + f"save, {step.name!r}, {data}{flags}"


def launch_bound(scripted: ScriptedCase) -> int:
    """Seconds one launch may take before run.sh calls it a hang: the case's own op bound (``op_timeout``, where
    it set one: its ops finish well inside it) twice over plus start-up, never more than ``STEP_TIMEOUT_S``."""
    op_timeout = scripted.options.get("op_timeout")
    return STEP_TIMEOUT_S if op_timeout is None else min(STEP_TIMEOUT_S, START_S + 2 * int(op_timeout))


def run_sh(scripted: ScriptedCase, with_fix: bool = False) -> str:
    """Each phase a launch of fresh processes into one checkpoint directory; the first that fails ends the run.
    ``with_fix``: ``run.sh --with-fix`` runs it with the candidate fix."""
    bound = launch_bound(scripted)
    lines = [
        "#!/usr/bin/env bash",
        "# Runs repro.py: each launch below starts fresh processes on the same checkpoint directory.",
        *(f"# {line}" for line in emitter(scripted.sut).TEXT.WHY),
        "# Exit status: 0 when no step shows the bug; 1 (or the failing launch's status) while it is there;",
        f"# 124 when a launch hangs (bounded at {bound} s).",
        "set -u",
        'cd "$(dirname "$0")"',
        *([WITH_FIX_ARG.rstrip("\n")] if with_fix else []),
        'WORK=$(mktemp -d)',
        "trap 'rm -rf \"$WORK\"' EXIT",
        'export TMPDIR="$WORK"  # temporary files of the launchers and frameworks go with it',
        "",
        "launch() {  # launch PHASE NPROC",
        '  if [ "$2" -eq 1 ]; then',
        f'    timeout -k 10 {bound} python repro.py "$WORK/ckpt" "$1"',
        "    return $?",
        "  fi",
        f"  timeout -k 10 {bound} {emitter(scripted.sut).TEXT.LAUNCH}",
        "  local status=$?",
        f"  {emitter(scripted.sut).TEXT.SHOW}",
        '  [ $status -eq 124 ] && echo "BUG: launch $1 did not finish within the bound: a hang"',
        "  return $status",
        "}",
        "",
    ]
    killed = scripted.crash_phases()
    if killed:
        lines += ["faulted() {  # faulted PHASE STATUS: the launch had to end with the fault at the finding's call",
                  FAULT_HUNG.rstrip("\n"), FAULT_HIT.rstrip("\n"), FAULT_CALL_GONE.rstrip("\n"),
                  '  echo "launch $1: no rank made the call the finding\'s fault hit; this script cannot show it"',
                  "  return 2", "}", ""]
    for number, phase in enumerate(scripted.phases):
        ends = f"; faulted {number} $? || exit $?" if number in killed else " || exit $?"
        lines.append(f"launch {number} {phase.world}{ends}")
    return "\n".join(lines) + "\n"


# How the script changes a checkpoint's files between steps, per kind of edit (faults.corrupt's kinds).
EDITS = {
    "bitflip": """with open(path, "r+b") as f:  # flip one bit of one byte
                f.seek(e["offset"])
                byte = f.read(1)[0]
                f.seek(e["offset"])
                f.write(bytes([byte ^ (1 << e["bit"])]))""",
    "truncate": """os.truncate(path, e["length"])""",
    "lose_data": """if os.path.exists(path):  # written since its last fsync (never): a power loss empties it
                os.truncate(path, 0)""",
    "append": """with open(path, "ab") as f:
                f.write(bytes.fromhex(e["content"]))""",
    "delete": """os.remove(path)""",
    "remove": """if os.path.isdir(path):  # a power loss lost the entry that made it
                shutil.rmtree(path)
            elif os.path.exists(path):
                os.remove(path)""",
    "rename_back": """os.rename(path, os.path.join(ROOT, e["to"]))  # a power loss lost the rename's entry""",
    "stale_marker": """with open(path, "x") as f:
                f.write(e["content"])""",
    "zero_range": """with open(path, "r+b") as f:
                f.seek(e["offset"])
                f.write(bytes(e["length"]))""",
}


def damage(kinds: set[str]) -> str:
    """The script's ``damage`` step, with a branch for each kind of edit the case makes."""
    branches = "".join(f"""        {'if' if i == 0 else 'elif'} e["kind"] == {kind!r}:
            {EDITS[kind]}
""" for i, kind in enumerate(sorted(kinds)))
    imports = "import shutil  # noqa: E402\n\n\n" if "remove" in kinds else ""
    return imports + f'''def damage(edits):
    """Change the checkpoint's files as listed, between two steps: every rank has finished the step before (a save
    may return on one rank before another has written its file), rank 0 edits, the others wait."""
    if dist.is_initialized():
        dist.barrier()
    for e in edits if RANK == 0 else ():
        path = os.path.join(ROOT, e["path"])
{branches}    if dist.is_initialized():
        dist.barrier()


'''
