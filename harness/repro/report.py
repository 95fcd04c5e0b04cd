"""REPORT.md: a bug report draft a maintainer can paste — title, versions, steps, expected, actual, the repro, and
the likely cause where the finding knows it."""

from __future__ import annotations

import platform
import re
from importlib import metadata
from pathlib import Path

from harness.repro.candidate import KIND_MEANS

DISTRIBUTIONS = {"paddle-dcp": ("paddlepaddle",), "paddle-save": ("paddlepaddle",),
                 "torch-dcp": ("torch",), "paddleformers-uc": ("paddleformers", "paddlepaddle")}


def versions(sut: str) -> str:
    found = []
    for dist in DISTRIBUTIONS.get(sut, ()):
        try:
            found.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            found.append(f"{dist} (not installed where this report was written)")
    found += [f"Python {platform.python_version()}", f"{platform.system()} {platform.release()} ({platform.machine()})",
              "device: CPU (gloo)"]
    return ", ".join(found)


def report_md(summary: dict, finding: dict, diff: str = "") -> str:
    """The report; ``diff``: the candidate fix's patch (fix.diff), shown under "Candidate fix"."""
    stem = Path(summary["source"]).stem
    title = f"[{summary['sut']}] {finding.get('property', '')} {summary.get('verdict', '')}: {stem}"
    cause = finding.get("note") or finding.get("why") or ""
    lines = [f"# {title}", "", f"**Versions:** {versions(summary['sut'])}", ""]
    if "unsupported" in summary:
        lines += ["**No standalone repro:** the case uses " + summary["unsupported"] + ". Replay it with the harness:",
                  "", f"    ckpt-harness replay {summary['source']}", ""]
    else:
        verified = "yes" if summary.get("standalone_verified") else "no"
        lines += [f"**Standalone verified:** {verified} (run in fresh processes: {summary.get('how', 'not run')}, "
                  f"exit status {summary.get('status', '-')})", "",
                  "## What the user does", "", _steps(summary.get("launches", [])), "",
                  "## What they expect", "",
                  "Every step succeeds and every load gives back, bit for bit, the tensors that were saved.", "",
                  "## What happens", "", "```", summary.get("output", "(not run)"), "```", "",
                  "## Reproduce", "", f"`bash run.sh` ({summary.get('ranks', 1)} process(es) at most; CPU is enough). "
                  "It exits 1 and prints BUG / EXPECTED / ACTUAL while the bug is there, 0 once it is fixed.", ""]
        if summary.get("simplified"):
            lines += ["Simplified from the harness's case (each kept only while the failure stayed): "
                      + "; ".join(summary["simplified"]) + ".", ""]
    if summary.get("needs_fixes"):
        ids = ", ".join(f"`{i}`" for i in summary["needs_fixes"])
        lines += ["## Shows only behind known bugs' fixes", "",
                  f"On stock code this run stops at a known bug first. The repro applies those bugs' fixes ({ids}: "
                  "`needs.py`, in every process; `needs.diff` as a patch) before its first step. So this is a bug "
                  "they unmask, or a bug of theirs: read `needs.diff` first.", ""]
    if cause:
        lines += ["## Likely cause", "", _with_sources(cause), ""]
    if summary.get("fix"):
        lines += _candidate(summary["fix"], diff)
    return "\n".join(lines)


def _candidate(fix: dict, diff: str) -> list[str]:
    """The fix the harness proved on this bug: what it is, what else it resolves, and whether the repro passes with
    it; then the patch."""
    lines = ["## Candidate fix", ""]
    if "error" in fix:
        return [*lines, f"Known fix {', '.join(fix['ids'])}, not rendered where this report was written: "
                f"{fix['error']}.", ""]
    own = fix.get("own") or fix["ids"]
    for fix_id in fix["ids"]:
        role = ("" if fix_id in own else
                " (another known bug's fix: with the own fix alone this run meets that bug on its way)"
                if fix_id in fix.get("companions", ()) else
                " (needed first: without it the fixed code meets another known bug)")
        lines.append(f"- `{fix_id}`{role}: {KIND_MEANS[fix['kinds'][fix_id]]}. {fix['summaries'][fix_id]}.")
    lines.append("")
    if fix.get("resolves"):
        lines += ["The same change also resolves: " + ", ".join(f"`{s}`" for s in fix["resolves"]) + ".", ""]
    checked = fix.get("with_fix")
    shown = ("not run" if checked is None else "exits 0" if checked["passed"]
             else f"does not pass ({checked['how']}, exit status {checked['status']})")
    run = (f"`fix.py` applies it in a process; `bash run.sh --with-fix` is not offered here: {fix['with_fix_not_run']}."
           if "with_fix_not_run" in fix else
           f"`bash run.sh --with-fix` applies it (`fix.py`) in every process of the run: it {shown} with the fix, "
           "while plain `bash run.sh` shows the bug.")
    lines += [f"Written against {', '.join(fix['written_against'])}. {run} `fix.diff` is the same change as a patch "
              "of the framework's source:", "", "```diff", diff.rstrip("\n"), "```", ""]
    alone = fix.get("alone")
    if alone and alone.get("output"):
        own_ids = ", ".join(f"`{i}`" for i in own)
        lines += [f"With its own fix ({own_ids}) alone the run met another known bug on its way, and printed:", "",
                  "```", alone["output"], "```", ""]
    if checked and not checked["passed"] and checked.get("output"):
        lines += ["With the fix, the run printed:", "", "```", checked["output"], "```", ""]
    return lines


def _steps(launches: list) -> str:
    """The script's named steps, in order, as a list under the launches that run them."""
    head = f"{len(launches)} launch(es) of fresh processes" + (
        " (" + ", ".join(f"{n} process(es)" for n, _ in launches) + ")" if launches else "")
    return head + ":\n\n" + "\n".join(f"1. {label}" for _, labels in launches for label in labels)


def _with_sources(text: str) -> str:
    """The finding's note, with framework file names set as code so a reader can grep for them."""
    return re.sub(r"(?<![`\w])([\w/]+\.(?:py|cc|h)(?::\d+)?)", r"`\1`", text)
