"""What a campaign leaves behind (a contract, docs/design.md §8): one JSON file per finding, ``summary.json``,
``report.md``, and the findings table printed at the end of ``fuzz``."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path

from harness.campaign.results import Campaign, Finding
from harness.fixes import FIXED_BY, own_fixes
from harness.report.coverage import coverage_lines, keep_coverage
from properties.model.verdicts import Verdict
from properties.registry import FAULT_PROPERTIES


def finding_json(finding: Finding, replay: str, fixes: list[str] | None = None) -> dict:
    """A finding as its JSON file (a contract: docs/design.md §12); ``fixes``: known bugs patched where it failed,
    which its replay applies too."""
    details = list(finding.judgement.details)
    if fixes:
        replay += f" --fixes {','.join(fixes)}"
    return {
        "property": finding.judgement.property,
        "sut": finding.case.sut,
        "verdict": finding.judgement.verdict.value,
        "error": details[0] if details else "",
        "details": details,
        "shims": list(finding.shims),
        "traceback": finding.traceback,
        "fault": finding.fault,
        "case": finding.case.to_json(),
        "replay": replay,
        "bucket": finding.bucket.id if finding.bucket else None,
        "bucket_title": finding.bucket.title if finding.bucket else None,
        "bucket_core": finding.bucket.core if finding.bucket else None,
        "bucket_features": sorted(finding.bucket.features) if finding.bucket else [],
        "swarm_left_out": list(finding.left_out),
        "found_at_s": round(finding.found_at, 1),
        **({"confirmed_real": finding.confirmed_real} if finding.confirmed_real is not None else {}),
        **({"io_map": finding.io_map} if finding.io_map else {}),
        **({"fixes": list(fixes)} if fixes else {}),
        **({"needs_fixes": list(finding.needs_fixes)} if finding.needs_fixes is not None else {}),
    }


def write_results(campaign: Campaign, out: Path, extra: Callable[[Path], dict] | None = None) -> list[dict]:
    """``extra``: called with each finding file once written (``fuzz`` writes its standalone repro there); what it
    returns is added to the finding's row, so the summary and the report link the repro."""
    findings_dir = out / "findings"
    findings_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for n, finding in enumerate(campaign.findings):
        safe_sut = re.sub(r"[^A-Za-z0-9._-]", "_", campaign.sut)
        path = findings_dir / f"{n:03d}-{finding.judgement.property}-{safe_sut}.json"
        fixes = campaign.fixes if finding.fixes is None else list(finding.fixes)
        data = finding_json(finding, f"ckpt-harness replay {path}", fixes)
        path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        if extra is not None:
            data.update(extra(path))
        rows.append(data)
    verdicts = Counter(f.judgement.verdict.value for f in campaign.findings)
    summary = {
        "sut": campaign.sut,
        "ranks": campaign.ranks,
        "seed": campaign.seed,
        "cases_per_property": campaign.cases_per_property,
        "cases_run": dict(sorted(campaign.cases_run.items())),
        "skipped_properties": campaign.skipped,
        "findings": {v.value: verdicts.get(v.value, 0) for v in Verdict if v is not Verdict.PASS},
        "wall_time_s": round(campaign.wall, 3),
        "sut_share": round(campaign.sut_seconds / campaign.wall, 3) if campaign.wall else 0.0,
        "launch_mode": campaign.mode,
        "launches": campaign.launches,
        "recovery": campaign.recovery,
        "shims": sorted(campaign.shims),
        "fixes": campaign.fixes,
        "devices": campaign.devices,
        "unreplayable_states": campaign.unreplayable,
        "known_findings_skipped": campaign.known,
        "known_seconds": {k: round(v, 1) for k, v in sorted(campaign.known_seconds.items())},
        "known_despite_fix": campaign.known_despite_fix,
        "fix_savings": fix_savings(campaign.known_seconds, campaign.swarm_cases, sum(campaign.cases_run.values())),
        "harness_errors": campaign.harness_errors[:20],
        "idle_batches": dict(campaign.idle_batches),
        "flaky_failures": campaign.flaky[:20],
        "seconds_per_property": {p: round(t, 1) for p, t in sorted(campaign.prop_seconds.items())},
        "fault_cases_per_minute": {p: round(campaign.cases_run[p] / campaign.prop_seconds[p] * 60, 1)
                                   for p in sorted(campaign.cases_run) if p in FAULT_PROPERTIES
                                   and campaign.prop_seconds[p] > 0},
        "exploration": campaign.exploration,
        "swarm_per_feature": {f: {"cases": campaign.swarm_cases[f], "seconds": round(campaign.swarm_seconds[f], 1)}
                              for f in sorted(campaign.swarm_cases)},
        "hypothesis_per_property": {p: {k: round(v, 2) if isinstance(v, float) else v for k, v in sorted(c.items())}
                                    for p, c in sorted(campaign.observed.items())},
        "buckets": buckets(campaign, rows),
        "corpus": campaign.corpus_rows,
        "coverage": keep_coverage(campaign, out),
    }
    if campaign.corpus is not None:  # the corpus keeps the nights: buckets opened and closed across them
        from harness.campaign.corpus import record_night, trends

        record_night(campaign.corpus.root, summary)
        summary["trends"] = trends(campaign.corpus.root)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    write_reports(out, summary, rows)
    return rows


