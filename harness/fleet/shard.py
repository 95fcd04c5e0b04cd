"""One shard of a fleet: the ordinary ``ckpt-harness fuzz`` campaign, run as a process of its own on whichever node
Ray placed it, bounded in time, its results carried back as data (the driver's folder may be on another machine).

Running the CLI as a process, rather than the campaign in the Ray worker, keeps one campaign code path and keeps
a shard's ranks out of the worker: when the shard overruns or the worker is cancelled, the shard's whole tree
(its ranks, their writers) is found by a token in its environment and ended (faults.procs), and its ``fuzz``
unwinds on SIGTERM as it does under any job scheduler.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from faults.procs import kill_tree, popen
from harness.campaign.corpus import NIGHTS
from harness.campaign.results import shrink_room
from harness.fleet.plan import ShardRun
from harness.ranks.launch import REPO_ROOT, child_env, short_tempdir

SHARD_VAR = "CKPT_HARNESS_SHARD"  # every process of one shard attempt carries it (ranks too: child_env copies it)
FLEET_VAR = "CKPT_HARNESS_FLEET"  # every process of one fleet carries it: the driver's last sweep
TERM_GRACE = 20.0  # seconds between SIGTERM (fuzz unwinds: ranks killed, results written) and SIGKILL
SOCKET_ROOM = 40  # bytes the campaign's pools and fork servers take under its temp folder (ckh-pool-XXXXXXXX/ctl)
CORPUS_LIMIT = 16 << 20  # bytes of corpus a shard carries to and from its node


def overrun_bound(seconds: float, slack: float) -> float:
    """Seconds a shard of ``seconds`` may run before it is overrun: its campaign's own room to finish shrinking and
    proving a failure it found (harness.campaign.results.shrink_room), then the plan's slack for start-up and the
    campaign's reports."""
    return seconds + shrink_room(seconds) + slack


def run_shard(run: ShardRun, seconds: float, slack: float, attempt: int, corpus: dict[str, bytes],
              fleet_token: str = "", pythonpath: str = "") -> dict:
    """Run the shard's campaign; return what it left: status, exit code, seconds, its files and new corpus files.

    ``status``: "ok" (the campaign ran: exit 0 or 1), "failed" (exit 2: the harness could not do its job), "died"
    (killed by a signal), "overrun" (still running ``overrun_bound`` after it started: terminated)."""
    started = time.time()
    work = Path(tempfile.mkdtemp(prefix=f"ckh-shard-{run.id}-"))
    # the campaign's own temp folder (its cases', pools' and ranks'): a shard killed mid-case cannot remove what
    # it made there, so the attempt removes the folder whole; short, as the pools' Unix sockets live under it
    scratch = short_tempdir("ckh-st-", room=SOCKET_ROOM)
    try:
        shared = _unpack(work / "shared", corpus)
        # --no-repro: a shard's bound is its campaign's time; repros of the night's new buckets are written
        # afterwards, from the merged findings (`ckpt-harness repro`), not inside a shard that would overrun
        python = str(REPO_ROOT / run.python) if run.python else sys.executable
        argv = [python, "-m", "harness.cli", *run.fuzz_argv(seconds, str(work / "out")),
                "--corpus", str(work / "corpus"), "--no-repro"]
        if shared is not None:
            argv += ["--corpus-readonly", str(shared)]
        token = f"{run.id}#{attempt}:{os.getpid()}:{time.time_ns()}"
        env = child_env({SHARD_VAR: token, FLEET_VAR: fleet_token, "CKPT_HARNESS_DEBUG": "0", "TMPDIR": scratch})
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, env["PYTHONPATH"]) if p)  # the driver's first
        if run.python:  # an environment of its own: its packages, not the driver's, with this harness first
            env["PYTHONPATH"] = str(REPO_ROOT)
        log = (work / "fuzz.log").open("wb")
        proc = popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=os.getcwd(), preexec_fn=_die_with_parent)
        bound = overrun_bound(run.time or seconds, slack)
        status = "ok"
        try:
            rc = proc.wait(timeout=bound)
        except subprocess.TimeoutExpired:
            status = "overrun"
            rc = _terminate(proc)
        finally:
            log.close()
            kill_tree(proc)
            sweep(SHARD_VAR, token)
        if status == "ok" and rc not in (0, 1):
            status = "died" if rc is None or rc < 0 else "failed"
        ended = time.time()
        return {"id": run.id, "attempt": attempt, "status": status, "exit": rc, "started": started, "ended": ended,
                "seconds": round(ended - started, 3), "node": os.uname().nodename,
                "gpus": os.environ.get("CUDA_VISIBLE_DEVICES") if run.gpus() else None,
                "error": _error_line(work / "fuzz.log", rc, status, bound),
                "files": _files(work / "out"), "out": str(work / "out"), "corpus": _new_corpus(work / "corpus", corpus)}
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)


