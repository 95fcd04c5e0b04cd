"""A night of shards as one result: each shard's files under ``DIR/shards/<id>/``, its buckets merged so one bug
found by N shards is one row naming all N (the same rule a campaign uses: ``properties.triage.buckets.Bucket.covers``),
one finding per bucket (the smallest case any shard shrank), one ``summary.json``, ``report.md`` and
``report.html``. Pure bookkeeping over the shards' returned data: no Ray here (harness/fleet/driver.py runs them)."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

from harness.report.coverage import coverage_lines
from harness.report.summary import buckets_table, exploration_lines, findings_table, fix_savings, write_reports
from properties.model.verdicts import Verdict
from properties.triage.buckets import Bucket


def write_shard(out: Path, result: dict) -> tuple[dict | None, list[dict]]:
    """Write one shard's returned files under ``out``/shards/<id>/ (replay commands pointed there); return its
    summary (None if it wrote none) and its findings."""
    folder = out / "shards" / result["id"]
    summary, rows = None, []
    for rel, text in sorted(result.get("files", {}).items()):
        if result.get("out"):
            text = text.replace(result["out"], str(folder))
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        if rel == "summary.json":
            summary = json.loads(text)
        elif rel.startswith("findings/") and rel.endswith(".json"):
            rows.append({**json.loads(text), "shard": result["id"], "file": str(path)})
    return summary, rows


def merge_buckets(shards: list[tuple[str, dict]]) -> list[dict]:
    """The buckets of every shard (id, its summary), one row per root cause: new buckets whose cores are equal and
    whose features one of the two holds all of are one bug (the smallest case's row is kept); known ones by the
    regression case that explains them."""
    merged: list[tuple[Bucket | None, dict]] = []
    for shard, summary in shards:
        for row in summary.get("buckets", []):
            key = Bucket(row["core"], frozenset(row.get("features", []))) if row.get("core") else None
            same = next((m for m in merged if _same(m, key, row)), None)
            if same is None:
                merged.append((key, {**row, "shards": [shard], "properties": list(row.get("properties", []))}))
                continue
            into = same[1]
            into["cases"] += row["cases"]
            into["shards"] = sorted({*into["shards"], shard})
            into["properties"] = sorted({*into["properties"], *row.get("properties", [])})
            if row.get("found_at_s") is not None and (into.get("found_at_s") is None
                                                     or row["found_at_s"] < into["found_at_s"]):
                into["found_at_s"] = row["found_at_s"]
    return [row for _, row in merged]


def _same(merged: tuple[Bucket | None, dict], key: Bucket | None, row: dict) -> bool:
    bucket, into = merged
    if key is None or bucket is None:
        return key is None and bucket is None and into["bucket"] == row["bucket"] and into["status"] == row["status"]
    return bucket.covers(key)


def pick_findings(buckets: list[dict], rows: list[dict], out: Path) -> list[dict]:
    """One finding per merged new bucket: the smallest case any of its shards shrank, written to ``out``/findings/
    naming every shard that met the bucket; the bucket row's replay command points at it."""
    (out / "findings").mkdir(parents=True, exist_ok=True)
    chosen = []
    for b in buckets:
        if not b["status"].startswith("new"):
            continue
        mine = [r for r in rows if r.get("shard") in b["shards"] and _covered(b, r)]
        if not mine:
            continue
        best = min(mine, key=lambda r: len(json.dumps(r["case"], sort_keys=True)))
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", best["sut"])
        path = out / "findings" / f"{len(chosen):03d}-{best['property']}-{safe}.json"
        data = {k: v for k, v in best.items() if k not in ("file",)}
        data.update(replay=f"ckpt-harness replay {path}", shards=b["shards"])
        path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        b.update(replay=data["replay"], verdict=best["verdict"], smallest=_size(best), bucket=best["bucket"])
        chosen.append(data)
    return chosen


def _covered(bucket: dict, row: dict) -> bool:
    if not bucket.get("core") or not row.get("bucket_core"):
        return row.get("bucket") == bucket["bucket"]
    return Bucket(bucket["core"], frozenset(bucket.get("features", []))).covers(
        Bucket(row["bucket_core"], frozenset(row.get("bucket_features", []))))


def _size(row: dict) -> str:
    from harness.report.summary import case_size

    return case_size(row["case"])


def merged_summary(runs: list[dict], shards: list[tuple[str, dict]], buckets: list[dict], findings: list[dict],
                   fleet: dict) -> dict:
    """One summary of the night: what every shard ran, summed; the merged buckets; the shards and their attempts;
    the fleet's own cost (``fleet``)."""
    cases: Counter = Counter()
    seconds: Counter = Counter()
    swarm_cases: Counter = Counter()
    swarm_seconds: Counter = Counter()
    recovery: Counter = Counter()
    known: Counter = Counter()
    known_seconds: Counter = Counter()
    launches = 0
    errors, corpus = [], []
    for shard, s in shards:
        cases.update(s.get("cases_run", {}))
        seconds.update(s.get("seconds_per_property", {}))
        for feature, v in s.get("swarm_per_feature", {}).items():
            swarm_cases[feature] += v["cases"]
            swarm_seconds[feature] += v["seconds"]
        recovery.update({k: v for k, v in (s.get("recovery") or {}).items() if isinstance(v, int | float)})
        known.update(s.get("known_findings_skipped", {}))
        known_seconds.update(s.get("known_seconds", {}))
        launches += s.get("launches", 0)
        errors += [f"{shard}: {e}" for e in s.get("harness_errors", [])]
        corpus += [{**r, "shard": shard} for r in s.get("corpus", [])]
    verdicts = Counter(f["verdict"] for f in findings)
    summaries = dict(shards)
    return {
        "sut": ", ".join(sorted({r["sut"] for r in runs})) or "-",
        "kind": "fleet",
        "ranks": max((r["ranks"] for r in runs), default=0),
        "seed": None,
        "cases_run": dict(sorted(cases.items())),
        "skipped_properties": {},
        "findings": {v.value: verdicts.get(v.value, 0) for v in Verdict if v is not Verdict.PASS},
        "wall_time_s": fleet.get("wall_s"),
        "sut_share": None,
        "launch_mode": ", ".join(sorted({r["launch"] for r in runs})),
        "launches": launches,
        "recovery": {k: round(v, 1) for k, v in sorted(recovery.items())},
        "shims": sorted({x for _, s in shards for x in s.get("shims", [])}),
        "devices": sorted({x for _, s in shards for x in s.get("devices", [])}),
        "known_findings_skipped": dict(sorted(known.items())),
        "known_seconds": {k: round(v, 1) for k, v in sorted(known_seconds.items())},
        "fix_savings": fix_savings(known_seconds, swarm_cases, sum(cases.values())),
        "harness_errors": errors[:40],
        "flaky_failures": [],
        "seconds_per_property": {p: round(t, 1) for p, t in sorted(seconds.items())},
        "swarm_per_feature": {f: {"cases": swarm_cases[f], "seconds": round(swarm_seconds[f], 1)}
                              for f in sorted(swarm_cases)},
        "buckets": buckets,
        "corpus": corpus,
        "exploration": {shard: s["exploration"] for shard, s in shards if s.get("exploration")},
        "shards": [{**{k: r[k] for k in ("id", "sut", "ranks", "device", "launch", "seed", "faults")},
                    **_outcome(r, summaries.get(r["id"]))} for r in runs],
        "fleet": fleet,
    }


def _outcome(run: dict, summary: dict | None) -> dict:
    attempts = run.get("attempts", [])
    last = attempts[-1] if attempts else {}
    return {"status": last.get("status", "not run"), "attempts": [
        {k: a.get(k) for k in ("attempt", "status", "exit", "seconds", "node", "gpus", "error")} for a in attempts],
        "seconds": round(sum(a.get("seconds") or 0.0 for a in attempts), 1), "where": _where(last),
        "cases": sum((summary or {}).get("cases_run", {}).values()),
        "new_buckets": sum(1 for b in (summary or {}).get("buckets", []) if b["status"].startswith("new"))}


def _where(attempt: dict) -> str:
    """The node a shard attempt ran on, and the GPUs Ray gave it (CUDA_VISIBLE_DEVICES) where it held some."""
    node = attempt.get("node") or "-"
    return f"{node} (GPUs {attempt['gpus']})" if attempt.get("gpus") else node


def fleet_report(summary: dict, findings: list[dict]) -> str:
    """report.md of a night: the shards, the fleet's cost, then the merged buckets and findings."""
    f = summary["fleet"]
    lines = [f"# ckpt-harness fleet report: {summary['sut']}", "",
             f"{len(summary['shards'])} shard runs, {sum(summary['cases_run'].values())} cases, "
             f"{f['wall_s']} s wall; {f['inside_shards_s']} s with a shard running, fleet overhead "
             f"{f['overhead_s']} s (Ray start {f['ray_start_s']} s, merge {f['merge_s']} s); Ray: {f['ray']}.", "",
             "| shard | SUT | ranks | device | where | seed | status | attempts | seconds | cases | new buckets |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in summary["shards"]:
        lines.append(f"| {s['id']} | {s['sut']} | {s['ranks']} | {s['device']} | {s.get('where', '-')} | {s['seed']} | "
                     f"{s['status']} | "
                     f"{len(s['attempts'])} | {s['seconds']} | {s['cases']} | {s['new_buckets']} |")
    for s in summary["shards"]:
        for a in s["attempts"]:
            if a["status"] != "ok":
                lines.append(f"Shard {s['id']} attempt {a['attempt']}: {a['status']}: {a['error']}")
    lines += ["", "| property | cases | seconds |", "|---|---|---|",
              *[f"| {p} | {n} | {summary['seconds_per_property'].get(p, '-')} |"
                for p, n in summary["cases_run"].items()], ""]
    lines += [f"Shard {shard}: {line}" for shard, explored in summary.get("exploration", {}).items()
              for line in exploration_lines(explored)]
    lines += [f"The harness itself failed on a case (a harness bug, not a finding): {e}"
              for e in summary["harness_errors"]]
    lines += coverage_lines(summary.get("coverage"))
    lines += ["## Buckets (one root cause each, across shards)", "", *buckets_table(summary), "", "## New findings",
              "", *findings_table(findings)]
    return "\n".join(lines) + "\n"


def write_fleet(out: Path, summary: dict, findings: list[dict]) -> None:
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    write_reports(out, summary, findings, markdown=fleet_report(summary, findings))


def busy_seconds(intervals: list[tuple[float, float]]) -> float:
    """Seconds covered by at least one (start, end) interval: the night's time with a shard running."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total
