"""Coverage of the frameworks' checkpoint code (harness/coverage/): recorded in every kind of process, never lost to
a kill, merged by label, analysed against what a CPU build can run, reported, and steering the campaign's time."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.campaign.guidance import (
    HIGH,
    KEEP_HIGH,
    KEEP_LOW,
    LOW,
    arms,
    keep_odds,
    leave_out_weight,
    note_turn,
    slice_factor,
)
from harness.campaign.results import Campaign
from harness.cli import main
from harness.coverage.merge import CoverageDataError, FileFigures, Measured, read_dir, read_file, summarise, write_file
from harness.coverage.reachability import cpu_only_lines
from harness.coverage.scope import SCOPES, scope_of
from harness.sut import REGISTRY, framework_available

REPO = Path(__file__).parent.parent
needs_paddle = pytest.mark.skipif(not framework_available(REGISTRY["paddle-dcp"]), reason="needs paddle")
IO = "paddle/framework/io.py"

# A process that records, saves and loads a tensor through paddle.save under a label, forks a child that saves
# again, and then waits to be killed (or ends, with "end").
_RECORDING = r"""
import os, sys, time
import numpy as np
import paddle
from harness.coverage import measure

measure.start({measure.COVERAGE_OPTION: {"dir": sys.argv[1]}})
measure.case_begins("P-ONE")
path = os.path.join(sys.argv[1], "t.pdparams")
paddle.save({"t": paddle.to_tensor(np.arange(3, dtype="float32"))}, path)
paddle.load(path)
measure.case_ends()
pid = os.fork()
if pid == 0:
    measure.case_begins("P-CHILD")
    paddle.save({"u": paddle.to_tensor(np.zeros(2, dtype="float32"))}, path + ".child")
    measure.case_ends()
    os._exit(0)
os.waitpid(pid, 0)
measure.case_begins("P-TWO")
paddle.load(path)
print("ready", flush=True)
if sys.argv[2] == "end":
    sys.exit(0)
