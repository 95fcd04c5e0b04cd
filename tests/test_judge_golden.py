"""What a user reads of a judgement (property, verdict, every detail line byte for byte) is pinned for ~1200
constructed histories (tests/golden_histories.py): sequences, fault cases, rotations, tensor differences, cover
violations and P-DIFF. A refactoring of the judges must leave all of it as it was."""

from __future__ import annotations

import json

import pytest

from tests.golden_histories import GOLDEN, as_json, judgements

EXPECTED = json.loads(GOLDEN.read_text(encoding="utf-8"))


def test_every_constructed_history_is_judged_as_recorded() -> None:
    got = dict(judgements())
    assert got.keys() == EXPECTED.keys()
    changed = [key for key, j in got.items() if as_json(j) != EXPECTED[key]]
    assert not changed, "\n".join(f"{k}: {EXPECTED[k]}\n  now {as_json(got[k])}" for k in changed[:5])


@pytest.mark.parametrize("verdict", ["pass", "silent-corruption", "data-loss", "hang", "crash", "loud-failure"])
def test_the_golden_histories_reach_every_verdict(verdict: str) -> None:
    assert sum(v[1] == verdict for v in EXPECTED.values()) >= 5
