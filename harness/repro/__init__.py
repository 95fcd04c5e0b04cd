"""Upstream-ready reproductions: a finding as ``repro.py`` + ``run.sh`` + ``REPORT.md`` that a framework maintainer
runs without the harness (issue 17; docs/design.md §17).

The order is syzkaller's: simplify the case one choice at a time while the harness still sees the same failure
(``simplify``), write the script from the simplified case (``scripted_case`` -> ``render``), then run the script in
fresh processes and record whether it showed the bug (``verify``) — in ``repro.json`` beside it and in the finding.
Imports harness.judging and below: the judge simplifies, the runners run the case.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
import sysconfig
import time
from pathlib import Path

from harness.fixes import covering
from harness.repro.candidate import SCRIPTED_LOSS, write_candidate, write_needs
from harness.repro.companions import fewest
from harness.repro.render import FAULT_CALL_GONE, FAULT_HIT, WITH_FIX, WITH_FIX_ARG, emitter, repro_py, run_sh
from harness.repro.report import report_md
from harness.repro.scripted_case import ReproUnsupported, check_supported, script_case
from harness.repro.simplify import judged, simplify
from harness.repro.verify import Verification, judge_fixed_run, judge_run, run_repro
from properties.model.case import Case, Op, read_case_file

__all__ = ["ReproUnsupported", "check_fix", "check_repro", "make_repro", "refresh_candidate"]



def make_repro(path: Path, out: Path, *, simplify_first: bool = True, verify: bool = True,
               update_finding: bool = True, launch: str | None = None, verify_max_ranks: int | None = None,
               needs: tuple[str, ...] | None = None) -> dict:
    """Write ``out``/{repro.py, run.sh, REPORT.md, repro.json} for the finding or case at ``path``; the summary is
    returned and, for a finding file, ``repro`` and ``standalone_verified`` are written into it. ``launch``: how the
    harness judges the case while simplifying (default: the finding's own, else fresh ranks; a virtual campaign's
    findings are judged on virtual ranks); ``verify_max_ranks``: a script needing more processes is written but not
    run (a campaign on a small machine leaves that to ``ckpt-harness repro``); ``needs``: the known bugs' fixes the
    script applies first (default: the finding's ``needs_fixes``; () for stock code)."""
    case, finding = read_case_file(path)
    launch = launch or finding.get("launch", "fresh")
    verdict = finding.get("verdict", "")
    ways = sorted({w["verdict"] for w in finding.get("or", []) if w.get("verdict")} - {verdict})  # racy: its others
    out.mkdir(parents=True, exist_ok=True)
    summary: dict = {"source": _shown_path(path), "sut": case.sut, "verdict": verdict, "standalone_verified": False}
    kept: list[str] = []
    needs = write_needs(out, finding.get("needs_fixes") or () if needs is None else needs, _title(path, finding, case))
    if needs:
        summary["needs_fixes"] = list(needs)
    fix = write_candidate(out, path.stem, _title(path, finding, case), needs=needs)
    if fix:
        summary["fix"] = fix
        if _scripted_loss(case):
            fix["with_fix_not_run"] = SCRIPTED_LOSS
        fix = None if "error" in fix or "with_fix_not_run" in fix else fix
    try:
        emitter(case.sut, case.training is not None)  # a SUT without scripts, or a case no script can show, is
        # said before any launch
        check_supported(case)
        if simplify_first and verdict:
            case, kept, tried = simplify(case, finding, launch, fixes=needs)
            summary["simplifications_tried"] = tried
        summary["simplified"] = kept
        judgement, outcome = judged(case, launch, needs)
        op = reported_op(judgement.details, _expected_words(finding, judgement.verdict.value))
        failed = frozenset(r.index for r in outcome.records if not r.ok and op is not None and r.index < op)
        summary.update(step=op, harness_verdict=judgement.verdict.value, **({"ways": ways} if ways else {}))
        corruptions = {r.index: r.applied for r in outcome.records if r.kind == "corrupt" and r.applied}
        # a racy finding may show another way at a later op: its script runs every op
        scripted = script_case(case, reference_failures(case), upto=None if ways else op, tolerated=failed,
                         corruptions=corruptions)
        title = _title(path, finding, case)
        source = f"ckpt-harness finding {path.name}"
        (out / "repro.py").write_text(repro_py(scripted, title, source, with_fix=bool(fix), needs=bool(needs)),
                                      encoding="utf-8")
        (out / "run.sh").write_text(run_sh(scripted, with_fix=bool(fix)), encoding="utf-8")
        os.chmod(out / "run.sh", 0o755)
        summary.update(phases=len(scripted.phases), ranks=scripted.max_world, case=case.to_json(),
                       launches=[[phase.world, [step.label for step in phase.steps]] for phase in scripted.phases])
        too_big = verify_max_ranks is not None and scripted.max_world > verify_max_ranks
        if too_big:
            summary["how"] = f"not run: {scripted.max_world} processes (more than {verify_max_ranks} here)"
        result = check_repro(out, verdict, op, ways) if verify and not too_big else None
    except ReproUnsupported as exc:
        summary["unsupported"] = str(exc)
        result = None
        for name in ("repro.py", "run.sh"):
            (out / name).unlink(missing_ok=True)
    if result is not None:
        summary.update(result.to_json())
        summary["output"] = portable(_excerpt(result.output))
        if fix:
            summary["fix"] = fix = _with_fix(out, path.stem, _title(path, finding, case), fix, needs)
    (out / "repro.json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    diff = (out / "fix.diff").read_text(encoding="utf-8") if fix else ""
    (out / "REPORT.md").write_text(report_md(summary, finding, diff), encoding="utf-8")
    if update_finding and finding:
        finding["repro"] = os.path.relpath(out, path.parent)
        finding["standalone_verified"] = summary["standalone_verified"]
        path.write_text(json.dumps(finding, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return summary


def check_repro(folder: Path, verdict: str | None = None, step: int | None = None,
                ways: list[str] | None = None) -> Verification:
    """Run an existing repro folder in fresh processes and judge it against its verdict, the step where the
    failure must show and a racy finding's other ways (all from repro.json unless given)."""
    meta = json.loads((folder / "repro.json").read_text(encoding="utf-8")) if (folder / "repro.json").is_file() else {}
    if not (folder / "run.sh").is_file():
        raise FileNotFoundError(f"{folder}: no run.sh (not a repro folder, or the finding has no standalone repro: "
                                f"{meta.get('unsupported', 'never written')})")
    status, output = run_repro(folder, int(meta.get("phases", 1)))
    return judge_run(status, output, verdict or meta.get("verdict", ""), step if step is not None else meta.get("step"),
                     meta.get("ways", ()) if ways is None else ways)


def refresh_candidate(path: Path, out: Path, verify: bool = True) -> dict:
    """Give the existing repro folder ``out`` of the finding or case at ``path`` today's candidate fix (fix.py,
    fix.diff, run.sh --with-fix, REPORT.md's section), run with it unless not ``verify``, without simplifying or
    re-verifying the bug itself: for repros written before their bug's fix was. Not run, the same fix keeps what its
    last run showed. The updated repro.json is returned."""
    case, finding = read_case_file(path)
    if not (out / "repro.json").is_file():
        raise FileNotFoundError(f"{out}: no repro.json (write the repro first: ckpt-harness repro)")
    summary = json.loads((out / "repro.json").read_text(encoding="utf-8"))
    before = summary.pop("fix", None) or {}
    needs = tuple(summary.get("needs_fixes") or ())
    fix = write_candidate(out, path.stem, _title(path, finding, case), needs=needs)
    if fix and _scripted_loss(case):
        fix["with_fix_not_run"] = SCRIPTED_LOSS
        _remove(out / "repro.py", WITH_FIX)
        _remove(out / "run.sh", WITH_FIX_ARG)
    elif fix and "error" not in fix and (out / "run.sh").is_file():
        _insert_once(out / "repro.py", "from collections import namedtuple\n", WITH_FIX)
        _insert_once(out / "run.sh", 'cd "$(dirname "$0")"\n', WITH_FIX_ARG)
        if FAULT_HIT in (out / "run.sh").read_text(encoding="utf-8"):
            _insert_once(out / "run.sh", FAULT_HIT, FAULT_CALL_GONE)
        if verify:
            fix = _with_fix(out, path.stem, _title(path, finding, case), fix, needs)
        elif before.get("ids") == fix["ids"] and "with_fix" in before:  # the same fix: what its run showed stands
            fix["with_fix"] = before["with_fix"]
    if fix:
        summary["fix"] = fix
    (out / "repro.json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    diff = (out / "fix.diff").read_text(encoding="utf-8") if fix and "error" not in fix else ""
    (out / "REPORT.md").write_text(report_md(summary, finding, diff), encoding="utf-8")
    return summary


def _with_fix(out: Path, stem: str, title: str, fix: dict, needs: tuple[str, ...] = ()) -> dict:
    """``fix`` with what ``run.sh --with-fix`` did, for repro.json and REPORT.md. Where the own fix alone does not
    pass, the fewest other known bugs' fixes that make the run pass join it (fix.py is rewritten with them), and
    what the run printed with the own fix alone is kept."""
    started = time.monotonic()
    fixed = check_fix(out)
    if fixed.shown or fixed.how != "failed":  # a hang or a stale fix is no other bug met on the way
        return {**fix, "with_fix": _ran(fixed)}
    runs: dict[tuple[str, ...], Verification] = {}
    bound = COMPANION_RUNS_S * (time.monotonic() - started)

    def passes(ids: tuple[str, ...]) -> bool:
        if time.monotonic() - started > bound:
            raise TimeoutError  # out of time: the smallest set that passed so far stands
        write_candidate(out, stem, title, tuple(i for i in ids if i not in covering(stem)), needs)
        runs[ids] = check_fix(out)
        return runs[ids].shown

    try:
        companions = fewest(stem, passes)
    except TimeoutError:
        passed = [ids for ids, run in runs.items() if run.shown]
        companions = tuple(i for i in min(passed, key=len) if i not in covering(stem)) if passed else None
    if companions is None:
        write_candidate(out, stem, title, needs=needs)
        return {**fix, "with_fix": _ran(fixed)}
    final = write_candidate(out, stem, title, companions, needs) or fix
    return {**final, "alone": _ran(fixed), "with_fix": _ran(runs[tuple(final["ids"])])}


COMPANION_RUNS_S = 12  # the search for companion fixes may take this many times the own fix's run


def _ran(fixed: Verification) -> dict:
    ran = {"passed": fixed.shown, "how": fixed.how, "status": fixed.status}
    return ran if fixed.shown else {**ran, "output": portable(_excerpt(fixed.output))}


def _scripted_loss(case: Case) -> bool:
    """The case's fault is a power-loss state, which its script makes itself (SCRIPTED_LOSS)."""
    return case.fault is not None and case.fault.kind == "state"


def _remove(path: Path, text: str) -> None:
    if path.is_file():
        path.write_text(path.read_text(encoding="utf-8").replace(text, ""), encoding="utf-8")


def _insert_once(path: Path, after: str, text: str) -> None:
    """``text`` after the first ``after`` line of a written script, unless it is there already."""
    body = path.read_text(encoding="utf-8")
    if text not in body:
        if after not in body:
            raise ValueError(f"{path}: no {after.strip()!r} line to put the fix's hook after (not a written repro?)")
        path.write_text(body.replace(after, after + text, 1), encoding="utf-8")


def check_fix(folder: Path) -> Verification:
    """Run an existing repro folder with its candidate fix (``bash run.sh --with-fix``, fresh processes): shown when
    every launch exits 0."""
    if not (folder / "fix.py").is_file():
        raise FileNotFoundError(f"{folder}: no fix.py (no known fix covers this finding)")
    meta = json.loads((folder / "repro.json").read_text(encoding="utf-8")) if (folder / "repro.json").is_file() else {}
    return judge_fixed_run(*run_repro(folder, int(meta.get("phases", 1)), with_fix=True))


def reported_op(details: tuple[str, ...] | list[str], words: str = "") -> int | None:
    """The op a judgement reports the finding at ("op 3 (load step-0): ..."): on the first line with the finding's
    own words (an earlier line may be another bug the case passes through), else the first that names an op."""
    lines = [line for line in details if words and words in line] + list(details)
    for line in lines:
        found = re.search(r"\bop (\d+) \(", line)
        if found:
            return int(found.group(1))
    return None


def _expected_words(finding: dict, verdict: str) -> str:
    way = next((w for w in (finding, *finding.get("or", [])) if w.get("verdict") == verdict), finding)
    return way.get("expect", "")


def reference_failures(case: Case) -> frozenset[int]:
    """Indices of ops the reference engine fails too (a load of a name never saved): there an error is right. The
    reference runs the case undamaged (no fault, a ``corrupt`` op kept only as a place): after damage, what is right
    is the data or an error, and the script's tolerance of earlier failures covers the error."""
    from harness.judging.run import run_case
    from harness.ranks.runners import Runners

    ops = tuple(Op("wait") if op.kind == "corrupt" else op for op in case.ops)
    runners = Runners("reference", mode="in-process")
    try:
        outcome = run_case(dataclasses.replace(case, sut="reference", fault=None, ops=ops), runners)
    finally:
        runners.close()
    return frozenset(r.index for r in outcome.records if not r.ok)


def _title(path: Path, finding: dict, case: Case) -> str:
    note = (finding.get("note") or finding.get("expect") or "").split(". ")[0].strip()
    head = f"{case.sut}: {finding.get('verdict', 'failure')} in {finding.get('property', case.property)}"
    return f"{head} ({path.stem})" + (f"\n\n{note}." if note else "")


def _shown_path(path: Path) -> str:
    """The finding as a reader of the repro finds it: relative to the working directory when inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return path.name


def portable(text: str) -> str:
    """Output with this machine's paths made neutral: the interpreter's packages, its prefix, the home directory,
    and run.sh's temporary work directory (a report names what happened, not where it ran)."""
    for where, shown in ((sysconfig.get_paths()["purelib"], "site-packages"), (sys.prefix, "<python>"),
                         (os.path.expanduser("~"), "~")):
        text = text.replace(where, shown)
    return re.sub(r"\S*/tmp\.\w{6,}", "$WORK", text)


def _excerpt(output: str, lines: int = 30) -> str:
    """The lines that say what happened: the script's own (each once), else the last lines of the output."""
    keep = list(dict.fromkeys(ln for ln in output.splitlines() if ln.startswith(("BUG", "EXPECTED", "ACTUAL"))))
    tail = [ln for ln in output.splitlines() if ln.strip() and "Warning" not in ln and "warn(" not in ln]
    return "\n".join(keep[:lines]) if keep else "\n".join(tail[-lines:])
