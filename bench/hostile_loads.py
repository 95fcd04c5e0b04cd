"""Every hostile checkpoint of tests/hostile_cases.py loaded in one child under its limits, each load's CPU time
against a load of the valid checkpoint it was made from, measured side by side in the same child.

Prints, per case and mode, the CPU seconds and the ratio to the valid checkpoint's load in that mode, and the
worst case against the target (issue 19: a hostile load is refused within 1 s of CPU). The test suite checks the
typed outcomes and guards against blow-ups at three times the target (tests/test_hostile_checkpoints.py); the
target itself is measured here, where nothing else shares the machine.

On the 2-core CI-like machine (Python 3.11, nothing else running) the target is missed: the worst load is
``index-most-slices`` (global), 1.06 to 1.16 s of CPU over two runs, 47x the valid checkpoint's global load; its
per-rank loads take 0.84 to 0.91 s and ``meta-900k-ints`` 0.74 to 0.77 s. Exits 1 while the target is missed.

Run from the repo root: ``python bench/hostile_loads.py [--dir PATH]``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # works without installing the package

from tests.hostile_cases import CASES, build_valid
from tests.test_hostile_checkpoints import LOAD_SECONDS, run_child

VALID = "(valid)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, help="where to build the checkpoints (default: a fresh temp dir)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(dir=args.dir, prefix="hostile-"))
    try:
        valid = work / "valid"
        build_valid(valid)
        roots = {VALID: valid}
        for name, (_, damage) in sorted(CASES.items()):
            roots[name] = work / name
            shutil.copytree(valid, roots[name])
            damage(roots[name])
        _, *records = run_child(roots, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    base = {r["mode"]: max(r["cpu"], 1e-4) for r in records if r["case"] == VALID}
    print(f"{'case':<40} {'mode':<8} {'CPU s':>7} {'x valid':>8}  outcome")
    for r in sorted(records, key=lambda r: -r["cpu"]):
        print(f"{r['case']:<40} {r['mode']:<8} {r['cpu']:7.3f} {r['cpu'] / base[r['mode']]:8.1f}  {r['outcome'][:60]}")
    worst = max((r for r in records if r["case"] != VALID), key=lambda r: r["cpu"])
    print(f"worst: {worst['case']} ({worst['mode']}) {worst['cpu']:.3f} s CPU; target {LOAD_SECONDS} s: "
          f"{'met' if worst['cpu'] <= LOAD_SECONDS else 'MISSED'}")
    return 0 if worst["cpu"] <= LOAD_SECONDS else 1


if __name__ == "__main__":
    sys.exit(main())
