"""``ckpt-harness``: fuzz, replay, crashpoints and list (docs/design.md §8, a contract).

Exit codes: 0 nothing found (the case passes), 1 findings (the failure reproduces), 2 the harness could not do its
job: bad input, an adapter that does not import or set up on the ranks, ranks that cannot start, or a bug of the
harness itself. Then one line on stderr says what is wrong, never a traceback; --debug (or the environment
variable CKPT_HARNESS_DEBUG=1) re-raises it with its traceback instead, for developers of the harness.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

from faults.strace import ERRNO_NAMES
from harness.campaign.corpus import Corpus
from harness.campaign.exploration import EVERY, Exploration, keep_place, parse_part, place_file, read_place
from harness.campaign.fuzz import default_seed, fuzz
from harness.campaign.results import Campaign, shrink_room
from harness.fixes import FIXES, FixError, resolve
from harness.fleet.driver import FleetError
from harness.fleet.plan import PlanError
from harness.judging.judge import EXHAUSTIVE_BOUND, Judge
from harness.ranks.runner import PoolFailure
from harness.ranks.runners import DEVICES, MODES, Runners
from harness.report.coverage import coverage_line
from harness.report.summary import buckets, buckets_table, write_results
from harness.sut import REGISTRY, UnknownSut, adapter_class
from properties import registry as catalogue
from properties.generate.fault_cases import has_latest
from properties.model.case import CaseError, read_case_file
from properties.triage.known import KnownFindingsError, read_known

KNOWN_DIR = Path(__file__).resolve().parent.parent / "tests" / "regressions"  # fuzz's known set by default
DEBUG_VAR = "CKPT_HARNESS_DEBUG"
DEBUG_HELP = (f"a harness error (exit 2) re-raises with its traceback instead of one line on stderr; also {DEBUG_VAR}=1"
              " (for developers of the harness)")


class HarnessError(Exception):
    """Bad input to the harness itself; reported as one line, exit status 2."""


# their message is the whole story
INPUT_ERRORS = (HarnessError, FixError, UnknownSut, CaseError, KnownFindingsError, PlanError, FleetError)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ckpt-harness", description=__doc__)
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    sub = parser.add_subparsers(dest="command", required=True)
    f = sub.add_parser("fuzz", help="fuzz a system under test for a fixed time")
    f.add_argument("--sut", required=True, help="SUT name (see `list`) or package.module:ClassName")
    f.add_argument("--ranks", type=int, default=2, help="world size of saves (default 2)")
    f.add_argument("--time", type=float, required=True, help="seconds to fuzz (shrinking a failure may add some)")
    f.add_argument("--out", type=Path, required=True, help="output directory (findings/, summary.json, report.md)")
    f.add_argument("--property", action="append", dest="properties", metavar="ID", help="restrict to property IDs")
    f.add_argument("--faults", action="store_true", help="turn the fault layer on")
    f.add_argument("--exhaustive-bound", type=int, default=EXHAUSTIVE_BOUND, metavar="N",
                   help="a drawn crash point or power-loss state is judged together with every other one of the case "
                   f"where it has at most N of them (default {EXHAUSTIVE_BOUND}: only the drawn one; every point of "
                   "short op sequences is the explorer's)")
    explore = f.add_mutually_exclusive_group()
    explore.add_argument("--no-explore", dest="explore", action="store_const", const="off", default="share",
                         help="with --faults: no share of the time for the bounded-exhaustive explorer (every crash "
                         "point, power-loss state and errno of short save sequences; resumed from --corpus)")
    explore.add_argument("--explore-only", dest="explore", action="store_const", const="only",
                         help="with --faults: the explorer takes all of the time, no property draws a case (a fleet's "
                         "exploration shard)")
    f.add_argument("--explore-part", default="0/1", metavar="K/N",
                   help="the explorer takes every N-th shape from the K-th (from 0), so N campaigns explore side by "
                   "side, each keeping its own place (default 0/1: every shape)")
    f.add_argument("--cases", type=int, default=None, metavar="N",
                   help="each property stops after N judged cases (default: as many as --time allows); --time "
                   "still bounds the campaign")
    f.add_argument("--seed", type=int, default=None, help="campaign seed (default: random, recorded in summary)")
    known = f.add_mutually_exclusive_group()
    known.add_argument("--known", "--skip-known", type=Path, default=KNOWN_DIR, metavar="DIR", dest="known",
                       help="regression cases with a 'signature': failures they explain are counted as known bugs, "
                       "not shrunk (default: this checkout's tests/regressions)")
    known.add_argument("--no-known", action="store_const", const=None, dest="known",
                       help="treat every failure as new (no known set)")
    f.add_argument("--no-repro", dest="repro", action="store_false",
                   help="do not write a standalone repro (OUT/repro/) for each new finding")
    f.add_argument("--corpus", type=Path, default=None, metavar="DIR",
                   help="keep what campaigns learn here: replay every bucket case it holds first, store each new "
                   "bucket's smallest case (harness/campaign/corpus.py)")
    f.add_argument("--corpus-readonly", type=Path, default=None, metavar="DIR",
                   help="with --corpus: also read this shared corpus, never writing to it (CI)")
    f.add_argument("--no-swarm", action="store_false", dest="swarm",
                   help="draw every batch from all the SUT can hold (default: each batch leaves a random subset of "
                   "optional capabilities out, properties/generate/swarm.py)")
    f.add_argument("--coverage", choices=("on", "unguided", "off"), default="on",
                   help="line and branch coverage of the framework's checkpoint code, recorded on every rank and "
                   "writer (default on: reported, and properties whose turns add coverage get more time; unguided: "
                   "reported only; off: not recorded, for when every case counts)")
    f.add_argument("--fail-on-known", action="store_true",
                   help="exit 1 when known bugs were met too (default: only new buckets exit 1)")
    f.add_argument(
        "--launch", choices=MODES, default="pool",
        help="warm rank pool (default), fresh launch per case, in-process, or virtual (the ranks as threads of one "
        "process, harness/ranks/virtual/paddle_world.py: paddle-dcp; fault properties still get real ranks)"
    )
    f.add_argument(
        "--op-timeout",
        type=float,
        default=120.0,
        help="seconds one operation may take before the ranks are declared hung (default 120)",
    )
    r = sub.add_parser("replay", help="re-run one case or finding file, or a standalone repro folder (its run.sh, "
                       "without the harness); exit 1 if the failure reproduces")
    r.add_argument("case", type=Path)
    r.add_argument("--with-fix", action="store_true", help="a repro folder only: run it with its candidate fix "
                   "(run.sh --with-fix); exit 0 when the fix makes every launch pass, 1 when not")
    r.add_argument("--launch", choices=MODES, default="fresh")
    r.add_argument("--op-timeout", type=float, default=120.0)
    c = sub.add_parser("crashpoints", help="kill a save at every syscall it makes (or, with --states, lose power in "
                       "every state its IO may leave) and judge each crash")
    c.add_argument("case", type=Path, nargs="?", help="a case or finding file; its tensors and layouts, or its own "
                   "fault op (not with --exhaustive)")
    c.add_argument("--async", dest="use_async", action="store_true", help="crash an async save (and its writer)")
    c.add_argument("--op", type=int, default=None, help="crash this op of the case's own ops (a job's life: any save "
                   "or rotation of it); default: the save whose result the first load checks")
    c.add_argument("--states", action="store_true", help="power-loss crash states instead of process kills")
    c.add_argument("--limit", type=int, default=None,
                   help="at most this many crash points or states (a deterministic spread, first and last included)")
    c.add_argument("--launch", choices=MODES, default="pool")
    c.add_argument("--op-timeout", type=float, default=120.0)
    c.add_argument("--exhaustive", action="store_true",
                   help="bounded-exhaustive: every shape of up to --max-len saves, re-saves and rotations over a fixed "
                   "small state, every crash point and power-loss state of each of its ops (needs --sut)")
    c.add_argument("--sut", default=None, help="with --exhaustive: the SUT (see `list`)")
    c.add_argument("--max-len", type=int, default=2, help="with --exhaustive: ops per shape (default 2; nightly 3)")
    c.add_argument("--ranks", type=int, default=2, help="with --exhaustive: world size (default 2)")
    c.add_argument("--shape", action="append", dest="shapes", metavar="SHAPE",
                   help="with --exhaustive: only this shape (letters S save, R re-save, T rotate; e.g. SST)")
    c.add_argument("--option", action="append", dest="options", default=[], metavar="KEY=JSON",
                   help="with --exhaustive: a case option, e.g. same_dir=true or format='\"safetensors\"'")
    c.add_argument("--only", choices=("points", "states"), default=None,
                   help="with --exhaustive: only crash points (process kills) or only power-loss states")
    c.add_argument("--errno", choices=ERRNO_NAMES, default=None,
                   help="with --exhaustive: every crash point fails its call with this errno instead of a kill "
                        "(ENOSPC: a full disk; EIO: a failing device), the job going on as the SUT lets it")
    c.add_argument("--confirm", type=int, default=None, metavar="N",
                   help="with --exhaustive: replay at most N failures per op and kind in fresh processes (default: "
                   "all); the rest count as failing, unconfirmed")
    c.add_argument("--verbose", action="store_true", help="with --exhaustive: a line per point or state judged "
                   "(the default on a terminal)")
    c.add_argument("--out", type=Path, default=None,
                   help="write summary.json, report.md and report.html (with the crash-point map: the save's IO per "
                   "rank and writer, each point or state on it by verdict); with --exhaustive: failing cases as "
                   "findings (DIR/findings/) and DIR/explore.json")
    for p in (f, r, c):
        p.add_argument("--device", choices=DEVICES, default="auto",
                       help="auto (default): one GPU per rank where the framework has CUDA and enough GPUs; cpu; gpu")
        p.add_argument("--nnodes", type=int, default=1,
                       help="launch the ranks as this many nodes (launchers) meeting over loopback (default 1)")
        campaign = p is f  # a campaign runs past the known bugs; a replay or a crash point shows stock code
        p.add_argument("--fixes", default="all" if campaign else None, metavar="all|none|ID,...",
                       help="patch known bugs of the SUT's framework (and the frameworks beneath it) on every rank "
                       f"first (harness/fixes/; `list` names them): all{' (default)' if campaign else ''}, none, "
                       "or fix ids (with the fixes each requires)" + (
                           "; a failure met with fixes applied is replayed on stock code, and the report names "
                           "the fixes it needs where stock code passes" if campaign else
                           "; default: a finding's needs_fixes (the fixes it shows only behind), else none"))
    fl = sub.add_parser("fleet", help="run a plan of campaigns (shards) as Ray tasks and merge their results "
                        "(docs/fleet.md; needs the fleet extra)")
    fl.add_argument("--plan", type=Path, required=True, help="the plan: TOML, [fleet] and [[shard]] "
                    "(harness/fleet/plan.py)")
    fl.add_argument("--time", type=float, required=True, help="seconds of each shard's campaign (a shard's own "
                    "'time' overrides it)")
    fl.add_argument("--out", type=Path, required=True, help="output directory (shards/<id>/, findings/, "
                    "summary.json, report.md, report.html)")
    fl.add_argument("--address", default=None, help="join this Ray cluster (default: start one on this machine for "
                    "the night and shut it down afterwards)")
    fl.add_argument("--fixes", default="all", metavar="all|none|ID,...",
                    help="each shard's fuzz --fixes where the plan gives it none (default all: campaigns run past "
                    "the known bugs)")
    fl.add_argument("--corpus", type=Path, default=None, metavar="DIR",
                    help="every shard reads this corpus; what they learn is folded back into it")
    w = sub.add_parser("repro", help="write a standalone reproduction (repro.py, run.sh, REPORT.md) of a finding or "
                       "case, simplified first and verified in fresh processes")
    w.add_argument("case", type=Path, help="a finding or case file")
    w.add_argument("--out", type=Path, required=True, help="the folder to write it to")
    w.add_argument("--no-simplify", dest="simplify", action="store_false",
                   help="write the case as it is (no simpler variants tried)")
    w.add_argument("--no-verify", dest="verify", action="store_false", help="do not run the written script")
    w.add_argument("--fixes", default=None, metavar="none|ID,...",
                   help="known bugs' fixes the script applies in every process before its first step, and the "
                   "simplification judges with (default: the finding's needs_fixes, the fixes it was shown behind); "
                   "'none' writes it against stock code")
    w.add_argument("--candidate-only", action="store_true", help="OUT is the case's repro already written: give it "
                   "today's candidate fix (fix.py, fix.diff, run.sh --with-fix, REPORT.md) and run it with the fix, "
                   "without writing or verifying the repro again")
    listing = sub.add_parser("list", help="SUTs, properties and faults")
    for p in (f, r, c, fl, w, listing):  # also after the command; SUPPRESS: an absent one keeps the top-level value
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
    return parser


def _runners(args: argparse.Namespace, sut: str) -> Runners:
    if args.nnodes < 1:
        raise HarnessError("--nnodes must be at least 1")
    fixes = resolve(args.fixes, adapter_class(sut).framework)
    try:
        return Runners(sut, args.launch, args.op_timeout, device=args.device, nnodes=args.nnodes, fixes=fixes)
    except ValueError as exc:  # e.g. --launch virtual for a SUT without virtual ranks
        raise HarnessError(str(exc)) from None


def _terminate(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through every finally: ranks killed, temp directories removed


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminate) if in_main else None
    try:
        return {"fuzz": _fuzz, "replay": _replay, "list": _list, "crashpoints": _crashpoints,
                "fleet": _fleet, "repro": _repro}[args.command](args)
    except Exception as exc:  # the harness could not do its job: never a finding (exit 1), never a traceback
        if args.debug or os.environ.get(DEBUG_VAR, "") not in ("", "0"):
            raise
        print(f"ckpt-harness: error: {error_line(exc)}", file=sys.stderr)
        return 2
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)


def error_line(exc: Exception) -> str:
    """What went wrong, in one line: bad input as its own message; ranks that could not start (or failed outside
    any case) with the tail of their logs; anything else as the harness's own bug, by type and message."""
    if isinstance(exc, INPUT_ERRORS):
        text = str(exc)
    elif isinstance(exc, PoolFailure):
        text = f"could not start ranks: {exc}" if exc.kind == "setup" else f"ranks failed ({exc.kind}): {exc}"
    else:
        what = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        text = f"internal error of the harness (not a finding): {what} (--debug shows the traceback)"
    return " / ".join(line.strip() for line in text.splitlines() if line.strip())


