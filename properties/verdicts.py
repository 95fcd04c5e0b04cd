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


class Excuse(str, Enum):
    """Why a verdict of "pass" is not a real pass: a known finding explained the failure, the case was skipped
    (it could not run or replay here), or a fault case failed without its fault too (not attributed to it)."""

    KNOWN = "known"
    SKIPPED = "skipped"
    UNATTRIBUTED = "unattributed"


@dataclass(frozen=True)
class Judgement:
    """A checker's answer: the verdict, the property it judged, and lines explaining any failure; ``anomalies``
    are the typed findings the lines were rendered from (properties.anomalies), ``excuse`` why a pass is not one."""

    property: str
    verdict: Verdict
    details: tuple[str, ...] = field(default=())
    anomalies: tuple = field(default=())
    excuse: str | None = None

    @property
    def ok(self) -> bool:
        return self.verdict is Verdict.PASS


def worst(judgements: list[Judgement]) -> Judgement | None:
    failing = [j for j in judgements if not j.ok]
    return min(failing, key=lambda j: j.verdict.severity) if failing else None
