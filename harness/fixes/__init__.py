"""Fixes of known bugs in the systems under test, one module per root cause: a known bug is identified by the patch
that fixes it. Imports nothing of the harness above it; patches the framework only when a fix is applied."""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import sys
from collections.abc import Callable

from harness.fixes.patch import Fix, FixError
from harness.fixes.reach import REACH_OPTION, Watched, watch
from harness.fixes.rebind import batched

__all__ = ["CARRIED_VAR", "FIXED_BY", "FIXES", "REACH_VAR", "STACKS", "Fix", "FixError", "apply_carried", "apply_fixes",
           "covering", "imports_nothing", "in_order", "own_fixes", "prepare", "resolve", "stack", "upstream_diff"]

CARRIED_VAR = "CKPT_HARNESS_FIXES"  # a rank's fixes, for the processes its framework spawns
REACH_VAR = "CKPT_HARNESS_REACH"  # a rank's reach option (JSON), for the same processes
FIXED_BY = "fixed by "  # a known count's name where a patched replay proved the failure known: + the fix ids
# The frameworks a SUT of a framework runs: PaddleFormers' checkpoints go through Paddle's own checkpoint code, so a
# known bug of either may meet a PaddleFormers case, and either's fix identifies it.
STACKS = {"paddleformers": ("paddleformers", "paddle")}


def _load() -> dict[str, Fix]:
    fixes: dict[str, Fix] = {}
    for info in pkgutil.walk_packages(__path__, f"{__name__}."):
        if not info.ispkg and info.name.count(".") > __name__.count(".") + 1:  # a stage's module, not the machinery
            fix = importlib.import_module(info.name).FIX
            fixes[fix.id] = fix
    return dict(sorted(fixes.items()))


FIXES: dict[str, Fix] = _load()


def stack(framework: str | None) -> tuple[str, ...]:
    """``framework`` and the frameworks beneath it (none for a SUT of no framework)."""
    return () if framework is None else STACKS.get(framework, (framework,))


def resolve(spec: str | None, framework: str | None = None) -> tuple[str, ...]:
    """``--fixes`` as fix ids: "all" (the fixes of ``framework`` and of the frameworks beneath it), "none", or ids
    separated by commas, each with the fixes it requires."""
    if spec is None or spec == "none":
        return ()
    if spec == "all":
        own = [i for i, f in FIXES.items() if f.framework in stack(framework)]
        return resolve(",".join(own)) if own else ()
    wanted = [s.strip() for s in spec.split(",") if s.strip()]
    unknown = [w for w in wanted if w not in FIXES]
    if unknown:
        raise FixError(f"unknown fixes {unknown}; known: {', '.join(FIXES)}")
    closed: list[str] = []
    while wanted:
        fix_id = wanted.pop(0)
        if fix_id not in closed:
            closed.append(fix_id)
            wanted.extend(FIXES[fix_id].requires)
    return tuple(sorted(closed))


def own_fixes(stem: str) -> tuple[str, ...]:
    """The fixes whose proof is the regression case ``stem`` (a case name with or without ``.json``)."""
    stem = stem.removesuffix(".json")
    return tuple(i for i, f in FIXES.items() if stem in f.covers)


def covering(stem: str) -> tuple[str, ...]:
    """``own_fixes`` with the fixes they require: the case's candidate fix."""
    own = own_fixes(stem)
    return resolve(",".join(own)) if own else ()


def in_order(ids: tuple[str, ...] | list[str]) -> list[str]:
    """``ids`` in the order they apply: each after those of them it requires or names in ``after`` (a fix that
    requires another may edit a function as that one leaves it); revert in the reverse order."""
    unknown = [i for i in ids if i not in FIXES]
    if unknown:
        raise FixError(f"unknown fix {unknown[0]!r}")
    order: list[str] = []

    def after_requirements(fix_id: str) -> None:
        if fix_id not in order:
            for required in (*FIXES[fix_id].requires, *FIXES[fix_id].after):
                if required in ids:
                    after_requirements(required)
            order.append(fix_id)

    for fix_id in ids:
        after_requirements(fix_id)
    return order


def imports_nothing(ids: tuple[str, ...] | list[str]) -> bool:
    """Every module these fixes patch is imported in this process already: applying them here runs no module's
    import-time code (which may read a rank's environment this process does not have)."""
    return all(h.module in sys.modules for i in ids for h in FIXES[i].hunks)


def upstream_diff(fix_id: str) -> str:
    """``fix_id``'s patch of the framework's source, as the fixes it requires leave that source."""
    fix = FIXES[fix_id]
    return fix.diff([FIXES[r] for r in in_order(resolve(",".join(fix.requires)))] if fix.requires else [])


def apply_fixes(ids: tuple[str, ...] | list[str]) -> None:
    """Apply these fixes in this process (idempotent), in ``in_order``'s order."""
    with batched():
        for fix_id in in_order(ids):
            FIXES[fix_id].apply()


def prepare(options: dict) -> Callable[[], None]:
    """A rank's set-up options put in force before the framework runs: their fixes applied, here and in the
    processes the framework spawns (``apply_carried``), and the functions the fix table asks about watched
    (``harness.fixes.reach``), here and there too. Returns what takes the watch off again."""
    ids = tuple(options.get("fixes", ()))
    apply_fixes(ids)
    _carry(CARRIED_VAR, ",".join(ids))
    reach = options.get(REACH_OPTION)
    _carry(REACH_VAR, json.dumps(reach) if reach else "")
    if not reach:
        return lambda: None
    return watch(edits(reach["fixes"]), reach["dir"])


def _carry(var: str, value: str) -> None:
    if value:
        os.environ[var] = value
    else:
        os.environ.pop(var, None)


def apply_carried() -> None:
    """In a process the framework spawned from a rank (an async writer, a Zero-Cost Checkpointing worker): the
    rank's fixes, applied before the process unpickles its work, and its reach watch. A spawned process imports
    the rank's main module again as ``__mp_main__``, which calls this, so a fixed ``paddle.save`` is what a fixed
    rank's writer runs, and a fix whose edits only a writer runs counts as reached."""
    apply_fixes([i for i in os.environ.get(CARRIED_VAR, "").split(",") if i])
    reach = os.environ.get(REACH_VAR)
    if reach:
        carried = json.loads(reach)
        watch(edits(carried["fixes"]), carried["dir"])


def edits(ids: list[str] | tuple[str, ...]) -> list[Watched]:
    """These fixes' edits, function by function, as the reach recorder takes them."""
    return [(i, h.module, h.qualname, h.edits) for i in ids for h in FIXES[i].hunks]