def _fuzz(args: argparse.Namespace) -> int:
    cls = adapter_class(args.sut)
    caps = frozenset(getattr(cls, "capabilities", ()))
    requested = args.properties or catalogue.default_properties(args.faults)
    unknown = [p for p in requested if p not in catalogue.REGISTRY]
    if unknown:
        raise HarnessError(f"unknown property IDs {unknown}; see `ckpt-harness list`")
    needs_faults = [p for p in requested if catalogue.REGISTRY[p].fault and not args.faults]
    if needs_faults:
        raise HarnessError(f"properties {needs_faults} inject faults: add --faults")
    if args.ranks < 1 or args.time <= 0 or (args.cases is not None and args.cases < 1):
        raise HarnessError("--ranks and --cases must be at least 1 and --time positive")
    try:
        args.explore_part = parse_part(args.explore_part)
    except ValueError as exc:
        raise HarnessError(f"--explore-part: {exc}") from None
    if args.explore == "only" and (not args.faults or args.cases is not None or args.properties):
        raise HarnessError("--explore-only needs --faults, and takes neither --cases nor --property (no property "
                           "draws a case)")
    skipped = {p: catalogue.REGISTRY[p].skip_reason(caps) for p in requested}
    props = [p for p in requested if skipped[p] is None] if args.explore != "only" else []
    seed = args.seed if args.seed is not None else default_seed()
    campaign = Campaign(args.sut, args.ranks, props, args.time, seed, mode=args.launch, faults=args.faults)
    campaign.skipped = {p: why for p, why in skipped.items() if why is not None}
    campaign.swarm = args.swarm
    campaign.cases_per_property = args.cases
    if args.corpus_readonly is not None and args.corpus is None:
        raise HarnessError("--corpus-readonly needs --corpus (where this campaign writes)")
    campaign.corpus = Corpus(args.corpus, args.corpus_readonly) if args.corpus is not None else None
    if args.faults:
        from faults import strace

        campaign.ptrace = strace.available()  # without ptrace: psutil triggers instead of crash points
    known = read_known(args.known) if args.known is not None and (args.known != KNOWN_DIR or KNOWN_DIR.is_dir()) \
        else []
    runners = _runners(args, args.sut)
    if args.coverage != "off" and getattr(cls, "framework", None) is not None:  # (else no framework code to cover)
        if importlib.util.find_spec("coverage") is None:
            raise HarnessError("--coverage needs the coverage package (python3 -m pip install coverage), or pass "
                               "--coverage off")
        # Each process's own recording, until the report merges them (never --out: a campaign whose ranks cannot
        # start must leave no results behind)
        campaign.coverage_dir = Path(tempfile.mkdtemp(prefix="ckh-coverage-"))
        campaign.coverage_guided = args.coverage == "on"
        runners.coverage = {"dir": str(campaign.coverage_dir)}
    try:
        return _campaign(args, campaign, cls, caps, runners, known)
    finally:  # each process's recording was merged into the results, or there are none
        if campaign.coverage_dir is not None:
            shutil.rmtree(campaign.coverage_dir, ignore_errors=True)


