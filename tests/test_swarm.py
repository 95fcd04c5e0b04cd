"""Swarm configurations (properties.generate.swarm): deterministic per seed, never leave out what a property needs, and
every drawable property of every SUT still draws cases under any of them."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.sut import REGISTRY
from properties.generate.swarm import FLOATS, GROUPS, swarm, swarm_fixes, swarmable
from properties.registry import REGISTRY as PROPERTIES
from properties.registry import drawable_properties, property_cases


def _caps(name: str) -> frozenset[str]:
    info = REGISTRY[name]
    module, _, cls = info.target.partition(":")
    return frozenset(getattr(__import__(module, fromlist=[cls]), cls).capabilities)


SUTS = sorted(REGISTRY)


@pytest.mark.parametrize("sut", SUTS)
def test_a_configuration_leaves_out_only_what_widens_a_case(sut: str) -> None:
    caps = _caps(sut)
    configs = [swarm(caps, seed) for seed in range(40)]
    assert configs == [swarm(caps, seed) for seed in range(40)]  # deterministic
    for kept, left_out in configs:
        assert kept | set(left_out) == caps and not kept & set(left_out)
        for prefix in GROUPS:
            assert not any(c.startswith(prefix) for c in caps) or any(c.startswith(prefix) for c in kept)
        assert not caps & set(FLOATS) or kept & set(FLOATS)
    # configurations differ from batch to batch: more than 10, or every one the SUT's few features allow
    made = {left for _, left in configs}
    assert len(made) > 10 or made == {swarm(caps, seed)[1] for seed in range(400)}
    for prop in drawable_properties(caps, faults=True):  # what a property needs comes back
        needs = PROPERTIES[prop].drawable
        assert all(needs(swarm(caps, seed, needs)[0]) for seed in range(40)), prop


@pytest.mark.parametrize("sut", SUTS)
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_every_property_draws_under_a_configuration(sut: str, data: st.DataObject) -> None:
    caps = _caps(sut)
    prop = data.draw(st.sampled_from(drawable_properties(caps, faults=True)))
    kept, _ = swarm(caps, data.draw(st.integers(0, 2**16)), PROPERTIES[prop].drawable)
    case = data.draw(property_cases(prop, sut, 2, kept, faults=True))
    dtypes = {c.split(":", 1)[1] for c in kept if c.startswith("dtype:")}
    # a trainer's (and P-MODEL's AdamW's) moments and master weights are F32 whatever its weights are, and a real
    # producer's parameters are of the dtypes it has (reference.producers.PARAM_DTYPES) whatever the batch keeps
    if "trainer_state" not in caps and prop != "P-MODEL":
        assert not dtypes or {t.dtype for t in case.tensors} <= dtypes


def test_a_round_leaves_out_a_few_fixes_with_what_requires_them() -> None:
    fixes = [f"f{n}" for n in range(20)]
    requirers = {"f3": ["f7"], "f7": ["f11"]}.get
    rounds = [swarm_fixes(fixes, f"9|{n}", lambda f: requirers(f) or []) for n in range(200)]
    assert rounds == [swarm_fixes(fixes, f"9|{n}", lambda f: requirers(f) or []) for n in range(200)]
    assert 60 < sum(not r for r in rounds) < 140  # about half the rounds carry every fix
    for left in rounds:
        assert list(left) == sorted(set(left)) and set(left) <= set(fixes)
        assert ("f3" not in left or {"f7", "f11"} <= set(left)) and ("f7" not in left or "f11" in left)
        assert len(set(left) - {"f7", "f11"}) <= 2
    assert swarm_fixes([], "9|1", lambda f: []) == ()


def test_the_values_of_a_choice_are_a_group_and_odds_steer_what_stays() -> None:
    """A multi-valued option's values are alternatives (one at least stays); a single-valued one is not swarmed.
    Keep odds move what stays: a feature kept at odds 0.8 stays far more often than one at 0.2."""
    caps = {"choice:k=1", "choice:k=2", "choice:solo=3", "zero_size", "flag:f", "dtype:F32", "reshard"}
    assert swarmable(caps) == ("choice:k=1", "choice:k=2", "flag:f", "zero_size")
    configs = [swarm(caps, seed)[0] for seed in range(200)]
    assert all({"choice:k=1", "choice:k=2"} & kept and {"choice:solo=3", "reshard"} <= kept for kept in configs)
    assert any("choice:k=1" not in kept for kept in configs) and any("choice:k=2" not in kept for kept in configs)
    odds = {"zero_size": 0.8, "flag:f": 0.2}
    steered = [swarm(caps, seed, keep=lambda c: odds.get(c, 0.5))[0] for seed in range(400)]
    assert sum("zero_size" in k for k in steered) > 260 and sum("flag:f" in k for k in steered) < 140


def test_a_heavier_fix_is_left_out_more_often() -> None:
    fixes = ["a", "b", "c"]
    rounds = [swarm_fixes(fixes, f"7|{n}", lambda f: [], lambda f: 2.0 if f == "a" else 0.5) for n in range(400)]
    counts = {f: sum(f in r for r in rounds) for f in fixes}
    assert counts["a"] > 2 * counts["b"] and counts["a"] > 2 * counts["c"]
