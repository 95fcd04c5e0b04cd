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
    (it could not run or replay here), a fault case failed without its fault too (not attributed to it), or its ranks
    died or hung once and the case passed when run again (flaky: reported, not shrunk)."""

    KNOWN = "known"
    SKIPPED = "skipped"
    UNATTRIBUTED = "unattributed"
    FLAKY = "flaky"


@dataclass(frozen=True)
class Judgement:
    """A checker's answer: the verdict, the property it judged, and lines explaining any failure; ``anomalies``
    are the typed findings the lines were rendered from (properties.check.anomalies), ``excuse`` why a pass is not
    one."""

    property: str
    verdict: Verdict
    details: tuple[str, ...] = field(default=())
    anomalies: tuple = field(default=())
    excuse: str | None = None

    @property
    def ok(self) -> bool:
        return self.verdict is Verdict.PASS


def worst(judgements: list[Judgement]) -> Judgement | None:
    """The judgement of the worst failure, carrying every other failure's lines and anomalies after its own: the
    verdict and property are the worst's, but nothing found is dropped, so a known finding excuses a case only
    when it explains all of them (properties.triage.known) and a lesser bug behind a worse one still shows."""
    failing = [j for j in judgements if not j.ok]
    if not failing:
        return None
    first = min(failing, key=lambda j: j.verdict.severity)
    rest = [j for j in failing if j is not first]
    return Judgement(first.property, first.verdict, first.details + tuple(x for j in rest for x in j.details),
                     first.anomalies + tuple(a for j in rest for a in j.anomalies))
