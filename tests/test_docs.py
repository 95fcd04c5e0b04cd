"""The repository reads on its own: every design section the code and docs cite exists in docs/design.md, and
every relative link in the docs names a file of the repository."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DESIGN = ROOT / "docs" / "design.md"
SOURCES = [p for p in ROOT.rglob("*") if p.suffix in (".py", ".md") and p.is_file()
           and not any(part.startswith(".") for part in p.relative_to(ROOT).parts)]


def _sections() -> set[str]:
    return set(re.findall(r"^## (\d+)\. ", DESIGN.read_text(encoding="utf-8"), re.MULTILINE))


def test_every_cited_design_section_exists() -> None:
    sections = _sections()
    assert {str(n) for n in range(1, 12)} <= sections  # the founding design's numbering is kept
    cited = []
    for path in SOURCES:
        text = path.read_text(encoding="utf-8")
        assert "DESIGN" + ".md" not in text, f"{path.relative_to(ROOT)} cites a design file outside the repository"
        for group in re.findall(r"design\.md\)? ((?:§\d+(?:, )?)+)", text):
            cited += [(path.relative_to(ROOT), n) for n in re.findall(r"§(\d+)", group)]
    assert cited
    missing = [(str(p), n) for p, n in cited if n not in sections]
    assert not missing, f"cited sections missing from docs/design.md: {missing}"


def test_relative_links_in_the_docs_resolve() -> None:
    broken = []
    for path in [p for p in SOURCES if p.suffix == ".md"]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text(encoding="utf-8")):
            if "://" not in target and not (path.parent / target).exists():
                broken.append(f"{path.relative_to(ROOT)} -> {target}")
    assert not broken, broken
