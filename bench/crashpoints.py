"""Judged crash points and power-loss states per second, per SUT, side by side in one run.

For each SUT the case is the exploration's shape ``S`` (harness/campaign/explore.py: one save of the fixed small state
— a
zero-size tensor, an uneven shard, a replicated and a BF16 tensor, within the SUT's claims — then the recovery
tail). The save is traced once; then crash points (a SIGKILL at each syscall of the save, each on a copy of the
root before it, the ranks relaunched in the background while the point runs) and power-loss states (all
materialised first, then judged on warm ranks, a fresh directory each) are judged as ``crashpoints --exhaustive``
judges them. The baseline is the way each point or state is replayed as its own case: a full run in fresh
directories (``Judge``), measured on ``--baseline`` of them. Every figure includes the real check (history checker
over loads and the recovery save).

Prints per SUT: ``points``, ``points_per_s``, ``baseline_points_per_s``, ``points_speedup``, ``states``,
``states_wall_s``, ``states_per_s``, ``baseline_states_per_s``, ``states_speedup``. Targets (docs/design.md §10):
paddle-dcp ≥ 2 judged states/s; every power-loss state of one paddleformers-uc save judged in ≤ 600 s.

Measured on the project's 2-core VM, shared with other jobs (load average 5-8, so +-50%), 2026-11-26:
  reference (2 ranks, in-process tail): 40 points at 0.29/s (full runs 0.29/s), 87 states at 6.3/s (full runs
  0.37/s, 17x); 16.8 states/s on a less loaded machine
  paddle-dcp (2 ranks, warm pool): 41 states at 0.13/s (full runs 0.04/s, 3.4x; 32 of them fail, and a failed
  load wedges the gloo group, so the ranks are relaunched), 3 points at 0.02/s (full runs 0.07/s)
  paddleformers-uc (1 rank): 395 states, all judged in 721 s end to end (``crashpoints --exhaustive --only states``)
2026-11-27, after stuck ranks are seen by their idle CPU, two spare pools are kept and kills stop waiting for init:
  paddle-dcp: 41 states in 37.3 s, 1.1/s (full runs 0.07/s, 15.7x); 10 points at 0.19/s (full runs 0.05/s, 3.9x).
  Below the 2/s target: 7 of the 41 states fail on one rank while the other waits in a collective, and each costs
  a relaunch of both ranks (about 5 CPU-seconds of Paddle start-up on this 2-core machine); the other 34 take
  0.12-0.3 s each.
  paddleformers-uc: 395 states, all judged in 278 s (1.42/s; target: <= 600 s)
2026-11-27, lost pools replaced by ranks forked from a process with Paddle imported (harness/ranks/forkserver.py):
  paddle-dcp: 41 states in 10.3 s, 3.99/s (target >= 2/s: met; full runs 0.10/s, 39x); 10 points in 9.3 s,
  1.07/s (full runs 0.05/s, 21.8x). A relaunch of 2 Paddle ranks now takes about 0.4 s.
  paddleformers-uc: 395 states in 142.5 s, 2.77/s (was 278 s; ranks also freeze what set-up left for the garbage
  collector, which UC's loads run explicitly).

``--sut`` picks SUTs (default: reference, paddle-dcp, paddleformers-uc; each with its ranks: 2, 2, 1); a SUT whose
framework is not importable here is run by ``--python-for SUT=PYTHON`` (e.g. the PaddleFormers venv's python, with
this checkout on PYTHONPATH) or skipped with a note. ``--points N`` / ``--states N`` judge at most N of each (an
even spread), for a quick look.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from faults import strace
from harness.campaign.explore import shape_case
from harness.judging.fault_runs import judge_crash_states, judge_points, traced
from harness.judging.judge import Judge
from harness.ranks.runners import Runners
from harness.sut import UnknownSut, adapter_class

ROOT = Path(__file__).resolve().parent.parent
SUTS = {"reference": (2, "in-process"), "paddle-dcp": (2, "pool"), "paddleformers-uc": (1, "pool")}


def _spread(items: list, n: int | None) -> list:
    if n is None or len(items) <= n:
        return items
    return [items[round(i * (len(items) - 1) / max(1, n - 1))] for i in range(n)]


def measure(sut: str, ranks: int, launch: str, points: int | None, states: int | None, baseline: int) -> dict:
    """One SUT's figures (see the module docstring)."""
    import dataclasses

    case = shape_case(sut, adapter_class(sut).capabilities, ranks, "S")
    judge = Judge(Runners(sut, launch))
    out: dict = {"sut": sut, "ranks": ranks, "launch": launch}
    try:
        start = time.perf_counter()
        with traced(case, judge.runners) as t:
            out["trace_s"] = round(time.perf_counter() - start, 1)
            all_points, all_states = t.points(), list(t.states())
            out["points_total"], out["states_total"] = len(all_points), len(all_states)
            for kind, judge_all, found, n in (("points", judge_points, all_points, points),
                                              ("states", judge_crash_states, all_states, states)):
                start = time.perf_counter()
                results = judge_all(t, _spread(found, n), judge.runners)
                wall = time.perf_counter() - start
                judged = sum(r.judged for r in results)
                out.update({kind: judged, f"{kind}_wall_s": round(wall, 1), f"{kind}_per_s": round(judged / wall, 2),
                            f"{kind}_failing": sum(1 for r in results if r.failing)})
            base_points = _spread(all_points, baseline)
            base_states = [t.state_fault(s) for s in _spread(all_states, baseline)]
        for kind, faults in (("points", base_points), ("states", base_states)):
            start = time.perf_counter()
            for fault in faults:
                judge(dataclasses.replace(case, fault=fault))  # a full run of the case in fresh directories
            wall = time.perf_counter() - start
            rate = len(faults) / wall if wall else 0.0
            out[f"baseline_{kind}_per_s"] = round(rate, 2)
            out[f"{kind}_speedup"] = round(out[f"{kind}_per_s"] / rate, 1) if rate else None
    finally:
        judge.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sut", action="append", dest="suts", choices=sorted(SUTS))
    parser.add_argument("--points", type=int, default=None, help="judge at most this many crash points per SUT")
    parser.add_argument("--states", type=int, default=None, help="judge at most this many power-loss states per SUT")
    parser.add_argument("--baseline", type=int, default=3, help="points and states judged by full runs (default 3)")
    parser.add_argument("--python-for", action="append", default=[], metavar="SUT=PYTHON",
                        help="run this SUT's measurement with another interpreter (its framework's venv)")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # one SUT, JSON out (subprocess)
    args = parser.parse_args(argv)
    if not strace.available():
        print("# strace is missing or ptrace is not permitted: nothing to measure")
        return 2
    pythons = dict(item.split("=", 1) for item in args.python_for)
    rows = []
    for sut in args.suts or list(SUTS):
        ranks, launch = SUTS[sut]
        if args.json:
            print(json.dumps(measure(sut, ranks, launch, args.points, args.states, args.baseline)))
            return 0
        if sut in pythons:
            rows.append(_elsewhere(pythons[sut], sut, args))
            continue
        try:
            adapter_class(sut)
        except UnknownSut as exc:
            rows.append({"sut": sut, "skipped": str(exc)})
            continue
        rows.append(measure(sut, ranks, launch, args.points, args.states, args.baseline))
    for row in rows:
        print(json.dumps(row))
    return 0


def _elsewhere(python: str, sut: str, args: argparse.Namespace) -> dict:
    """Measure ``sut`` in a subprocess running ``python`` (with this checkout on its path)."""
    cmd = [python, __file__, "--json", "--sut", sut, "--baseline", str(args.baseline)]
    cmd += [f"--points={args.points}"] if args.points is not None else []
    cmd += [f"--states={args.states}"] if args.states is not None else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=3600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"sut": sut, "error": (done.stderr or done.stdout).strip().splitlines()[-3:]}
    return json.loads(lines[-1])


if __name__ == "__main__":
    sys.exit(main())
