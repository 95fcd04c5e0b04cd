"""The fuzz/replay/list CLI end to end: the reference yields no findings; broken SUTs are caught, shrunk, and
replayed; bad input to the harness gets one clear line and exit status 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.cli import main


def _findings(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((out / "findings").glob("*.json"))]


def test_reference_fuzz_finds_nothing(tmp_path: Path, capsys) -> None:
    code = main(["fuzz", "--sut", "reference", "--ranks", "2", "--time", "4", "--out", str(tmp_path), "--seed", "1"])
    assert code == 0, capsys.readouterr()
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert sum(summary["cases_run"].values()) > 0
    assert all(v == 0 for v in summary["findings"].values())
    assert summary["launch_mode"] == "in-process" and summary["shims"] == []
    assert "No findings." in (tmp_path / "report.md").read_text()


@pytest.mark.parametrize(
    ("sut", "prop", "verdict"),
    [
        ("tests.suts.buggy:FlipsLastElementSut", "P-ROUNDTRIP", "silent-corruption"),
        ("tests.suts.buggy:LoadsLatestAlwaysSut", "P-REPEAT", "silent-corruption"),
        ("tests.suts.buggy:NoSnapshotAsyncSut", "P-ASYNC-ISOLATION", "silent-corruption"),
    ],
)
def test_broken_sut_is_caught_shrunk_and_replayed(tmp_path: Path, capsys, sut: str, prop: str, verdict: str) -> None:
    out = tmp_path / "out"
    code = main(["fuzz", "--sut", sut, "--ranks", "2", "--time", "20", "--out", str(out), "--property", prop,
                 "--seed", "7"])
    assert code == 1
    (finding,) = _findings(out)
    assert finding["property"] == prop and finding["verdict"] == verdict and finding["sut"] == sut
    case = finding["case"]
    # shrunk: one small tensor (special-value or seeded), few elements
    assert len(case["tensors"]) == 1
    assert all(len(t["shape"]) <= 1 and all(s <= 2 for s in t["shape"]) for t in case["tensors"])
    report = (out / "report.md").read_text()
    assert verdict in report and "ckpt-harness replay" in report
    finding_file = next((out / "findings").glob("*.json"))
    capsys.readouterr()
    assert main(["replay", str(finding_file)]) == 1
    assert verdict in capsys.readouterr().out
    # the bare case replays too, and passes on the reference
    case["sut"] = "reference"
    fixed = tmp_path / "fixed.json"
    fixed.write_text(json.dumps(case))
    assert main(["replay", str(fixed)]) == 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["fuzz", "--sut", "no-such-sut", "--time", "1", "--out", "{tmp}"], "unknown SUT 'no-such-sut'"),
        (["fuzz", "--sut", "nosuchpkg.mod:Cls", "--time", "1", "--out", "{tmp}"], "cannot import SUT adapter"),
        (["fuzz", "--sut", "reference", "--time", "1", "--out", "{tmp}", "--property", "P-NOPE"], "unknown property"),
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
    assert "reference" in out and "P-RESHARD" in out and "P-ATOMIC" in out
