"""The save and load parameters paddle-dcp draws (issue: every public parameter judged against the reference): which
are claimed, that strategies reach each, and which the virtual world leaves to real ranks."""

from __future__ import annotations

import pytest
from hypothesis import find, settings

from harness.sut.paddle_dcp import COMM_METHODS, LOAD_APIS, MW_NAMES, VIRTUAL_COMM, PaddleDcpSut, state_key
from properties.generate.cases import Caps, in_same_dir, unmet_choices_dropped
from properties.model.case import Case
from properties.registry import property_cases


def test_every_communicator_but_the_3d_one_is_claimed() -> None:
    claimed = {c.split("=", 1)[1] for c in PaddleDcpSut.capabilities if c.startswith("choice:comm_method=")}
    assert claimed == set(COMM_METHODS) >= {"broadcast", "send_recv", "grouped_send_recv", "multi_group_broadcast"}


def test_strategies_reach_each_communicator_and_virtual_ranks_play_only_collectives() -> None:
    """(full_param's groups are real ranks' alone, test_full_params_groups_and_splits_are_drawn_only_for_full_param.)"""
    for method in COMM_METHODS:
        case = find(property_cases("P-RESHARD", "paddle-dcp", 2, PaddleDcpSut.capabilities),
                    lambda c, m=method: c.options.get("comm_method") == m and c.options.get("load_api") != "full_param",
                    settings=settings(max_examples=400, database=None))
        assert PaddleDcpSut.virtual_plays(case) == (method in VIRTUAL_COMM)


def test_a_nested_state_dict_is_drawn_for_paddle_dcp() -> None:
    case = find(property_cases("P-ROUNDTRIP", "paddle-dcp", 2, PaddleDcpSut.capabilities),
                lambda c: "nested" in c.options and any(t.name.count("/") > 1 for t in c.tensors),
                settings=settings(max_examples=400, database=None))
    assert case.options["nested"] == "/"


def _drawn(prop: str, want) -> Case:
    return find(property_cases(prop, "paddle-dcp", 2, PaddleDcpSut.capabilities), want,
                settings=settings(max_examples=600, database=None))


def test_strategies_reach_every_other_load_and_save_parameter() -> None:
    """coordinator_rank off rank 0, offload, an explicit unique_id, a merged load, and each master-weight naming
    with a master weight to rename."""
    assert _drawn("P-RESHARD", lambda c: c.options.get("load_api") == LOAD_APIS[1])
    assert _drawn("P-RESHARD", lambda c: c.options.get("coordinator_rank") == -1)
    assert _drawn("P-RESHARD", lambda c: c.options.get("offload") is True)
    assert _drawn("P-ROUNDTRIP", lambda c: isinstance(c.options.get("unique_id"), int))
    for naming in MW_NAMES:
        assert _drawn("P-RESHARD", lambda c, n=naming: c.options.get("mw_names") == n and "nested" not in c.options
                      and any(t.name.startswith("master/") for t in c.tensors))


def test_versions_of_one_directory_carry_no_explicit_unique_id() -> None:
    """Under same_dir a name's number is its id: a drawn unique_id would be a second, unused one."""
    case = _drawn("P-REPEAT", lambda c: c.options.get("same_dir") is True)
    assert "unique_id" not in case.options
    assert "unique_id" not in in_same_dir({"unique_id": 3, "format": "pickle"})


@pytest.mark.parametrize("naming", ["to_static", "to_dynamic"])
def test_a_renamed_master_weight_is_one_paddle_maps_back(naming: str) -> None:
    """The two names a case gives a master weight are the pair Paddle's mw_name_compatibility maps: its own mapping
    turns the load's key into the saved one."""
    pytest.importorskip("paddle")
    from paddle.distributed.flex_checkpoint.dcp.load_state_dict import _modify_mw_name_for_compatibility

    options = {"mw_names": naming}
    saved, asked = (state_key("master/w", options, side) for side in ("save", "load"))
    assert saved != asked and state_key("model/w", options, "load") == "model/w"
    missing = {asked}
    mapping = _modify_mw_name_for_compatibility({asked: object()}, missing, [saved])
    assert mapping == {asked: saved} and not missing
    assert state_key("master/w", {"mw_names": "off"}, "load") == "master/w"
    assert state_key("master/w", {"mw_names": naming, "nested": "/"}, "load") == "master.w"  # nested: no rename


def test_a_world_of_one_has_no_worker_group_for_multi_group_broadcast() -> None:
    """Paddle requires worker_groups for multi_group_broadcast and a world of one has no group: such a case is
    refused (a hand-written one exits 2; campaigns do not draw it), the same load on two ranks is not."""
    lone = _drawn("P-EDGE", lambda c: c.options.get("comm_method") == "multi_group_broadcast" and not c.tensors)
    assert "no worker group" in (PaddleDcpSut.refuses(lone) or "")
    two = _drawn("P-ROUNDTRIP", lambda c: c.options.get("comm_method") == "multi_group_broadcast"
                 and c.world_size(c.op_layouts(len(c.ops) - 1)) == 2)
    assert PaddleDcpSut.refuses(two) is None


def test_full_params_groups_and_splits_are_drawn_only_for_full_param() -> None:
    """A choice conditioned on another option (``choice:K=V@OTHER=W``) is in a case only where the other option
    has that value: full_param's groups and splits ride with ``load_api=full_param``, nowhere else."""
    case = _drawn("P-RESHARD", lambda c: c.options.get("load_api") == "full_param"
                  and c.options.get("full_param_groups") == "hv" and c.options.get("full_param_splits") == 3)
    assert not PaddleDcpSut.virtual_plays(case)
    other = _drawn("P-RESHARD", lambda c: c.options.get("load_api") == "load_state_dict")
    assert not {"full_param_groups", "full_param_splits"} & set(other.options)
    caps = Caps({"choice:mode=a", "choice:mode=b", "choice:depth=1@mode=b", "choice:depth=2@mode=b"})
    assert caps.choices == {"depth": [1, 2], "mode": ["a", "b"]} and caps.choice_when == {"depth": ("mode", "b")}
    assert unmet_choices_dropped({"mode": "a", "depth": 2}, caps) == {"mode": "a"}
    assert unmet_choices_dropped({"mode": "b", "depth": 2}, caps) == {"mode": "b", "depth": 2}


def test_full_param_on_hv_groups_in_a_world_of_one_is_refused() -> None:
    """full_param's horizontal/vertical assembler asserts a distributed job: a world of one has no groups to name."""
    lone = _drawn("P-EDGE", lambda c: c.options.get("full_param_groups") == "hv" and not c.tensors)
    assert "horizontal and vertical groups" in (PaddleDcpSut.refuses(lone) or "")
