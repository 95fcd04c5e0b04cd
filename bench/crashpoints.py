"""Exhaustive crash points of a 2-rank, 4-tensor reference save: how many, and how long (target ≤ 60 s).

Prints ``crash_points: N``, ``wall_s: T`` and ``points_per_s: R`` for a sync save and, with ``--async``, for an
async save whose writer process is the one killed. Every point is judged (P-ATOMIC, P-NOLOSS, recovery), so the
figure is the cost of the real check, not of the kills alone.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from faults import strace
from harness.crash import crashpoints, standard_case


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--async", dest="use_async", action="store_true")
    args = parser.parse_args(argv)
    if not strace.available():
        print("# strace is missing or ptrace is not permitted: nothing to measure")
        return 2
    start = time.perf_counter()
    results = crashpoints(standard_case(64), use_async=args.use_async)
    wall = time.perf_counter() - start
    failing = sum(1 for r in results if not r.judgement.ok or not r.recovered)
    print(f"crash_points: {len(results)}")
    print(f"wall_s: {wall:.1f}")
    print(f"points_per_s: {len(results) / wall:.2f}")
    print(f"# {'async' if args.use_async else 'sync'} save, 2 ranks, 4 tensors; {failing} failing points; "
          "includes recording, one replay per point, two loads and a recovery save per point")
    return 0


if __name__ == "__main__":
    sys.exit(main())
