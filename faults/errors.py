"""The one error type of the fault layer: a fault spec that is malformed or cannot be applied."""

from __future__ import annotations


class FaultSpecError(ValueError):
    """A fault (corruption spec, crash point, or its JSON) is malformed, or cannot be planned or applied."""


class TraceMismatch(FaultSpecError):
    """A crash state was enumerated from a trace whose IO ran in another order than this run's (ranks interleave
    their writes differently from run to run): the state cannot be applied to this run."""
