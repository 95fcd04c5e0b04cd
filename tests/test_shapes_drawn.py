"""Cases reach the tensors real models have (0-d to 4-d, in every layout kind, dims smaller than the mesh) and
the version counts that expose id-matching bugs (1 and 11 in one directory)."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, find, settings

from harness.sut import adapter_class
from properties.generate.layouts import shapes
from properties.model.case import Case
from properties.registry import property_cases

CAPS = frozenset(adapter_class("reference").capabilities)
FIND = settings(max_examples=2000, deadline=None, suppress_health_check=list(HealthCheck), database=None)


def _drawn(prop: str, predicate) -> Case:
    return find(property_cases(prop, "reference", 4, CAPS), predicate, settings=FIND)


def _kinds(case: Case, ndim: int) -> set[str]:
    """Layout kinds (sharded / flat) under which the case saves or loads a tensor of ``ndim`` dims."""
    dims = {t.name: len(t.shape) for t in case.tensors}
    return {lay["kind"] for layouts in (case.save_layout, case.load_layout) for n, lay in layouts.items()
            if dims.get(n) == ndim}


def test_shapes_span_zero_to_four_dims_and_stay_small() -> None:
    for ndim in range(5):
        assert len(find(shapes(), lambda s, n=ndim: len(s) == n, settings=FIND)) == ndim
    assert find(shapes(), lambda s: len(s) == 4 and 0 in s, settings=FIND)
    big = find(shapes(), lambda s: math.prod(s) > 200, settings=FIND)
    assert math.prod(big) <= 256


def test_four_dim_tensors_are_drawn_sharded_and_flattened() -> None:
    assert "sharded" in _kinds(_drawn("P-RESHARD", lambda c: "sharded" in _kinds(c, 4)), 4)
    assert "flat" in _kinds(_drawn("P-FLAT", lambda c: "flat" in _kinds(c, 4)), 4)
    uneven = _drawn("P-ROUNDTRIP", lambda c: any(len(t.shape) == 4 and 0 < min(t.shape) < 4 for t in c.tensors))
    assert any(len(t.shape) == 4 for t in uneven.tensors)


def test_stacked_experts_and_training_parameters_reach_four_dims() -> None:
    moe = _drawn("P-MOE", lambda c: c.options.get("encoding") == "stacked" and any(len(t.shape) == 4
                                                                                  for t in c.tensors))
    assert moe.options["encoding"] == "stacked"
    trained = _drawn("P-RESUME", lambda c: any(len(t.shape) >= 3 for t in c.tensors))
    assert trained.training is not None


def test_repeated_saves_reach_ids_that_share_a_suffix() -> None:
    case = _drawn("P-REPEAT", lambda c: {"step-1", "step-11"} <= {op.name for op in c.ops if op.kind == "save"})
    assert sum(op.kind == "save" for op in case.ops) >= 12
