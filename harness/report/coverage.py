"""A campaign's coverage of the framework's checkpoint code, as its results keep and show it: ``coverage.json`` (the
merged recording a fleet merges and a corpus accumulates), the ``coverage`` block of ``summary.json`` (per scope,
per file, per property, what each property's turns added, and the corpus's total across nights) and the report
lines. docs/coverage.md says how to read them."""

from __future__ import annotations

import re
import shutil
from html import escape
from pathlib import Path

from harness.campaign.results import Campaign
from harness.coverage.merge import (
    Measured,
    analyse_files,
    read_figures,
    read_file,
    summarise,
    write_figures,
    write_file,
)
from harness.coverage.scope import scope_of
from harness.sut import REGISTRY, adapter_class

MERGED = "coverage.json"  # in a campaign's --out: its recording, merged
FIGURES = "coverage-figures.json"  # ... and the analysis of the files it counts against (merge.write_figures)
TIMELINE_POINTS = 60


def framework_of(sut: str) -> str | None:
    """The framework whose checkpoint code a SUT runs (None: none, as the reference engine)."""
    info = REGISTRY.get(sut)
    return info.framework if info is not None else getattr(adapter_class(sut), "framework", None)


def corpus_file(root: Path, sut: str) -> Path:
    return root / "coverage" / (re.sub(r"[^A-Za-z0-9._-]", "_", sut) + ".json")


def keep_coverage(campaign: Campaign, out: Path) -> dict | None:
    """Write the campaign's merged recording (and fold it into the corpus's), drop the processes' own files, and
    return the summary's block; None where coverage was off or the SUT runs no framework."""
    if campaign.coverage is None:
        return None
    if campaign.coverage_dir is not None:
        shutil.rmtree(campaign.coverage_dir, ignore_errors=True)
    framework = framework_of(campaign.sut)
    if framework is None:  # a SUT of no framework (the reference engine): no framework code to cover
        return None
    measured = campaign.coverage.measured
    write_file(measured, out / MERGED)
    figures = analyse_files(framework)
    write_figures(figures, out / FIGURES)
    block = summarise(measured, figures)
    block["guided"] = campaign.coverage_guided
    block["arcs"] = measured.arc_count()
    block["gain_by_property"] = {
        prop: {"new_arcs": sum(n for n, _ in turns), "turns": len(turns),
               "seconds": round(sum(s for _, s in turns), 1)}
        for prop, turns in sorted(campaign.coverage_turns.items())}
    block["timeline"] = thinned(campaign.coverage_timeline)
    if campaign.coverage_guided:
        block["guidance"] = campaign.guidance
    if campaign.corpus is not None:
        path = corpus_file(campaign.corpus.root, campaign.sut)
        total = read_file(path)
        total.merge(measured)
        write_file(total, path)
        block["corpus"] = summarise(total, figures)["scopes"]
    return block


def fleet_coverage(out: Path, shards: list[tuple[str, str]], corpus: Path | None) -> dict | None:
    """The block of a night: every shard's ``coverage.json`` (under ``out``/shards/<id>/; ``shards``: (id, SUT))
    merged, labels named by SUT where the night ran several, analysed over the code their SUTs run; with a corpus,
    its total across nights per SUT. None where no shard recorded any."""
    suts = sorted({sut for _, sut in shards})
    measured, found = Measured(), False
    for shard, sut in shards:
        path = out / "shards" / shard / MERGED
        found |= path.exists()
        for label, files in read_file(path).labels.items():
            for name, arcs in files.items():
                measured.add(label if len(suts) == 1 else f"{sut} {label}", name, arcs)
    if not found:
        return None
    figures = {}
    for framework in {framework_of(sut) for sut in suts} - {None}:
        figures.update(analyse_files(framework))
    for shard, _ in shards:  # files of a framework this environment lacks, as the shard that ran them analysed them
        for name, analysed in read_figures(out / "shards" / shard / FIGURES).items():
            figures.setdefault(name, analysed)
    block = summarise(measured, figures)
    block["arcs"] = measured.arc_count()
    if corpus is not None:
        block["corpus"] = {}
        for sut in suts:
            total = read_file(corpus_file(corpus, sut))
            block["corpus"].update({(scope if len(suts) == 1 else f"{sut} {scope}"): t
                                    for scope, t in summarise(total, figures)["scopes"].items()})
    return block


def thinned(timeline: list[tuple[float, int]], points: int = TIMELINE_POINTS) -> list[list[float]]:
    """At most ``points`` of (seconds, arcs), the first and last kept."""
    if len(timeline) <= points:
        return [list(p) for p in timeline]
    step = (len(timeline) - 1) / (points - 1)
    return [list(timeline[round(i * step)]) for i in range(points)]


def coverage_line(block: dict | None) -> str:
    """One line for the console: each scope's line and branch coverage of what a CPU build can run."""
    if not block or not block["scopes"]:
        return ""
    return "coverage: " + "; ".join(
        f"{scope} {t['line_percent']}% of lines ({t['covered']}/{t['reachable']}), {t['branch_percent']}% of "
        f"branches" for scope, t in sorted(block["scopes"].items()))


