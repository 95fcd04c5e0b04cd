"""``fuzz --skip-known``: regression cases with a signature explain failures, so a campaign looks past them; a
failure that shows anything else still counts, and bad input is named in one line."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from properties.anomalies import At, TensorDiffers, judged
from properties.known import KnownFindingsError, explained_by, read_known
from properties.verdicts import Judgement, Verdict
from reference.tensor import BitsDiffer

REGRESSIONS = Path(__file__).parent / "regressions"
LOAD = At(1, "load", "step-1")
NAN = TensorDiffers("P-ROUNDTRIP", LOAD, 0, BitsDiffer("model/b", 3, 4, (0,), "0x7fc1", "0x7fc0", "nan", "nan"))
OTHER = TensorDiffers("P-ROUNDTRIP", LOAD, 1, BitsDiffer("model/w", 1, 3, (2,), "0x3f80", "0x0000", "1.0", "0.0"))


def test_the_examples_read_as_a_real_diff_does() -> None:
    assert judged([NAN, OTHER]).details == (
        "op 1 (load step-1), rank 0: model/b: 3 of 4 elements differ; first at index [0]: expected 0x7fc1 (nan), "
        "got 0x7fc0 (nan)",
        "op 1 (load step-1), rank 1: model/w: 1 of 3 elements differ; first at index [2]: expected 0x3f80 (1.0), "
        "got 0x0000 (0.0)")


def test_the_uc_findings_carry_signatures() -> None:
    """Each signature is checked against the real failure by tests/test_regressions.py."""
    assert {k.case_file for k in read_known(REGRESSIONS)} >= {"paddleformers-uc-bf16-nan-payload-sync-save.json",
                                                             "paddleformers-uc-dp2-fp32-resume-on-one-rank.json"}


def test_a_failure_is_known_only_if_every_line_is_explained() -> None:
    known = read_known(REGRESSIONS)
    silent = Verdict.SILENT_CORRUPTION
    assert explained_by(known, "paddleformers-uc", judged([NAN])) == "paddleformers-uc-bf16-nan-payload-sync-save.json"
    assert explained_by(known, "paddleformers-uc", judged([NAN, dataclasses.replace(NAN, rank=1)]))
    assert explained_by(known, "paddleformers-uc", judged([NAN, OTHER])) is None
    assert explained_by(known, "paddle-dcp", judged([NAN])) is None  # another SUT
    lost = judged([NAN])
    assert explained_by(known, "paddleformers-uc", dataclasses.replace(lost, verdict=Verdict.DATA_LOSS)) is None
    assert explained_by(known, "paddleformers-uc", Judgement("P-ROUNDTRIP", Verdict.PASS)) is None
    bare = Judgement("P-ROUNDTRIP", silent, lost.details)  # lines without anomalies: nothing to match
    assert explained_by(known, "paddleformers-uc", bare) is None


def test_bad_known_findings_are_named(tmp_path: Path) -> None:
    with pytest.raises(KnownFindingsError, match="not a directory"):
        read_known(tmp_path / "missing")
    (tmp_path / "bad.json").write_text(json.dumps({"sut": "x", "verdict": "hang", "signature": "(unclosed"}))
    with pytest.raises(KnownFindingsError, match=r"bad\.json: error"):
        read_known(tmp_path)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(KnownFindingsError, match=r"bad\.json: JSONDecodeError"):
        read_known(tmp_path)
    for signature, message in [({"anomaly": "meteor"}, "must be one of"),
                               ({"anomaly": "rank-hung", "colour": "red"}, r"no fields \['colour'\]"),
                               ({"anomaly": "rank-hung", "message": {"regex": "(unclosed"}}, "error"),
                               ({"anomaly": "rank-hung", "message": {"glob": "*"}}, "regex"),
                               (3, "TypeError")]:
        (tmp_path / "bad.json").write_text(json.dumps({"sut": "x", "verdict": "hang", "signature": signature}))
        with pytest.raises(KnownFindingsError, match=message):
            read_known(tmp_path)
    (tmp_path / "bad.json").write_text(json.dumps({"sut": "x", "verdict": "hang"}))  # no signature: left out
    assert read_known(tmp_path) == []


def test_cli_names_a_missing_known_directory_in_one_line(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "fuzz", "--sut", "reference", "--time", "1",
                           "--out", str(tmp_path / "out"), "--skip-known", str(tmp_path / "nowhere")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "is not a directory of regression cases" in proc.stderr and "Traceback" not in proc.stderr
