"""Nested state dicts (reference/nesting.py): what a nested save stores under which key, when a nesting is
ambiguous, and that case files and strategies carry nesting as the reference defines it."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings

from properties.generate.cases import cases
from properties.model.case import Case, CaseError, Op, TensorCase
from reference import nesting
from reference.layout import Mesh, replicated


def test_a_leaf_is_stored_under_its_path_joined_with_a_dot_and_read_back_at_its_path() -> None:
    leaves = {"model/layers/0/w": 1, "model/layers.1/b": 2, "model/w": 3, "rng": 4}
    tree = nesting.build(leaves, "/", ["model/unused", "extra"])
    assert tree == {"model": {"layers": {"0": {"w": 1}}, "layers.1": {"b": 2}, "w": 3, "unused": {}},
                    "rng": 4, "extra": {}}
    assert [nesting.stored_key(n, "/") for n in leaves] == ["model.layers.0.w", "model.layers.1.b", "model.w", "rng"]
    assert all(nesting.leaf(tree, n, "/") == v for n, v in leaves.items())
    assert nesting.empty_dicts_lost(tree, ["model/unused", "extra"], "/") == []
    tree["extra"]["x"] = 5
    assert nesting.empty_dicts_lost(tree, ["model/unused", "extra"], "/") == ["extra"]


@pytest.mark.parametrize(("names", "empty", "said"), [
    (["a/b.c", "a.b/c"], [], "both stored as 'a.b.c'"),
    (["a", "a/b"], [], "a prefix of its path is a leaf"),
    (["a//b"], [], "an empty key"),
    (["a/b"], ["a/b"], "its path holds a leaf"),
    (["a/b"], ["a"], "holds leaves"),
])
def test_an_ambiguous_nesting_is_a_typed_error(names, empty, said) -> None:
    with pytest.raises(nesting.NestingError, match=said):
        nesting.check(names, "/", empty)


def test_a_checkpoints_listing_reads_by_the_cases_names_again() -> None:
    stored = {"model.layers.0.w": "x", "stray": "y"}
    joined = lambda name: nesting.stored_key(name, "/")  # noqa: E731
    assert nesting.by_name(stored, ["model/layers/0/w"], joined) == {"model/layers/0/w": "x", "stray": "y"}
    assert nesting.by_name(stored, ["model/layers/0/w"], lambda name: name) == stored


def test_a_case_file_with_an_ambiguous_nesting_is_refused_with_its_reason() -> None:
    mesh = Mesh((1,))
    tensors = (TensorCase("a/b.c", "F32", (2,), 1), TensorCase("a.b/c", "F32", (2,), 2))
    layout = {t.name: replicated(mesh).to_json() for t in tensors}
    case = Case("P-ROUNDTRIP", "paddle-dcp", tensors, layout, layout, (Op("save", "s-1"), Op("load", "s-1")),
                {"nested": "/"})
    with pytest.raises(CaseError, match="both stored as"):
        Case.from_json(json.loads(case.dumps()))


@settings(max_examples=60, database=None)
@given(cases("P-EDGE", "paddle-dcp", 2, ["nested", "reshard", "zero_size"]))
def test_strategies_draw_nestings_the_reference_defines(case: Case) -> None:
    sep = case.options.get("nested")
    if sep:
        nesting.check([t.name for t in case.tensors], sep, case.options.get("empty_dicts", ()))
        assert Case.from_json(json.loads(case.dumps())) == case
