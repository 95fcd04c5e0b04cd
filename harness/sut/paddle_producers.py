"""Real producers of sharded state for paddle-dcp (capabilities "producer:<name>", property P-MODEL): the state a
save hands Paddle, and the state a load fills, is what Paddle's own ``sharded_state_dict`` gives for a model of its
tensor-parallel layers (``VocabParallelEmbedding``, ``ColumnParallelLinear``, ``RowParallelLinear``, a
``LayerNorm``) under fleet's hybrid groups, and for ``AdamW`` (multi_precision) over it, bare (``tp``: tensor
parallelism over the world) or wrapped by ``DygraphShardingOptimizerV2`` (``stage1v2``: sharding over the world).
reference/producers.py says what each rank's pieces must be; every piece Paddle gives is held to it before the
case's bits go in, and a load is read back from a second ``sharded_state_dict`` of the same model and optimizer:
a load that filled a piece Paddle handed out but not the state behind it reads as lost."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.sut._paddle_common import from_paddle, write_bytes
from harness.sut.base import RankTensor
from reference import producers
from reference.layout import FlatRange
from reference.tensor import Tensor

# Paddle's key of a case name's state (AdamW.sharded_state_dict names them "<param>.<state>"; a master weight
# "<param>.w_0")
_OPTIMIZER_KEYS = {".m1": "moment1_0", ".m2": "moment2_0", ".beta1_pow": "beta1_pow_acc_0",
                   ".beta2_pow": "beta2_pow_acc_0"}


class ProducerMismatch(RuntimeError):
    """Paddle's producer gave a piece other than the one the producer puts on this rank (or a key the model does
    not have): a bug of the producer, met before any checkpoint code runs."""


def key(name: str) -> str:
    """Paddle's key of case tensor ``name`` (reference/producers.py names)."""
    family, _, rest = name.partition("/")
    if family == "master":
        return f"{rest}.w_0"
    if family == "optimizer":
        param = producers.parameter_of(name)
        return f"{param}.{_OPTIMIZER_KEYS[rest[len(param):]]}"
    return rest


@dataclass
class Produced:
    """A fresh model (and optimizer) of a case's layers on this rank, and the case's pieces it must give."""

    model: Any
    optimizer: Any
    tensors: dict[str, RankTensor]

    def state(self) -> dict[str, Any]:
        """The sharded state as Paddle gives it now, keyed by Paddle, each piece checked against the case's layout.
        A rank's empty piece of a flattened tensor is one Paddle gives no entry for."""
        model_state = self.model.sharded_state_dict()
        state = dict(model_state)
        if self.optimizer is not None:
            state.update(self.optimizer.sharded_state_dict(model_state))
        expected = {key(n): n for n, rt in self.tensors.items() if _numel(rt)}
        if set(state) != set(expected):
            raise ProducerMismatch(f"sharded_state_dict gave keys {sorted(state)}; this rank's pieces of the model "
                                   f"are {sorted(expected)}")
        for paddle_key, name in expected.items():
            _check(paddle_key, state[paddle_key], self.tensors[name])
        return state

    def read(self, state: dict[str, Any]) -> dict[str, Tensor]:
        """Each case tensor's piece in ``state``, as the case's dtype and shape (empty where the rank holds none)."""
        return {n: from_paddle(state[key(n)].local_tensor, rt.local.tensor.shape) if _numel(rt) else rt.local.tensor
                for n, rt in self.tensors.items()}


def produced(producer: str, tensors: dict[str, RankTensor], world: int) -> Produced:
    """A fresh model of the case's layers (and AdamW, where the case has optimizer state) under ``producer`` of
    degree ``world``."""
    given = {n: (rt.local.tensor.dtype.name, tuple(rt.local.global_shape)) for n, rt in tensors.items()}
    layers, vocab, hidden, ffn, dtype, optimizer = producers.spec(given, rank=True)
    model, opt = _built(producer, layers, vocab, hidden, ffn, dtype, optimizer, world)
    return Produced(model, opt, tensors)


def filled(made: Produced) -> dict[str, Any]:
    """The sharded state, each piece holding the case's bits (what a save hands Paddle)."""
    state = made.state()
    for name, rt in made.tensors.items():
        if _numel(rt):
            write_bytes(state[key(name)].local_tensor, rt.local.tensor.bits.tobytes())
    return state


def _numel(rt: RankTensor) -> int:
    return rt.local.region.numel


