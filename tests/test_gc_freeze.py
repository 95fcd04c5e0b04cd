"""harness.ranks.gc_freeze: what outlives a case is frozen for the collector, and thawed now and then."""

from __future__ import annotations

import gc
import weakref

from harness.ranks.gc_freeze import THAW_EVERY, GcFreezer


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the collector frees it


def test_a_case_s_garbage_is_collected_and_what_survives_is_frozen() -> None:
    gc_freezer = GcFreezer()
    try:
        garbage = weakref.ref(_Node())  # a cycle, already garbage
        gc_freezer.collect_and_freeze()
        assert garbage() is None and gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


def test_a_cycle_that_died_after_being_frozen_is_freed_at_the_next_thaw() -> None:
    gc_freezer = GcFreezer()
    try:
        node = _Node()
        alive = weakref.ref(node)
        gc_freezer.collect_and_freeze()  # node survives the case: frozen
        del node
        for _ in range(THAW_EVERY - 2):
            gc_freezer.collect_and_freeze()
        assert alive() is not None  # frozen: the collector does not walk it
        gc_freezer.collect_and_freeze()  # the THAW_EVERY-th: thawed and collected
        assert alive() is None
    finally:
        gc.unfreeze()
