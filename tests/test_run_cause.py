"""Which rank's error an op's record cites when ranks fail differently (harness.run.cause)."""

from __future__ import annotations

from harness.run import CAUSE_MARGIN_S, _merge
from properties.outcome import OpRecord

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