def _campaign(args: argparse.Namespace, campaign: Campaign, cls: type, caps: frozenset[str], runners: Runners,
              known: list) -> int:
    """Run the campaign ``_fuzz`` set up, and report it."""
    # A failure no signature explains is replayed with the fixes not applied already: known where it then passes.
    prove = () if args.known is None else tuple(f for f in resolve("all", cls.framework) if f not in runners.fixes)
    judge_case = Judge(runners, exploring=True, known=known, exhaustive=args.exhaustive_bound, prove=prove)
    args.repro_until = time.monotonic() + args.time + shrink_room(args.time)
    if sys.stderr.isatty():  # the terminal's user learns the tail up front; logs keep one line per error
        print(f"fuzz: drawing cases for {args.time:g} s; a failure found late is shrunk and proven for up to "
              f"{shrink_room(args.time):.0f} s more" + (", and a repro is written for each new bucket while that "
              "time lasts (after it: the command to write it)" if args.repro else ""), file=sys.stderr)
    exploration, place_path = _exploration(args, campaign, caps, runners.fixes)
    try:
        fuzz(judge_case, campaign, caps, progress=sys.stderr.isatty(), exploration=exploration)
    finally:
        judge_case.close()
        if exploration is not None and place_path is not None:
            keep_place(place_path, exploration.place)
        if campaign.coverage is not None:  # what the last processes wrote as they ended
            campaign.coverage.poll()
    return _report(args, campaign)


