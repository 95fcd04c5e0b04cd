"""Coverage of the framework's checkpoint code: what recording it costs per case, and what guidance buys, side by
side in one run.

Overhead: the same drawn cases (a fixed seed) judged on warm ranks with recording on and off, alternating case by
case so both see the same machine; prints seconds per case each way and their ratio (target, docs/design.md §10:
recording makes a case at most 30% slower), and the seconds the merge and analysis take at a campaign's end.

Guidance: two campaigns of the same seed and time, one whose turns are weighted by what they add
(``--coverage on``) and one not (``--coverage unguided``); prints the arcs each reached, and its flex-checkpoint
line coverage, at each quarter of the time.

Measured on the project's 2-core machine (Paddle 3.3.1 CPU, 2 ranks), 2026-12-02:
  overhead, 40 P-ROUNDTRIP cases: warm pool 1.07x per case; virtual ranks 1.23x (1.98x before a virtual host
  traced only every fourth case); in-process reference 1.05x; merge and analysis 1.1-1.4 s.
  guidance, 120 s of every default property, seed 11: guided 450 cases, unguided 496; both 1688 arcs (22.3% of flex
  checkpoint's reachable lines, 25.7% of paddle.framework.io), 1615 and 1654 of them in the first quarter. The
  drawn cases reach one path of flex checkpoint and saturate it within a minute; no property's turns add code
  later, so weighting them cannot either (the reach of the strategies, not the schedule, is what limits it).
  guidance over properties, swarm features and left-out fixes, 300 s each, seed 11 (--cases 10): guided 1556
  cases, 1899 arcs (24.9% of flex checkpoint's reachable lines), unguided 1101 cases, 1771 arcs (23.6%): 1.072x
  the arcs; at the quarters guided 1675/1838/1841/1899, unguided 1633/1680/1771/1771. One seed: the gap is the
  size of the code a few swarm features reach, not yet a measured effect across seeds.

``--sut`` (default paddle-dcp), ``--launch`` (pool or virtual), ``--cases`` per mode (default 40), ``--time`` per
campaign (default 120; 0 skips the guidance part), ``--property`` (default P-ROUNDTRIP for the overhead; every
default property for guidance).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hypothesis import HealthCheck, given, settings
from hypothesis import seed as hypothesis_seed

from harness.coverage.merge import analyse_files, read_dir, summarise
from harness.judging.judge import Judge
from harness.ranks.runners import Runners
from harness.report.coverage import framework_of
from properties.registry import property_cases

ROOT = Path(__file__).resolve().parent.parent


def drawn(prop: str, sut: str, ranks: int, n: int, seed: int) -> list:
    cases: list = []

    @hypothesis_seed(seed)
    @settings(max_examples=n, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(property_cases(prop, sut, ranks))
    def draw(case) -> None:
        cases.append(case)

    draw()
    return cases[:n]


def overhead(sut: str, prop: str, ranks: int, n: int, launch: str) -> dict:
    cases = drawn(prop, sut, ranks, n, 1)
    with tempfile.TemporaryDirectory() as tmp:
        on, off = Runners(sut, launch), Runners(sut, launch)
        on.coverage = {"dir": tmp}
        judges = {"on": Judge(on, exploring=True), "off": Judge(off, exploring=True)}  # as a campaign judges
        seconds = {"on": 0.0, "off": 0.0}
        try:
            for mode in ("on", "off"):  # warm both pools before timing
                judges[mode](cases[0])
            for case in cases:
                for mode in ("on", "off"):
                    t = time.perf_counter()
                    judges[mode](case)
                    seconds[mode] += time.perf_counter() - t
        finally:
            for judge in judges.values():
                judge.close()
        t = time.perf_counter()
        block = summarise(read_dir(tmp), analyse_files(framework_of(sut)))
        analysis = time.perf_counter() - t
    per = {m: seconds[m] / len(cases) for m in seconds}
    return {"cases": len(cases), "s_per_case_on": round(per["on"], 4), "s_per_case_off": round(per["off"], 4),
            "ratio": round(per["on"] / per["off"], 3), "merge_and_analysis_s": round(analysis, 2),
            "scopes": {s: t["line_percent"] for s, t in block["scopes"].items()}}


def campaign(sut: str, ranks: int, seconds: float, mode: str, out: Path) -> dict:
    subprocess.run([sys.executable, "-m", "harness.cli", "fuzz", "--sut", sut, "--ranks", str(ranks), "--time",
                    str(seconds), "--out", str(out), "--seed", "11", "--no-repro", "--no-known", "--coverage", mode],
                   cwd=ROOT, check=False, capture_output=True, timeout=seconds * 3 + 600)
    summary = json.loads((out / "summary.json").read_text())
    block = summary["coverage"]
    timeline = block["timeline"]
    quarters = []
    for q in (0.25, 0.5, 0.75, 1.0):
        reached = [arcs for at, arcs in timeline if at <= q * seconds]
        quarters.append(reached[-1] if reached else 0)
    return {"cases": sum(summary["cases_run"].values()), "arcs_at_quarters": quarters, "arcs": block["arcs"],
            "lines": {s: t["line_percent"] for s, t in block["scopes"].items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sut", default="paddle-dcp")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--cases", type=int, default=40)
    parser.add_argument("--time", type=float, default=120.0)
    parser.add_argument("--property", default="P-ROUNDTRIP")
    parser.add_argument("--launch", default="pool", help="pool (default) or virtual")
    args = parser.parse_args()
    print(json.dumps({"overhead": overhead(args.sut, args.property, args.ranks, args.cases, args.launch)}))
    if args.time > 0:
        with tempfile.TemporaryDirectory() as tmp:
            got = {mode: campaign(args.sut, args.ranks, args.time, mode, Path(tmp) / mode)
                   for mode in ("on", "unguided")}
        got["arcs_ratio_guided_over_unguided"] = round(got["on"]["arcs"] / max(1, got["unguided"]["arcs"]), 3)
        print(json.dumps({"guidance": got}))


if __name__ == "__main__":
    main()
