"""GPU mode on real GPUs: one GPU per rank, NCCL for device collectives and gloo for DCP's CPU group, tensors
created on the GPU, async saves staging device memory to the host. Runs torch-dcp and the reference at 2 and
4 ranks where that many GPUs exist; skipped (conftest) without 2 GPUs and a CUDA build of torch or Paddle.
`.ci/gpu` runs these and the GPU campaigns on a GPU runner (docs/gpu.md)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from harness.judging.judge import Judge
from harness.ranks.runners import Runners
from harness.sut import adapter_class
from properties.generate.fault_cases import fault_cases
from properties.model.case import Case
from properties.registry import property_cases
from tests.regressions_known import survivable

PROPS = ("P-ROUNDTRIP", "P-RESHARD", "P-EDGE", "P-ASYNC-ISOLATION", "P-EMA", "P-RESUME")


def _gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _check(judge: Judge, strategy, examples: int) -> None:
    @settings(max_examples=examples)
    @given(strategy)
    def check(case: Case) -> None:
        judgement, _ = judge(case)
        assert judgement.ok, "\n".join(judgement.details) + "\n" + case.dumps()

    check()


@pytest.mark.gpu
@pytest.mark.multirank
@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("sut", ["torch-dcp", "reference"])
def test_properties_on_gpus(sut: str, ranks: int) -> None:
    pytest.importorskip("torch")
    if _gpus() < ranks:
        pytest.skip(f"needs {ranks} GPUs")
    caps = frozenset(adapter_class(sut).capabilities)
    runners = Runners(sut, mode="pool", device="gpu" if sut == "torch-dcp" else "auto")
    judge = Judge(runners, exploring=True)
    try:
        for prop in PROPS:
            _check(judge, property_cases(prop, sut, ranks, caps), max(5, settings.default.max_examples // 8))
        if sut == "torch-dcp":
            # one GPU per rank: the save pool covers every GPU; loads on fewer ranks use the first ones
            assert {d.split(" ")[0] for d in runners.devices} == {f"cuda:{i}" for i in range(ranks)}
    finally:
        judge.close()


@pytest.mark.gpu
@pytest.mark.multirank
@pytest.mark.parametrize("ranks", [2, 4])
def test_rank_killed_mid_async_save_on_gpus(ranks: int) -> None:
    """P-ATOMIC on GPUs without strace: psutil kills a rank (or its DCP writer process) while an async save that
    staged device memory is in flight; fresh ranks must find the previous checkpoint and a clear history."""
    pytest.importorskip("torch")
    if _gpus() < ranks:
        pytest.skip(f"needs {ranks} GPUs")
    caps = frozenset(adapter_class("torch-dcp").capabilities)
    judge = Judge(Runners("torch-dcp", mode="pool", device="gpu"), exploring=True)
    try:
        strategy = fault_cases("P-ATOMIC", "torch-dcp", ranks, caps, ptrace=False).filter(survivable)
        _check(judge, strategy, max(4, settings.default.max_examples // 16))
    finally:
        judge.close()