def _exploration(args: argparse.Namespace, campaign: Campaign, caps: frozenset[str], fixes: tuple[str, ...]
                 ) -> tuple[Exploration | None, Path | None]:
    """A fault campaign's explorer (unless --no-explore, or no strace here), resumed where the corpus's last one
    stopped (this campaign's --corpus, else the --corpus-readonly a fleet shard is given); and where to keep its
    place."""
    if args.explore == "only" and not campaign.ptrace:
        raise HarnessError("--explore-only: strace cannot attach here, so the explorer cannot run")
    if not (args.faults and args.explore != "off" and campaign.ptrace) or args.cases is not None:
        return None, None  # (a campaign bounded by cases is the same run anywhere; the explorer's share is time)
    # Crash points and errnos strike rank processes: in-process ranks have none, only power-loss states.
    kinds = ("state",) if args.launch == "in-process" else EVERY
    where = [place_file(root, args.sut, args.ranks, fixes, kinds, args.explore_part)
             for root in (args.corpus, args.corpus_readonly) if root is not None]
    place = next((p for p in map(read_place, where) if p is not None), None)
    return Exploration(args.sut, caps, args.ranks, place=place, kinds=kinds, part=args.explore_part), \
        (where[0] if args.corpus is not None else None)


def _report(args: argparse.Namespace, campaign: Campaign) -> int:
    """Write and print the campaign's results. A campaign stopped by ranks that cannot start (campaign.py) raises
    that error (exit 2), after writing the results of the cases that did run."""
    total = sum(campaign.cases_run.values())
    if campaign.fatal is not None and not total:
        raise campaign.fatal
    args.out.mkdir(parents=True, exist_ok=True)
    rows = write_results(campaign, args.out,
                         extra=(lambda path: _repro_of(path, args.launch, args.repro_until)) if args.repro else None)
    if campaign.corpus is not None:
        for finding, row in zip(campaign.findings, rows):
            campaign.corpus.keep(campaign.sut, finding.bucket, row)
    print(f"{total} cases, {len(rows)} findings, {campaign.wall:.0f} s ({args.launch}); results in {args.out}")
    covered = coverage_line(json.loads((args.out / "summary.json").read_text()).get("coverage"))
    if covered:
        print(covered)
    for error in campaign.harness_errors[:5] if campaign.fatal is None else ():  # else: one line, from main
        print(f"harness error (a bug of the harness, not a finding): {error}", file=sys.stderr)
    print("\n".join(buckets_table({"buckets": buckets(campaign, rows)})))
    if campaign.fatal is not None:
        raise campaign.fatal
    return 1 if rows or (args.fail_on_known and campaign.known) else 0


