"""Which rank's error an op's record cites when ranks fail differently (harness.judging.run.cause)."""

from __future__ import annotations

import os
import time

import pytest

from harness.judging.run import CAUSE_MARGIN_S, _merge
from harness.ranks.runner import PoolFailure
from properties.model.outcome import OpRecord

TIMEOUT = "[/paddle/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:80] TIMEOUT"


def _reply(rank: int, seconds: float, error_type: str | None = None, error: str | None = None) -> dict:
    return {"rank": rank, "ok": error_type is None, "error_type": error_type, "error": error, "seconds": seconds,
            "loaded": {}, "traceback": f"tb {rank}" if error_type else None}


def _record(*replies: dict) -> OpRecord:
    rec = OpRecord(1, "load", "step-0")
    _merge(rec, list(replies))
    return rec


def test_a_peer_timing_out_on_the_rank_that_raised_cites_the_rank_that_raised() -> None:
    """Rank 1 raised at once; rank 0 waited in the next barrier until gloo gave up: rank 1's error is the bug."""
    rec = _record(_reply(0, 30.4, "RuntimeError", TIMEOUT), _reply(1, 0.6, "ValueError", "view uint8 as bfloat16"))
    assert (rec.ok, rec.error_type, rec.error, rec.traceback) == (
        False, "ValueError", "rank 1: view uint8 as bfloat16", "tb 1")
    assert not rec.symmetric and rec.seconds == 30.4


def test_ranks_failing_at_about_the_same_time_cite_the_lowest_rank() -> None:
    rec = _record(_reply(0, 2.0 + CAUSE_MARGIN_S / 2, "KeyError", "'a'"), _reply(1, 2.0, "ValueError", "b"))
    assert (rec.error_type, rec.error) == ("KeyError", "rank 0: 'a'")


def test_the_only_failed_rank_is_cited_however_long_it_took() -> None:
    rec = _record(_reply(0, 0.1), _reply(1, 40.0, "RuntimeError", TIMEOUT))
    assert (rec.error_type, rec.error) == ("RuntimeError", f"rank 1: {TIMEOUT}")


def test_an_op_every_rank_finished_stays_ok() -> None:
    rec = _record(_reply(0, 1.0), _reply(1, 9.0))
    assert rec.ok and rec.error is None and rec.symmetric and set(rec.loaded) == {0, 1}


def test_a_warm_fault_pass_does_not_wait_out_a_peer_stuck_on_the_rank_that_raised(tmp_path) -> None:
    """With ``stuck_after`` the op returns that long after rank 0 raised, rank 1 answered for as "Stuck" (and the
    record cites rank 0); without it the same op is a hang at the op's timeout."""
    from harness.ranks.pool import RankPool
    from properties.model.case import Case, Op, TensorCase
    from reference.layout import Mesh, replicated

    layout = {"w": replicated(Mesh((2,))).to_json()}
    case = Case("P-ROUNDTRIP", "tests.suts.buggy:RaisesWhilePeerWaitsSut", (TensorCase("w", "F32", (2,), 1),),
                layout, layout, (Op("save", "step-0"), Op("load", "step-0")))
    pool = RankPool(case.sut, 2, {})
    try:
        pool.begin(case.to_json(), str(tmp_path))
        pool.op(0, 60)
        start = time.monotonic()
        replies = pool.op(1, 60, stuck_after=20.0)
        assert time.monotonic() - start < 10  # rank 1 uses no CPU: it is seen waiting long before stuck_after
        assert pool.failure_wait_s > 0 and len(pool.launch_seconds) == 1
        assert [(r["rank"], r["error_type"]) for r in replies] == [(0, "ValueError"), (1, "Stuck")]
        rec = _record(*replies)
        assert (rec.error_type, rec.error, rec.symmetric) == ("ValueError", "rank 0: rank 0 cannot read its shard",
                                                              False)
    finally:
        pool.close(graceful=False)
    pool = RankPool(case.sut, 2, {})
    try:
        pool.begin(case.to_json(), str(tmp_path / "again"))
        pool.op(0, 60)
        with pytest.raises(PoolFailure) as failure:
            pool.op(1, 2.0)
        assert failure.value.kind == "hang" and failure.value.silent == (1,)
    finally:
        pool.close(graceful=False)


def test_a_peer_that_computes_after_a_rank_raised_is_waited_for(tmp_path) -> None:
    """Only a rank that uses no CPU counts as stuck: one still computing two seconds after its peer raised gets
    to finish its op (stuck_after is the bound, not the guess)."""
    from harness.ranks.pool import RankPool
    from properties.model.case import Case, Op, TensorCase
    from reference.layout import Mesh, replicated

    layout = {"w": replicated(Mesh((2,))).to_json()}
    case = Case("P-ROUNDTRIP", "tests.suts.buggy:RaisesWhilePeerComputesSut", (TensorCase("w", "F32", (2,), 1),),
                layout, layout, (Op("save", "step-0"), Op("load", "step-0")))
    pool = RankPool(case.sut, 2, {})
    try:
        pool.begin(case.to_json(), str(tmp_path))
        pool.op(0, 60)
        replies = pool.op(1, 60, stuck_after=20.0)
        assert [(r["rank"], r["ok"]) for r in replies] == [(0, False), (1, True)]
    finally:
        pool.close(graceful=False)


@pytest.mark.parametrize("sut,stalls", [("tests.suts.buggy:HangsOnLoadSut", True),
                                        ("tests.suts.buggy:ComputesOnLoadSut", False)])
def test_an_idle_limit_cuts_a_stalled_op_short_and_never_a_busy_one(tmp_path, sut: str, stalls: bool) -> None:
    """``idle_limit`` (what bounds virtual ranks, whose op may take the bound times W over the cores): a rank whose
    processes use no CPU for that long hangs well before the op's timeout; one computing longer than that does not."""
    from harness.ranks.pool import RankPool
    from properties.model.case import Case, Op, TensorCase
    from reference.layout import Mesh, replicated

    layout = {"w": replicated(Mesh((2,))).to_json()}
    case = Case("P-ROUNDTRIP", sut, (TensorCase("w", "F32", (2,), 1),), layout, layout,
                (Op("save", "step-0"), Op("load", "step-0")))
    pool = RankPool(case.sut, 2, {})
    try:
        pool.begin(case.to_json(), str(tmp_path))
        pool.op(0, 60)
        start = time.monotonic()
        if stalls:
            with pytest.raises(PoolFailure) as failure:
                pool.op(1, 120, idle_limit=1.5)
            assert failure.value.kind == "hang" and failure.value.silent == (1,)
            assert "did not finish op 1; its process used no CPU for 2 s" in str(failure.value)
            assert time.monotonic() - start < 30
        else:
            replies = pool.op(1, 120, idle_limit=1.5)
            assert [(r["rank"], r["ok"]) for r in replies] == [(0, True), (1, True)]
    finally:
        pool.close(graceful=False)


def test_virtual_ranks_share_the_cores_they_are_bounded_by() -> None:
    from harness.ranks.virtual_pool import shared_cores_factor

    cores = len(os.sched_getaffinity(0))
    assert shared_cores_factor(1) == 1 and shared_cores_factor(cores) == 1
    assert shared_cores_factor(cores + 1) == 2 and shared_cores_factor(32 * cores) == 32
