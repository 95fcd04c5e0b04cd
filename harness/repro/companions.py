"""The fewest other known bugs' fixes a repro's run needs beside its own fix: a repro may pass through another known
bug on its way (a load that sets it off fails with that bug; a fixed save goes on to a kernel that stock CPU Paddle
lacks), so ``run.sh --with-fix`` with the own fix alone still fails, with the other bug's failure. Each candidate set
is judged by a run in fresh processes, as the reader runs it; the search is delta debugging over the framework's
other fixes, one needed fix at a time by binary search, bounded in runs."""

from __future__ import annotations

from collections.abc import Callable

from harness.fixes import FIXES, covering, in_order, resolve, stack

RUNS = 24  # fresh runs a search may take beyond the first (each is a launch of the whole repro)


def others(stem: str) -> list[str]:
    """The fixes a companion may come from: every fix of the stem's frameworks that is not its own."""
    own = covering(stem)
    frameworks = {name for i in own for name in stack(FIXES[i].framework)}
    return [i for i, f in FIXES.items() if f.framework in frameworks and i not in own]


def fewest(stem: str, passes: Callable[[tuple[str, ...]], bool], runs: int = RUNS) -> tuple[str, ...] | None:
    """The smallest set of other fixes with which ``passes(own + set)`` holds, found in about k·log2(n) + 1 calls for
    k needed of n fixes (each needed fix is the last of the shortest passing prefix: a binary search); None when even
    every other fix does not make it pass. Where the bound of ``runs`` ends the search, the smallest set seen to pass,
never one no run has shown to pass."""
    own = covering(stem)
    left = [runs]

    def check(chosen: list[str]) -> bool:
        left[0] -= 1
        return passes(resolve(",".join((*own, *chosen))))

    # each fix after the fixes it requires: else a requirer found first stands in for the fix it brings along
    candidates, needed = in_order(others(stem)), []
    if not candidates or not check(candidates):
        return None
    # Throughout, needed + candidates is a set that was seen to pass: what is returned when the runs run out.
    while candidates and left[0] > 0:
        if check(needed):
            candidates = []
            break
        low, high = 1, len(candidates)  # needed + candidates[:high] passes
        while low < high and left[0] > 0:
            middle = (low + high) // 2
            if check(needed + candidates[:middle]):
                high = middle
            else:
                low = middle + 1
        if low < high:  # out of runs
            candidates = candidates[:high]
            break
        needed.append(candidates[high - 1])
        candidates = candidates[:high - 1]
    return tuple(i for i in resolve(",".join((*own, *needed, *candidates))) if i not in own)
