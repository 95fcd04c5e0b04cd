"""Verdicts (docs/design.md §7, a contract): names and severity order, worst first."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Verdict(str, Enum):
    SILENT_CORRUPTION = "silent-corruption"
    DATA_LOSS = "data-loss"
    HANG = "hang"
    CRASH = "crash"
    LOUD_FAILURE = "loud-failure"
    PASS = "pass"

    @property
    def severity(self) -> int:
        """Lower is worse."""
        return list(Verdict).index(self)


@dataclass(frozen=True)
class Judgement:
    """A checker's answer: the verdict, the property it judged, and lines explaining any failure."""

    property: str
    verdict: Verdict
    details: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return self.verdict is Verdict.PASS


def worst(judgements: list[Judgement]) -> Judgement | None:
    failing = [j for j in judgements if not j.ok]
    return min(failing, key=lambda j: j.verdict.severity) if failing else None
