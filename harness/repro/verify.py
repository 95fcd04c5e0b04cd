"""Run a written repro the way its reader will — ``bash run.sh`` in a fresh process tree — and say whether it shows
the bug the finding reports (syzkaller's rule: a reproducer counts only once it has been seen to reproduce)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from faults.procs import kill_tree, popen
from harness.ranks.launch import child_env
from harness.repro.render import MARK, STEP_TIMEOUT_S

SLACK_S = 60  # beyond the script's own bounds: start-up, and the kill of a hung launch


@dataclass(frozen=True)
class Verification:
    shown: bool  # the run showed the bug the way the finding's verdict says
    how: str  # "marked" (the script printed the bug), "crash", "hang", "passed", "script-error"
    status: int
    output: str

    def to_json(self) -> dict:
        return {"standalone_verified": self.shown, "how": self.how, "status": self.status}


def run_repro(folder: Path, phases: int, timeout: float | None = None, with_fix: bool = False) -> tuple[int, str]:
    """(exit status, output) of ``bash run.sh`` (``--with-fix``: with the candidate fix) in ``folder``, its whole
    process tree killed at the bound."""
    bound = timeout if timeout is not None else phases * (STEP_TIMEOUT_S + 10) + SLACK_S
    env = child_env()
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")  # "python" is this one
    # marked (faults.procs.popen): a writer a crashed rank left behind re-parents to init, out of the tree
    proc = popen(["bash", "run.sh", *(["--with-fix"] if with_fix else [])], cwd=folder, env=env,
                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        out, _ = proc.communicate(timeout=bound)
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        out = (proc.stdout.read() if proc.stdout else b"").decode("utf-8", "replace")
        return 124, out + f"\n{MARK}: run.sh did not end within {bound:.0f} s"
    finally:
        kill_tree(proc)
    return proc.returncode, out.decode("utf-8", "replace")


def judge_fixed_run(status: int, output: str) -> Verification:
    """Does the run with the candidate fix pass? Every launch must exit 0: a hang, a stale fix (fix.py says the
    framework's source is not what it was written against) or any failure says the fix does not fix it here.
    ``shown`` is True when the fix is shown to work."""
    how = "stale-fix" if "STALE FIX:" in output else {0: "passed", 124: "hang"}.get(status, "failed")
    if status == 0 and "WITH FIX: no rank made the call" in output:
        how = "passed, the faulted call gone"  # the harness proves such a fix at crash points over the fixed save
    return Verification(status == 0, how, status, output)


def judge_run(status: int, output: str, verdict: str, step: int | None = None,
              ways: Collection[str] = ()) -> Verification:
    """Does the run show the finding? A hang must time out, a crash must end a process abnormally; any other
    verdict needs the script's own words (an error where none is due, or bits that differ) at ``step`` when the
    finding names the op it shows at (an earlier step failing is another bug, not this one). ``ways``: the other
    verdicts a racy finding shows as (its ``or`` ways), each at its own op: then a hang is one of them if listed,
    and the script's words at ``step`` or any later step count."""
    verdicts = {verdict, *ways}
    bugs = [int(m.group(1)) for m in re.finditer(rf"^{MARK}: step (\d+):", output, re.MULTILINE)]
    at_step = bugs and (step is None or min(bugs) == step or (bool(ways) and min(bugs) >= step))
    if status == 0:
        return Verification(False, "passed", status, output)
    if status == 124:
        return Verification("hang" in verdicts, "hang", status, output)
    if at_step and verdicts == {"silent-corruption"} and not _wrong_bits(output, step):
        return Verification(False, "another-bug", status, output)  # it raised where the finding gave other bits
    if at_step:
        return Verification(verdicts != {"hang"}, "marked", status, output)
    if bugs:
        return Verification(False, "another-step", status, output)  # it failed before the reported step
    crashed = "Traceback (most recent call last)" not in output or any(
        s in output for s in ("Aborted", "SIGABRT", "SIGSEGV", "SIGFPE", "terminate called", "FatalError"))
    return Verification("crash" in verdicts and crashed, "crash" if crashed else "script-error", status, output)


def _wrong_bits(output: str, step: int | None) -> bool:
    """Whether the script saw other bits than were saved (at ``step`` when given), not only a step that raised: a
    silent corruption is shown by the bits (or by the script's own check, its ``Failed``), and a framework error
    there is another bug on the way."""
    at = r"\d+" if step is None else str(step)
    for found in re.finditer(rf"^{MARK}: step {at}:.*$", output, re.MULTILINE):
        if not re.search(r" raised on rank \d+$", found.group(0)):
            return True
        actual = re.search(r"^ACTUAL:\s+(\S+)", output[found.end():], re.MULTILINE)
        if actual and actual.group(1) == "Failed:":
            return True
    return False
