"""Known findings, so a campaign can look past them (``fuzz --skip-known DIR``).

A campaign keeps one shrunk finding per property, so the first bug a property meets hides every other one behind
it. A regression case may carry a ``signature``: a regular expression that every detail line of a judgement
caused by that bug matches (e.g. BF16 NaN payloads that come back as another NaN). A failure of the same SUT and
verdict whose every detail line matches a known signature is counted as known instead of being shrunk. A failure
that shows anything else on any line still counts, so a new bug on top of a known one is not hidden.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from .verdicts import Judgement


class KnownFindingsError(ValueError):
    """A regression directory or one of its files cannot be read as known findings; the message names it."""


@dataclass(frozen=True)
class Known:
    case_file: str
    sut: str
    verdict: str
    signature: re.Pattern[str]

    def explains(self, sut: str, judgement: Judgement) -> bool:
        return (sut == self.sut and judgement.verdict.value == self.verdict and bool(judgement.details)
                and all(self.signature.search(line) for line in judgement.details))


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
            out.append(Known(path.name, str(data["sut"]), str(data["verdict"]), re.compile(data["signature"])))
        except (OSError, ValueError, KeyError, TypeError, re.error) as exc:
            raise KnownFindingsError(f"--skip-known: {path}: {type(exc).__name__}: {exc}") from None
    return out


def explained_by(known: list[Known], sut: str, judgement: Judgement) -> str | None:
    """The case file of the known finding that explains this failing judgement, if one does."""
    if judgement.ok:
        return None
    return next((k.case_file for k in known if k.explains(sut, judgement)), None)
