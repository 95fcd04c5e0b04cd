"""A gather's payload unpickled once for every virtual rank: each rank gets objects equal to its own unpickle, with
containers of its own, so nothing one rank changes reaches another; what cannot be proven immutable is unpickled per
rank as before."""

from __future__ import annotations

import dataclasses
import pickle
from collections import defaultdict

import numpy as np

from harness.ranks.virtual.shared_objects import SHARE, UNSHAREABLE, GatherCopies, recipe


@dataclasses.dataclass(frozen=True)
class Index:
    key: str
    offset: tuple[int, ...]


@dataclasses.dataclass
class Loose:
    key: str


@dataclasses.dataclass(frozen=True)
class HoldsList:
    items: list


def test_each_rank_gets_its_own_containers_around_shared_immutable_leaves() -> None:
    payload = {"files": ["0_0.distcp", "1_0.distcp"], "index": [Index("w", (0, 2)), Index("w", (2, 0))],
               "nested": ([1, 2], "x"), "by_rank": defaultdict(list, {0: [Index("b", ())]})}
    data = pickle.dumps(payload)
    copies = GatherCopies()
    first, second = copies.loads(data, epoch=1), copies.loads(data, epoch=1)
    assert first == second == payload and first is not second
    assert first["index"] is not second["index"] and first["index"][0] is second["index"][0]  # a leaf: shared
    assert first["nested"][0] is not second["nested"][0]  # a list inside a tuple: fresh
    assert isinstance(second["by_rank"], defaultdict) and second["by_rank"].default_factory is list
    first["files"].append("2_0.distcp")
    first["by_rank"][1].append(Index("c", ()))
    first["nested"][0].clear()
    third = copies.loads(data, epoch=1)
    assert third == second == payload  # what one rank changed reached nobody else, nor the kept original


def test_what_cannot_be_proven_immutable_is_unpickled_per_rank() -> None:
    for payload in ([Loose("w")], {"a": np.zeros(3)}, [HoldsList([1])], [object()], {("k", [1]).__repr__(): Loose("")}):
        assert recipe(payload) is UNSHAREABLE, payload
    assert recipe((1, "a", Index("w", (1,)), frozenset({2}), np.float32(1))) is SHARE
    copies = GatherCopies()
    data = pickle.dumps([Loose("w")])
    a, b = copies.loads(data, 3), copies.loads(data, 3)
    assert a == b and a[0] is not b[0]


def test_a_new_gather_forgets_the_last() -> None:
    copies = GatherCopies()
    data = pickle.dumps([Index("w", (0,))])
    a = copies.loads(data, epoch=1)
    b = copies.loads(data, epoch=2)
    assert a == b and a[0] is not b[0]  # unpickled again for the new gather, not shared across gathers


def test_a_pure_call_on_the_same_immutable_items_is_made_once_per_epoch() -> None:
    from harness.ranks.virtual.shared_objects import SharedCalls

    epoch, calls = [1], []

    def plan(items: list) -> dict:
        calls.append(len(items))
        return {"w": sorted(items, key=repr)}

    shared = SharedCalls(lambda: epoch[0])
    planned = shared.wrap(plan)
    items = [Index("w", (2,)), Index("w", (0,))]
    first, second = planned(list(items)), planned(list(items))  # each rank's own list of the same gathered leaves
    assert first == second == plan(items) and calls == [2, 2]  # one shared call, then the direct one above
    first["w"].append(Index("x", ()))
    assert planned(list(items)) == second  # a rank's change to its result reaches no other rank
    planned([Index("w", (2,)), Index("w", (0,))])  # equal values, other objects: not proven the same, made again
    epoch[0] = 2
    planned(list(items))  # a new epoch: made again
    loose = [Loose("w")]
    planned(loose), planned(loose)  # a mutable argument: made on every call
    assert calls == [2, 2, 2, 2, 1, 1]
    epoch[0], calls[:] = 3, []
    mine = list(items)
    planned(mine)
    mine.append(Index("x", ()))  # the first caller changes its list afterwards: the others' calls still match
    planned(list(items)), planned(items[:1]), planned(items[::-1])  # a prefix, another order: made again
    assert calls == [2, 1, 2]


def test_deepcopy_keeps_an_immutable_frozen_dataclass_and_copies_one_that_holds_a_list() -> None:
    import copy
    import sys

    from harness.ranks.virtual.shared_objects import deepcopy_keeping_immutable, frozen_classes

    assert set(frozen_classes([sys.modules[__name__]])) == {Index, HoldsList}
    kept, held = Index("w", (1, 2)), HoldsList([1])
    memo: dict = {}
    assert deepcopy_keeping_immutable(kept, memo) is kept
    copied = deepcopy_keeping_immutable(held, memo)
    assert copied == held and copied.items is not held.items
    assert copy.deepcopy({"k": [kept]})["k"][0] == kept  # the ordinary deepcopy is untouched by the functions
