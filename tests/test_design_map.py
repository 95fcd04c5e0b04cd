"""docs/design.md §14 maps every module of the project, and names no module that is gone: a reader who looks a
module up there finds it, and the map cannot drift from the code unnoticed."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("reference", "faults", "properties", "harness")


def _section(number: int) -> str:
    text = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    start = text.index(f"\n## {number}. ")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def _named(section: str) -> set[str]:
    """Every module path the section names in backticks (``harness/ranks/pool.py``)."""
    return set(re.findall(r"`((?:" + "|".join(PACKAGES) + r")/[\w/]+\.py)`", section))


def _modules() -> set[str]:
    return {str(p.relative_to(ROOT)) for top in PACKAGES for p in (ROOT / top).rglob("*.py")
            if p.name != "__init__.py"}


def test_the_map_names_every_module() -> None:
    missing = sorted(_modules() - _named(_section(14)))
    assert not missing, f"docs/design.md §14 does not map: {missing}"


def test_the_map_names_no_module_that_is_gone() -> None:
    gone = sorted(p for p in _named(_section(14)) if not (ROOT / p).is_file())
    assert not gone, f"docs/design.md §14 names modules that do not exist: {gone}"


def test_every_subpackage_says_what_lives_there() -> None:
    """Each stage's ``__init__`` says what it holds and what it may import (tests/test_import_graph.py holds the
    imports to it)."""
    for init in sorted(p for top in PACKAGES for p in (ROOT / top).rglob("__init__.py") if p.parent.parent != ROOT):
        text = init.read_text(encoding="utf-8")
        assert text.startswith('"""') and "import" in text.split('"""')[1].lower(), f"{init.relative_to(ROOT)}"
