"""The load parameters paddle-dcp draws (issue: every public parameter judged against the reference): which are
claimed, that strategies reach each, and which the virtual world leaves to real ranks."""

from __future__ import annotations

from hypothesis import find, settings

from harness.sut.paddle_dcp import COMM_METHODS, VIRTUAL_COMM, PaddleDcpSut
from properties.registry import property_cases


def test_every_communicator_but_the_3d_one_is_claimed() -> None:
    claimed = {c.split("=", 1)[1] for c in PaddleDcpSut.capabilities if c.startswith("choice:comm_method=")}
    assert claimed == set(COMM_METHODS) >= {"broadcast", "send_recv", "grouped_send_recv", "multi_group_broadcast"}


def test_strategies_reach_each_communicator_and_virtual_ranks_play_only_collectives() -> None:
    for method in COMM_METHODS:
        case = find(property_cases("P-RESHARD", "paddle-dcp", 2, PaddleDcpSut.capabilities),
                    lambda c, m=method: c.options.get("comm_method") == m,
                    settings=settings(max_examples=400, database=None))
        assert PaddleDcpSut.virtual_plays(case) == (method in VIRTUAL_COMM)


def test_a_nested_state_dict_is_drawn_for_paddle_dcp() -> None:
    case = find(property_cases("P-ROUNDTRIP", "paddle-dcp", 2, PaddleDcpSut.capabilities),
                lambda c: "nested" in c.options and any(t.name.count("/") > 1 for t in c.tensors),
                settings=settings(max_examples=400, database=None))
    assert case.options["nested"] == "/"
