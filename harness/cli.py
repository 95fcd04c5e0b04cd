"""``ckpt-harness``: fuzz, replay and list (DESIGN.md §8, a contract). Exit codes: 0 clean, 1 findings or a
reproduced failure, 2 harness error (one line on stderr saying what is wrong and what to do)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from properties.case import Case, CaseError
from properties.case_strategies import IN_PROCESS_PROPERTIES
from properties.catalogue import PROPERTIES

from .fuzz import Campaign, default_seed, findings_table, fuzz, run_case, write_results
from .sut import REGISTRY, UnknownSut, framework_available, resolve


class HarnessError(Exception):
    """Bad input to the harness itself; reported as one line, exit status 2."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ckpt-harness", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    f = sub.add_parser("fuzz", help="fuzz a system under test for a fixed time")
    f.add_argument("--sut", required=True, help="SUT name (see `list`) or package.module:ClassName")
    f.add_argument("--ranks", type=int, default=2, help="world size of saves (default 2)")
    f.add_argument("--time", type=float, required=True, help="seconds to fuzz (shrinking may add a little)")
    f.add_argument("--out", type=Path, required=True, help="output directory (findings/, summary.json, report.md)")
    f.add_argument("--property", action="append", dest="properties", metavar="ID", help="restrict to property IDs")
    f.add_argument("--faults", action="store_true", help="turn the fault layer on")
    f.add_argument("--seed", type=int, default=None, help="campaign seed (default: random, recorded in summary)")
    r = sub.add_parser("replay", help="re-run one case or finding file; exit 1 if the failure reproduces")
    r.add_argument("case", type=Path)
    sub.add_parser("list", help="SUTs, properties and faults")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return {"fuzz": _fuzz, "replay": _replay, "list": _list}[args.command](args)
    except (HarnessError, UnknownSut, CaseError) as exc:
        print(f"ckpt-harness: error: {exc}", file=sys.stderr)
        return 2


def _adapter(name: str):
    cls = resolve(name)
    caps = getattr(cls, "capabilities", frozenset())
    if "in_process_world" not in caps:
        raise HarnessError(
            f"SUT {name!r} needs real multi-rank launches, which this version of the harness does not provide yet"
        )
    return cls()


def _fuzz(args: argparse.Namespace) -> int:
    props = args.properties or list(IN_PROCESS_PROPERTIES)
    unknown = [p for p in props if p not in PROPERTIES]
    if unknown:
        raise HarnessError(f"unknown property IDs {unknown}; see `ckpt-harness list`")
    unsupported = [p for p in props if p not in IN_PROCESS_PROPERTIES]
    if unsupported:
        raise HarnessError(
            f"properties {unsupported} are not implemented yet; implemented: {list(IN_PROCESS_PROPERTIES)}"
        )
    if args.faults:
        raise HarnessError("--faults: the fault layer is not available in this version yet")
    if args.ranks < 1 or args.time <= 0:
        raise HarnessError("--ranks must be at least 1 and --time positive")
    adapter = _adapter(args.sut)
    campaign = Campaign(args.sut, args.ranks, props, args.time, args.seed if args.seed is not None else default_seed())
    try:
        fuzz(adapter, campaign, progress=sys.stderr.isatty())
    finally:
        adapter.close()
    args.out.mkdir(parents=True, exist_ok=True)
    write_results(campaign, args.out)
    rows = [json.loads(p.read_text()) for p in sorted((args.out / "findings").glob("*.json"))]
    total = sum(campaign.cases_run.values())
    print(f"{total} cases, {len(rows)} findings, {campaign.wall:.0f} s; results in {args.out}")
    print("\n".join(findings_table(rows)))
    return 1 if rows else 0


def _replay(args: argparse.Namespace) -> int:
    try:
        data = json.loads(args.case.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CaseError(f"{args.case}: no such case file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CaseError(f"{args.case}: not a JSON case file ({exc})") from None
    raw = data.get("case", data) if isinstance(data, dict) else data
    case = Case.from_json(raw, str(args.case))
    adapter = _adapter(case.sut)
    try:
        judgement, _ = run_case(case, adapter)
    finally:
        adapter.close()
    print(f"{case.property} on {case.sut}: {judgement.verdict.value}")
    for line in judgement.details:
        print(f"  {line}")
    return 0 if judgement.ok else 1


def _list(args: argparse.Namespace) -> int:
    print("SUTs:")
    for name, info in sorted(REGISTRY.items()):
        cls = resolve(name) if framework_available(info) else None
        caps = ", ".join(sorted(getattr(cls, "capabilities", ()))) if cls else "-"
        state = "importable" if cls else f"needs {info.framework}"
        print(f"  {name:<12} {state:<12} {caps}")
    print("Properties:")
    for pid, text in PROPERTIES.items():
        mark = "*" if pid in IN_PROCESS_PROPERTIES else " "
        print(f"  {mark} {pid:<18} {text}")
    print("  (* = implemented in this version)")
    print("Faults: none in this version")
    return 0


if __name__ == "__main__":
    sys.exit(main())
