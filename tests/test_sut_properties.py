"""The property suite against the SUT chosen with ``--sut`` (default: the reference), on real ranks in a warm
pool. Against the reference every property must hold; against a real SUT a failure here is a finding: run
``ckpt-harness fuzz`` to shrink it into a case file."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from harness.sut import adapter_class
from properties.model.case import Case
from properties.registry import REGISTRY, default_properties, property_cases


@pytest.mark.multirank
@pytest.mark.parametrize("prop", default_properties(faults=False))
def test_property_holds(prop: str, sut_judge, request: pytest.FixtureRequest) -> None:
    name = request.config.getoption("--sut")
    ranks = request.config.getoption("--ranks")
    caps = frozenset(adapter_class(name).capabilities)
    why = REGISTRY[prop].skip_reason(caps)
    if why is not None:
        pytest.skip(f"{name}: {why}")

    # A quarter of the profile's examples: every example here is a real multi-rank save and load.
    @settings(max_examples=max(5, settings.default.max_examples // 4))
    @given(property_cases(prop, name, ranks, caps))
    def check(case: Case) -> None:
        judgement, outcome = sut_judge(case)
        shims = outcome.shims
        assert judgement.ok, f"{judgement.verdict.value} (shims: {list(shims)}):\n" + "\n".join(judgement.details)

    check()
