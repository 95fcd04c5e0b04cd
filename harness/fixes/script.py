"""A fix set as one standalone file, a repro's ``fix.py``: the patched functions' whole text and the machinery that
binds them (``rebind``'s own text), so a maintainer applies a candidate fix with nothing but the framework installed
and sees it bound exactly as the harness's ranks bind it."""

from __future__ import annotations

import ast
import inspect
import textwrap

from harness.fixes import rebind
from harness.fixes.patch import Edits, Fix, Hunk

APPLY = '''

_APPLIED = []


def apply():
    """Bind every patched function where the framework holds the original (once per process). A stale fix (the
    installed framework's source is not what it was written against) stops the run with status 3 and says so."""
    if _APPLIED:
        return
    for module, qualname, digest, source in PATCHES:
        owner, _, current = target(module, qualname)
        original = getattr(current, ORIGINAL_ATTR, current)  # needs.py may have patched it first
        found = source_digest(inspect.getsource(original))
        if found != digest:
            print(f"STALE FIX: {module}.{qualname} is not the source this fix was written against (sha256 {found}, "
                  f"expected {digest}): the installed framework changed there", flush=True)
            sys.exit(3)
        patched = compiled(original, source, owner, f"<fix.py: {module}.{qualname}>")
        setattr(patched, ORIGINAL_ATTR, original)
        rebind(current, patched)
    _APPLIED.append(True)
'''


def fix_script(fixes: list[Fix], title: str, about: str | None = None, base: list[Fix] | None = None) -> str:
    """``fix.py`` for these fixes, applied in this order (several may edit one function: their edits stack);
    ``about``: what the file is for, where it is not a repro's candidate fix; ``base``: fixes another script
    applies first (a repro's needs.py): where they edit a function these fixes edit, the function is bound with
    their edits and these, as one."""
    stacks: dict[tuple[str, str], tuple[Hunk, list[tuple[str, Edits]]]] = {}
    for fix in fixes:
        for hunk in fix.hunks:
            stacks.setdefault((hunk.module, hunk.qualname), (hunk, []))[1].append((fix.id, hunk.edits))
    for fix in reversed(base or []):
        for hunk in fix.hunks:
            if (hunk.module, hunk.qualname) in stacks:
                stacks[(hunk.module, hunk.qualname)][1].insert(0, (fix.id, hunk.edits))
    patches = []
    for (module, qualname), (hunk, stack) in stacks.items():
        source = hunk.patched_source(tuple(stack), stack[-1][0])
        patches.append(f"    ({module!r}, {qualname!r}, {hunk.digest!r},\n     {_literal(source)}),\n")
    ids = ", ".join(f.id for f in fixes)
    about = textwrap.fill(about or (
        f"The candidate fix ({ids}), written by ckpt-harness: ``bash run.sh --with-fix`` runs the repro with it, "
        "repro.py calling ``apply()`` in every process before its first step. fix.diff is the same change as a "
        "patch of the framework's source."), 116)
    return (f'"""{title}\n\n{about}"""\n\n'
            + _machinery()
            + "\n\n# (module, function, sha256[:16] of the source it was written against, the patched function)\n"
            + "PATCHES = [\n" + "".join(patches) + "]\n" + APPLY)


def _machinery() -> str:
    """rebind.py's text without its docstring."""
    text = inspect.getsource(rebind)
    first = ast.parse(text).body[1]  # after the docstring
    return "\n".join(text.splitlines()[first.lineno - 1:]).rstrip() + "\n"


def _literal(source: str) -> str:
    """The function's text as a readable raw string where it can be one, else as Python's repr."""
    if "'''" in source or source.endswith("\\"):
        return repr(source)
    return f"r'''{source}'''"
