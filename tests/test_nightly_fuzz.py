"""Nightly: a long fuzz campaign of the reference against itself (must find nothing)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from harness.cli import main


@pytest.mark.nightly
@pytest.mark.timeout(3600)
def test_reference_long_fuzz_finds_nothing(tmp_path: Path) -> None:
    seconds = os.environ.get("CKPT_HARNESS_NIGHTLY_SECONDS", "1200")
    code = main(["fuzz", "--sut", "reference", "--ranks", "4", "--time", seconds, "--out", str(tmp_path)])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert code == 0, (tmp_path / "report.md").read_text()
    assert sum(summary["cases_run"].values()) > 100
