"""A gather's payload unpickled once for every virtual rank: each rank gets objects equal to its own unpickle, with
containers of its own, so nothing one rank changes reaches another; what cannot be proven immutable is unpickled per
rank as before."""

from __future__ import annotations

import dataclasses
import pickle
from collections import defaultdict

import numpy as np

from harness.shared_objects import SHARE, UNSHAREABLE, GatherCopies, recipe


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