def _check(paddle_key: str, sw: Any, rt: RankTensor) -> None:
    lt = rt.local
    flat = isinstance(lt.region, FlatRange)
    flattened = bool(getattr(sw, "is_flattened", False))
    got_range = (int(sw.flattened_range.start), int(sw.flattened_range.stop)) if flattened else None
    gave = (tuple(sw.global_shape), tuple(sw.global_offset), tuple(sw.local_shape), tuple(sw.local_tensor.shape),
            got_range)
    if flat:  # a flattened piece of a tensor the model holds whole: its elements [start, stop)
        whole = tuple(lt.global_shape)
        want = (whole, (0,) * len(whole), whole, (lt.region.numel,), (lt.region.start, lt.region.stop))
    else:
        want = (tuple(lt.global_shape), tuple(lt.region.offsets), tuple(lt.region.shape), tuple(lt.region.shape),
                None)
    if gave != want:
        raise ProducerMismatch(f"{paddle_key}: sharded_state_dict gave global shape {gave[0]}, offset {gave[1]}, "
                               f"local shape {gave[2]} (tensor {gave[3]}), flattened range {gave[4]}; the producer "
                               f"puts this rank's piece at offset {want[1]}, local shape {want[2]} (tensor {want[3]}), "
                               f"flattened range {want[4]} of {want[0]}")


def _built(producer: str, layers: tuple[str, ...], vocab: int, hidden: int, ffn: int, dtype: str, optimizer: bool,
           world: int) -> tuple[Any, Any]:
    import paddle
    from paddle.distributed.fleet.meta_parallel import (
        ColumnParallelLinear,
        RowParallelLinear,
        VocabParallelEmbedding,
    )

    _hybrid_groups(producer, world)
    model = paddle.nn.Layer()
    if "emb" in layers:
        model.emb = VocabParallelEmbedding(vocab, hidden)
    if "up" in layers:
        model.up = ColumnParallelLinear(hidden, ffn, has_bias=True, gather_output=False)
    if "down" in layers:
        model.down = RowParallelLinear(ffn, hidden, has_bias=True, input_is_parallel=True)
    if "norm" in layers:
        model.norm = paddle.nn.LayerNorm(hidden)
    if dtype == "BF16":
        model.to(dtype="bfloat16")
    if not optimizer:
        return model, None
    opt = paddle.optimizer.AdamW(parameters=model.parameters(), multi_precision=True)
    block = paddle.static.default_main_program().global_block()
    # The moments, beta powers and master weights exist once a first step makes them; CPU Paddle has no bfloat16
    # adamw kernel to step with, so they are made as that step makes them. Their values are the case's anyway.
    if producer == "tp":
        opt._create_accumulators(block, model.parameters())
        return model, opt
    from paddle.distributed import fleet
    from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer.dygraph_sharding_optimizer import (
        DygraphShardingOptimizerV2,
    )

    sharded = DygraphShardingOptimizerV2(opt, fleet.get_hybrid_communicate_group())
    # A step points each parameter's slice at this rank's part of the fused buffer and makes the state of the
    # slices that have one (DygraphShardingOptimizerV2.step: _assign_slice_grad, then the inner optimizer's update)
    slices = []
    for buffer in sharded._comm_buffer_list:
        for name, view in buffer._sharding_param_grad_view.items():
            if view.has_effective_slice_param:
                view.fill_slice_param(sharded._slice_params[name])
                slices.append(sharded._slice_params[name])
    opt._create_accumulators(block, slices)
    return model, sharded


def _hybrid_groups(producer: str, world: int) -> None:
    """fleet's hybrid groups with the producer's parallelism over the whole world, made once per process (a process
    keeps its world; P-MODEL's ops run on processes of their own, ``PaddleDcpSut.process_shape``)."""
    global _fleet
    from paddle.distributed import fleet

    if _fleet == (producer, world):
        return
    if _fleet is not None:
        raise RuntimeError(f"this process's hybrid groups are for {_fleet}, not {(producer, world)}")
    strategy = fleet.DistributedStrategy()
    mp, sharding = (world, 1) if producer == "tp" else (1, world)
    strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": mp, "pp_degree": 1, "sharding_degree": sharding}
    fleet.init(is_collective=True, strategy=strategy)
    _fleet = (producer, world)


_fleet: tuple[str, int] | None = None  # the producer and degree this process's fleet groups were made for
