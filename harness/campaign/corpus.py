"""A corpus that survives the night (``fuzz --corpus DIR``): what one campaign learned, the next starts from.

``DIR/buckets/<sut>/<id>.json`` holds the smallest case of every root-cause bucket ever seen (a finding file:
``ckpt-harness replay`` runs it). A campaign with a corpus first replays every stored bucket case and reports each
as still failing, known by now (a regression case explains it) or passing (fixed upstream?); the buckets still
failing count as seen, so the campaign does not shrink them again and does not exit 1 for them. For CI,
``--corpus-readonly SHARED`` also reads a shared corpus (a nightly job's) without writing to it.

``DIR/covering/<sut>/<hash>.json`` holds passing cases that reached lines of the framework's checkpoint code no
earlier case of their campaign had (``keep_covering``; the newest ``COVERING_MAX`` per SUT). A campaign with a
corpus replays them first too, so it starts where the last ones got to and spends its time beyond it; one that
fails now is reported as such. ``DIR/coverage/<sut>.json`` is the coverage of every night, merged.

``DIR/hypothesis/`` is Hypothesis's own example database (a directory database; with ``--corpus-readonly``, a
multiplexed one that also reads the shared corpus's and writes only locally), keyed by SUT and property. Each
batch of a property starts by replaying what it holds (Hypothesis's reuse phase): the choices of every failure a
campaign shrank, drawn again under the batch's own swarm configuration, then explores as usual.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from properties.model.case import Case, CaseError, read_case_file
from properties.triage.buckets import Bucket

COVERING_MAX = 40  # covering cases kept per SUT: each is replayed before every campaign that uses the corpus


@dataclass(frozen=True)
class Corpus:
    root: Path
    shared: Path | None = None  # read, never written (a nightly job's corpus, in CI)

    def database(self):
        """Hypothesis's example database in this corpus (reading the shared one too, writing only here)."""
        from hypothesis.database import DirectoryBasedExampleDatabase, MultiplexedDatabase, ReadOnlyDatabase

        local = DirectoryBasedExampleDatabase(self.root / "hypothesis")
        if self.shared is None:
            return local
        return MultiplexedDatabase(local, ReadOnlyDatabase(DirectoryBasedExampleDatabase(self.shared / "hypothesis")))

    def bucket_dirs(self, sut: str) -> list[Path]:
        name = safe_name(sut)
        return [d / "buckets" / name for d in (self.root, self.shared) if d is not None]

    def keep(self, sut: str, bucket: Bucket, finding: dict) -> Path:
        """Store a bucket's smallest case (a finding file) unless the corpus has one for it already."""
        path = self.bucket_dirs(sut)[0] / f"{bucket.id}.json"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            data = {**finding, "bucket": bucket.id, "bucket_core": bucket.core,
                    "bucket_features": sorted(bucket.features), "bucket_title": bucket.title}
            path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        return path

    def keep_covering(self, sut: str, case: Case) -> Path:
        """Store a passing case that reached new code; past ``COVERING_MAX`` for the SUT, the oldest goes."""
        text = json.dumps({"case": case.to_json()}, indent=1, sort_keys=True) + "\n"
        directory = self.root / "covering" / safe_name(sut)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / (hashlib.sha256(text.encode()).hexdigest()[:16] + ".json")
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
        kept = sorted(directory.glob("*.json"), key=lambda p: (p.stat().st_mtime_ns, p.name))
        for old in kept[:max(0, len(kept) - COVERING_MAX)]:
            old.unlink(missing_ok=True)
        return path

    def covering(self, sut: str) -> list[Path]:
        """Every stored covering case of ``sut`` (local first; a shared one of the same name is skipped)."""
        out: dict[str, Path] = {}
        for root in (self.root, self.shared):
            directory = root / "covering" / safe_name(sut) if root is not None else None
            for path in sorted(directory.glob("*.json")) if directory is not None and directory.is_dir() else ():
                out.setdefault(path.name, path)
        return list(out.values())

    def stored(self, sut: str) -> list[tuple[Path, Bucket]]:
        """Every stored bucket case of ``sut`` (local first; a shared one the local corpus also has is skipped)."""
        out: dict[str, tuple[Path, Bucket]] = {}
        for directory in self.bucket_dirs(sut):
            for path in sorted(directory.glob("*.json")) if directory.is_dir() else ():
                try:
                    data = json.loads(path.read_text(encoding="utf-8"))
                    bucket = Bucket(data["bucket_core"], frozenset(data["bucket_features"]), data["bucket_title"])
                except (OSError, ValueError, KeyError, TypeError) as exc:
                    raise CaseError(f"corpus file {path}: not a bucket case ({type(exc).__name__}: {exc})") from None
                out.setdefault(bucket.id, (path, bucket))
        return list(out.values())


