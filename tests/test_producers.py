"""P-MODEL: a real model's and optimizer's sharded state (reference/producers.py says what it must be). The
reference's side is checked here without a framework; one drawn case runs through Paddle's own layers."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings

from properties.model.case import Case, CaseError
from properties.registry import property_cases
from reference import producers
from reference.errors import LayoutError
from reference.layout import Shard, Sharded

CAPS = frozenset({"reshard", "producer:tp", "dtype:F32", "dtype:BF16", "format:pickle", "format:safetensors"})


def test_a_16_bit_model_with_adamw_holds_moments_powers_and_an_f32_master_per_parameter() -> None:
    given = producers.tensors(("up", "norm"), vocab=2, hidden=3, ffn=4, dtype="BF16", optimizer=True)
    assert given["model/up.weight"] == ("BF16", (3, 4)) and given["master/up.weight"] == ("F32", (3, 4))
    assert given["optimizer/norm.bias.m2"] == ("F32", (3,)) and given["optimizer/up.bias.beta1_pow"] == ("F32", (1,))
    assert len(given) == 4 * 6  # four parameters: the weight, two moments, two powers, a master
    assert "master/up.weight" not in producers.tensors(("up",), 2, 3, 4, "F32", optimizer=True)
    assert producers.spec(given) == (("up", "norm"), 1, 3, 4, "BF16", True)


def test_tensor_parallelism_splits_what_each_layer_splits_and_nothing_else() -> None:
    splits = {n: producers.layout(n, 2).placements for n in ("model/emb.weight", "model/up.weight", "model/up.bias",
                                                              "model/down.weight", "optimizer/down.weight.m1")}
    assert splits == {"model/emb.weight": (Shard(0),), "model/up.weight": (Shard(1),), "model/up.bias": (Shard(0),),
                      "model/down.weight": (Shard(0),), "optimizer/down.weight.m1": (Shard(0),)}
    for whole in ("model/down.bias", "model/norm.weight", "optimizer/up.weight.beta2_pow"):
        assert not any(isinstance(p, Shard) for p in producers.layout(whole, 2).placements)
    assert isinstance(producers.layout("master/emb.weight", 1), Sharded)


def test_a_case_not_as_the_producer_gives_it_is_refused_with_its_reason() -> None:
    given = producers.tensors(("emb",), vocab=3, hidden=1, ffn=1, dtype="F32", optimizer=False)
    with pytest.raises(LayoutError, match="multiples of the save world 2"):
        producers.check(given, {"save": {n: producers.layout(n, 2) for n in given}})
    with pytest.raises(LayoutError, match="not what the tp model gives"):
        producers.spec({**given, "optimizer/emb.weight.m1": ("F32", (3, 1))})
    data = _drawn().to_json()
    name = next(n for n in data["load_layout"] if n.startswith("model/"))
    data["load_layout"][name]["placements"] = ["R"] if data["load_layout"][name]["placements"] != ["R"] else ["S0"]
    with pytest.raises(CaseError, match=r"not where tensor parallelism|multiples"):
        Case.from_json(json.loads(json.dumps(data)))


def _drawn() -> Case:
    from hypothesis import find

    return find(property_cases("P-MODEL", "paddle-dcp", 2, CAPS),
                lambda c: c.world_size("load") == 2 and any(t.name.startswith("model/") for t in c.tensors),
                settings=settings(max_examples=200, database=None))


@settings(max_examples=50, deadline=None)
@given(property_cases("P-MODEL", "paddle-dcp", 2, CAPS))
def test_drawn_cases_are_the_producers_and_valid(case: Case) -> None:
    assert Case.from_json(case.to_json()) == case
    assert case.options["producer"] == "tp" and "nested" not in case.options


@pytest.mark.multirank
def test_a_bf16_model_with_adamw_resumes_on_another_tensor_parallel_degree() -> None:
    """Through Paddle's own layers and optimizer, saved on 2 ranks and loaded on 1, bit for bit."""
    pytest.importorskip("paddle")
    from hypothesis import find

    from harness.judging.judge import Judge
    from harness.ranks.runners import Runners

    case = find(property_cases("P-MODEL", "paddle-dcp", 2, CAPS),
                lambda c: (c.world_size("save"), c.world_size("load")) == (2, 1)
                and any(t.name.startswith("master/") for t in c.tensors) and len(c.tensors) > 12,
                settings=settings(max_examples=400, database=None))
    judge = Judge(Runners("paddle-dcp", mode="pool"), exploring=False)
    try:
        judgement, _ = judge(case)
    finally:
        judge.close()
    assert judgement.ok, "\n".join(judgement.details)


def test_a_campaign_never_runs_a_case_the_format_rejects() -> None:
    """A shrinker's step can break a rule only the case format checks (here: a layout tensor parallelism does not
    give); the ranks would meet it as a failure to set the case up, read as the SUT's crash. Campaigns filter it."""
    from harness.campaign.fuzz import _well_formed

    good = _drawn()
    data = good.to_json()
    name = next(n for n in data["load_layout"] if n.startswith("model/"))
    data["load_layout"][name]["placements"] = ["R"] if data["load_layout"][name]["placements"] != ["R"] else ["S0"]
    bad = Case(**{**{f: getattr(good, f) for f in ("property", "sut", "tensors", "save_layout", "ops", "options",
                                                     "seed")}, "load_layout": data["load_layout"]})
    assert _well_formed(good) and not _well_formed(bad)
