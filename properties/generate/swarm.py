"""Swarm configurations (Groce et al., ISSTA 2012): each batch of a campaign draws its cases from a random subset
of what the SUT can hold, so one bug that dominates the default mix (a dtype, zero-size tensors, one file format)
cannot mask the rest: in about half the batches it cannot even be drawn.

A configuration leaves out optional capabilities that only widen what a case may hold — dtypes, file formats,
tensor kinds, async executors and the values of each multi-valued option (at least one of each group stays),
zero-size tensors, saving every replica, explicit checkpoint ids, boolean flags — never one a property needs to
run at all (async, reshard, latest, ...), so every property still draws.

Each optional capability is kept with probability ``keep(capability)``: one half unless a coverage-guided campaign
says otherwise (harness.campaign.guidance), so what has recently paid off is drawn more often.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable

#: A trainer's parameters and most strategies' plain tensors need one of these: one at least stays.
FLOATS = ("dtype:F32", "dtype:BF16", "dtype:F16")
#: Groups of alternatives (one at least stays) and lone options (each kept or left out).
GROUPS = ("dtype:", "format:", "tensor_kind:", "async_executor:")
OPTIONAL = ("zero_size", "save_replicas", "unique_id")
FLAGS = "flag:"
CHOICES = "choice:"  # "choice:KEY=VALUE": the values of one KEY are a group


def group_of(capability: str) -> str | None:
    """The group a capability is one alternative of (its prefix, or a choice's key), None for a lone one."""
    if capability.startswith(CHOICES):
        return capability.partition("=")[0] + "="
    return next((prefix for prefix in GROUPS if capability.startswith(prefix)), None)


def swarmable(capabilities: Iterable[str]) -> tuple[str, ...]:
    """The capabilities a configuration may leave out (sorted): alternatives of a group with more than one, lone
    options and flags."""
    caps = sorted(set(capabilities))
    groups: dict[str, list[str]] = {}
    for c in caps:
        if (g := group_of(c)) is not None:
            groups.setdefault(g, []).append(c)
    alternatives = {c for members in groups.values() if len(members) > 1 for c in members}
    return tuple(c for c in caps if c in alternatives or c in OPTIONAL or c.startswith(FLAGS))


def swarm(capabilities: Iterable[str], seed: int, needs: Callable[[frozenset[str]], bool] = lambda _: True,
          keep: Callable[[str], float] = lambda _: 0.5) -> tuple[frozenset[str], tuple[str, ...]]:
    """The capabilities a batch draws from, and the ones it leaves out (sorted), for ``seed``. ``needs``: what
    the batch's property must still be able to draw from (a training property needs BF16, say); left-out
    capabilities come back, in order, until it can. ``keep``: the odds each optional capability stays."""
    caps = sorted(set(capabilities))
    optional = set(swarmable(caps))
    rng = random.Random(seed)
    out: set[str] = set()
    groups: dict[str, list[str]] = {}
    for c in caps:
        if c in optional and (g := group_of(c)) is not None:
            groups.setdefault(g, []).append(c)
    for members in groups.values():
        kept = [c for c in members if rng.random() < keep(c)] or [rng.choice(members)]
        out.update(c for c in members if c not in kept)
    floats = [c for c in FLOATS if c in caps]
    if floats and all(c in out for c in floats):
        out.discard(rng.choice(floats))
    out.update(c for c in caps if c in optional and group_of(c) is None and rng.random() >= keep(c))
    for cap in sorted(out):
        if needs(frozenset(c for c in caps if c not in out)):
            break
        out.discard(cap)
    return frozenset(c for c in caps if c not in out), tuple(sorted(out))


def swarm_fixes(fixes: Iterable[str], seed: int | str, requirers: Callable[[str], Iterable[str]],
                weight: Callable[[str], float] = lambda _: 1.0) -> tuple[str, ...]:
    """The known-bug fixes (harness.fixes) a round of a campaign leaves out, for ``seed``: none in half the
    rounds, else one or two, with every fix that requires one left out (sorted). A bug reachable only through a
    known bug's behaviour (a file the stock code writes, an error path it takes) stays reachable, while most rounds
    spend no time on known bugs. ``requirers``: the fixes that require a fix; ``weight``: how much likelier a fix
    is to be left out than another (a coverage-guided campaign's say)."""
    pool = sorted(set(fixes))
    rng = random.Random(seed)
    if not pool or rng.random() < 0.5:
        return ()
    out: set[str] = set()
    for _ in range(min(len(pool), rng.choice((1, 2)))):  # drawn by weight, without replacement
        rest = [f for f in pool if f not in out]
        out.add(rng.choices(rest, weights=[max(weight(f), 1e-9) for f in rest])[0])
    grown = True
    while grown:
        more = {r for f in out for r in requirers(f) if r in pool} - out
        out |= more
        grown = bool(more)
    return tuple(sorted(out))
