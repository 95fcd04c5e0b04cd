"""A known bug's fix as the upstream change itself: hunks of a function's source, recompiled in its own module and
bound wherever the framework (or anyone) holds the original.

A hunk names its function, the exact lines it replaces and the digest of the source it was written against, so a
fix is applied only to the code it was written for (a stale one refuses, naming what changed) and renders as the
unified diff a maintainer would apply. The patched function is compiled in its module's own globals and bound by
identity across ``sys.modules``: a function imported by name lives in several modules. The fix keeps no state of
its own: what is bound where is read back from the functions themselves (``__ckpt_fixes__``), so virtual ranks that
copy module state, forked ranks and repeated applies all see one truth.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from harness.fixes.rebind import EDITS_ATTR, ORIGINAL_ATTR, compiled, rebind, source_digest, target

KINDS = ("fix", "workaround", "detector")

Edits = tuple[tuple[str, str], ...]  # (old, new): exact lines of the function's source and what replaces them


class FixError(Exception):
    """A fix that cannot be applied here: unknown, or written against other code (stale)."""


@dataclass(frozen=True)
class Hunk:
    """Edits of one function; ``digest`` is the source they were written against. Several fixes may edit one
    function: the patched function is the original with every applied fix's edits, in the order applied."""

    module: str
    qualname: str  # a function of the module, or Class.method
    digest: str
    edits: Edits

    def current(self) -> Callable:
        return target(self.module, self.qualname)[2]

    def original(self) -> Callable:
        func = self.current()
        return getattr(func, ORIGINAL_ATTR, func)

    def applied(self) -> tuple[tuple[str, Edits], ...]:
        """The fixes bound on the function, in order; none where its module was never imported (nothing patched it,
        and asking must not import a framework that may not be installed)."""
        if self.module not in sys.modules:
            return ()
        return getattr(self.current(), EDITS_ATTR, ())

    def carries(self, fix_id: str) -> bool:
        """The bound function has ``fix_id``'s edits."""
        return any(who == fix_id for who, _ in self.applied())

    def check(self, fix_id: str) -> str:
        """The original's source, after checking it is the code this hunk was written for."""
        func = self.original()
        # a decorated function is checked as the function it wraps: its whole source, decorators included, is
        # compiled again, which decorates the patched function the same way
        code = getattr(inspect.unwrap(func), "__code__", None)
        if code is None or set(code.co_freevars) - {"__class__"}:  # zero-argument super() is rebuilt below
            raise FixError(f"fix {fix_id}: {self.module}.{self.qualname} is not a plain function (closure or "
                           "builtin): it cannot be recompiled")
        source = inspect.getsource(func)
        if source_digest(source) != self.digest:
            raise FixError(f"fix {fix_id} is stale: {self.module}.{self.qualname} is not the source it was written "
                           f"against (digest {source_digest(source)}, expected {self.digest}); the installed framework "
                           "changed there: check whether upstream fixed the bug, then rewrite or retire the fix")
        return source

    def rebuilt(self, stack: tuple[tuple[str, Edits], ...], fix_id: str) -> Callable:
        """The original with ``stack``'s edits, compiled in the module's own globals (it sees what the original
        sees); the original itself when the stack is empty."""
        original = self.original()
        if not stack:
            return original
        source = self.patched_source(stack, fix_id)
        # its run counts toward the framework's own lines (coverage of a patched function) where its file is known
        path = inspect.getsourcefile(inspect.unwrap(original))
        filename = path or f"<ckpt-harness fix {'+'.join(who for who, _ in stack)}: {self.module}.{self.qualname}>"
        func = compiled(original, source, target(self.module, self.qualname)[0], filename,
                        origin_lines(original, source) if path else None)
        setattr(func, EDITS_ATTR, stack)
        setattr(func, ORIGINAL_ATTR, original)
        return func

    def patched_source(self, stack: tuple[tuple[str, Edits], ...], fix_id: str) -> str:
        """The original's source with ``stack``'s edits, in order."""
        source = self.check(fix_id)
        for who, edits in stack:
            source = _edited(source, edits, who, f"{self.module}.{self.qualname}")
        return source

    def upstream_diff(self, root: Path, fix_id: str, base: tuple[tuple[str, Edits], ...] = ()) -> str:
        """The hunk as a unified diff of the source file, its path relative to the framework's package parent;
        ``base``: the edits of the fixes it requires there, already in the file it patches."""
        original = self.original()
        self.check(fix_id)
        path = Path(inspect.getsourcefile(inspect.unwrap(original)) or "")  # a decorated one's own file
        source, first = inspect.getsourcelines(original)
        file = path.read_text().splitlines(True)
        before = "".join(source)
        for who, edits in base:
            before = _edited(before, edits, who, self.qualname)
        patched = _edited(before, self.edits, fix_id, self.qualname).splitlines(True)
        lines = file[:first - 1] + before.splitlines(True) + file[first - 1 + len(source):]
        after = file[:first - 1] + patched + file[first - 1 + len(source):]
        rel = path.relative_to(root) if path.is_relative_to(root) else path
        return "".join(difflib.unified_diff(lines, after, f"a/{rel}", f"b/{rel}"))


