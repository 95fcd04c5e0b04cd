"""What ``crashpoints`` prints and writes: the crash-point and power-loss state tables, the exploration table of
``--exhaustive``, and the files of ``--out`` (summary.json, report.md and report.html; explore.json and findings of an
exploration). The command line (harness/cli.py) runs the crashes and hands their results here."""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
import sys
from pathlib import Path

from harness.campaign.results import Finding
from harness.judging.iomap import crash_rows, place, timeline
from harness.report.summary import finding_json, write_reports


def point_progress(n: int, r) -> None:
    """One line on stderr per crash point judged (a long run reports each as it goes)."""
    print(f"point {n}: {r.fault.syscall} {r.fault.path} -> {r.judgement.verdict.value}", file=sys.stderr, flush=True)


def shape_progress(shape: str, r) -> None:
    """One line on stderr per crash point or state an exploration judged (or could not run)."""
    verdict = r.judgement.verdict.value if r.judged else f"NOT RUN ({r.error})"
    print(f"{shape} op {r.fault.op}: {r.description} -> {verdict}", file=sys.stderr, flush=True)


def traced_map(t, sut: str, out: Path | None) -> tuple[dict, list, str] | None:
    """What the crash-point map needs of the traced run, taken while it exists (only when a report is written)."""
    return (timeline(t, sut), list(t.recording.all_calls), t.root) if out is not None else None


def print_points(results: list) -> tuple[int, list[str]]:
    """The crash points table, printed; also returned (report.md of ``--out``)."""
    lines = ["| point | syscall | k | path | fired | verdict |", "|---|---|---|---|---|---|"]
    for n, r in enumerate(results):
        f = r.fault
        lines.append(f"| {n} | {f.syscall} | {f.k} | {f.path} | {'yes' if r.report.get('fired') else 'no'} | "
                     f"{r.judgement.verdict.value} |")
    bad = [(n, r) for n, r in enumerate(results) if not r.judgement.ok]
    for n, r in bad:
        lines.append(f"point {n}: {r.judgement.property} {r.judgement.verdict.value}: "
                     f"{'; '.join(r.judgement.details)}")
        lines.append(f"  fault: {json.dumps(r.fault.to_json(), sort_keys=True)}")
    lines.append(f"{len(results)} crash points, {sum(1 for r in results if r.report.get('fired'))} fired, "
                 f"{len(bad)} failing")
    print("\n".join(lines))
    return (1 if bad else 0), lines


def print_states(results: list, n_ops: int) -> tuple[int, list[str]]:
    """The power-loss states table, printed; also returned (report.md of ``--out``)."""
    lines = ["| state | verdict | confirmed in fresh processes |", "|---|---|---|"]
    for r in results:
        confirmed = "-" if r.confirmed is None else ("yes" if r.confirmed else "NO (flaky)")
        lines.append(f"| {r.description} | {r.judgement.verdict.value} | {confirmed} |")
    bad = [r for r in results if not r.judgement.ok and r.confirmed is not False]
    for r in bad:
        lines.append(f"{r.description}: {r.judgement.property} {r.judgement.verdict.value}: "
                     f"{'; '.join(r.judgement.details)}")
    lines.append(f"{len(results)} crash states from {n_ops} IO ops, {len(bad)} failing")
    print("\n".join(lines))
    return (1 if bad else 0), lines


def write_crash_report(out: Path, case, case_path: Path, states: bool, launch: str, results: list, traced: list,
                       lines: list[str], wall: float) -> None:
    """``crashpoints --out DIR``: summary.json (every point or state with its verdict, and the crash-point map),
    report.md (the table printed) and report.html (the map drawn)."""
    rows = crash_rows(results)
    io_map = place(traced[0][0], results, traced[0][1], traced[0][2]) if traced and traced[0] else None
    failing = [r for r in rows if r["verdict"] not in ("pass", None)]
    summary = {"kind": "crashpoints --states" if states else "crashpoints", "sut": case.sut,
               "case": str(case_path), "ranks": case.world_size("save"),
               "launch_mode": launch, "seed": case.seed, "wall_time_s": round(wall, 1),
               "cases_run": {case.property: sum(1 for r in rows if r["verdict"] is not None)},
               "judged": sum(1 for r in rows if r["verdict"] is not None), "total": len(rows), "failing": len(failing),
               "crash_results": rows, "io_map": io_map}
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    markdown = "\n".join([f"# ckpt-harness {summary['kind']}: {case.sut}", "", f"Case {case_path}, op "
                          f"{io_map['op'] if io_map else '-'}: {summary['judged']}/{summary['total']} judged, "
                          f"{len(failing)} failing, {summary['wall_time_s']} s.", "", *lines]) + "\n"
    write_reports(out, summary, [], markdown=markdown)


