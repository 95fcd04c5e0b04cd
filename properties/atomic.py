"""P-ATOMIC and P-NOLOSS over what loads returned after a crash (pure: the harness does the loading)."""

from __future__ import annotations

from collections.abc import Mapping

from reference.tensor import Tensor, diff_states

from .verdicts import Judgement, Verdict

Loaded = Mapping[str, Tensor] | BaseException


def judge_after_crash(acknowledged: Mapping[str, Tensor], attempted: Mapping[str, Tensor], latest: Loaded,
                      previous: Loaded, clear_errors: tuple[type[BaseException], ...]) -> Judgement:
    """After a crash during the save of ``attempted``: loading the latest gives the acknowledged state, the
    attempted one complete, or a clear error (P-ATOMIC); the acknowledged checkpoint is still there, bitwise
    (P-NOLOSS)."""
    if isinstance(previous, BaseException):
        return Judgement("P-NOLOSS", Verdict.DATA_LOSS,
                         (f"the acknowledged checkpoint no longer loads: {type(previous).__name__}: {previous}",))
    lost = diff_states(dict(acknowledged), dict(previous))
    if lost:
        return Judgement("P-NOLOSS", Verdict.DATA_LOSS, tuple(f"acknowledged checkpoint changed: {d}" for d in lost))
    if isinstance(latest, BaseException):
        if isinstance(latest, clear_errors):
            return Judgement("P-ATOMIC", Verdict.PASS)
        return Judgement("P-ATOMIC", Verdict.LOUD_FAILURE, (f"unclear error: {type(latest).__name__}: {latest}",))
    if not diff_states(dict(acknowledged), dict(latest)) or not diff_states(dict(attempted), dict(latest)):
        return Judgement("P-ATOMIC", Verdict.PASS)
    mixed = diff_states(dict(attempted), dict(latest))
    return Judgement("P-ATOMIC", Verdict.SILENT_CORRUPTION, ("latest is neither checkpoint:", *mixed))