def fix_savings(known_seconds: Mapping[str, float], swarm_cases: Mapping[str, int], total: int) -> dict:
    """What each fix saved, estimated from the swarm rounds that left it out: the seconds that round's cases of its
    known bug took (signature or patched replay, proofs included), per case run without it, times the cases run
    with it. Fixes never left out have no estimate. A known count names its fixes ("fixed by a+b", shared equally)
    or a regression case (the fixes covering it)."""
    lost: Counter = Counter()
    for name, seconds in known_seconds.items():
        ids = name[len(FIXED_BY):].split("+") if name.startswith(FIXED_BY) else own_fixes(name)
        for fix_id in ids:
            lost[fix_id] += seconds / len(ids)
    per_fix = {}
    for feature, without in sorted(swarm_cases.items()):
        if feature.startswith("fix:") and without:
            fix_id = feature[len("fix:"):]
            per_fix[fix_id] = {"cases_without": without, "seconds_lost_without": round(lost[fix_id], 1),
                               "estimated_seconds_saved": round(lost[fix_id] / without * max(0, total - without), 1)}
    return {"per_fix": per_fix, "estimated_seconds_saved": round(sum(f["estimated_seconds_saved"]
                                                                    for f in per_fix.values()), 1)}


def write_reports(out: Path, summary: dict, rows: list[dict], markdown: str | None = None) -> None:
    """``report.md`` (terminals, CI logs) and ``report.html`` (a page people look at) of one summary, side by side:
    every command that writes one writes both, through the one HTML renderer (harness/report/html.py)."""
    from harness.report.html import render

    (out / "report.md").write_text(report(summary, rows) if markdown is None else markdown, encoding="utf-8")
    (out / "report.html").write_text(render(summary, rows, out), encoding="utf-8")


def _despite_fix_line(despite: dict[str, int]) -> list[str]:
    """Signatures and fixes disagreeing: a row's signature explained failures while that row's fix was applied."""
    if not despite:
        return []
    return ["Signatures that matched although their row's fix was applied (the fix misses a variant, or the "
            f"signature covers another bug): {', '.join(f'{k} ({n})' for k, n in despite.items())}."]


def _savings_line(summary: dict) -> list[str]:
    """Seconds known bugs took, and what the fixes saved by the swarm rounds' estimate (``fix_savings``)."""
    lost = sum(summary.get("known_seconds", {}).values())
    savings = summary.get("fix_savings") or {}
    line = f"Cases of known bugs took {lost:.0f} s." if summary.get("known_seconds") else ""
    if savings.get("per_fix"):
        line += (f" Rounds that left fixes out ({', '.join(savings['per_fix'])}) put the fixes' saving at about "
                 f"{savings['estimated_seconds_saved']:.0f} s.")
    return [line.strip()] if line else []