def replay_corpus(corpus: Corpus, sut: str, judge) -> tuple[list[dict], list[Bucket]]:
    """Replay every stored bucket case: rows for the summary, and the buckets still failing (seen already)."""
    rows, failing = [], []
    for path, bucket in corpus.stored(sut):
        case, _ = read_case_file(path)
        judgement, _ = judge(case)
        status = ("known" if judgement.excuse == "known" else "passing") if judgement.ok else "still failing"
        rows.append({"bucket": bucket.id, "title": bucket.title, "status": status, "case": str(path)})
        if status == "still failing":
            failing.append(bucket)
    return rows, failing


def replay_covering(corpus: Corpus, sut: str, judge) -> list[dict]:
    """Replay every stored covering case (their coverage is where this campaign starts); rows only for those that
    fail now (they passed when kept: a regression, or a bug a changed environment shows)."""
    rows = []
    for path in corpus.covering(sut):
        case, _ = read_case_file(path)
        judgement, _ = judge(case)
        if not judgement.ok:
            rows.append({"bucket": "-", "title": f"covering case fails now: {judgement.verdict.value}",
                         "status": "covering case fails", "case": str(path)})
    return rows


def safe_name(name: str) -> str:
    """A name as a file name: everything but letters, digits and ._- becomes _."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


NIGHTS = "nights.jsonl"  # one line per campaign or fleet that used this corpus: which buckets failed that night


def record_night(root: Path, summary: dict) -> None:
    """Append this run's failing buckets (new, known, or replayed from the corpus and still failing) to the
    corpus's history, so reports can show buckets opened and closed night by night."""
    failing = {b["bucket"] for b in summary.get("buckets", [])}
    failing |= {r["bucket"] for r in summary.get("corpus", []) if r.get("status") == "still failing"}
    line = {"night": time.strftime("%Y-%m-%dT%H:%M:%S"), "sut": summary.get("sut"), "buckets": sorted(failing),
            "cases": sum(summary.get("cases_run", {}).values())}
    coverage = summary.get("coverage") or {}
    if coverage:  # the night's own and the corpus's total line coverage per scope: the trend of what is reached
        line["coverage"] = {scope: t["line_percent"] for scope, t in coverage["scopes"].items()}
        line["coverage_total"] = {scope: t["line_percent"] for scope, t in coverage.get("corpus", {}).items()}
    root.mkdir(parents=True, exist_ok=True)
    with (root / NIGHTS).open("a", encoding="utf-8") as f:
        f.write(json.dumps(line, sort_keys=True) + "\n")


def trends(root: Path, last: int = 30) -> list[dict]:
    """The last ``last`` nights of the corpus: per night, buckets failing, opened (not failing the night before)
    and closed (failing the night before, not this one), and when each open bucket was first seen."""
    path = root / NIGHTS
    nights = []
    if path.is_file():
        for text in path.read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(ValueError):
                nights.append(json.loads(text))
    out, before, first = [], set(), {}
    for night in nights:
        now = set(night.get("buckets", []))
        for b in now:
            first.setdefault(b, night["night"])
        out.append({"night": night["night"], "sut": night.get("sut"), "cases": night.get("cases", 0),
                    "failing": len(now), "opened": sorted(now - before), "closed": sorted(before - now),
                    "first_seen": {b: first[b] for b in sorted(now)}, "coverage": night.get("coverage", {}),
                    "coverage_total": night.get("coverage_total", {})})
        before = now
    return out[-last:]