time.sleep(600)
"""


@needs_paddle
@pytest.mark.parametrize("how", ["end", "kill"])
def test_every_process_writes_what_it_ran_and_a_kill_loses_at_most_its_last_case(tmp_path: Path, how: str) -> None:
    """A rank's recording, by label, in a file of its own; a forked child's in another; a SIGKILL leaves every file
    readable (only the case in progress is lost), while an orderly end writes that case too."""
    proc = subprocess.Popen([sys.executable, "-c", _RECORDING, str(tmp_path), how], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready", proc.stderr.read()
        if how == "kill":
            proc.send_signal(signal.SIGKILL)
        proc.wait(120)
    finally:
        proc.kill()
        proc.wait()
    files = sorted(tmp_path.glob("*.json"))
    assert len(files) == 2 and not list(tmp_path.glob("*.tmp"))  # parent and child, each whole
    measured = read_dir(tmp_path)
    assert measured.labels["P-ONE"][IO] and measured.labels["P-CHILD"][IO]
    assert ("P-TWO" in measured.labels) == (how == "end")
    assert all(scope_of(name) is not None for files in measured.labels.values() for name in files)


def test_a_coverage_file_the_harness_did_not_write_is_a_typed_error(tmp_path: Path) -> None:
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(CoverageDataError, match=r"x\.json"):
        read_dir(tmp_path)
    (tmp_path / "x.json").write_text(json.dumps({"format": 99, "labels": {}}))
    with pytest.raises(CoverageDataError, match="format"):
        read_dir(tmp_path)


def test_recordings_merge_as_sets_and_survive_a_round_trip(tmp_path: Path) -> None:
    a, b = Measured(), Measured()
    a.add("P-A", IO, [(-1, 1), (1, 2)])
    b.add("P-A", IO, [(1, 2), (2, 3)])
    b.add("P-B", IO, [(5, 6)])
    assert a.merge(b) == 2 and a.arc_count() == 4  # (1, 2) counted once
    write_file(a, tmp_path / "c.json")
    assert read_file(tmp_path / "c.json").to_json() == a.to_json()
    assert read_file(tmp_path / "absent.json").labels == {}


def test_covering_cases_are_kept_newest_first_and_read_back_as_cases(tmp_path: Path, monkeypatch) -> None:
    from harness.campaign import corpus as corpus_module
    from harness.campaign.explore import shape_case
    from harness.sut import adapter_class
    from properties.model.case import read_case_file

    monkeypatch.setattr(corpus_module, "COVERING_MAX", 2)
    corpus = corpus_module.Corpus(tmp_path)
    cases = [shape_case("reference", adapter_class("reference").capabilities, 2, s) for s in ("S", "SS", "SR")]
    paths = []
    for case in cases:
        paths.append(corpus.keep_covering("reference", case))
        time.sleep(0.01)  # distinct modification times
    kept = corpus.covering("reference")
    assert sorted(kept) == sorted(paths[1:])  # the oldest went
    assert [read_case_file(p)[0] for p in sorted(kept, key=paths.index)] == cases[1:]


def test_device_only_branches_are_listed_with_their_condition_not_counted_as_missed() -> None:
    source = ("import paddle\n"
              "def f(x):\n"
              "    if paddle.is_compiled_with_cuda():\n"
              "        x = x.cuda()\n"
              "    if not paddle.is_compiled_with_xpu():\n"
              "        return x\n"
              "    else:\n"
              "        return x.xpu()\n"
              "    if x or paddle.is_compiled_with_cuda():\n"
              "        return 1\n")
    lines = cpu_only_lines(source)
    assert set(lines) == {4, 8}  # the CUDA body, the XPU else; not a disjunction that holds on CPU
    assert "is_compiled_with_cuda" in lines[4]
    figures = FileFigures(IO, "paddle.framework.io", {2, 3, 4, 5, 6, 8, 9, 10}, {(3, 4), (3, 5), (9, 10), (9, -2)},
                          lines)
    got = figures.figures({(-2, 2), (2, 3), (3, 5), (5, 6)})
    assert got["reachable"] == 6 and got["covered"] == 4 and got["cpu_only"] == 2
    assert got["missing"] == [9, 10] and got["branches"] == 4 and got["covered_branches"] == 1


def test_the_summary_counts_per_scope_and_per_label() -> None:
    m = Measured()
    m.add("P-A", IO, [(-1, 1), (1, 2)])
    m.add("P-B", IO, [(2, 3)])
    figures = {IO: FileFigures(IO, "paddle.framework.io", {1, 2, 3, 4}, {(2, 3), (2, 4)}, {})}
    block = summarise(m, figures)
    assert block["scopes"]["paddle.framework.io"]["covered"] == 3
    assert block["scopes"]["paddle.framework.io"]["line_percent"] == 75.0
    assert block["by_label"]["P-A"]["paddle.framework.io"]["covered"] == 2
    assert block["by_label"]["P-B"]["paddle.framework.io"]["covered_branches"] == 1


def test_scopes_name_the_checkpoint_code_of_each_framework() -> None:
    names = {s.name for s in SCOPES}
    assert {"flex checkpoint", "paddle.framework.io", "unified checkpoint", "torch dcp"} <= names
    assert scope_of("paddle/distributed/flex_checkpoint/dcp/utils.py").name == "flex checkpoint"
    assert scope_of("paddle/distributed/flex_checkpoint/aoa/aoa_engine.py").name == "flex checkpoint"
    assert scope_of("paddle/nn/layer/layers.py") is None


def test_turns_that_add_coverage_get_longer_slices_within_bounds() -> None:
    campaign = Campaign("reference", 2, ["P-A", "P-B", "P-C"], 60.0, 0)
    campaign.coverage_dir = Path("unused")
    assert slice_factor(campaign, "P-A") == 1.0  # no turn yet
    campaign.coverage_turns = {"P-A": [(400, 10.0)], "P-B": [(0, 10.0)], "P-C": [(150, 10.0)]}
    assert slice_factor(campaign, "P-A") == HIGH and slice_factor(campaign, "P-B") == LOW
    assert LOW < slice_factor(campaign, "P-C") < HIGH
    campaign.coverage_guided = False
    assert slice_factor(campaign, "P-A") == 1.0


def test_a_feature_or_fix_that_paid_off_is_drawn_more_and_unguided_choices_stay_even() -> None:
    """A swarm feature whose batches added coverage is kept more often, one whose absence paid off less often; a
    fix whose rounds without it reached more is left out more. Until an arm was seen both ways, or without
    guidance, every choice is the unguided one."""
    campaign = Campaign("reference", 2, ["P-A"], 60.0, 0)
    campaign.coverage_dir = Path("unused")
    note_turn(campaign, "P-A", 300, 10.0, ["zero_size", "fix:f1"], ["flag:x"])
    assert keep_odds(campaign, "zero_size") == 0.5 and leave_out_weight(campaign, "f1") == 1.0  # one way only
    note_turn(campaign, "P-A", 0, 10.0, ["flag:x"], ["zero_size", "fix:f1"])
    assert keep_odds(campaign, "zero_size") > 0.5 > keep_odds(campaign, "flag:x") >= KEEP_LOW
    assert leave_out_weight(campaign, "f1") == LOW
    for _ in range(5):
        note_turn(campaign, "P-A", 0, 10.0, ["zero_size"], [])
        note_turn(campaign, "P-A", 900, 1.0, [], ["zero_size", "fix:f1"])
    assert keep_odds(campaign, "zero_size") == KEEP_LOW and leave_out_weight(campaign, "f1") == HIGH
    assert len(campaign.feature_turns["zero_size"][True]) == 3  # the window only
    assert arms(campaign) == {"keep_odds": {"flag:x": keep_odds(campaign, "flag:x"), "zero_size": KEEP_LOW},
                              "leave_out_weight": {"f1": HIGH}}
    assert len(campaign.coverage_turns["P-A"]) == 12  # a property keeps every turn (the report sums them)
    campaign.coverage_guided = False
    assert keep_odds(campaign, "zero_size") == 0.5 and leave_out_weight(campaign, "f1") == 1.0
    assert KEEP_HIGH < 1


@needs_paddle
@pytest.mark.slow
@pytest.mark.parametrize("launch", ["pool", "virtual"])
def test_a_campaign_reports_coverage_of_flex_checkpoint(tmp_path: Path, launch: str, capsys) -> None:
    """The README's main job, shortened: summary.json carries per-scope, per-file and per-property coverage of
    flex checkpoint (launched ranks and virtual ones alike), report.md and report.html show it, the merged
    recording is kept and the processes' own files are gone; --coverage off records nothing."""
    out, corpus = tmp_path / "on", tmp_path / "corpus"
    main(["fuzz", "--sut", "paddle-dcp", "--ranks", "2", "--time", "12", "--out", str(out), "--launch", launch,
          "--property", "P-ROUNDTRIP", "--property", "P-RESHARD", "--seed", "3", "--no-repro", "--no-known",
          "--corpus", str(corpus)])
    summary = json.loads((out / "summary.json").read_text())
    block = summary["coverage"]
    flex = block["scopes"]["flex checkpoint"]
    assert flex["covered"] > 0 and 0 < flex["line_percent"] <= 100 and flex["covered_branches"] > 0
    assert set(block["by_label"]) >= {"P-ROUNDTRIP", "setup"}  # importing the framework counts, forked or not
    assert sum(g["new_arcs"] for g in block["gain_by_property"].values()) > 0
    assert set(block["guidance"]) == {"keep_odds", "leave_out_weight"}
    assert block["arcs"] == read_file(out / "coverage.json").arc_count() > 0
    assert sorted(p.name for p in out.iterdir()) == ["coverage-figures.json", "coverage.json", "findings",
                                                     "report.html", "report.md", "summary.json"]
    assert read_file(corpus / "coverage" / "paddle-dcp.json").arc_count() == block["arcs"]  # the first night's
    assert block["corpus"]["flex checkpoint"]["covered"] == flex["covered"]
    assert list((corpus / "covering" / "paddle-dcp").glob("*.json"))  # cases that reached new code, kept
    assert "Coverage of the framework's checkpoint code" in (out / "report.md").read_text()
    page = (out / "report.html").read_text()
    assert "class=miss" in page and "load_state_dict.py" in page
    off = tmp_path / "off"
    main(["fuzz", "--sut", "paddle-dcp", "--ranks", "2", "--time", "3", "--out", str(off), "--launch", launch,
          "--property", "P-ROUNDTRIP", "--seed", "3", "--no-repro", "--no-known", "--coverage", "off"])
    assert json.loads((off / "summary.json").read_text())["coverage"] is None
    assert not (off / "coverage.json").exists()