def _recovery_line(rec: dict) -> list[str]:
    if not rec:
        return []
    restarts = (f"; cases' own restarts took {rec['restart_launch_seconds']} s of fresh launches"
                if rec.get("restart_launch_seconds") else "")
    return [f"Lost ranks cost {rec['replacement_launch_seconds']} s of replacement launches (of "
            f"{rec['launch_seconds']} s launching in all) and {rec['failure_wait_seconds']} s waiting on ranks that "
            f"had failed{restarts}."]


def _observed(summary: dict, prop: str) -> str:
    """Hypothesis's own view of a property's turns (campaign._observer)."""
    seen = summary.get("hypothesis_per_property", {}).get(prop)
    if not seen:
        return "- | - | - | -"
    return (f"{seen.get('test_cases', 0)} ({seen.get('gave_up', 0)}) | {seen.get('while_shrinking', 0)} | "
            f"{seen.get('from_database', 0)} | {seen.get('generate_s', 0.0)}")


def exploration_lines(exploration: dict) -> list[str]:
    """The explorer's share of a fault campaign, in a sentence, and its judged / total per shape so far."""
    if not exploration:
        return []
    shapes = "; ".join(f"{s}: " + ", ".join(f"{k} {v}" for k, v in kinds.items())
                       for s, kinds in exploration.get("shapes", {}).items())
    return [f"Explorer: {exploration.get('orders', 0)} saves' IO checked for persistence order, "
            f"{exploration['points']} crash points and {exploration['states']} power-loss states judged in "
            f"{exploration['seconds']} s ({exploration['points_per_minute']} and {exploration['states_per_minute']} "
            f"per minute), {exploration['failing']} failing; now at {exploration['at']}"
            + (f" (part {exploration['part']} of the shapes)" if exploration.get("part", "0/1") != "0/1" else "")
            + (f"; judged/total so far: {shapes}" if shapes else "") + "."]


def report(summary: dict, rows: list[dict]) -> str:
    shims = ", ".join(summary["shims"]) or "none"
    lines = [
        f"# ckpt-harness report: {summary['sut']}",
        "",
        f"{sum(summary['cases_run'].values())} cases in {summary['wall_time_s']} s on {summary['ranks']} rank(s), "
        f"launch mode {summary['launch_mode']} ({summary['launches']} launches), seed {summary['seed']}, "
        f"shims: {shims}, devices: {', '.join(summary.get('devices', [])) or 'unknown'}.",
        *([f"Known bugs patched on every rank (--fixes): {', '.join(summary['fixes'])}."]
          if summary.get("fixes") else []),
        *_savings_line(summary),
        *_despite_fix_line(summary.get("known_despite_fix") or {}),
        *_recovery_line(summary.get("recovery") or {}),
        *exploration_lines(summary.get("exploration") or {}),
        "",
        "| property | cases | seconds | drawn (gave up) | while shrinking | from database | drawing s |",
        "|---|---|---|---|---|---|---|",
        *[f"| {p} | {n} | {summary.get('seconds_per_property', {}).get(p, '-')} | {_observed(summary, p)} |"
          for p, n in summary["cases_run"].items()],
        *[f"| {p} | skipped: {why} |" for p, why in summary["skipped_properties"].items()],
        "",
        *[f"Cases explained by the known finding `{k}` (not shrunk): {n}." if not k.startswith(FIXED_BY) else
          f"Cases known by a patched replay, {k} (not shrunk): {n}." for k, n in
          summary.get("known_findings_skipped", {}).items()],
        *[f"The harness itself failed on a case (a harness bug, not a finding): {e}" for e in
          summary.get("harness_errors", [])],
        *[f"Ranks died or hung once, and the case passed when run again (flaky, not shrunk): {e}" for e in
          summary.get("flaky_failures", [])],
        *[f"Corpus bucket `{r['bucket']}` ({r['title']}): {r['status']}." for r in summary.get("corpus", [])],
        "",
    ]
    lines += coverage_lines(summary.get("coverage"))
    lines += ["## Buckets (one root cause each)", "", *buckets_table(summary), "", "## New findings", "",
              *findings_table(rows)]
    return "\n".join(lines) + "\n"


