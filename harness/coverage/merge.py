"""A campaign's coverage: every process's recording merged (by label: the property its cases had), kept across
nights (a corpus) and across a fleet's shards, and analysed into the figures the reports show.

Arcs are merged as sets, so a recording met twice (a forked child that wrote its parent's arcs too, a shard's
total merged with a night's) counts once. The analysis is coverage.py's own (statements, branches, what ran),
for every file of every installed scope, recorded or not: a file no case reached is 0%, not absent.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from harness.coverage.reachability import cpu_only_lines
from harness.coverage.scope import FORMAT, installed, scope_of

Arc = tuple[int, int]


class CoverageDataError(ValueError):
    """A coverage file that is not one this harness wrote (its name and the reason are in the message)."""


@dataclass
class Measured:
    """Arcs by label, then by file (named relative to the framework's install root)."""

    labels: dict[str, dict[str, set[Arc]]] = field(default_factory=dict)

    def add(self, label: str, name: str, arcs: Iterable[Arc]) -> int:
        """Add arcs; how many were new to this label."""
        have = self.labels.setdefault(label, {}).setdefault(name, set())
        before = len(have)
        have.update((int(a), int(b)) for a, b in arcs)
        return len(have) - before

    def merge(self, other: Measured) -> int:
        """Take in ``other``; how many arcs were new (to their label)."""
        return sum(self.add(label, name, arcs) for label, files in other.labels.items()
                   for name, arcs in files.items())

    def union(self) -> dict[str, set[Arc]]:
        """Every label's arcs together, by file."""
        out: dict[str, set[Arc]] = {}
        for files in self.labels.values():
            for name, arcs in files.items():
                out.setdefault(name, set()).update(arcs)
        return out

    def arc_count(self) -> int:
        return sum(len(arcs) for arcs in self.union().values())

    def to_json(self) -> dict:
        return {"format": FORMAT, "labels": {label: {name: sorted(arcs) for name, arcs in sorted(files.items())}
                                             for label, files in sorted(self.labels.items())}}

    @classmethod
    def from_json(cls, doc: object, source: str = "coverage data") -> Measured:
        if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("labels"), dict):
            raise CoverageDataError(f"{source}: not coverage data of format {FORMAT}")
        out = cls()
        try:
            for label, files in doc["labels"].items():
                for name, arcs in files.items():
                    out.add(str(label), str(name), arcs)
        except (TypeError, ValueError, AttributeError) as exc:
            raise CoverageDataError(f"{source}: malformed arcs ({exc})") from None
        return out


class Tracker:
    """A campaign's coverage as its processes write it: each poll reads the files that changed since the last one
    and says how many arcs no earlier poll had (what the cases run meanwhile added)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.measured = Measured()
        self._union: dict[str, set[Arc]] = {}
        self._stamps: dict[Path, tuple[int, int]] = {}

    def poll(self) -> int:
        new = 0
        for path in sorted(self.directory.glob("*.json")) if self.directory.is_dir() else ():
            try:
                stat = path.stat()
            except FileNotFoundError:
                continue
            stamp = (stat.st_mtime_ns, stat.st_size)
            if self._stamps.get(path) == stamp:
                continue
            self._stamps[path] = stamp
            try:
                got = Measured.from_json(json.loads(path.read_text()), str(path))
            except (OSError, json.JSONDecodeError) as exc:
                raise CoverageDataError(f"{path}: unreadable coverage file ({exc})") from None
            self.measured.merge(got)
            for name, arcs in got.union().items():
                have = self._union.setdefault(name, set())
                before = len(have)
                have |= arcs
                new += len(have) - before
        return new

    def arcs(self) -> int:
        return sum(len(a) for a in self._union.values())


def read_dir(directory: str | Path) -> Measured:
    """Every process's file in a campaign's coverage directory, merged. Each was written whole and renamed into
    place, so an unreadable one is not a torn write but something else's file: an error naming it."""
    tracker = Tracker(directory)
    tracker.poll()
    return tracker.measured


def read_file(path: str | Path) -> Measured:
    """A merged recording kept in one file (a corpus's, a shard's); an empty one where the file is absent."""
    path = Path(path)
    if not path.exists():
        return Measured()
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CoverageDataError(f"{path}: unreadable coverage file ({exc})") from None
    return Measured.from_json(doc, str(path))


def write_file(measured: Measured, path: str | Path) -> None:
    _write_whole(measured.to_json(), Path(path))


