"""A repro's candidate fix: the known fix whose proof is the finding's regression case (with the fixes it requires),
written beside the script as ``fix.py`` (what ``run.sh --with-fix`` applies) and ``fix.diff`` (the same change as a
patch of the framework's source), and described in REPORT.md with the other rows it resolves."""

from __future__ import annotations

from pathlib import Path

from harness.fixes import FIXES, covering, in_order, resolve, upstream_diff
from harness.fixes.patch import Fix, FixError
from harness.fixes.script import fix_script

KIND_MEANS = {
    "fix": "a fix of the root cause",
    "workaround": "a workaround: the root cause lies where a Python patch cannot reach (C++, a collective backend, a "
                  "file format), so the patch steers around it",
    "detector": "a detector: it does not repair the bug but turns its silent or hanging outcome into the same typed "
                "error on every rank",
}


# Why a power-loss repro is not run with its fix: its script makes the loss itself.
SCRIPTED_LOSS = ("the script makes the power loss itself (it removes the entry or the data a power loss may lose), "
                 "whatever the code fsyncs, so no fix can make it pass; the harness proves a durability fix by "
                 "judging every power-loss state of the fixed save (tests/test_fixes.py)")


def candidate_fixes(stem: str, companions: tuple[str, ...] = (), needs: tuple[str, ...] = ()) -> list[Fix]:
    """The regression case ``stem``'s fixes, those required first, and ``companions`` (other known bugs' fixes the
    repro's run needs, with what they require); none for a finding no known fix covers. ``needs``: fixes the
    script applies anyway (needs.py, before fix.py), left out: applied twice, the second finds its source changed."""
    own = covering(stem)
    return [FIXES[i] for i in in_order(resolve(",".join((*own, *companions)))) if i not in needs] if own else []


def write_candidate(out: Path, stem: str, title: str, companions: tuple[str, ...] = (),
                    needs: tuple[str, ...] = ()) -> dict | None:
    """``out``/fix.py and fix.diff for ``stem``'s candidate fix (with ``companions``, without the ``needs`` the
    script applies first), and what REPORT.md says of it; None without one. A fix that cannot be rendered here
    (stale, or its framework missing) is named with the error, no files."""
    fixes = candidate_fixes(stem, companions, needs)
    if not fixes:
        for name in ("fix.py", "fix.diff"):
            (out / name).unlink(missing_ok=True)
        return None
    try:
        script = fix_script(fixes, title.splitlines()[0], base=[FIXES[i] for i in needs])
        diff = "".join(upstream_diff(f.id) for f in fixes)
    except (FixError, ImportError) as exc:  # stale here, or its framework is not installed where the repro is written
        return {"ids": [f.id for f in fixes], "error": f"{type(exc).__name__}: {exc}"}
    (out / "fix.py").write_text(script, encoding="utf-8")
    (out / "fix.diff").write_text(diff, encoding="utf-8")
    own = [f for f in fixes if stem in f.covers]
    return {"ids": [f.id for f in fixes],
            "own": [f.id for f in own],
            **({"companions": list(companions)} if companions else {}),
            "kinds": {f.id: f.kind for f in fixes},
            "summaries": {f.id: f.summary for f in fixes},
            "written_against": sorted({f"{f.framework} {f.version}" for f in fixes}),
            "resolves": sorted({s for f in own for s in f.covers} - {stem})}


def write_needs(out: Path, needed: list[str] | tuple[str, ...], title: str) -> tuple[str, ...]:
    """``out``/needs.py and needs.diff: the known bugs' fixes a finding shows only behind (its ``needs_fixes``,
    with what they require), which repro.py applies in every process; () where it needs none. The bug is one those
    fixes unmask (stock code stops at the known bug first) or one of theirs: REPORT.md says which to suspect."""
    ids = resolve(",".join(needed)) if needed else ()
    if not ids:
        for name in ("needs.py", "needs.diff"):
            (out / name).unlink(missing_ok=True)
        return ()
    fixes = [FIXES[i] for i in ids]
    about = (f"Known bugs' fixes ({', '.join(ids)}) this finding shows only behind, written by ckpt-harness: "
             "repro.py calls ``apply()`` in every process before its first step, since on stock code the run stops "
             "at a known bug first. needs.diff is the same change as a patch of the framework's source.")
    (out / "needs.py").write_text(fix_script(fixes, title.splitlines()[0], about), encoding="utf-8")
    (out / "needs.diff").write_text("".join(upstream_diff(f.id) for f in fixes), encoding="utf-8")
    return ids
