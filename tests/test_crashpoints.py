"""Exhaustive crash points of a 2-rank, 4-tensor reference save (sync and async): after a SIGKILL at every
syscall, the latest load gives the acknowledged or the new checkpoint or a clear error (P-ATOMIC), the
acknowledged checkpoint survives bitwise (P-NOLOSS), and the next save recovers."""

from __future__ import annotations

import numpy as np
import pytest

from faults import strace
from harness.crash import crashpoints, standard_case
from properties.atomic import judge_after_crash
from reference import CheckpointIncomplete, Tensor

pytestmark = pytest.mark.skipif(not strace.available(), reason="needs strace with ptrace permitted")


@pytest.mark.slow
@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_reference_is_atomic_at_every_crash_point(use_async: bool) -> None:
    results = crashpoints(standard_case(), use_async=use_async)
    assert len(results) >= 30  # files, manifests, index, renames, latest pointer: every one of them
    assert all(r.killed for r in results), [r.point for r in results if not r.killed]
    failing = [(r.point.index, r.where, r.judgement.details) for r in results if not r.judgement.ok or not r.recovered]
    assert not failing, failing
    assert {r.point.syscall for r in results} >= {"write", "fsync", "rename", "openat"}


def test_judge_after_crash_classifies() -> None:
    a = {"w": Tensor.from_array(np.array([1.0], "float32"))}
    b = {"w": Tensor.from_array(np.array([2.0], "float32"))}
    mixed = {"w": Tensor.from_array(np.array([3.0], "float32"))}
    errors = (CheckpointIncomplete,)
    assert judge_after_crash(a, b, a, a, errors).ok
    assert judge_after_crash(a, b, b, a, errors).ok
    assert judge_after_crash(a, b, CheckpointIncomplete("x"), a, errors).ok
    assert judge_after_crash(a, b, mixed, a, errors).verdict.value == "silent-corruption"
    assert judge_after_crash(a, b, KeyError("x"), a, errors).verdict.value == "loud-failure"
    assert judge_after_crash(a, b, a, CheckpointIncomplete("gone"), errors).verdict.value == "data-loss"
    assert judge_after_crash(a, b, a, mixed, errors).verdict.value == "data-loss"
