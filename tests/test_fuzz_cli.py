"""The fuzz/replay/list CLI end to end on real multi-process ranks: the reference yields no findings; broken SUTs
are caught, shrunk and replayed; dead and hung ranks become verdicts; bad input gets one clear line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.cli import main


def _findings(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((out / "findings").glob("*.json"))]


@pytest.mark.multirank
@pytest.mark.parametrize("launch", ["pool", "in-process"])
def test_reference_fuzz_finds_nothing(tmp_path: Path, capsys, launch: str) -> None:
    code = main(["fuzz", "--sut", "reference", "--ranks", "2", "--time", "300", "--cases", "1", "--out", str(tmp_path),
                 "--seed", "1", "--launch", launch])
    assert code == 0, capsys.readouterr()
    summary = json.loads((tmp_path / "summary.json").read_text())
    # Bounded by cases, not seconds: every property ran exactly its one, however slow the machine.
    assert summary["cases_per_property"] == 1 and len(summary["cases_run"]) >= 9
    assert set(summary["cases_run"].values()) == {1}, summary["cases_run"]
    assert all(v == 0 for v in summary["findings"].values())
    assert summary["launch_mode"] == launch and summary["shims"] == []
    assert summary["devices"] == ["cpu"]
    if launch == "pool":
        assert 1 <= summary["launches"] <= 2  # warm: one pool for 2 ranks, maybe one for 1-rank loads
    assert "No findings." in (tmp_path / "report.md").read_text()


@pytest.mark.parametrize(
    ("sut", "prop", "verdict", "launch"),
    [
        ("tests.suts.buggy:FlipsLastElementSut", "P-ROUNDTRIP", "silent-corruption", "in-process"),
        ("tests.suts.buggy:FlipsLastElementSut", "P-DIFF", "silent-corruption", "in-process"),
        ("tests.suts.buggy:LoadsLatestAlwaysSut", "P-REPEAT", "silent-corruption", "in-process"),
        ("tests.suts.buggy:NoSnapshotAsyncSut", "P-ASYNC-ISOLATION", "silent-corruption", "in-process"),
        pytest.param("tests.suts.buggy:FlipsLastElementSut", "P-RESHARD", "silent-corruption", "pool",
                     marks=pytest.mark.multirank),
    ],
)
def test_broken_sut_is_caught_shrunk_and_replayed(tmp_path: Path, capsys, sut, prop, verdict, launch) -> None:
    out = tmp_path / "out"
    code = main(["fuzz", "--sut", sut, "--ranks", "2", "--time", "20", "--out", str(out), "--property", prop,
                 "--seed", "7", "--launch", launch])
    assert code == 1
    (finding,) = _findings(out)
    assert finding["property"] == prop and finding["verdict"] == verdict and finding["sut"] == sut
    case = finding["case"]
    assert len(case["tensors"]) == 1  # shrunk: one small tensor
    assert all(len(t["shape"]) <= 1 and all(s <= 2 for s in t["shape"]) for t in case["tensors"])
    report = (out / "report.md").read_text()
    assert verdict in report and "ckpt-harness replay" in report
    finding_file = next((out / "findings").glob("*.json"))
    capsys.readouterr()
    assert main(["replay", str(finding_file), "--launch", launch]) == 1
    assert verdict in capsys.readouterr().out
    case["sut"] = "reference"  # the same case passes on the reference
    fixed = tmp_path / "fixed.json"
    fixed.write_text(json.dumps(case))
    assert main(["replay", str(fixed), "--launch", launch]) == 0


@pytest.mark.multirank
@pytest.mark.parametrize(
    ("sut", "verdict"),
    [("tests.suts.buggy:DiesOnLoadSut", "crash"), ("tests.suts.buggy:HangsOnLoadSut", "hang")],
)
def test_dead_or_hung_rank_is_a_verdict_and_the_pool_recovers(tmp_path: Path, capsys, sut, verdict) -> None:
    out = tmp_path / "out"
    code = main(["fuzz", "--sut", sut, "--ranks", "2", "--time", "5", "--out", str(out), "--property", "P-ROUNDTRIP",
                 "--seed", "3", "--op-timeout", "4"])
    assert code == 1, capsys.readouterr()
    (finding,) = _findings(out)
    assert finding["verdict"] == verdict
    summary = json.loads((out / "summary.json").read_text())
    assert summary["launches"] >= 2  # the pool was relaunched after each dead or hung case


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["fuzz", "--sut", "no-such-sut", "--time", "1", "--out", "{tmp}"], "unknown SUT 'no-such-sut'"),
        (["fuzz", "--sut", "nosuchpkg.mod:Cls", "--time", "1", "--out", "{tmp}"], "cannot import SUT adapter"),
        (["fuzz", "--sut", "reference", "--time", "1", "--out", "{tmp}", "--property", "P-NOPE"], "unknown property"),
        (["fuzz", "--sut", "reference", "--time", "1", "--out", "{tmp}", "--nnodes", "0"], "--nnodes must be"),
        (["fuzz", "--sut", "reference", "--time", "1", "--out", "{tmp}", "--cases", "0"], "--cases must be at least"),
        (["fuzz", "--sut", "reference", "--time", "1", "--out", "{tmp}", "--launch", "virtual"], "no virtual ranks"),
        (["replay", "{tmp}/missing.json"], "no such case file"),
        (["replay", "{tmp}/garbage.json"], "not a JSON case file"),
        (["replay", "{tmp}/bad_version.json"], "case version"),
        (["replay", "{tmp}/bad_dtype.json"], "unknown dtype"),
    ],
)
def test_bad_input_is_one_clear_line(tmp_path: Path, capsys, argv: list[str], message: str) -> None:
    (tmp_path / "garbage.json").write_text("{not json")
    (tmp_path / "bad_version.json").write_text(json.dumps({"version": 99}))
    good = {"version": 1, "property": "P-ROUNDTRIP", "sut": "reference", "save_layout": {}, "load_layout": {},
            "ops": [], "tensors": [{"name": "w", "dtype": "F33", "shape": [2]}]}
    (tmp_path / "bad_dtype.json").write_text(json.dumps(good))
    code = main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_list_names_suts_and_properties(capsys) -> None:
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "reference" in out and "paddle-dcp" in out and "P-RESHARD" in out and "P-ATOMIC" in out


def test_missing_framework_is_one_clear_line(tmp_path: Path, capsys, monkeypatch) -> None:
    from harness import sut

    monkeypatch.setitem(sut.REGISTRY, "needs-missing", sut.SutInfo("needs-missing", "x.y:Z", "no_such_framework_xyz"))
    code = main(["fuzz", "--sut", "needs-missing", "--time", "1", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "needs the Python package 'no_such_framework_xyz'" in err and "pip install" in err
    assert err.count("\n") == 1


def test_a_failure_the_harness_cannot_bucket_is_its_own_error_and_the_campaign_goes_on() -> None:
    """Bucketing a failure is the harness's work: where it raises, the case is counted as a harness error and a pass
    to Hypothesis, never a Hypothesis "flaky" error out of the campaign (a 64-rank virtual campaign ended that way:
    the error was met once, and the replay of the failing case ran after its property's slice, so it passed)."""
    from harness.campaign.fuzz import fuzz
    from harness.campaign.results import Campaign
    from harness.judging.judge import Judge
    from harness.ranks.runners import Runners
    from harness.sut import adapter_class

    class CannotBucket(Judge):
        def bucket(self, case, judgement, outcome):
            raise KeyError("no bucket")

    sut = "tests.suts.buggy:FlipsLastElementSut"
    judge = CannotBucket(Runners(sut, "in-process"))
    try:
        campaign = fuzz(judge, Campaign(sut, 1, ["P-ROUNDTRIP"], 300.0, 0, mode="in-process", cases_per_property=6),
                        frozenset(adapter_class(sut).capabilities))
    finally:
        judge.close()
    assert campaign.harness_errors and all("KeyError" in e for e in campaign.harness_errors)
    assert not campaign.findings and campaign.cases_run["P-ROUNDTRIP"] == 6


def test_a_harness_failure_on_one_case_is_reported_and_the_campaign_goes_on(tmp_path: Path) -> None:
    """The harness's own exception on a case (here: every third case) is neither a finding nor the campaign's end:
    it is counted in summary.json and report.md, and the other cases still run."""
    from harness.campaign.fuzz import fuzz
    from harness.campaign.results import Campaign
    from harness.judging.judge import Judge
    from harness.ranks.runners import Runners
    from harness.sut import adapter_class

    class Flaky(Judge):
        calls = 0

        def __call__(self, case):
            Flaky.calls += 1
            if Flaky.calls % 3 == 0:
                raise RuntimeError("harness bug")
            return super().__call__(case)

    judge = Flaky(Runners("reference", "in-process"))
    try:
        campaign = fuzz(judge, Campaign("reference", 1, ["P-ROUNDTRIP"], 3.0, 0, mode="in-process"),
                        frozenset(adapter_class("reference").capabilities))
    finally:
        judge.close()
    assert campaign.harness_errors and all("RuntimeError: harness bug" in e for e in campaign.harness_errors)
    assert not campaign.findings and campaign.cases_run["P-ROUNDTRIP"] > 0