@needs_paddle
def test_a_fleet_merges_its_shards_coverage_and_grows_the_corpus_total(tmp_path: Path) -> None:
    """Two shards of one SUT: the night's block is their union; each shard's grown corpus file is merged into the
    shared one (never overwritten by the last shard)."""
    import base64

    from harness.fleet.driver import _fold
    from harness.report.coverage import corpus_file, fleet_coverage

    flex = "paddle/distributed/flex_checkpoint/dcp/utils.py"
    for shard, arcs in (("a", [(-1, 1), (1, 2)]), ("b", [(1, 2), (2, 3)])):
        m = Measured()
        m.add("P-ROUNDTRIP", flex, arcs)
        write_file(m, tmp_path / "out" / "shards" / shard / "coverage.json")
        _fold(tmp_path / "corpus", {"coverage/paddle-dcp.json": base64.b64encode(
            json.dumps(m.to_json()).encode()).decode()})
    block = fleet_coverage(tmp_path / "out", [("a", "paddle-dcp"), ("b", "paddle-dcp")], tmp_path / "corpus")
    assert block is not None and block["arcs"] == 3
    assert set(block["by_label"]) == {"P-ROUNDTRIP"} and "flex checkpoint" in block["scopes"]
    assert read_file(corpus_file(tmp_path / "corpus", "paddle-dcp")).arc_count() == 3  # both shards' arcs
    assert "flex checkpoint" in block["corpus"]
    assert fleet_coverage(tmp_path / "none", [("a", "paddle-dcp")], None) is None


