"""torch-dcp takes nested state dicts (reference/nesting.py): DCP flattens them itself, each leaf under its path
joined with ".", and a load fills every leaf at its path, keeping empty sub-dicts empty."""

from __future__ import annotations

import pytest

from harness.judging.judge import Judge
from harness.ranks.runners import Runners
from properties.model.case import Case

_MESH = {"dim_names": ["d0"], "shape": [2]}
_SHARDED = {"kind": "sharded", "mesh": _MESH, "owner": [], "placements": ["S0"]}
_REPLICATED = {**_SHARDED, "placements": ["R"]}
# a key with the join character inside ("layers.0"), a deeper path, a 0-d leaf, and an empty sub-dict
_TENSORS = {"model/layers.0/w": ("F32", [4]), "model/layers/1/w": ("BF16", [3, 2]), "optimizer/state/w/m1": ("F32", [])}


def _case() -> Case:
    return Case.from_json({
        "property": "P-RESHARD", "sut": "torch-dcp", "seed": 0, "version": 1,
        "tensors": [{"name": n, "dtype": dt, "shape": shape, "seed": i + 1}
                    for i, (n, (dt, shape)) in enumerate(sorted(_TENSORS.items()))],
        "save_layout": {n: _SHARDED if shape else _REPLICATED for n, (_, shape) in _TENSORS.items()},
        "load_layout": {n: _REPLICATED for n in _TENSORS},
        "ops": [{"kind": "save", "name": "step-0", "version": 0}, {"kind": "load", "name": "step-0", "version": 0}],
        "options": {"nested": "/", "empty_dicts": ["buffers/none"]},
    })


@pytest.mark.multirank
def test_a_nested_state_dict_round_trips_through_dcp_at_its_paths() -> None:
    pytest.importorskip("torch")
    judge = Judge(Runners("torch-dcp", mode="pool"), exploring=False)
    try:
        judgement, _ = judge(_case())
    finally:
        judge.close()
    assert judgement.ok, "\n".join(judgement.details)
