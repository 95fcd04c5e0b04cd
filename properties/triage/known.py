"""Known findings, so a campaign can look past them (``fuzz --skip-known DIR``): a failure whose every anomaly the
``signature`` of a regression case explains is counted as that known bug instead of being shrunk, and a new bug on
top of a known one still counts. docs/design.md §13 ("Known findings", "Rendered text") states the rules: what a
signature is, how it matches anomalies, and how consequences and parts of anomalies are explained.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from properties.check.anomalies import (
    ERROR_KINDS,
    TYPES,
    Anomaly,
    LoadedNoVersion,
    ResumedRunDiffers,
    cites_sut_error,
    field_names,
)
from properties.model.verdicts import Judgement

#: Anomaly fields that say what came before a failure in the job's history, not what the failure is: a signature
#: that needs one recognises a bug by its circumstances, so a finding that matches without one explains first.
HISTORY_FACTS = frozenset({"resaved", "after_failed_load", "loaded_before", "repeats_load", "repeats_failure"})


class KnownFindingsError(ValueError):
    """A regression directory or one of its files cannot be read as known findings; the message names it."""


@dataclass(frozen=True)
class Signature:
    """Anomaly types and the fields an anomaly of one of them must have (exact values, or patterns for strings).
    Several types: one bug may show as several anomalies (a load that fails is ``op-failed`` to the oracle and
    ``outcome-differs-from-reference`` to P-DIFF; both cite the SUT's error with the same fields)."""

    kinds: tuple[str, ...]
    fields: tuple[tuple[str, Any], ...]

    @property
    def names_error(self) -> bool:
        """Recognises a SUT error by what it says, so any anomaly quoting that error is this bug's."""
        return set(self.kinds) <= ERROR_KINDS and any(key in ("error_type", "message") for key, _ in self.fields)

    @classmethod
    def parse(cls, data: dict) -> Signature:
        """Raise ValueError (or re.error) naming what is wrong with a signature object."""
        raw = data.get("anomaly")
        kinds = tuple(raw) if isinstance(raw, list) else (raw,)
        bad = [k for k in kinds if k not in TYPES]
        if bad or not kinds:
            raise ValueError(f"signature: 'anomaly' must be one of {', '.join(sorted(TYPES))} (or a list of them), "
                             f"got {raw!r}")
        for kind in kinds:
            unknown = sorted(data.keys() - field_names(TYPES[kind]))
            if unknown:
                raise ValueError(f"signature: {kind} anomalies have no fields {unknown}")
        fields = []
        for key, want in sorted(data.items()):
            if key == "anomaly":
                continue
            if isinstance(want, dict):
                if want.keys() != {"regex"} or not isinstance(want["regex"], str):
                    raise ValueError(f"signature: field {key!r} must be a JSON value or {{\"regex\": \"...\"}}")
                want = re.compile(want["regex"])
            fields.append((key, want))
        return cls(kinds, tuple(fields))

    def matches(self, anomaly: Anomaly) -> bool:
        if anomaly.kind not in self.kinds and not (self.names_error and cites_sut_error(anomaly)):
            return False
        got = anomaly.to_json()
        return all(_field_matches(got.get(key), want) for key, want in self.fields)


def _field_matches(got: Any, want: Any) -> bool:
    if isinstance(want, re.Pattern):
        text = got if isinstance(got, str) else json.dumps(got)
        return got is not None and want.search(text) is not None
    return got == want


@dataclass(frozen=True)
class Known:
    case_file: str
    sut: str
    verdict: str
    signature: Signature | tuple[Signature, ...] | re.Pattern[str]  # a pattern: the legacy form, over detail lines
    alternatives: tuple[str, ...] = ()  # the verdicts of the case file's ``or`` ways (a racy bug)

    @property
    def verdicts(self) -> tuple[str, ...]:
        return (self.verdict, *self.alternatives)

    def explains(self, sut: str, judgement: Judgement) -> bool:
        """This finding alone explains the whole failure."""
        return explanations([self], sut, judgement) is not None

    def matches(self, sut: str, anomaly: Anomaly) -> bool:
        """One anomaly is this finding's (a structured signature only): of one of its verdicts, or quoting the SUT
        error the signature names (whatever rule that broke)."""
        return self.closeness(sut, anomaly) is not None

    def closeness(self, sut: str, anomaly: Anomaly) -> bool | None:
        """Whether the best matching way describes the anomaly itself (True) or only what came before it in the
        job's history (False: a way that needs a HISTORY_FACTS field); None: no way matches. Where two findings
        match one anomaly (a bug that strikes after another: a wedged group after a failed load), the one that
        describes the failure itself explains it; among equals, the first listed."""
        if sut != self.sut or isinstance(self.signature, re.Pattern):
            return None
        ways = self.signature if isinstance(self.signature, tuple) else (self.signature,)
        return max((not any(key in HISTORY_FACTS for key, _ in way.fields)
                    for way in ways if way.matches(anomaly)
                    and (anomaly.verdict.value in self.verdicts or way.names_error)), default=None)

    def explains_lines(self, sut: str, judgement: Judgement) -> bool:
        """The legacy form: every detail line matches the pattern."""
        return (isinstance(self.signature, re.Pattern) and sut == self.sut and judgement.verdict.value in self.verdicts
                and bool(judgement.details) and all(self.signature.search(line) for line in judgement.details))


def read_signature(raw: object) -> Signature | tuple[Signature, ...] | re.Pattern[str]:
    """A case file's ``signature``: an object (anomaly type and fields), a list of them (any one matches), or a
    string (legacy: a line pattern)."""
    if isinstance(raw, str):
        return re.compile(raw)
    if isinstance(raw, dict):
        return Signature.parse(raw)
    if isinstance(raw, list) and raw and all(isinstance(way, dict) for way in raw):
        return tuple(Signature.parse(way) for way in raw)
    raise TypeError(f"signature must be an object, a non-empty list of objects or a string, got {raw!r:.60}")


def read_known(directory: Path) -> list[Known]:
    """The findings under ``directory`` that carry a signature (the others cannot be recognised and are left out)."""
    if not directory.is_dir():
        raise KnownFindingsError(f"--skip-known: {directory} is not a directory of regression cases")
    out = []
    for path in sorted(directory.glob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if "signature" not in data:
                continue
            out.append(Known(path.name, str(data["sut"]), str(data["verdict"]), read_signature(data["signature"]),
                             tuple(str(way["verdict"]) for way in data.get("or", []))))
        except (OSError, ValueError, KeyError, TypeError, re.error) as exc:
            raise KnownFindingsError(f"--skip-known: {path}: {type(exc).__name__}: {exc}") from None
    return out


def explanations(known: list[Known], sut: str, judgement: Judgement) -> list[str] | None:
    """The case files that together explain a failing judgement, the worst anomaly's first; None unless every
    anomaly is explained (by a finding whose verdicts include the anomaly's) and the failure's verdict is one of
    those findings'. The legacy line form explains a failure alone."""
    if judgement.ok:
        return None
    legacy = next((k.case_file for k in known if k.explains_lines(sut, judgement)), None)
    if legacy is not None:
        return [legacy]
    if not judgement.anomalies:
        return None
    anomalies = judgement.anomalies

    def matched(anomaly: Anomaly) -> list[Known]:
        closest = _closest(known, sut, anomaly)
        return [closest] if closest is not None else []

    # what describes each anomaly (or each of its tensor differences) itself; then consequences, by their causes'
    found = {i: matched(a) or _by_parts(a, matched) for i, a in enumerate(anomalies)}
    used: list[Known] = []
    for i, anomaly in enumerate(anomalies):
        ks = found[i] or _consequence_of(anomaly, anomalies, found) or _by_parts(
            anomaly, lambda part: _consequence_of(part, anomalies, found))
        if not ks:
            return None
        used.extend(k for k in ks if k not in used)
    if not any(judgement.verdict.value in k.verdicts for k in used) and not cites_sut_error(anomalies[0]):
        return None
    return [k.case_file for k in used]


def _closest(known: list[Known], sut: str, anomaly: Anomaly) -> Known | None:
    """The known finding that describes ``anomaly`` most closely (Known.closeness), the first of equals."""
    best, best_at = None, None
    for k in known:
        at = k.closeness(sut, anomaly)
        if at is not None and (best_at is None or at > best_at):
            best, best_at = k, at
    return best


def _consequence_of(anomaly: Anomaly, anomalies: tuple[Anomaly, ...], found: dict[int, list[Known]]) -> list[Known]:
    """The known findings behind an anomaly that is another's consequence, not a bug of its own; empty (unexplained)
    for any other anomaly, or where what is behind it is not all known. Such an anomaly carries no error for a
    signature to match, and a signature that matched it would hide a new bug that shows the same way:

    * a ``no-complete-checkpoint`` gap whose checkpoints all failed to load afterwards (``gone``): the failed loads
      of its checkpoints that are anomalies (the others the checker excused: rotated away, corrupted) are its cause;
    * a train op's wrong tensor on a rank that trained on what a load gave (``state_from``): that load's anomalies
      on the rank (or of the whole op: a wrong version, a failure; a state none of the versions where it differs on
      that rank) are its cause, when it has any. A train op that
      goes wrong from a load that gave every rank the right state stays a finding (an optimizer or EMA bug)."""
    data = anomaly.to_json()
    if data["anomaly"] == "no-complete-checkpoint" and data.get("gone"):
        def causes(other: dict) -> bool:
            return other.get("op_kind") == "load" and other.get("message") is not None \
                and other.get("name") in data["gone"]
    elif data["anomaly"] == "tensor-differs" and data.get("op_kind") == "train" and data.get("state_from") is not None:
        def causes(other: dict) -> bool:  # a state none of the versions is wrong rank by rank: on this one?
            return other.get("op") == data["state_from"] and other.get("rank") in (None, data["rank"]) and (
                other["anomaly"] != "loaded-none-of-versions"
                or any(d.get("rank") == data["rank"] for d in other["differences"]))
    else:
        return []
    behind = [i for i, a in enumerate(anomalies) if causes(a.to_json())]
    if not behind or any(not found[i] for i in behind):
        return []
    return list(dict.fromkeys(k for i in behind for k in found[i]))


def _by_parts(anomaly: Anomaly, explain: Callable[[Anomaly], list[Known]]) -> list[Known]:
    """A state that is wrong tensor by tensor — a load that gave none of the versions it may give, a resumed run
    that differs from the uninterrupted one — is explained by what ``explain`` finds behind each of its tensor
    differences, taken as that op's: those findings. Empty for any other anomaly, or where one difference is not
    explained."""
    if not isinstance(anomaly, (LoadedNoVersion, ResumedRunDiffers)) or not anomaly.differences:
        return []
    parts = [explain(dataclasses.replace(d, at=anomaly.at)) for d in anomaly.differences]
    if not all(parts):
        return []
    return list(dict.fromkeys(k for ks in parts for k in ks))


def explained_by(known: list[Known], sut: str, judgement: Judgement) -> str | None:
    """The case file of the known finding that explains this failing judgement's worst anomaly, if known findings
    explain all of it."""
    found = explanations(known, sut, judgement)
    return found[0] if found else None