def _fleet(args: argparse.Namespace) -> int:
    """A night of shards on Ray: exit 1 with a new bucket, 2 when a shard failed for good (after its retry) or the
    plan is bad; the merged report is written either way."""
    from harness.fleet.driver import print_line, run_fleet
    from harness.fleet.plan import read_plan

    if args.time <= 0:
        raise HarnessError("--time must be positive")
    plan = read_plan(args.plan, args.fixes)
    summary = run_fleet(plan, args.time, args.out, args.address, args.corpus, on_event=print_line)
    fleet = summary["fleet"]
    print(f"{len(summary['shards'])} shard runs, {sum(summary['cases_run'].values())} cases, {fleet['wall_s']} s; "
          f"fleet overhead {fleet['overhead_s']} s (seconds with no shard running); results in {args.out}")
    if coverage_line(summary.get("coverage")):
        print(coverage_line(summary.get("coverage")))
    print("\n".join(buckets_table(summary)))
    failed = [s["id"] for s in summary["shards"] if s["status"] != "ok"]
    if failed:
        raise HarnessError(f"fleet: shard(s) {', '.join(failed)} failed after {plan.retries + 1} attempt(s); "
                           f"see {args.out / 'report.md'}")
    return 1 if any(b["status"].startswith("new") for b in summary["buckets"]) else 0


