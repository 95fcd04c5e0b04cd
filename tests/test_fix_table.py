"""The golden fix table (tests/fix_table.py): every regression case with the fixes its stock run reaches and what
each does to it alone. CI checks the table itself (complete, consistent, no fix changing a row it does not own) and
that a stock run reaches what the table says; the nightly run rebuilds every row and compares."""

from __future__ import annotations

import json

import pytest

from harness.fixes import FIXES, own_fixes
from tests.fix_table import OUTCOMES, Tables, read_golden, rows, runnable, violations, watched

GOLDEN = read_golden()
CHECKED = "paddle-dcp-version-cache"  # CI's sample: a stock run reaching what the table says (a few seconds)


def test_the_table_has_every_row_and_only_what_is_known() -> None:
    assert sorted(GOLDEN) == rows(), "rebuild the missing rows: python -m tests.fix_table STEM ..."
    for stem, line in GOLDEN.items():
        assert line["stock"] == "own", f"{stem}: its stock run does not show its own bug ({line['stock']})"
        assert set(line["reached"]) <= set(FIXES), f"{stem}: unknown fixes in the table"
        assert list(line["alone"]) == line["reached"], f"{stem}: every reached fix is replayed alone, only those"
        assert set(line["alone"].values()) <= set(OUTCOMES), stem


def test_a_fix_changes_only_its_own_rows() -> None:
    """Applied alone, a fix leaves every other row's failure as it was (or the row says why it may not: a bug set
    off by another known bug, a fix that also removes a shared trigger), and reaches and resolves its own."""
    assert violations(GOLDEN) == []
    for stem, line in GOLDEN.items():
        assert all(isinstance(r, str) and len(r) > 40 for r in line.get("why", {}).values()), stem
    for stem, line in GOLDEN.items():
        assert all(line["alone"][f] != "own" for f in own_fixes(stem)), f"{stem}: its own fix alone leaves its bug"


@pytest.mark.multirank
@pytest.mark.skipif(not runnable(CHECKED), reason="needs paddle: pip install -e '.[paddle]'")
def test_a_stock_run_reaches_what_the_table_says() -> None:
    tables = Tables()
    try:
        line = tables.row(CHECKED, alone=False)
    finally:
        tables.close()
    assert line["stock"] == "own" and line["reached"] == GOLDEN[CHECKED]["reached"]
    assert set(line["reached"]) <= set(watched("paddle-dcp"))


@pytest.mark.nightly
@pytest.mark.multirank
@pytest.mark.parametrize("stem", [pytest.param(s, marks=pytest.mark.skipif(not runnable(s), reason="framework"))
                                  for s in rows()])
def test_each_row_is_as_the_golden_table_says(stem: str) -> None:
    """Every reached fix alone, in runs of its own: a fix starting to mask another row's bug, a row reaching a fix
    it did not, an outcome that moved, each shows here. Rebuild a row that changed on purpose with
    ``python -m tests.fix_table STEM`` and say why in the commit."""
    tables = Tables()
    try:
        line = tables.row(stem)
    finally:
        tables.close()
    golden = {k: v for k, v in GOLDEN.get(stem, {}).items() if k != "why"}
    assert line == golden, f"{stem}: the table says {golden}, the run {line}"


def test_rebuilding_drops_rows_without_a_case_and_refuses_unknown_stems(tmp_path, monkeypatch, capsys) -> None:
    """A case renamed or removed leaves no row behind it; a stem with no case file is bad input (exit 2)."""
    from tests import fix_table

    golden = tmp_path / "fix_table.json"
    kept = rows()[0]
    golden.write_text(json.dumps({kept: GOLDEN[kept], "a-case-renamed-since": GOLDEN[kept]}))
    monkeypatch.setattr(fix_table, "GOLDEN", golden)
    monkeypatch.setattr(fix_table, "runnable", lambda stem: False)  # rebuild no row: only the drop is under test
    assert fix_table.main(["no-such-case"]) == 2 and "no regression case no-such-case" in capsys.readouterr().err
    assert json.loads(golden.read_text()) == {kept: GOLDEN[kept], "a-case-renamed-since": GOLDEN[kept]}
    assert fix_table.main([]) == 0
    assert json.loads(golden.read_text()) == {kept: GOLDEN[kept]}
    assert "dropped rows with no case file: a-case-renamed-since" in capsys.readouterr().out