def origin_lines(original: Callable, patched: str) -> list[int]:
    """For each line of ``patched`` (the original's source with edits), the line of the original's file it stands
    for: its own where the edits kept it, else the first line the edit replaced (the line after an insertion)."""
    before, first = inspect.getsourcelines(original)
    after = patched.splitlines(True)
    out = [first] * len(after)
    for tag, i1, _i2, j1, j2 in difflib.SequenceMatcher(None, before, after, autojunk=False).get_opcodes():
        for j in range(j1, j2):
            out[j] = first + (i1 + j - j1 if tag == "equal" else min(i1, len(before) - 1))
    return out


def _edited(source: str, edits: Edits, fix_id: str, where: str) -> str:
    for old, new in edits:
        if source.count(old) != 1:
            raise FixError(f"fix {fix_id}: the lines it replaces occur {source.count(old)} times in {where} "
                           "(another fix applied there changed them?)")
        source = source.replace(old, new)
    return source


@dataclass(frozen=True)
class Fix:
    """One known root cause's patch: what it fixes, the regression cases it covers, what must be fixed first."""

    id: str
    kind: Literal["fix", "workaround", "detector"]
    framework: str  # the importable package it patches ("paddle")
    version: str  # the framework version it was written against (the digests are the check)
    summary: str  # the bug and the change, in one line
    hunks: tuple[Hunk, ...]
    covers: tuple[str, ...]  # regression case stems (tests/regressions/<stem>.json) it makes pass
    requires: tuple[str, ...] = ()  # fixes that must be applied with it (its covered cases fail without them)
    # fixes that, applied with it, edit first: its edits fit the function either way, theirs only the original
    after: tuple[str, ...] = ()

    def applied(self) -> bool:
        return all(h.carries(self.id) for h in self.hunks)

    def apply(self) -> None:
        """Bind the patched functions everywhere the originals are bound; a second apply changes nothing."""
        if self.kind not in KINDS:
            raise FixError(f"fix {self.id}: unknown kind {self.kind!r}")
        for hunk in self.hunks:
            hunk.check(self.id)  # all or nothing: a stale hunk refuses before any is bound
        for hunk in self.hunks:
            if not hunk.carries(self.id):
                rebind(hunk.current(), hunk.rebuilt((*hunk.applied(), (self.id, hunk.edits)), self.id),
                       *target(hunk.module, hunk.qualname)[:2])

    def revert(self) -> None:
        """Bind the functions back without this fix's edits (other fixes' stay); a fix not applied changes nothing."""
        for hunk in self.hunks:
            if hunk.carries(self.id):
                rebind(hunk.current(), hunk.rebuilt(tuple(e for e in hunk.applied() if e[0] != self.id), self.id))

    def diff(self, required: Sequence[Fix] = ()) -> str:
        """The change in upstream terms: a unified diff per hunk, paths as in the framework's source tree, of the
        source as ``required`` (the fixes it requires, in the order they apply) leave it: it applies after them."""
        root = Path(importlib.import_module(self.framework).__file__ or "").parent.parent
        return "".join(h.upstream_diff(root, self.id, tuple(
            (r.id, other.edits) for r in required for other in r.hunks
            if (other.module, other.qualname) == (h.module, h.qualname))) for h in self.hunks)