def print_exploration(reports: list, wall: float, sut: str, ranks: int, max_len: int, launch: str,
                      out: Path | None) -> int:
    """``crashpoints --exhaustive``: the shapes table and every failure, printed; with ``out``, each failing crash
    as a finding (OUT/findings/), explore.json, report.md and report.html. The exit status: 1 when any crash failed
    or could not be judged."""
    print("| shape | ops | without fault | crash points judged/total | power-loss states judged/total | "
          "judged/total | failing | unconfirmed | flaky | excused |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    rows = [r.row() for r in reports]
    for row in rows:
        print(f"| {row['shape']} | {row['ops']} | {row['control']} | {row['points']} | {row['states']} | "
              f"{row['judged']}/{row['total']} | {row['failing']} | {row['unconfirmed']} | {row['flaky']} | "
              f"{row['excused']} |")
    failing = [(rep, r) for rep in reports for r in rep.failing]
    judged, total = sum(r["judged"] for r in rows), sum(r["total"] for r in rows)
    for rep in reports:
        for error in rep.errors:
            print(f"{rep.shape}: not run: {error}")
        for r in rep.results:
            if not r.judged:
                print(f"{rep.shape} op {r.fault.op} {r.description}: not run: {r.error}")
    written = []
    if out is not None:
        (out / "findings").mkdir(parents=True, exist_ok=True)
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", sut)
        for n, (rep, r) in enumerate(failing):
            path = out / "findings" / f"{n:03d}-{rep.shape}-{r.fault.kind}-{safe}.json"
            finding = Finding(dataclasses.replace(rep.case, fault=r.fault), r.judgement, fault=r.report)
            path.write_text(json.dumps(finding_json(finding, f"ckpt-harness replay {path}"), indent=1,
                                       sort_keys=True) + "\n", encoding="utf-8")
            written.append(str(path))
        summary = {"sut": sut, "ranks": ranks, "max_len": max_len, "wall_time_s": round(wall, 1),
                   "judged": judged, "total": total, "failing": len(failing), "shapes": rows, "findings": written}
        (out / "explore.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
        write_explore_report(out, summary, reports, sut, ranks, max_len, launch)
    for (rep, r), path in itertools.zip_longest(failing, written):
        details = "; ".join(r.judgement.details)
        print(f"{rep.shape} op {r.fault.op} {r.description}: {r.judgement.verdict.value}: {details}")
        print(f"  fault: {json.dumps(r.fault.to_json(), sort_keys=True)}" + (f"  (finding: {path})" if path else ""))
    print(f"{sut}, {ranks} ranks, shapes of up to {max_len} ops: {judged}/{total} judged, "
          f"{len(failing)} failing, {wall:.0f} s")
    return 1 if failing or judged < total else 0


def write_explore_report(out: Path, explored: dict, reports: list, sut: str, ranks: int, max_len: int,
                         launch: str) -> None:
    """report.md and report.html of an exploration: the shapes table, and every crash point or state that failed
    or could not run (those that passed are counted per shape)."""
    rows = [{**row, "label": f"{rep.shape} op {r.fault.op}: {row['label']}"} for rep in reports
            for r, row in zip(rep.results, crash_rows(rep.results)) if row["verdict"] != "pass"]
    summary = {**explored, "kind": "crashpoints --exhaustive", "launch_mode": launch, "seed": None,
               "cases_run": {"shapes": len(explored["shapes"])}, "crash_results": rows}
    lines = [f"# ckpt-harness crashpoints --exhaustive: {sut}", "",
             f"{explored['judged']}/{explored['total']} judged, {explored['failing']} failing, shapes of up to "
             f"{max_len} ops on {ranks} ranks, {explored['wall_time_s']} s.", "",
             "| shape | ops | without fault | crash points | power-loss states | failing |",
             "|---|---|---|---|---|---|",
             *[f"| {r['shape']} | {r['ops']} | {r['control']} | {r['points']} | {r['states']} | {r['failing']} |"
               for r in explored["shapes"]], "", *[f"- {r['label']}: {r['verdict'] or 'not run'} {r['detail']}"
                                                    for r in rows]]
    write_reports(out, summary, [], markdown="\n".join(lines) + "\n")
