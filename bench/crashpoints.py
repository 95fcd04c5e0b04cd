"""Exhaustive crash points and power-loss crash states of a 2-rank, 4-tensor reference save.

Prints ``crash_points``, ``wall_s`` and ``points_per_s`` (target: all points in ≤ 60 s on 2 cores), then
``crash_states``, ``states_wall_s`` and ``states_per_s``. Every point and every state is judged (P-ATOMIC, P-NOLOSS,
and the recovery save that follows), so the figures are the cost of the real check, not of the kills alone.
``--async`` crashes an async save instead (its writer process is what gets killed); ``--launch pool`` runs the
unfaulted ops on warm launched ranks instead of in-process ranks (the faulted op always runs on launched ranks).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from faults import strace
from harness.faultrun import crashpoints, crashstates, standard_case
from harness.judge import Judge
from harness.runners import Runners


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--async", dest="use_async", action="store_true")
    parser.add_argument("--launch", choices=("in-process", "pool"), default="in-process")
    args = parser.parse_args(argv)
    if not strace.available():
        print("# strace is missing or ptrace is not permitted: nothing to measure")
        return 2
    case = standard_case(64, use_async=args.use_async)
    judge = Judge(Runners("reference", args.launch))
    try:
        start = time.perf_counter()
        points = crashpoints(case, judge)
        wall = time.perf_counter() - start
        start = time.perf_counter()
        states, n_ops = crashstates(case, judge.runners)
        states_wall = time.perf_counter() - start
    finally:
        judge.close()
    failing = sum(1 for r in points if not r.judgement.ok) + sum(1 for r in states if not r.judgement.ok)
    print(f"crash_points: {len(points)}")
    print(f"wall_s: {wall:.1f}")
    print(f"points_per_s: {len(points) / wall:.2f}")
    print(f"crash_states: {len(states)}")
    print(f"states_wall_s: {states_wall:.1f}")
    print(f"states_per_s: {len(states) / states_wall:.2f}")
    print(f"# {'async' if args.use_async else 'sync'} save, 2 ranks, 4 tensors, {n_ops} IO ops, launch {args.launch}; "
          f"{failing} failing; each point: a fresh faulted run + restart + loads + recovery save; each state: "
          "materialised in a fresh directory + loads + recovery save")
    return 0


if __name__ == "__main__":
    sys.exit(main())
