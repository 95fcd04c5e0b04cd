"""harness.ranks.heap: what outlives a case is frozen for the collector, and thawed now and then."""

from __future__ import annotations

import gc
import weakref

from harness.ranks.heap import THAW_EVERY, Heap


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the collector frees it


def test_a_case_s_garbage_is_collected_and_what_survives_is_frozen() -> None:
    heap = Heap()
    try:
        garbage = weakref.ref(_Node())  # a cycle, already garbage
        heap.settle()
        assert garbage() is None and gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


def test_a_cycle_that_died_after_being_frozen_is_freed_at_the_next_thaw() -> None:
    heap = Heap()
    try:
        node = _Node()
        alive = weakref.ref(node)
        heap.settle()  # node survives the case: frozen
        del node
        for _ in range(THAW_EVERY - 2):
            heap.settle()
        assert alive() is not None  # frozen: the collector does not walk it
        heap.settle()  # the THAW_EVERY-th: thawed and collected
        assert alive() is None
    finally:
        gc.unfreeze()
