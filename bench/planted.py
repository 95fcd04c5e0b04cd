"""Defects planted for ``bench/detect.py``: each one a general kind of checkpoint bug, in the reference engine or
in Paddle's own load path, that a campaign should find unaided while the SUT's known bugs are there too.

Each adapter keeps its SUT's ``name``, so the campaign's known set (``tests/regressions``) still applies: the
Paddle defects are found, or not, among Paddle 3.3.1's real bugs, which the known set excuses.
"""

from __future__ import annotations

import contextlib
import math
import re
from pathlib import Path

import numpy as np

from harness.sut.paddle_dcp import PaddleDcpSut, _loaded_local
from harness.sut.reference import ReferenceSut
from reference.tensor import Tensor


def _rolled(tensor: Tensor) -> Tensor:
    """The tensor's elements moved by one place (a piece copied to the wrong offset)."""
    if tensor.bits.size < 2:
        return tensor
    flat = np.roll(tensor.bits.reshape(-1), 1)
    return Tensor(tensor.dtype, flat.reshape(tensor.bits.shape))


class RollsLoadsReference(ReferenceSut):
    """Every loaded tensor of more than one element comes back with its elements moved by one."""

    def load(self, root, name, targets, *, options):
        return {k: _rolled(t) for k, t in super().load(root, name, targets, options=options).items()}


class DropsEmptyReference(ReferenceSut):
    """Saves leave out tensors with no elements (a writer that skips empty buffers)."""

    def save(self, root, name, tensors, *, use_async, options):
        kept = {k: rt for k, rt in tensors.items() if rt.local.tensor.bits.size or not rt.local.global_shape}
        return super().save(root, name, kept, use_async=use_async, options=options)


class LoadsNewestReference(ReferenceSut):
    """A load by name gives the newest checkpoint instead (a resolver that ignores the name)."""

    def load(self, root, name, targets, *, options):
        return super().load(root, None, targets, options=options)


class IntsKeptReference(ReferenceSut):
    """Integer tensors are not restored: they keep what the target held (a loader filtering by dtype)."""

    def load(self, root, name, targets, *, options):
        out = super().load(root, name, targets, options=options)
        return {k: (targets[k].local.tensor if t.dtype.kind == "int" else t) for k, t in out.items()}


def _rolling(load):
    """``paddle.distributed.load_state_dict``, then every loaded local piece of more than one element rolled."""
    def load_state_dict(state_dict, *args, **kwargs):
        import paddle

        result = load(state_dict, *args, **kwargs)
        for value in state_dict.values():
            local = _loaded_local(value, None)
            if local is not None and math.prod(local.shape) > 1:
                with contextlib.suppress(Exception):  # a dtype without a CPU roll kernel stays as loaded
                    local.set_value(paddle.roll(local.reshape([-1]), 1).reshape(local.shape))
        return result
    return load_state_dict


class RollsLoadsPaddle(PaddleDcpSut):
    """Paddle's ``load_state_dict`` patched on every rank (an import-time hook) to roll what it loaded."""

    def setup(self, rank, world_size, options):
        import paddle.distributed as dist

        shims = super().setup(rank, world_size, options)
        if not getattr(dist.load_state_dict, "_planted", False):
            dist.load_state_dict = _rolling(dist.load_state_dict)
            dist.load_state_dict._planted = True
        return shims


class LoadsNewestPaddle(PaddleDcpSut):
    """A load by name of a same_dir checkpoint gives the newest version instead: a resolver that takes the highest
    ``unique_id`` with a metadata file and passes it to Paddle (not Paddle's own "latest", whose known bugs would
    show instead of the defect)."""

    def load(self, root, name, targets, *, options):
        if options.get("same_dir") and name is not None:
            ids = [int(p.name.split(".")[0]) for p in Path(root).rglob("*.metadata") if p.name.split(".")[0].isdigit()]
            if ids:
                name = re.sub(r"\d+$", str(max(ids)), name)
        return super().load(root, name, targets, options=options)


#: name -> (adapter, ranks, launch mode)
DEFECTS = {
    "reference-rolls-loads": ("bench.planted:RollsLoadsReference", 2, "in-process"),
    "reference-drops-empty": ("bench.planted:DropsEmptyReference", 2, "in-process"),
    "reference-loads-newest": ("bench.planted:LoadsNewestReference", 2, "in-process"),
    "reference-ints-kept": ("bench.planted:IntsKeptReference", 2, "in-process"),
    "paddle-rolls-loads": ("bench.planted:RollsLoadsPaddle", 2, "pool"),
    "paddle-loads-newest": ("bench.planted:LoadsNewestPaddle", 2, "pool"),
}