def test_a_fleet_counts_a_shards_files_its_own_environment_cannot_analyse(tmp_path: Path) -> None:
    """A shard that ran in an environment of its own (PaddleFormers) hands back its analysis beside its recording:
    the night counts that framework's files by it, where the driver's environment has no such files to analyse."""
    from harness.coverage.merge import FileFigures, read_figures, write_figures
    from harness.report.coverage import FIGURES, fleet_coverage

    uc = "paddleformers/trainer/unified_checkpoint/check_completion.py"
    shard = tmp_path / "out" / "shards" / "uc-1"
    m = Measured()
    m.add("P-ROUNDTRIP", uc, [(-1, 1), (1, 2), (2, 4)])
    write_file(m, shard / "coverage.json")
    analysed = {uc: FileFigures(uc, "unified checkpoint", {1, 2, 3, 4}, {(2, 3), (2, 4)}, {3: "is_compiled_with_cuda"})}
    write_figures(analysed, shard / FIGURES)
    assert read_figures(shard / FIGURES) == analysed
    block = fleet_coverage(tmp_path / "out", [("uc-1", "paddleformers-uc")], None)
    assert block is not None and block["scopes"]["unified checkpoint"] == {
        "files": 1, "statements": 4, "reachable": 3, "covered": 3, "cpu_only": 1, "branches": 2,
        "covered_branches": 1, "line_percent": 100.0, "branch_percent": 50.0}
    (shard / FIGURES).write_text("{}")
    with pytest.raises(CoverageDataError, match="not a coverage analysis"):
        fleet_coverage(tmp_path / "out", [("uc-1", "paddleformers-uc")], None)


@needs_paddle
def test_coverage_without_its_package_is_one_line_and_exit_2(tmp_path: Path, monkeypatch, capsys) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "coverage" else real(name, *a))
    code = main(["fuzz", "--sut", "paddle-dcp", "--time", "1", "--out", str(tmp_path), "--no-repro"])
    err = capsys.readouterr().err
    assert code == 2 and "--coverage off" in err and "Traceback" not in err


def test_a_process_that_records_again_registers_its_exit_and_fork_hooks_once(tmp_path: Path, monkeypatch) -> None:
    """An in-process controller starts and stops recording with each run of its ranks: the recorder's own exit
    and fork hooks are one set however often it does."""
    import atexit

    from harness.coverage import measure

    ours = []
    register = atexit.register
    monkeypatch.setattr(atexit, "register", lambda f, *a, **k: (ours.append(f), register(f, *a, **k))[1])
    options = {measure.COVERAGE_OPTION: {"dir": str(tmp_path)}}
    for _ in range(3):
        measure.start(options)
        measure.stop()
    assert ours.count(measure._write_quietly) <= 1 and measure._hooked and not measure.recording()
