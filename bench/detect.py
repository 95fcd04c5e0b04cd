"""Detection power: does a campaign of a fixed budget find a planted defect unaided, with the SUT's known bugs
there too (the known set is ``tests/regressions``, as ``fuzz`` uses by default)?

For each defect of ``bench/planted.py`` one campaign runs (every default property, swarm on, seed fixed) until its
first finding that is the defect's, or the budget: a finding (a new bucket) is the defect's when its case, run
on the unplanted SUT, passes there (or fails only with a known bug): the SUT's own unknown bugs, which a campaign
also meets, are not the defect's. Prints one JSON
row per defect (``found``, ``seconds`` to the first new bucket, its title, cases run) and then
``detected_ratio``. Target (docs/design.md §10): every planted defect found within 150 s on 2 ranks.

Each defect runs twice per ``--fixes`` setting (default ``all`` and ``none``), in ABBA order (all, none, none, all),
so that what a defect's first campaign pays (a cold forkserver, files not yet cached) falls on both settings alike;
a framework without fixes runs once for both. Each setting's seconds to detection are the mean of its runs (a miss
counts the whole budget), summed over defects and printed with their ratio. The issue's target: with every fix
applied, detection in less time than without.

``--faults``: the fault-path defects of ``bench/planted_faults.py`` instead, each hunted by a ``fuzz --faults``
campaign (every default property with the fault properties, the explorer taking its share from the first round)
with a budget of 600 s. The reference has no fixes, so one campaign per defect. A finding is the defect's when its
case passes on the unplanted reference, or when its fault names IO the unplanted reference never does (a power-loss
state or crash point of the defect's own calls: the row says which). Target (docs/design.md §10): every fault-path
defect found within 600 s on 2 ranks.

Measured on a 2-core VM (seed 1, budget 600 s, ``--faults``): every fault-path defect found (``detected_ratio``
1.00, 321.7 s summed). Data fsynced after the commit: 1.2 s, and data never fsynced: 1.3 s (the explorer's first
check, the order of the first save's IO: the index vouches for data not yet durable); a swallowed write error:
80.5 s (the explorer's ENOSPC on the data file: the committed file is shorter than its index says); a rank's vote
before its data: 94.9 s (a drawn P-ATOMIC kill: rank 0 commits a short file); retention counting a crashed save's
directory: 143.8 s (a drawn P-NOLOSS file-size limit whose restart rotates: no complete checkpoint left).

``--main-job SECONDS`` also runs the README's main job (``fuzz --sut paddle-dcp --ranks 2``) for that long per
setting and prints ``distinct_buckets`` (new and known) and ``new_buckets``.

Measured on a 2-core VM, Paddle 3.3.1 CPU (seed 1, budget 150 s): every defect found with either setting
(``detected_ratio`` 1.00 and 1.00). Seconds to detection: paddle-loads-newest 16.1 and 9.5 with all fixes, 14.9
and 11.5 without; paddle-rolls-loads 14.4 and 13.9 with, 14.2 and 19.9 without; the reference's four once each
(0.4 to 2.5 s). Summed: 32.8 s with all fixes, 36.0 s without (ratio 0.91): the target is met. The two runs of one
setting differ by up to 6.6 s, as much as the settings do: a run's seconds are dominated by the pools it starts.
Run in one order only (all, then none), the same campaigns had read 1.19: the first campaign of each defect paid
the cold start.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.planted import DEFECTS  # noqa: E402
from bench.planted_faults import FAULT_DEFECTS  # noqa: E402
from faults import strace  # noqa: E402
from faults.errors import FaultSpecError  # noqa: E402
from harness.campaign.exploration import EVERY, Exploration  # noqa: E402
from harness.campaign.fuzz import fuzz  # noqa: E402
from harness.campaign.results import Campaign  # noqa: E402
from harness.fixes import resolve  # noqa: E402
from harness.judging.judge import Judge  # noqa: E402
from harness.ranks.runners import Runners  # noqa: E402
from harness.report.summary import buckets  # noqa: E402
from harness.sut import UnknownSut, adapter_class  # noqa: E402
from properties.registry import drawable_properties  # noqa: E402
from properties.triage.known import read_known  # noqa: E402

KNOWN = read_known(ROOT / "tests" / "regressions")


def campaign(sut: str, ranks: int, mode: str, seconds: float, seed: int, fixes: str = "all",
             stop_when: Callable | None = None, faults: bool = False) -> tuple[Campaign, float]:
    """A campaign as ``fuzz --fixes FIXES [--faults]`` runs it: the fixes of the SUT's framework applied, the
    others proving a failure known by a patched replay; with ``faults``, the explorer takes its share."""
    cls = adapter_class(sut)
    caps = frozenset(cls.capabilities)
    applied = resolve(fixes, cls.framework)
    run = Campaign(sut, ranks, drawable_properties(caps, faults), seconds, seed, mode=mode, stop_when=stop_when,
                   faults=faults)
    run.ptrace = faults and strace.available()
    exploration = Exploration(sut, caps, ranks, kinds=EVERY if mode != "in-process" else ("state",)) \
        if run.ptrace else None
    prove = tuple(f for f in resolve("all", cls.framework) if f not in applied)
    judge = Judge(Runners(sut, mode, fixes=applied), exploring=True, known=KNOWN, prove=prove)
    start = time.monotonic()
    try:
        fuzz(judge, run, caps, exploration=exploration)
    finally:
        judge.close()
    return run, time.monotonic() - start


def passes_without_defect(family: str, mode: str, fixes: tuple[str, ...], accepted: list) -> Callable:
    """Whether a finding's case passes on the unplanted SUT with the campaign's fixes (a pass excused by a known
    finding counts), or its fault names IO that SUT never does; the findings it accepts are appended to
    ``accepted``, each with what its case did on the unplanted SUT."""
    def check(finding) -> bool:
        judge = Judge(Runners(family, mode, fixes=fixes), known=KNOWN)
        try:
            judgement, _ = judge(dataclasses.replace(finding.case, sut=family))
            unplanted = "pass" if judgement.ok else ""
        except FaultSpecError as exc:  # e.g. a power-loss state of calls the unplanted SUT does not make
            unplanted = f"fault not replayable there ({type(exc).__name__})"
        finally:
            judge.close()
        if unplanted:
            accepted.append((finding, unplanted))
        return bool(unplanted)
    return check


def hunt(name: str, budget: float, seed: int, fixes: str, faults: bool = False) -> dict:
    """One campaign on the planted SUT until the defect's first finding or the budget, as a row."""
    sut, ranks, mode = (FAULT_DEFECTS if faults else DEFECTS)[name]
    family = adapter_class(sut).name
    accepted: list = []
    applied = resolve(fixes, adapter_class(sut).framework)
    run, wall = campaign(sut, ranks, mode, budget, seed, fixes, passes_without_defect(family, mode, applied, accepted),
                         faults=faults)
    first, unplanted = accepted[0] if accepted else (None, None)
    row = {"defect": name, "fixes": fixes, "fixes_applied": len(applied), "found": first is not None,
            "seconds": round(first.found_at, 1) if first else None,
            "bucket": first.bucket.title if first else None,
            "property": first.judgement.property if first else None,
            "fault": (first.case.fault.kind if first.case.fault is not None else None) if first else None,
            "unplanted": unplanted, "cases": sum(run.cases_run.values()),
            "wall_s": round(wall, 1), "known_met": sum(run.known.values()),
            "other_new_buckets": sum(1 for f in run.findings if f is not first),
            "other_buckets": [f.bucket.title for f in run.findings if f is not first],
            "cases_per_property": dict(run.cases_run)}
    if run.exploration:
        row["explorer"] = {k: run.exploration[k] for k in ("seconds", "points", "states", "orders", "at")}
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=float, help="seconds per defect (default 150; 600 with --faults)")
    parser.add_argument("--faults", action="store_true", help="the fault-path defects, hunted by fuzz --faults")
    parser.add_argument("--defect", action="append", choices=sorted({**DEFECTS, **FAULT_DEFECTS}),
                        help="only these (default: all of the chosen set)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--fixes", action="append", choices=("all", "none"),
                        help="campaigns' --fixes, each setting run for every defect, side by side "
                        "(default: all and none)")
    parser.add_argument("--main-job", type=float, default=0.0, metavar="SECONDS")
    args = parser.parse_args(argv)
    defects = FAULT_DEFECTS if args.faults else DEFECTS
    args.budget = args.budget or (600.0 if args.faults else 150.0)
    if args.faults and not strace.available():
        print("detect --faults: strace cannot attach here, so crash points, errnos and the explorer cannot run",
              file=sys.stderr)
        return 2
    stray = sorted(set(args.defect or ()) - set(defects))
    if stray:
        parser.error(f"not {'fault-path ' if args.faults else ''}defects: {stray} (--faults picks that set)")
    settings = args.fixes or ["all", "none"]
    found: Counter = Counter()
    total = 0
    seconds: dict[str, dict[str, float]] = {}
    for name in args.defect or sorted(defects):
        try:
            adapter_class(defects[name][0])
        except UnknownSut as exc:  # Paddle not installed here
            print(json.dumps({"defect": name, "skipped": str(exc)}))
            continue
        total += 1
        rows: dict[tuple[str, ...], list[dict]] = {}  # a framework without fixes: one campaign serves both settings
        framework = adapter_class(defects[name][0]).framework
        # ABBA: each setting runs once first and once last, so what the first campaign of a defect pays (a cold
        # forkserver, files not yet cached) falls on both alike; each setting's seconds are its runs' mean
        each = 2 if len({resolve(f, framework) for f in settings}) > 1 else 1
        for fixes in settings + settings[::-1]:
            applied = resolve(fixes, framework)
            if len(rows.get(applied, [])) >= each:
                continue
            row = {**hunt(name, args.budget, args.seed, fixes, args.faults), "fixes": fixes}
            rows.setdefault(applied, []).append(row)
            print(json.dumps(row), flush=True)
        for fixes in settings:
            runs = rows[resolve(fixes, framework)]
            found[fixes] += all(r["found"] for r in runs)
            # not found: the whole budget, so a miss never reads as fast
            seconds.setdefault(fixes, {})[name] = sum(r["seconds"] if r["found"] else args.budget
                                                      for r in runs) / len(runs)
    for fixes in settings:
        print(f"detected_ratio (--fixes {fixes}): {found[fixes] / total:.2f}" if total
              else "detected_ratio: - (nothing ran)")
    if total and set(settings) == {"all", "none"}:
        fixed, stock = sum(seconds["all"].values()), sum(seconds["none"].values())
        print(f"seconds to detection, summed over defects: --fixes all {fixed:.1f}, --fixes none {stock:.1f}; "
              f"ratio all/none {fixed / stock:.2f}" if stock else "")
    if args.main_job:
        for fixes in settings:
            run, _ = campaign("paddle-dcp", 2, "pool", args.main_job, args.seed, fixes)
            rows = [{"bucket": f.bucket.id, "property": f.judgement.property, "bucket_title": f.bucket.title,
                     "replay": "-"} for f in run.findings]
            listed = buckets(run, rows)
            print(f"--fixes {fixes}: distinct_buckets: {len(listed)}, "
                  f"new_buckets: {sum(1 for b in listed if b['status'].startswith('new'))}")
            print(json.dumps({"fixes": fixes, "cases": sum(run.cases_run.values()),
                              "seconds_per_property": dict(run.prop_seconds),
                              "buckets": [(b["status"], b["title"], b["cases"]) for b in listed]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