def _repro_of(path: Path, launch: str, until: float | None = None) -> dict:
    """The standalone repro of one new finding, beside the findings (simplified, then verified in fresh processes
    where its world fits real ranks here); its folder and verification go into the finding file and its row. Past
    ``until`` (the time ``--time`` promised) it is left for the user, with the command that writes it."""
    from harness.judging.fidelity import REAL_MAX
    from harness.repro import make_repro

    if until is not None and time.monotonic() > until:
        command = f"ckpt-harness repro {path} --out {path.parent.parent / 'repro' / path.stem}"
        print(f"{path.name}: no standalone repro yet (--time is spent): {command}", file=sys.stderr)
        return {"standalone_verified": False, "repro_deferred": command}
    try:
        summary = make_repro(path, path.parent.parent / "repro" / path.stem,
                             launch="virtual" if launch == "virtual" else "fresh", verify_max_ranks=REAL_MAX)
    except Exception as exc:  # the harness's failure, never the finding's: the campaign's results are still written
        why = error_line(exc)
        print(f"{path.name}: no standalone repro: the harness failed writing it ({why})", file=sys.stderr)
        return {"standalone_verified": False, "repro_error": why}
    print(f"{path.name}: " + (f"no standalone repro ({summary['unsupported']})" if "unsupported" in summary else
                              f"standalone repro standalone_verified={str(summary['standalone_verified']).lower()}"),
          file=sys.stderr)
    return {"repro": f"repro/{path.stem}", "standalone_verified": summary["standalone_verified"]}


def _read_case(path: Path):
    """A case file, its fault checked too (a bad fault is bad input, named in one line: reading the case parses
    it, and a fault must hit an op that runs on the ranks), and a case its SUT cannot run at all refused."""
    case, finding = read_case_file(path)
    if case.fault is not None:
        op = case.fault.op
        if case.ops[op].kind not in ("save", "load", "rotate"):
            raise HarnessError(f"{path}: bad fault: op {op} is a {case.ops[op].kind!r}; a fault hits a save, "
                               "a load or a rotation, which run on the ranks")
    refused = adapter_class(case.sut).refuses(case)
    if refused:
        raise HarnessError(f"{path}: {case.sut} cannot run this case: {refused}")
    return case, finding


def _replay(args: argparse.Namespace) -> int:
    if args.case.is_dir():
        return _check_repro(args.case, args.with_fix)
    if args.with_fix:
        raise HarnessError(f"{args.case}: --with-fix runs a repro folder (one written by `ckpt-harness repro`); for a "
                           "case file use --fixes")
    case, finding = _read_case(args.case)
    if args.fixes is None:  # a finding shown only behind known bugs' fixes replays behind them
        args.fixes = ",".join(finding.get("needs_fixes") or ()) or "none"
    judge_case = Judge(_runners(args, case.sut))
    try:
        judgement, outcome = judge_case(case)
        shims = outcome.shims
    finally:
        judge_case.close()
    fixes = judge_case.runners.fixes
    print(f"{case.property} on {case.sut}: {judgement.verdict.value}"
          + (f" (shims: {', '.join(shims)})" if shims else "") + (f" (fixes: {', '.join(fixes)})" if fixes else ""))
    for line in judgement.details:
        print(f"  {line}")
    return 0 if judgement.ok else 1


