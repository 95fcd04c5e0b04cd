"""The fault-path defects of ``bench/planted_faults.py`` measure what ``bench/detect.py --faults`` claims: each one
passes a fault-free case of every op the explorer uses (saves, re-saves, rotations, loads), so a campaign that
finds it found it under a fault or in the order of its IO, never in a plain run."""

from __future__ import annotations

import pytest

from bench.planted_faults import FAULT_DEFECTS
from harness.campaign.explore import shape_case
from harness.judging.judge import Judge
from harness.ranks.runners import Runners
from harness.sut import adapter_class


@pytest.mark.parametrize("defect", sorted(FAULT_DEFECTS))
def test_a_fault_path_defect_passes_without_a_fault(defect: str) -> None:
    sut, ranks, mode = FAULT_DEFECTS[defect]
    case = shape_case(sut, adapter_class(sut).capabilities, ranks, "SRT")
    judge = Judge(Runners(sut, mode))
    try:
        judgement, _ = judge(case)
    finally:
        judge.close()
    assert judgement.ok, (defect, judgement.details)