def coverage_lines(block: dict | None) -> list[str]:
    """The report's coverage section (markdown)."""
    if not block:
        return []
    lines = ["## Coverage of the framework's checkpoint code", "",
             "| scope | files | lines covered / reachable on CPU | branches | needs a device |",
             "|---|---|---|---|---|"]
    for scope, t in sorted(block["scopes"].items()):
        lines.append(f"| {scope} | {t['files']} | {t['covered']}/{t['reachable']} ({t['line_percent']}%) | "
                     f"{t['covered_branches']}/{t['branches']} ({t['branch_percent']}%) | {t['cpu_only']} lines |")
    corpus = block.get("corpus")
    if corpus:
        lines += ["", "Across the corpus's nights: " + ", ".join(
            f"{scope} {t['line_percent']}% lines, {t['branch_percent']}% branches"
            for scope, t in sorted(corpus.items()))]
    gain = block.get("gain_by_property")
    if gain:
        lines += ["", "| property | arcs its turns added | turns | seconds |", "|---|---|---|---|"]
        lines += [f"| {p} | {g['new_arcs']} | {g['turns']} | {g['seconds']} |" for p, g in gain.items()]
        lines += ["", "Turns were " + ("weighted by what they added (harness/campaign/guidance.py)."
                                       if block.get("guided") else "not weighted by coverage (--coverage unguided).")]
    lines += ["", "Least covered files:", ""]
    worst = sorted(((f["covered"] / f["reachable"] if f["reachable"] else 1.0, name, f)
                    for name, f in block["files"].items()), key=lambda t: (t[0], t[1]))[:10]
    lines += [f"- `{name}`: {f['covered']}/{f['reachable']} lines" for _, name, f in worst]
    return [*lines, ""]


def coverage_html(block: dict | None) -> str:
    """The page's coverage section: totals per scope, a table per file, and each file's source with what no case
    ran marked (red), branches left untaken (amber) and lines only a device build runs (grey, with the condition).
    Sources are read from this machine's installed framework; a file not installed here shows its table row only."""
    if not block:
        return ""
    parts = ["<h2>Coverage of the framework's checkpoint code</h2>",
             "<table><tr><th>scope</th><th>files</th><th>lines covered / reachable on CPU</th><th>branches</th>"
             "<th>needs a device</th></tr>"]
    for scope, t in sorted(block["scopes"].items()):
        parts.append(f"<tr><td>{escape(scope)}</td><td class=n>{t['files']}</td>"
                     f"<td class=n>{t['covered']}/{t['reachable']} ({t['line_percent']}%)</td>"
                     f"<td class=n>{t['covered_branches']}/{t['branches']} ({t['branch_percent']}%)</td>"
                     f"<td class=n>{t['cpu_only']}</td></tr>")
    parts.append("</table><table><thead><tr><th>file</th><th data-sort>lines %</th><th>lines</th>"
                 "<th data-sort>branches %</th><th>needs a device</th></tr></thead><tbody>")
    for name, f in sorted(block["files"].items()):
        parts.append(f"<tr><td><a href='#cov-{_anchor(name)}'><code>{escape(name)}</code></a></td>"
                     f"<td class=n>{_pct(f['covered'], f['reachable'])}</td><td class=n>{f['covered']}/{f['reachable']}"
                     f"</td><td class=n>{_pct(f['covered_branches'], f['branches'])}</td>"
                     f"<td class=n>{f['cpu_only']}</td></tr>")
    parts.append("</tbody></table>")
    parts += [_source_html(name, f) for name, f in sorted(block["files"].items())]
    return "".join(parts)


def _source_html(name: str, figures: dict) -> str:
    scope = scope_of(name)
    root = scope.root() if scope is not None else None
    path = root / name if root is not None else None
    if path is None or not path.is_file():
        return ""
    missing = set(figures["missing"])
    partial = {b[0] for b in figures["missing_branches"]}
    device = {int(n): why for n, why in figures.get("cpu_only_lines", {}).items()}
    rows = []
    for n, text in enumerate(path.read_text(errors="replace").splitlines(), 1):
        cls, title = ("dev", device[n]) if n in device else ("miss", "no case ran it") if n in missing else \
            ("part", "a branch from here was never taken") if n in partial else ("", "")
        mark = f" class={cls} title='{escape(title)}'" if cls else ""
        rows.append(f"<tr{mark}><td class=ln>{n}</td><td>{escape(text) or ' '}</td></tr>")
    return (f"<details id='cov-{_anchor(name)}'><summary><code>{escape(name)}</code> "
            f"{figures['covered']}/{figures['reachable']} lines</summary><table class=src>{''.join(rows)}</table>"
            "</details>")


def _anchor(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]", "-", name)


def _pct(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.1f}" if whole else "-"