def _repro(args: argparse.Namespace) -> int:
    """Write the repro; exit 0 when it was verified standalone (or not asked to be), 1 when not."""
    from harness.repro import make_repro

    _read_case(args.case)  # a malformed file is the user's error, said in one line
    if args.candidate_only:
        return _refresh_candidate(args)
    needs = None if args.fixes is None else _repro_fixes(args.fixes)
    summary = make_repro(args.case, args.out, simplify_first=args.simplify, verify=args.verify, needs=needs)
    if "unsupported" in summary:
        print(f"{args.case}: no standalone script: the case uses {summary['unsupported']}; wrote {args.out}/REPORT.md")
        return 1
    kept = f" (simplified: {'; '.join(summary['simplified'])})" if summary.get("simplified") else ""
    state = ("not run" if not args.verify else
             f"standalone_verified: {str(summary['standalone_verified']).lower()} ({summary.get('how')})")
    print(f"{args.out}: repro.py, run.sh, REPORT.md{kept}; {state}")
    return 0 if summary["standalone_verified"] or not args.verify else 1


def _repro_fixes(spec: str) -> tuple[str, ...]:
    """``repro --fixes`` as fix ids (with what they require); "all" would hide the bug the script is for."""
    if spec == "all":
        raise HarnessError("repro --fixes takes none or fix ids: with every fix the script would show no known bug")
    return resolve(spec)


def _refresh_candidate(args: argparse.Namespace) -> int:
    """Exit 0 when the repro has a candidate fix and runs clean with it (or was not asked to run), 1 when not."""
    from harness.repro import refresh_candidate

    try:
        summary = refresh_candidate(args.case, args.out, verify=args.verify)
    except (FileNotFoundError, ValueError) as exc:
        raise HarnessError(str(exc)) from None
    fix = summary.get("fix")
    if not fix:
        print(f"{args.case}: no known fix covers it; {args.out}/REPORT.md says none")
        return 1
    ran = fix.get("with_fix")
    state = "not run" if ran is None else f"run.sh --with-fix: {ran['how']} (exit {ran['status']})"
    print(f"{args.out}: candidate fix {', '.join(fix['ids'])}; {state}")
    return 0 if ran is None or ran["passed"] else 1


def _check_repro(folder: Path, with_fix: bool = False) -> int:
    from harness.repro import check_fix, check_repro

    try:
        result = check_fix(folder) if with_fix else check_repro(folder)
    except FileNotFoundError as exc:
        raise HarnessError(str(exc)) from None
    if with_fix:
        print(f"{folder}: with its candidate fix: {result.how} (exit {result.status})")
        for line in result.output.splitlines():
            if line.startswith(("BUG", "EXPECTED", "ACTUAL", "STALE FIX")):
                print(f"  {line}")
        return 0 if result.shown else 1
    print(f"{folder}: {'reproduces' if result.shown else 'does not reproduce'} standalone ({result.how}, exit "
          f"{result.status})")
    for line in result.output.splitlines():
        if line.startswith(("BUG", "EXPECTED", "ACTUAL")):
            print(f"  {line}")
    return 1 if result.shown else 0


def _crashpoints(args: argparse.Namespace) -> int:
    from faults import strace
    from harness.judging.fault_runs import as_fault_case, crashpoints, crashstates
    from harness.report.crash import point_progress, print_points, print_states, traced_map, write_crash_report

    if not strace.available():
        raise HarnessError("crashpoints: strace is missing or ptrace is not permitted here (apt-get install strace); "
                           "use `fuzz --faults`, whose kill-when faults need only psutil")
    if args.exhaustive:
        return _explore(args)
    if args.case is None:
        raise HarnessError("crashpoints: give a case file, or --exhaustive --sut NAME")
    case, _ = _read_case(args.case)
    cls = adapter_class(case.sut)
    if args.use_async and "async" not in cls.capabilities:
        raise HarnessError(f"crashpoints --async: {case.sut} does not claim async saves")
    try:
        case = as_fault_case(case, latest=has_latest(cls.capabilities, case.options), use_async=args.use_async,
                             op=args.op)
    except ValueError as exc:
        raise HarnessError(f"crashpoints: {exc}") from None
    judge_case = Judge(_runners(args, case.sut))
    traced: list = []
    start = time.perf_counter()
    try:
        if args.states:
            results, n_ops = crashstates(case, judge_case.runners, limit=args.limit, confirm=judge_case,
                                         on_traced=lambda t: traced.append(traced_map(t, case.sut, args.out)))
            code, lines = print_states(results, n_ops)
        else:
            results = crashpoints(case, judge_case, sample=args.limit, on_result=point_progress,
                                  on_traced=lambda t: traced.append(traced_map(t, case.sut, args.out)))
            code, lines = print_points(results)
    finally:
        judge_case.close()
    if args.out is not None:
        write_crash_report(args.out, case, args.case, args.states, args.launch, results, traced, lines,
                           time.perf_counter() - start)
    return code


