"""Real producers of sharded state for paddle-dcp (capability "producer:tp", property P-MODEL): the state a save
hands Paddle, and the state a load fills, is what Paddle's own ``sharded_state_dict`` gives for a model of its
tensor-parallel layers (``VocabParallelEmbedding``, ``ColumnParallelLinear``, ``RowParallelLinear``, a
``LayerNorm``) under fleet's hybrid groups, and for ``AdamW`` (multi_precision) over it. reference/producers.py
says what each rank's pieces must be; every piece Paddle gives is held to it before the case's bits go in."""

from __future__ import annotations

from typing import Any

from harness.sut._paddle_common import write_bytes
from harness.sut.base import RankTensor
from reference import producers

# Paddle's key of a case name's state (AdamW.sharded_state_dict names them "<param>.<state>"; a master weight
# "<param>.w_0")
_OPTIMIZER_KEYS = {".m1": "moment1_0", ".m2": "moment2_0", ".beta1_pow": "beta1_pow_acc_0",
                   ".beta2_pow": "beta2_pow_acc_0"}


class ProducerMismatch(RuntimeError):
    """Paddle's producer gave a piece other than the one tensor parallelism puts on this rank (or a key the model
    does not have): a bug of the producer, met before any checkpoint code runs."""


def key(name: str) -> str:
    """Paddle's key of case tensor ``name`` (reference/producers.py names)."""
    family, _, rest = name.partition("/")
    if family == "master":
        return f"{rest}.w_0"
    if family == "optimizer":
        param = producers.parameter_of(name)
        return f"{param}.{_OPTIMIZER_KEYS[rest[len(param):]]}"
    return rest


def state_dict(tensors: dict[str, RankTensor], world: int, fill: bool) -> dict[str, Any]:
    """A fresh model (and AdamW, where the case has optimizer state) of the case's layers, on tensor parallelism of
    degree ``world``: its sharded state as Paddle gives it, keyed by Paddle, each piece checked against the case's
    layout; with ``fill`` each piece then holds the case's bits (a save), else what the model was built with (a
    load target)."""
    given = {n: (rt.local.tensor.dtype.name, tuple(rt.local.global_shape)) for n, rt in tensors.items()}
    layers, vocab, hidden, ffn, dtype, optimizer = producers.spec(given)
    model, opt = _built(layers, vocab, hidden, ffn, dtype, optimizer, world)
    model_state = model.sharded_state_dict()
    state = dict(model_state)
    if opt is not None:
        state.update(opt.sharded_state_dict(model_state))
    expected = {key(n): n for n in tensors}
    extra = sorted(set(state) - set(expected))
    if extra or set(expected) - set(state):
        raise ProducerMismatch(f"sharded_state_dict gave keys {sorted(state)}; the model's are {sorted(expected)}")
    for paddle_key, name in expected.items():
        _check(paddle_key, state[paddle_key], tensors[name])
        if fill:
            write_bytes(state[paddle_key].local_tensor, tensors[name].local.tensor.bits.tobytes())
    return state


def _check(paddle_key: str, sw: Any, rt: RankTensor) -> None:
    lt = rt.local
    gave = (tuple(sw.global_shape), tuple(sw.global_offset), tuple(sw.local_shape), tuple(sw.local_tensor.shape))
    want = (tuple(lt.global_shape), tuple(lt.region.offsets), tuple(lt.region.shape), tuple(lt.region.shape))
    if gave != want:
        raise ProducerMismatch(f"{paddle_key}: sharded_state_dict gave global shape {gave[0]}, offset {gave[1]}, "
                               f"local shape {gave[2]} (tensor {gave[3]}); tensor parallelism puts this rank's piece "
                               f"at offset {want[1]}, shape {want[2]} of {want[0]}")


def _built(layers: tuple[str, ...], vocab: int, hidden: int, ffn: int, dtype: str, optimizer: bool,
           world: int) -> tuple[Any, Any]:
    import paddle
    from paddle.distributed.fleet.meta_parallel import (
        ColumnParallelLinear,
        RowParallelLinear,
        VocabParallelEmbedding,
    )

    _hybrid_groups(world)
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
    # The moments, beta powers and master weights exist once a first step makes them; CPU Paddle has no bfloat16
    # adamw kernel to step with, so they are made as that step makes them. Their values are the case's anyway.
    opt._create_accumulators(paddle.static.default_main_program().global_block(), model.parameters())
    return model, opt


def _hybrid_groups(world: int) -> None:
    """fleet's hybrid groups with tensor parallelism over the whole world, made once per process (a process keeps
    its world; P-MODEL's ops run on processes of their own, ``PaddleDcpSut.process_shape``)."""
    global _fleet_world
    from paddle.distributed import fleet

    if _fleet_world == world:
        return
    if _fleet_world is not None:
        raise RuntimeError(f"this process's hybrid groups are for {_fleet_world} ranks, not {world}")
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": world, "pp_degree": 1}
    fleet.init(is_collective=True, strategy=strategy)
    _fleet_world = world


_fleet_world: int | None = None  # the tensor-parallel degree this process's fleet groups were made for
