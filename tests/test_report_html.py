"""report.html in a real headless browser (Debian's chromium): the page shows what summary.json says — the buckets
and their cases, the totals its script counts from the embedded JSON, and for crashpoints the crash-point map with
every point or state placed on the recorded IO, coloured by verdict."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

import pytest

from harness.cli import main

from .browser import chromium, dump_dom, screenshot

needs_chromium = pytest.mark.skipif(chromium() is None, reason="chromium is not installed (apt-get install -y "
                                    "chromium; CI installs it)")


class _Dom(HTMLParser):
    """Every element's tag, attributes and text, flat: enough to find rows by class and data attributes."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.elements: list[dict] = []
        self._open: list[dict] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list) -> None:
        element = {"tag": tag, **{k: v or "" for k, v in attrs}, "text": ""}
        self.elements.append(element)
        if tag not in ("br", "meta", "rect", "circle", "path", "line"):
            self._open.append(element)

    def handle_endtag(self, tag: str) -> None:
        while self._open and self._open.pop()["tag"] != tag:
            pass

    def handle_data(self, data: str) -> None:
        for element in self._open:
            element["text"] += data

    def find(self, cls: str) -> list[dict]:
        return [e for e in self.elements if cls in e.get("class", "").split()]

    def by_id(self, ident: str) -> dict:
        return next(e for e in self.elements if e.get("id") == ident)


@needs_chromium
def test_fuzz_report_page_shows_the_buckets_of_the_json(tmp_path: Path) -> None:
    out = tmp_path / "out"
    code = main(["fuzz", "--sut", "tests.suts.buggy:TwoBugsSut", "--ranks", "2", "--time", "6", "--out", str(out),
                 "--property", "P-ROUNDTRIP", "--property", "P-EDGE", "--seed", "3", "--launch", "in-process"])
    assert code == 1
    summary = json.loads((out / "summary.json").read_text())
    dom = _Dom(dump_dom(out / "report.html"))
    rows = dom.find("bucket")
    assert [r["data-bucket"] for r in rows] == [b["bucket"] for b in summary["buckets"]]
    assert [int(r["data-cases"]) for r in rows] == [b["cases"] for b in summary["buckets"]]
    new = sum(1 for b in summary["buckets"] if b["status"].startswith("new"))
    cases = sum(summary["cases_run"].values())
    hits = sum(b["cases"] for b in summary["buckets"])
    # Written by the page's script from the embedded JSON: the browser ran it, and it agrees with the file.
    assert dom.by_id("totals")["text"] == (f"{len(rows)} buckets ({new} new, {len(rows) - new} known), {hits} failing "
                                           f"cases, {cases} cases run")
    props = {r["data-property"] for r in dom.find("property")}
    assert props == set(summary["cases_run"])
    assert len(dom.find("feature")) == len(summary["swarm_per_feature"])
    for finding in (out / "findings").glob("*.json"):  # every finding linked from its bucket row
        assert any(e.get("href") == f"findings/{finding.name}" for e in dom.elements)
    png = screenshot(out / "report.html", tmp_path / "page.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


@needs_chromium
@pytest.mark.multirank
def test_crashpoints_page_draws_the_crash_point_map(tmp_path: Path) -> None:
    from harness.judging.fault_runs import standard_case

    case = tmp_path / "case.json"
    case.write_text(json.dumps(standard_case(4, "reference").to_json()))
    out = tmp_path / "out"
    assert main(["crashpoints", str(case), "--states", "--limit", "6", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    io_map = summary["io_map"]
    assert {lane["rank"] for lane in io_map["lanes"]} == {0, 1}  # a lane per rank process
    kinds = {e["kind"] for e in io_map["events"]}
    assert {"write", "fsync", "rename"} <= kinds
    dom = _Dom(dump_dom(out / "report.html"))
    marks = dom.find("mark")
    assert len(marks) == len(io_map["marks"]) == len(summary["crash_results"]) == summary["total"] > 0
    assert [m["data-verdict"] for m in marks] == [str(m["verdict"]) for m in io_map["marks"]]
    assert len(dom.find("io")) == len(io_map["events"])
    failing = sum(1 for r in summary["crash_results"] if r["verdict"] not in ("pass", None))
    assert dom.by_id("totals")["text"] == (f"{summary['judged']}/{summary['total']} crash points and states judged, "
                                           f"{failing} failing")
    assert len(dom.find("crash")) == summary["total"] and "Crash-point map" in (out / "report.html").read_text()
    assert "crash states" in (out / "report.md").read_text()


def test_trends_and_standalone_repro_links_are_rendered_from_the_json(tmp_path: Path) -> None:
    """Nights recorded in a corpus become opened/closed per night; a finding's standalone reproducer (issue 17's
    ``repro`` and ``standalone_verified``) is linked from its bucket row when the summary carries it."""
    from harness.campaign.corpus import record_night, trends
    from harness.report.html import render

    for failing in (["a", "b"], ["b", "c"]):
        record_night(tmp_path, {"sut": "s", "buckets": [{"bucket": x} for x in failing], "cases_run": {"P": 3}})
    nights = trends(tmp_path)
    assert [(n["opened"], n["closed"]) for n in nights] == [(["a", "b"], []), (["c"], ["a"])]
    assert nights[-1]["first_seen"]["b"] == nights[0]["night"]
    bucket = {"bucket": "c", "status": "new", "title": "t", "cases": 2, "repro": "findings/000-repro",
              "standalone_verified": True, "verdict": "data-loss"}
    page = _Dom(render({"sut": "s", "cases_run": {"P": 3}, "buckets": [bucket], "trends": nights}, [], tmp_path))
    (row,) = page.find("bucket")
    assert row["data-bucket"] == "c" and "verified" in row["text"] and nights[-1]["night"] in row["text"]
    assert any(e.get("href") == "findings/000-repro" for e in page.elements)
    rows = page.find("night")
    assert len(rows) == 2 and all(r["text"].startswith(n["night"]) for r, n in zip(rows, nights))