def _explore(args: argparse.Namespace) -> int:
    """``crashpoints --exhaustive``: explore every shape, print shape -> judged / total / failing, write findings."""
    from harness.campaign.explore import explore, shapes
    from harness.report.crash import print_exploration, shape_progress

    if args.sut is None:
        raise HarnessError("crashpoints --exhaustive needs --sut")
    if args.max_len < 1 or args.ranks < 1:
        raise HarnessError("--max-len and --ranks must be at least 1")
    cls = adapter_class(args.sut)
    options = _options(args)
    only = args.shapes
    if only:
        valid = set(shapes(cls.capabilities, max(len(s) for s in only)))
        bad = [s for s in only if s not in valid]
        if bad:
            raise HarnessError(f"--shape {bad}: not shapes of {args.sut} (S first, then S, R"
                               f"{', T' if 'rotate' in cls.capabilities else ''})")
    judge_case = Judge(_runners(args, args.sut), exploring=True)
    start = time.perf_counter()
    try:
        reports = explore(args.sut, judge_case.runners, args.ranks, args.max_len, judge_case, options=options,
                          only=only, confirm_limit=args.confirm, points=args.only != "states",
                          states=args.only != "points" and args.errno is None, errno=args.errno,
                          on_result=shape_progress if args.verbose or sys.stderr.isatty() else None)
    finally:
        judge_case.close()
    wall = time.perf_counter() - start
    return print_exploration(reports, wall, args.sut, args.ranks, args.max_len, args.launch, args.out)


def _options(args: argparse.Namespace) -> dict:
    """``--option KEY=JSON`` (a bare KEY is true) as a case's options."""
    options = {}
    for item in args.options:
        key, sep, value = item.partition("=")
        try:
            options[key] = json.loads(value) if sep else True
        except json.JSONDecodeError as exc:
            raise HarnessError(f"--option {item}: the value is not JSON ({exc})") from None
    return options


def _and(ids: list[str]) -> str:
    return ", ".join(ids[:-1]) + f" and {ids[-1]}" if len(ids) > 1 else "".join(ids)


def _faults_note() -> str:
    """Which properties need --faults, and which others it widens (the registry says)."""
    crashing = [p for p, spec in catalogue.REGISTRY.items() if spec.crashes_with_faults]
    also = f", which also lets {_and(crashing)} crash a save" if crashing else ""
    return f"({_and(list(catalogue.FAULT_PROPERTIES))} run with --faults{also})"


def _list(args: argparse.Namespace) -> int:
    print("SUTs:")
    for name in sorted(REGISTRY):
        try:
            cls, state = adapter_class(name), "importable"
        except UnknownSut as exc:
            cls, state = None, f"unavailable: {exc}"
        caps = ", ".join(sorted(getattr(cls, "capabilities", ()))) if cls else ""
        print(f"  {name:<12} {state}  {caps}")
    print("Properties:")
    for pid, spec in catalogue.REGISTRY.items():
        print(f"  {pid:<18} {spec.description}")
    print(f"  {_faults_note()}")
    from faults import strace

    ptrace = strace.available()
    print("Faults (`fuzz --faults`, `crashpoints`; kinds in a case's \"fault\", see docs/faults.md):")
    state = "available" if ptrace else "unavailable here: no strace or no ptrace"
    print(f"  kill, error   SIGKILL / ENOSPC / EIO / EDQUOT at the k-th syscall on a path, strace attached ({state})")
    print(f"  state         power-loss crash states of a save's recorded IO ({state})")
    print("  kill-when     psutil fallback: kill a rank (or its writer) when a file appears / after N bytes / a delay")
    print("  stall         SIGSTOP a rank for a while (a straggler)")
    print("  fsize         RLIMIT_FSIZE on the ranks (writes past it fail with EFBIG)")
    print("  corrupt       bit flip, truncate, append garbage, delete, stale marker, zero range (seeded, replayable)")
    print("Fixes (`--fixes`; harness/fixes/, each a known bug's patch in upstream terms):")
    for fix_id, fix in FIXES.items():
        print(f"  {fix_id:<40} {fix.kind:<10} {fix.framework} {fix.version}: {fix.summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