def buckets(campaign: Campaign, rows: list[dict]) -> list[dict]:
    """Every root-cause bucket the campaign met: the new ones (one shrunk finding each, how many cases fell in
    them, which properties) and the known ones (the regression case that explains them, as FINDINGS.md lists
    it)."""
    out = [{"bucket": r["bucket"], "status": _new_status(r), "title": r["bucket_title"],
            "cases": campaign.bucket_hits.get(r["bucket"], 1),
            "properties": sorted(campaign.bucket_props.get(r["bucket"], {r["property"]})), "replay": r["replay"],
            "swarm_left_out": r.get("swarm_left_out", []), "core": r.get("bucket_core"),
            "features": r.get("bucket_features", []), "verdict": r["verdict"], "found_at_s": r.get("found_at_s"),
            "smallest": case_size(r["case"]),
            **{k: r[k] for k in ("repro", "standalone_verified", "repro_deferred") if k in r}}
           for r in rows]
    out += [_known_row(name, n) for name, n in sorted(campaign.known.items())]
    return out


def _new_status(row: dict) -> str:
    """A new bucket's status: where its finding was confirmed on real ranks, and whether it fails on stock code
    or only with some of the fixes applied."""
    notes = [f"real ranks: {row['confirmed_real']}"] if "confirmed_real" in row else []
    if row.get("needs_fixes"):
        notes.append(f"only with fixes {', '.join(row['needs_fixes'])}")
    return "new" + (f" ({'; '.join(notes)})" if notes else "")


def _known_row(name: str, cases: int) -> dict:
    """A known bucket: a regression case's signature explained it, or ("fixed by a+b") a patched replay passed."""
    if name.startswith(FIXED_BY):
        fixes = name[len(FIXED_BY):]
        return {"bucket": name, "status": "known", "cases": cases, "fixes": fixes.split("+"),
                "title": f"known: passes with fixes {fixes.replace('+', ', ')} (harness/fixes/)"}
    return {"bucket": Path(name).stem, "status": "known", "title": f"known finding {name} (FINDINGS.md)",
            "cases": cases}


def case_size(case: dict) -> str:
    """A case in a few words (how small the smallest case of a bucket is): ops, tensors and their shapes."""
    tensors = case.get("tensors", [])
    shapes = ", ".join(f"{t.get('dtype', '?')}{list(t.get('shape', []))}" for t in tensors[:4])
    more = f" +{len(tensors) - 4}" if len(tensors) > 4 else ""
    return f"{len(case.get('ops', []))} ops, {len(tensors)} tensors: {shapes}{more}"


def buckets_table(summary: dict) -> list[str]:
    rows = summary.get("buckets", [])
    if not rows:
        return ["No failures."]
    out = ["| bucket | new/known | cases | what | replay | standalone repro |", "|---|---|---|---|---|---|"]
    for b in rows:
        title = (b["title"] or "").replace("|", "\\|").replace("\n", " ")[:160]
        repro = (f"{b['repro']} ({'verified' if b.get('standalone_verified') else 'not verified'})"
                 if b.get("repro") else f"not written in time: `{b['repro_deferred']}`" if b.get("repro_deferred")
                 else "-")
        out.append(f"| {b['bucket']} | {b['status']} | {b['cases']} | {title} | "
                   f"{'`' + b['replay'] + '`' if b.get('replay') else '-'} | {repro} |")
    return out


def findings_table(rows: list[dict]) -> list[str]:
    if not rows:
        return ["No findings."]
    out = ["| property | SUT | verdict | error | replay |", "|---|---|---|---|---|"]
    for r in rows:
        error = r["error"].replace("|", "\\|").replace("\n", " ")
        if len(error) > 160:
            error = error[:157] + "..."
        out.append(f"| {r['property']} | {r['sut']} | {r['verdict']} | {error} | `{r['replay']}` |")
    return out


