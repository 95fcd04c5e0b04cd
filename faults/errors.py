"""The one error type of the fault layer: a fault spec that is malformed or cannot be applied."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping


class FaultSpecError(ValueError):
    """A fault (corruption spec, crash point, or its JSON) is malformed, or cannot be planned or applied."""


class TraceMismatch(FaultSpecError):
    """A crash state was enumerated from a trace whose IO ran in another order than this run's (ranks interleave
    their writes differently from run to run): the state cannot be applied to this run."""


def spec_object(data: object, what: str, known: Iterable[str], required: Iterable[str]) -> Mapping:
    """A fault spec's JSON object (or its text) with only ``known`` fields and all ``required`` ones; every problem
    is a FaultSpecError naming the field."""
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except json.JSONDecodeError as exc:
            raise FaultSpecError(f"{what} is not valid JSON ({exc})") from None
    if not isinstance(data, Mapping):
        raise FaultSpecError(f"{what} must be a JSON object, got {type(data).__name__}")
    known = set(known)
    for key in data:
        if key not in known:
            raise FaultSpecError(f"field {key!r}: unknown field of a {what}")
    for key in required:
        if key not in data:
            raise FaultSpecError(f"field {key!r}: missing")
    return data
