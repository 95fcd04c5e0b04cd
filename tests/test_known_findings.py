"""``fuzz --skip-known``: regression cases with a signature explain failures, so a campaign looks past them; a
failure that shows anything else still counts, and bad input is named in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from properties.known import KnownFindingsError, explained_by, read_known
from properties.verdicts import Judgement, Verdict

REGRESSIONS = Path(__file__).parent / "regressions"
NAN = ("op 1 (load step-1), rank 0: model/b: 3 of 4 elements differ; first at index [0]: expected 0x7fc1 (nan), "
       "got 0x7fc0 (nan)")
OTHER = ("op 1 (load step-1), rank 1: model/w: 1 of 3 elements differ; first at index [2]: expected 0x3f80 (1.0), "
         "got 0x0000 (0.0)")


def test_the_uc_findings_carry_signatures() -> None:
    """Each signature is checked against the real failure by tests/test_regressions.py."""
    assert {k.case_file for k in read_known(REGRESSIONS)} >= {"paddleformers-uc-bf16-nan-payload-sync-save.json",
                                                             "paddleformers-uc-dp2-fp32-resume-on-one-rank.json"}


def test_a_failure_is_known_only_if_every_line_is_explained() -> None:
    known = read_known(REGRESSIONS)
    silent = Verdict.SILENT_CORRUPTION
    assert explained_by(known, "paddleformers-uc", Judgement("P-ROUNDTRIP", silent, (NAN,))) == \
        "paddleformers-uc-bf16-nan-payload-sync-save.json"
    assert explained_by(known, "paddleformers-uc", Judgement("P-EDGE", silent, (NAN, NAN.replace("rank 0", "rank 1"))))
    assert explained_by(known, "paddleformers-uc", Judgement("P-ROUNDTRIP", silent, (NAN, OTHER))) is None
    assert explained_by(known, "paddle-dcp", Judgement("P-ROUNDTRIP", silent, (NAN,))) is None  # another SUT
    assert explained_by(known, "paddleformers-uc", Judgement("P-ROUNDTRIP", Verdict.DATA_LOSS, (NAN,))) is None
    assert explained_by(known, "paddleformers-uc", Judgement("P-ROUNDTRIP", Verdict.PASS)) is None


def test_bad_known_findings_are_named(tmp_path: Path) -> None:
    with pytest.raises(KnownFindingsError, match="not a directory"):
        read_known(tmp_path / "missing")
    (tmp_path / "bad.json").write_text(json.dumps({"sut": "x", "verdict": "hang", "signature": "(unclosed"}))
    with pytest.raises(KnownFindingsError, match=r"bad\.json: error"):
        read_known(tmp_path)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(KnownFindingsError, match=r"bad\.json: JSONDecodeError"):
        read_known(tmp_path)
    (tmp_path / "bad.json").write_text(json.dumps({"sut": "x", "verdict": "hang"}))  # no signature: left out
    assert read_known(tmp_path) == []


def test_cli_names_a_missing_known_directory_in_one_line(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "fuzz", "--sut", "reference", "--time", "1",
                           "--out", str(tmp_path / "out"), "--skip-known", str(tmp_path / "nowhere")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "is not a directory of regression cases" in proc.stderr and "Traceback" not in proc.stderr
