"""Swarm configurations (Groce et al., ISSTA 2012): each batch of a campaign draws its cases from a random subset
of what the SUT can hold, so one bug that dominates the default mix (a dtype, zero-size tensors, one file format)
cannot mask the rest: in about half the batches it cannot even be drawn.

A configuration leaves out optional capabilities that only widen what a case may hold — dtypes, file formats,
tensor kinds and async executors (at least one of each group stays), zero-size tensors, saving every replica,
boolean flags — never one a property needs to run at all (async, reshard, latest, ...), so every property still
draws.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable

#: A trainer's parameters and most strategies' plain tensors need one of these: one at least stays.
FLOATS = ("dtype:F32", "dtype:BF16", "dtype:F16")
#: Groups of alternatives (one at least stays) and lone options (each kept or left out).
GROUPS = ("dtype:", "format:", "tensor_kind:", "async_executor:")
OPTIONAL = ("zero_size", "save_replicas")
FLAGS = "flag:"


def swarm(capabilities: Iterable[str], seed: int, needs: Callable[[frozenset[str]], bool] = lambda _: True,
          ) -> tuple[frozenset[str], tuple[str, ...]]:
    """The capabilities a batch draws from, and the ones it leaves out (sorted), for ``seed``. ``needs``: what
    the batch's property must still be able to draw from (a training property needs BF16, say); left-out
    capabilities come back, in order, until it can."""
    caps = sorted(set(capabilities))
    rng = random.Random(seed)
    out: set[str] = set()
    for prefix in GROUPS:
        members = [c for c in caps if c.startswith(prefix)]
        if len(members) > 1:
            kept = [c for c in members if rng.random() < 0.5] or [rng.choice(members)]
            out.update(c for c in members if c not in kept)
    floats = [c for c in FLOATS if c in caps]
    if floats and all(c in out for c in floats):
        out.discard(rng.choice(floats))
    out.update(c for c in caps if (c in OPTIONAL or c.startswith(FLAGS)) and rng.random() < 0.5)
    for cap in sorted(out):
        if needs(frozenset(c for c in caps if c not in out)):
            break
        out.discard(cap)
    return frozenset(c for c in caps if c not in out), tuple(sorted(out))


def swarm_fixes(fixes: Iterable[str], seed: int | str, requirers: Callable[[str], Iterable[str]]) -> tuple[str, ...]:
    """The known-bug fixes (harness.fixes) a round of a campaign leaves out, for ``seed``: none in half the
    rounds, else one or two, with every fix that requires one left out (sorted). A bug reachable only through a
    known bug's behaviour (a file the stock code writes, an error path it takes) stays reachable, while most rounds
    spend no time on known bugs. ``requirers``: the fixes that require a fix."""
    pool = sorted(set(fixes))
    rng = random.Random(seed)
    if not pool or rng.random() < 0.5:
        return ()
    out = set(rng.sample(pool, min(len(pool), rng.choice((1, 2)))))
    grown = True
    while grown:
        more = {r for f in out for r in requirers(f) if r in pool} - out
        out |= more
        grown = bool(more)
    return tuple(sorted(out))