def _die_with_parent() -> None:
    """In the shard's process: get SIGTERM when the Ray worker that started it dies (a cancelled task)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _terminate(proc: subprocess.Popen) -> int:
    """SIGTERM first (fuzz kills its ranks and writes what it has), SIGKILL after a grace."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=TERM_GRACE)
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        return proc.wait()


def sweep(var: str, token: str) -> list[int]:
    """Kill every process whose environment carries ``var=token`` (orphaned ranks of a killed campaign)."""
    killed = []
    if not token:
        return killed
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if p.pid != os.getpid() and p.environ().get(var) == token:
                p.kill()
                killed.append(p.pid)
    return killed


def _error_line(log: Path, rc: int | None, status: str, bound: float) -> str | None:
    """Why a shard did not finish cleanly, in one line (the campaign's own ``error:`` line where it printed one)."""
    if status == "overrun":
        return f"still running {bound:.0f} s after it started: terminated"
    if status == "ok":
        return None
    text = log.read_text(encoding="utf-8", errors="replace") if log.exists() else ""
    errors = [line for line in text.splitlines() if "error:" in line]
    if errors:
        return errors[-1].strip()[:400]
    if rc is not None and rc < 0:
        return f"killed by signal {signal.Signals(-rc).name}"
    tail = " / ".join(line.strip() for line in text.splitlines()[-3:] if line.strip())
    return f"exit {rc}: {tail[:400]}"


def _files(out: Path) -> dict[str, str]:
    """The campaign's results as text (summary.json, report.md, report.html, findings/*.json)."""
    if not out.is_dir():
        return {}
    return {str(p.relative_to(out)): p.read_text(encoding="utf-8", errors="replace")
            for p in sorted(out.rglob("*")) if p.is_file()}


def _unpack(root: Path, files: dict[str, bytes]) -> Path | None:
    if not files:
        return None
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def pack_corpus(root: Path | None) -> dict[str, bytes]:
    """A corpus folder as data for a shard on any node (bucket cases first; Hypothesis's database while it fits)."""
    if root is None or not root.is_dir():
        return {}
    files = sorted(p for p in root.rglob("*") if p.is_file())
    files.sort(key=lambda p: not str(p.relative_to(root)).startswith("buckets"))
    out: dict[str, bytes] = {}
    size = 0
    for p in files:
        data = p.read_bytes()
        if size + len(data) > CORPUS_LIMIT:
            break
        out[str(p.relative_to(root))] = data
        size += len(data)
    return out


def _new_corpus(root: Path, shipped: dict[str, bytes]) -> dict[str, str]:
    """Corpus files the shard wrote that the shared corpus did not hold, and explorer places it moved on (base64:
    any bytes travel); not its night line: the fleet records the night once, merged."""
    return {rel: base64.b64encode(data).decode() for rel, data in pack_corpus(root).items()
            if rel != NIGHTS and (rel not in shipped or ((is_place(rel) or is_coverage(rel)) and shipped[rel] != data))}


def is_coverage(rel: str) -> bool:
    """Whether a corpus file is a SUT's coverage across nights (harness.report.coverage.corpus_file): a shard
    sends it back grown, and the fleet merges every shard's into it."""
    return Path(rel).parts[:1] == ("coverage",)


def is_place(rel: str) -> bool:
    """Whether a corpus file is an explorer's place (harness.campaign.exploration.place_file): state a night
    moves on, where every other corpus file is written once."""
    return Path(rel).parts[:1] == ("explore",)
