"""Reducing a finding past Hypothesis (harness.campaign.reduce): smaller worlds first, then fewer ops, each kept only
where the case still fails the same way; and a virtual campaign's finding too big for real ranks reduced to one they can
confirm (harness.campaign.fuzz._reduced)."""

from __future__ import annotations

import importlib.util
import time

import pytest

from harness.campaign.reduce import capped, fewer_ops, reduce_case, smaller_worlds
from harness.judging.fidelity import max_world
from properties.model.case import Case, Op, TensorCase
from reference.layout import Flat, Mesh, Replicate, Shard, Sharded

SAVE_MESH, LOAD_MESH = Mesh((3, 2, 4)), Mesh((3, 1, 7))


def _case(ops: tuple[Op, ...], fault: dict | None = None) -> Case:
    tensors = (TensorCase("w", "F32", (12, 2), 1), TensorCase("e", "F32", (5,), 2), TensorCase("f", "I32", (3,), 3))
    save = {"w": Sharded(SAVE_MESH, (Shard(0), Replicate(), Shard(1))).to_json(),
            "e": Sharded(SAVE_MESH, (Replicate(), Replicate(), Replicate()), ((2, 3),)).to_json(),
            "f": Flat(SAVE_MESH, 2, 0, 8).to_json()}
    load = {"w": Sharded(LOAD_MESH, (Replicate(), Replicate(), Shard(0))).to_json(),
            "e": Sharded(LOAD_MESH, (Replicate(), Replicate(), Replicate()), ((2, 6),)).to_json(),
            "f": Flat(LOAD_MESH, 2, 0, 8).to_json()}
    return Case("P-LIFECYCLE", "paddle-dcp", tensors, save, load, ops, {"same_dir": True}, 0, fault=fault)


OPS = (Op("save", "step-0", 0), Op("save", "step-1", 1), Op("load", "step-1", 1), Op("load", "step-0", 0),
       Op("load", "step-999", 0), Op("load", "step-1", 1))


def test_meshes_shrink_smallest_world_first_and_nothing_else_changes() -> None:
    case = _case(OPS)
    assert max_world(case) == 24
    worlds = [(c.world_size("save"), c.world_size("load")) for c in smaller_worlds(case)]
    # caps 1, 2, 3 ((1, 1), (8, 4), (18, 9)) and dims collapsed to 1, by largest world; none as large as before
    assert worlds == [(1, 1), (2, 1), (3, 3), (6, 3), (4, 7), (8, 4), (8, 7), (18, 9), (12, 21)]
    two = capped(case, 2)
    assert two is not None
    assert two.save_layout["w"]["placements"] == case.save_layout["w"]["placements"]
    assert two.save_layout["e"]["owner"] == [[2, 1]] and two.load_layout["e"]["owner"] == [[2, 1]]  # last index
    assert two.save_layout["f"]["total"] == 8 and two.ops == case.ops and two.tensors == case.tensors


def test_ops_go_in_chunks_while_the_case_still_fails_the_same_way() -> None:
    def still_fails(case: Case) -> bool:  # a cache: a load of a name never saved, after another load
        names = [op.name for op in case.ops]
        return "step-999" in names and any(op.kind == "load" for op in case.ops[:names.index("step-999")]) \
            and any(op.kind == "save" for op in case.ops)

    smallest = fewer_ops(_case(OPS), still_fails, time.monotonic() + 60)
    assert [(op.kind, op.name) for op in smallest.ops] == [("save", "step-1"), ("load", "step-0"),
                                                           ("load", "step-999")]


def test_a_fault_case_keeps_its_ops_and_a_spent_budget_keeps_the_case() -> None:
    fault = {"kind": "kill", "op": 1, "syscall": "openat", "k": 1, "path": "x"}
    assert fewer_ops(_case(OPS, fault), lambda c: True, time.monotonic() + 60).ops == OPS
    case = _case(OPS)
    assert reduce_case(case, lambda c: True, time.monotonic() - 1) is case


@pytest.mark.skipif(importlib.util.find_spec("paddle") is None, reason="needs Paddle")
def test_a_virtual_finding_too_big_for_real_ranks_is_reduced_to_one_they_hold() -> None:
    """Paddle's unique_id-blind cache met at 8 virtual ranks (a load of a version never saved gives the previous
    load's data): reduced to one rank, and only the ops that show it."""
    from harness.campaign.fuzz import _reduced
    from harness.campaign.results import Finding
    from harness.judging.judge import Judge
    from harness.ranks.runners import Runners

    mesh = Mesh((2, 2, 2))
    layout = {"w": Sharded(mesh, (Shard(0), Replicate(), Replicate())).to_json()}
    ops = (Op("save", "step-0", 0), Op("save", "step-1", 1), Op("load", "step-0", 0), Op("load", "step-999", 0))
    case = Case("P-LIFECYCLE", "paddle-dcp", (TensorCase("w", "F32", (4, 2), 1),), layout, layout, ops,
                {"same_dir": True}, 0)
    judge = Judge(Runners("paddle-dcp", "virtual"), exploring=True)  # no known findings: it is a new bug here
    try:
        judgement, outcome = judge(case)
        assert not judgement.ok
        finding = Finding(case, judgement, bucket=judge.bucket(case, judgement, outcome))
        reduced = _reduced(judge, finding, time.monotonic() + 120)
        assert max_world(reduced.case) == 1 and reduced.bucket is not None
        assert reduced.bucket.core == finding.bucket.core == "silent-corruption|loaded-unsaved"
        assert [(op.kind, op.name) for op in reduced.case.ops] == [("save", "step-0"), ("load", "step-0"),
                                                                   ("load", "step-999")]
    finally:
        judge.close()
