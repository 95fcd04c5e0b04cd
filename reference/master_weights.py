"""What a resume restores of a trainer's state saved without one of a 16-bit weight and its FP32 master weight.

A checkpoint may keep only one of the two, the other being the same value in another precision: the weight is its
master rounded (to nearest even, as training makes it after every step), the master is its weight widened
(exactly). PaddleFormers' Unified Checkpoint offers both under ``unified_checkpoint_config``:

- ``skip_save_model_weight``: the masters are saved where the weights would be, and a resume gives each weight
  with a master its master rounded to the weight's dtype; a weight without a master (an FP32 one) is saved as is.
- ``remove_master_weight``: no master is saved, and a resume gives each master its weight widened.

Either holds only where the job saves through its distributed path (more than one rank): a job of one rank saves
both. A state whose weights already are their masters rounded (any trained state) is restored unchanged.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from .tensor import Tensor
from .training import cast_bits, decode_bits

SKIP_MODEL_WEIGHT = "skip_save_model_weight"
REMOVE_MASTER_WEIGHT = "remove_master_weight"
FLAGS = (SKIP_MODEL_WEIGHT, REMOVE_MASTER_WEIGHT)


def restored(state: Mapping[str, Tensor], flags: Collection[str]) -> dict[str, Tensor]:
    """``state`` (``model/<p>``, ``master/<p>``, … keys) as a resume restores it from a save made under ``flags``."""
    out = dict(state)
    for key, tensor in state.items():
        family, _, param = key.partition("/")
        master = state.get(f"master/{param}")
        if family != "model" or master is None or tensor.dtype.name == "F32":
            continue
        if SKIP_MODEL_WEIGHT in flags:
            values = decode_bits(master.bits, "F32")
            out[key] = Tensor(tensor.dtype, cast_bits(values, tensor.dtype.name).reshape(tensor.shape))
        elif REMOVE_MASTER_WEIGHT in flags:
            values = decode_bits(tensor.bits, tensor.dtype.name)
            out[f"master/{param}"] = Tensor(master.dtype, cast_bits(values, "F32").reshape(master.shape))
    return out
