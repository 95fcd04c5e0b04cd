"""No fault can stall a campaign past its bound: for every kind of fault, a SUT that never gives up (it waits
forever, using no CPU, for a failed call, a dead peer, a stopped peer, a checkpoint it cannot read or a writer
that is held) ends at the case's op timeout with a hang verdict, and the same judge then runs the next case as if
nothing had happened, leaving no process behind."""

from __future__ import annotations

import dataclasses
import time

import psutil
import pytest

from faults import strace
from faults.spec import (
    CorruptFault,
    ErrorFault,
    Fault,
    FsizeFault,
    KillFault,
    KillWhenFault,
    PowerFault,
    StallFault,
)
from harness.judging.fault_runs import standard_case
from harness.judging.judge import Judge
from harness.ranks.runners import Runners
from harness.sut.reference import agreed_save_id
from properties.model.case import Op

needs_strace = pytest.mark.skipif(not strace.available(), reason="needs strace with ptrace permitted")
SUT = "tests.suts.buggy:WaitsOutEveryFaultSut"
OP_TIMEOUT = 4.0
# Each op may take the op timeout; a hang costs one, a rank's restart a few seconds more on a loaded machine.
BOUND_S = 60.0
RANK1_DATA = f".staging-step-1-{agreed_save_id('step-1')}/rank-00001.safetensors"
# A peer's part is waited for an hour: only the harness's bound ends the wait.
OPTIONS = {"op_timeout": OP_TIMEOUT, "commit_timeout": 3600}

FAULTS: dict[str, Fault] = {
    "kill": KillFault(op=1, syscall="write", k=1, path=RANK1_DATA, rank=1),
    "error": ErrorFault(op=1, syscall="write", k=1, path=RANK1_DATA, rank=1, errno="ENOSPC"),
    "fsize": FsizeFault(op=1, limit=64),
    # at once: a file trigger polls, and a staging file that lives a few milliseconds can be missed under load
    "kill-when": KillWhenFault(op=1, rank=1, delay=0.0),
    "stall": StallFault(op=1, rank=1, delay=0.0, duration=600.0),
    "power": PowerFault(op=1, index=0),
    "corrupt": CorruptFault(op=1, seed=1, corruption="truncate", region="any"),
}


def _held_writer_case():
    """A detached async save whose writer is held, and a load (which waits for that writer first) with no
    ``resume`` coming before it."""
    base = standard_case(sut=SUT)
    ops = (Op("save", "step-0", 0), Op("save", "step-1", 1, use_async=True, detach=True, stall=True),
           Op("load", "step-0", 0), Op("resume"), Op("wait"), Op("load", "step-1", 1))
    return dataclasses.replace(base, ops=ops, property="P-LIFECYCLE", options=OPTIONS)


def _cases():
    base = dataclasses.replace(standard_case(sut=SUT), options=OPTIONS)
    cases = {kind: dataclasses.replace(base, fault=fault) for kind, fault in FAULTS.items()}
    cases["held-writer"] = _held_writer_case()
    return cases


CASES = _cases()


def _leftovers() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if p.is_running()
            and p.status() != psutil.STATUS_ZOMBIE]


@needs_strace
@pytest.mark.parametrize("kind", sorted(CASES))
def test_a_fault_the_sut_never_gets_over_ends_at_the_bound_as_a_hang(kind: str) -> None:
    judge = Judge(Runners(SUT, "pool"))
    try:
        start = time.monotonic()
        judgement, _ = judge(CASES[kind])
        took = time.monotonic() - start
        assert judgement.verdict.value == "hang", (kind, judgement.details)
        assert took < BOUND_S, f"{kind}: {took:.0f} s"
        recovery = dataclasses.replace(standard_case(sut=SUT), options=OPTIONS)  # the next case, no fault
        after, _ = judge(recovery)
        assert after.ok, (kind, after.details)
    finally:
        judge.close()
    deadline = time.monotonic() + 10
    while _leftovers() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _leftovers(), [p.cmdline() for p in _leftovers()]