def _write_whole(doc: dict, path: Path) -> None:
    """Write whole, then rename into place (a corpus must never hold half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as out:
        json.dump(doc, out, separators=(",", ":"))
    os.replace(tmp, path)


@dataclass
class FileFigures:
    """One file's analysis: its statements and branches, what ran, and what cannot run on CPU."""

    name: str
    scope: str
    statements: set[int]
    branches: set[Arc]  # every branch arc coverage.py sees in the source
    cpu_only: dict[int, str]  # statement -> why it needs a device build

    def figures(self, arcs: set[Arc]) -> dict:
        """Covered lines and branches for ``arcs``, counted against what is reachable on CPU."""
        ran = {n for arc in arcs for n in arc if n > 0}
        reachable = self.statements - set(self.cpu_only)
        covered = ran & reachable
        branches = {b for b in self.branches if b[0] not in self.cpu_only}
        taken = arcs & branches
        return {"statements": len(self.statements), "reachable": len(reachable), "covered": len(covered),
                "cpu_only": len(self.statements & set(self.cpu_only)),
                "branches": len(branches), "covered_branches": len(taken),
                "missing": sorted(reachable - ran), "missing_branches": sorted(branches - taken)}


def analyse_files(framework: str | None = None) -> dict[str, FileFigures]:
    """coverage.py's analysis of every file of the installed scopes (those ``framework``'s SUTs run, where given):
    statements and branches."""
    import coverage

    scopes = installed(framework)
    paths: dict[str, str] = {}
    for scope in scopes:
        root = scope.root()
        for name in scope.files():
            paths[str(root / name)] = name
    if not paths:
        return {}
    cov = coverage.Coverage(data_file=None, branch=True, config_file=False)
    data = cov.get_data()
    data.add_arcs({})  # arcs mode: every touched file gets its branches analysed
    data.touch_files(list(paths))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        cov.json_report(outfile=str(out), ignore_errors=True)
        report = json.loads(out.read_text())
    entries = {str(Path(key).resolve()): entry for key, entry in report["files"].items()}
    figures = {}
    for path, name in paths.items():
        entry = entries.get(path)
        if entry is None:  # coverage.py could not parse it (ignore_errors): nothing to count
            continue
        scope = scope_of(name)
        statements = set(entry["executed_lines"]) | set(entry["missing_lines"])
        branches = {tuple(b) for b in entry.get("missing_branches", []) + entry.get("executed_branches", [])}
        cpu_only = cpu_only_lines(Path(path).read_text(errors="replace"))
        figures[name] = FileFigures(name, scope.name if scope else "", statements, branches,
                                    {n: why for n, why in cpu_only.items() if n in statements})
    return figures


def write_figures(figures: dict[str, FileFigures], path: Path) -> None:
    """The analysis behind a campaign's figures, for a reader whose environment lacks the framework (a fleet's
    driver merging a shard that ran in an environment of its own)."""
    _write_whole({"format": FORMAT, "files": {
        name: {"scope": f.scope, "statements": sorted(f.statements), "branches": sorted(map(list, f.branches)),
               "cpu_only": {str(n): why for n, why in sorted(f.cpu_only.items())}}
        for name, f in sorted(figures.items())}}, path)


def read_figures(path: Path) -> dict[str, FileFigures]:
    """``write_figures``'s file; none where it is absent; a typed error where it is not one."""
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
        if data.get("format") != FORMAT:
            raise ValueError(f"format {data.get('format')!r}, not {FORMAT}")
        return {name: FileFigures(name, entry["scope"], set(entry["statements"]),
                                  {(a, b) for a, b in entry["branches"]},
                                  {int(n): why for n, why in entry["cpu_only"].items()})
                for name, entry in data["files"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CoverageDataError(f"{path}: not a coverage analysis the harness wrote ({exc})") from None


def summarise(measured: Measured, figures: dict[str, FileFigures]) -> dict:
    """The figures reports show (``figures``: ``analyse_files``): per scope and per file (lines and branches,
    covered of reachable on CPU, what stays missing and what needs a device), and per label (property) per scope."""
    union = measured.union()
    files = {name: {"scope": f.scope, **f.figures(union.get(name, set())),
                    "cpu_only_lines": {str(n): why for n, why in sorted(f.cpu_only.items())}}
             for name, f in sorted(figures.items())}
    return {"scopes": _by_scope(files), "files": files,
            "by_label": {label: _by_scope({name: {"scope": f.scope, **f.figures(arcs.get(name, set()))}
                                           for name, f in figures.items()})
                         for label, arcs in sorted(measured.labels.items())}}


def _by_scope(files: dict[str, dict]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for entry in files.values():
        total = out.setdefault(entry["scope"], {"files": 0, "statements": 0, "reachable": 0, "covered": 0,
                                                "cpu_only": 0, "branches": 0, "covered_branches": 0})
        total["files"] += 1
        for key in ("statements", "reachable", "covered", "cpu_only", "branches", "covered_branches"):
            total[key] += entry[key]
    for total in out.values():
        total["line_percent"] = _percent(total["covered"], total["reachable"])
        total["branch_percent"] = _percent(total["covered_branches"], total["branches"])
    return out


def _percent(part: int, whole: int) -> float:
    return round(100.0 * part / whole, 1) if whole else 0.0
