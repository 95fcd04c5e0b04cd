"""paddleformers-trainer: silent-corruption in P-RESUME (paddleformers-trainer-sharding-io-reshard-drops-ema)

The same 2 -> 4 resume behind paddleformers-sharding-v1-reshard: the model, master weights and moments come back bitwise, but the EMA does not: EMABufferShardingIOBased._load asks ShardingIO.check_same_strategy, which fails on another sharding degree, logs 'Cannot load EMA because: ...' at INFO and returns, so the resumed job's EMA restarts and what the checkpoint saved of it is silently dropped (here w's EMA reads zero on every rank).

Standalone reproduction written by ckpt-harness from ckpt-harness finding paddleformers-trainer-sharding-io-reshard-drops-ema.json. Run ``bash run.sh``: it starts each launch below with fresh processes. The script prints BUG / EXPECTED / ACTUAL and exits 1 while the bug is there; every rank exits 0 once it is fixed.
"""

import os
import sys
import traceback

import numpy as np
import paddle
import paddle.distributed as dist

from collections import namedtuple


import needs  # noqa: E402  known bugs' fixes this bug shows behind (needs.py): applied in every process

needs.apply()


ROOT, PHASE, RANK = None, None, 0  # the checkpoint directory, which launch of run.sh this is, this rank

FORMAT = 'sharding_io'  # TrainingArguments.save_checkpoint_format
LOGGING_STEPS = 1
USE_ASYNC_SAVE = False  # the optimizer goes to AsyncSaver's writer
TrainingSpec = namedtuple("TrainingSpec", 'lr beta1 beta2 eps weight_decay ema_every ema_decay loss_threshold seed')
SPEC = TrainingSpec(lr=0.01, beta1=0.9, beta2=0.999, eps=1e-08, weight_decay=0.0, ema_every=1, ema_decay=0.9, loss_threshold=None, seed=7)  # zcc_save_ema_coef = ema_decay, zcc_ema_interval = ema_every, zcc_ema_loss_threshold = loss_threshold
PARAMS = {'w': 'BF16', 'b': 'BF16'}  # the model's parameters and their dtypes
# The reference loop as data: each step's loss (what the model's forward returns) and each parameter's
# FP32 gradient as hex (what AdamW's step applies; the forward gives zero gradients)
LOSSES = {1: 1.2028591632843018, 2: 1.1232956647872925}
GRADIENTS = {1: {'w': 'c0565c3f4072333e400b433f40ea16be', 'b': '602fd4bec04535bf'}, 2: {'w': '8031c5be307556bfa04bb53e00e45c3f', 'b': 'e0e2da3e107c22bf'}}

CARRIERS = {'BF16': ('uint16', None), 'F32': ('float32', None), 'I64': ('int64', None)}  # numpy dtype Paddle reads bit for bit, and the paddle dtype to view it as

DTYPE_NAMES = {'BF16': 'bfloat16', 'F32': 'float32', 'I64': 'int64'}  # as the framework prints them

# One rank's piece of a tensor: dtype, global shape, offsets and shape of its box (or the [start, stop) of a
# flattened slice), its bits as hex, and for a dist tensor its mesh shape, placements and owner coordinates.
Piece = namedtuple("Piece", "dtype global_shape offsets shape flat bits mesh placements owner")

# What each rank saves, and what each load must give back: (layout, version) -> rank -> tensor -> piece
DATA = {}
DATA['load', 1] = {
    0: {'ema/b': Piece('F32', (2,), (0,), (2,), None, 'a3706fbfa37046bf', (4,), ('R',), ()), 'ema/w': Piece('F32', (4,), (0,), (4,), None, '45e1ca3e45e1803eba1edabea37035bf', (4,), ('R',), ()), 'master/b': Piece('F32', (2,), (0,), (2,), None, 'a3706fbfa37046bf', (4,), ('R',), ()), 'master/w': Piece('F32', (4,), (0,), (4,), None, '45e1ca3e45e1803eba1edabea37035bf', (4,), ('R',), ()), 'meta/step': Piece('I64', (), (), (), None, '0100000000000000', (4,), ('R',), ()), 'model/b': Piece('BF16', (2,), (0,), (2,), None, '6fbf46bf', (4,), ('R',), ()), 'model/w': Piece('BF16', (4,), (0,), (4,), None, 'cb3e813edabe35bf', (4,), ('R',), ()), 'optimizer/b.m1': Piece('F32', (2,), (0,), (2,), None, '83bf29bd9c0491bd', (4,), ('R',), ()), 'optimizer/b.m2': Piece('F32', (2,), (0,), (2,), None, '72163439e86f033a', (4,), ('R',), ()), 'optimizer/w.m1': Piece('F32', (4,), (0,), (4,), None, '6945b03d9c8e8f3c02099c3dd17671bc', (4,), ('R',), ()), 'optimizer/w.m2': Piece('F32', (4,), (0,), (4,), None, 'c231423a5fcd0038a72a183a5133b637', (4,), ('R',), ()), 'rng/state': Piece('I64', (2,), (0,), (2,), None, '1c663cf4d73c4c046f07f0e9c70cab95', (4,), ('R',), ())},
    1: {'ema/b': Piece('F32', (2,), (0,), (2,), None, 'a3706fbfa37046bf', (4,), ('R',), ()), 'ema/w': Piece('F32', (4,), (0,), (4,), None, '45e1ca3e45e1803eba1edabea37035bf', (4,), ('R',), ()), 'master/b': Piece('F32', (2,), (0,), (2,), None, 'a3706fbfa37046bf', (4,), ('R',), ()), 'master/w': Piece('F32', (4,), (0,), (4,), None, '45e1ca3e45e1803eba1edabea37035bf', (4,), ('R',), ()), 'meta/step': Piece('I64', (), (), (), None, '0100000000000000', (4,), ('R',), ()), 'model/b': Piece('BF16', (2,), (0,), (2,), None, '6fbf46bf', (4,), ('R',), ()), 'model/w': Piece('BF16', (4,), (0,), (4,), None, 'cb3e813edabe35bf', (4,), ('R',), ()), 'optimizer/b.m1': Piece('F32', (2,), (0,), (2,), None, '83bf29bd9c0491bd', (4,), ('R',), ()), 'optimizer/b.m2': Piece('F32', (2,), (0,), (2,), None, '72163439e86f033a', (4,), ('R',), ()), 'optimizer/w.m1': Piece('F32', (4,), (0,), (4,), None, '6945b03d9c8e8f3c02099c3dd17671bc', (4,), ('R',), ()), 'optimizer/w.m2': Piece('F32', (4,), (0,), (4,), None, 'c231423a5fcd0038a72a183a5133b637', (4,), ('R',), ()), 'rng/state': Piece('I64', (2,), (0,), (2,), None, '1c663cf4d73c4c046f07f0e9c70cab95', (4,), ('R',), ())},
    2: {'ema/b': Piece('F32', (2,), (0,), (2,), None, 'a3706fbfa37046bf', (4,), ('R',), ()), 'ema/w': Piece('F32', (4,), (0,), (4,), None, '45e1ca3e45e1803eba1edabea37035bf', (4,), ('R',), ()), 'master/b': Piece('F32', (2,), (0,), (2,), None, 'a3706fbfa37046bf', (4,), ('R',), ()), 'master/w': Piece('F32', (4,), (0,), (4,), None, '45e1ca3e45e1803eba1edabea37035bf', (4,), ('R',), ()), 'meta/step': Piece('I64', (), (), (), None, '0100000000000000', (4,), ('R',), ()), 'model/b': Piece('BF16', (2,), (0,), (2,), None, '6fbf46bf', (4,), ('R',), ()), 'model/w': Piece('BF16', (4,), (0,), (4,), None, 'cb3e813edabe35bf', (4,), ('R',), ()), 'optimizer/b.m1': Piece('F32', (2,), (0,), (2,), None, '83bf29bd9c0491bd', (4,), ('R',), ()), 'optimizer/b.m2': Piece('F32', (2,), (0,), (2,), None, '72163439e86f033a', (4,), ('R',), ()), 'optimizer/w.m1': Piece('F32', (4,), (0,), (4,), None, '6945b03d9c8e8f3c02099c3dd17671bc', (4,), ('R',), ()), 'optimizer/w.m2': Piece('F32', (4,), (0,), (4,), None, 'c231423a5fcd0038a72a183a5133b637', (4,), ('R',), ()), 'rng/state': Piece('I64', (2,), (0,), (2,), None, '1c663cf4d73c4c046f07f0e9c70cab95', (4,), ('R',), ())},
    3: {'ema/b': Piece('F32', (2,), (0,), (2,), None, 'a3706fbfa37046bf', (4,), ('R',), ()), 'ema/w': Piece('F32', (4,), (0,), (4,), None, '45e1ca3e45e1803eba1edabea37035bf', (4,), ('R',), ()), 'master/b': Piece('F32', (2,), (0,), (2,), None, 'a3706fbfa37046bf', (4,), ('R',), ()), 'master/w': Piece('F32', (4,), (0,), (4,), None, '45e1ca3e45e1803eba1edabea37035bf', (4,), ('R',), ()), 'meta/step': Piece('I64', (), (), (), None, '0100000000000000', (4,), ('R',), ()), 'model/b': Piece('BF16', (2,), (0,), (2,), None, '6fbf46bf', (4,), ('R',), ()), 'model/w': Piece('BF16', (4,), (0,), (4,), None, 'cb3e813edabe35bf', (4,), ('R',), ()), 'optimizer/b.m1': Piece('F32', (2,), (0,), (2,), None, '83bf29bd9c0491bd', (4,), ('R',), ()), 'optimizer/b.m2': Piece('F32', (2,), (0,), (2,), None, '72163439e86f033a', (4,), ('R',), ()), 'optimizer/w.m1': Piece('F32', (4,), (0,), (4,), None, '6945b03d9c8e8f3c02099c3dd17671bc', (4,), ('R',), ()), 'optimizer/w.m2': Piece('F32', (4,), (0,), (4,), None, 'c231423a5fcd0038a72a183a5133b637', (4,), ('R',), ()), 'rng/state': Piece('I64', (2,), (0,), (2,), None, '1c663cf4d73c4c046f07f0e9c70cab95', (4,), ('R',), ())},
}
DATA['save', 0] = {
    0: {'ema/b': Piece('F32', (2,), (0,), (2,), None, '0000000000000000', (2,), ('R',), ()), 'ema/w': Piece('F32', (4,), (0,), (4,), None, '00000000000000000000000000000000', (2,), ('R',), ()), 'master/b': Piece('F32', (2,), (0,), (2,), None, '000072bf000049bf', (2,), ('R',), ()), 'master/w': Piece('F32', (4,), (0,), (4,), None, '0000d03e0000863e0000d5be000038bf', (2,), ('R',), ()), 'meta/step': Piece('I64', (), (), (), None, '0000000000000000', (2,), ('R',), ()), 'model/b': Piece('BF16', (2,), (0,), (2,), None, '72bf49bf', (2,), ('R',), ()), 'model/w': Piece('BF16', (4,), (0,), (4,), None, 'd03e863ed5be38bf', (2,), ('R',), ()), 'optimizer/b.m1': Piece('F32', (2,), (0,), (2,), None, '0000000000000000', (2,), ('R',), ()), 'optimizer/b.m2': Piece('F32', (2,), (0,), (2,), None, '0000000000000000', (2,), ('R',), ()), 'optimizer/w.m1': Piece('F32', (4,), (0,), (4,), None, '00000000000000000000000000000000', (2,), ('R',), ()), 'optimizer/w.m2': Piece('F32', (4,), (0,), (4,), None, '00000000000000000000000000000000', (2,), ('R',), ()), 'rng/state': Piece('I64', (2,), (0,), (2,), None, 'd70d3259e4e1cb631c663cf4d73c4c04', (2,), ('R',), ())},
    1: {'ema/b': Piece('F32', (2,), (0,), (2,), None, '0000000000000000', (2,), ('R',), ()), 'ema/w': Piece('F32', (4,), (0,), (4,), None, '00000000000000000000000000000000', (2,), ('R',), ()), 'master/b': Piece('F32', (2,), (0,), (2,), None, '000072bf000049bf', (2,), ('R',), ()), 'master/w': Piece('F32', (4,), (0,), (4,), None, '0000d03e0000863e0000d5be000038bf', (2,), ('R',), ()), 'meta/step': Piece('I64', (), (), (), None, '0000000000000000', (2,), ('R',), ()), 'model/b': Piece('BF16', (2,), (0,), (2,), None, '72bf49bf', (2,), ('R',), ()), 'model/w': Piece('BF16', (4,), (0,), (4,), None, 'd03e863ed5be38bf', (2,), ('R',), ()), 'optimizer/b.m1': Piece('F32', (2,), (0,), (2,), None, '0000000000000000', (2,), ('R',), ()), 'optimizer/b.m2': Piece('F32', (2,), (0,), (2,), None, '0000000000000000', (2,), ('R',), ()), 'optimizer/w.m1': Piece('F32', (4,), (0,), (4,), None, '00000000000000000000000000000000', (2,), ('R',), ()), 'optimizer/w.m2': Piece('F32', (4,), (0,), (4,), None, '00000000000000000000000000000000', (2,), ('R',), ()), 'rng/state': Piece('I64', (2,), (0,), (2,), None, 'd70d3259e4e1cb631c663cf4d73c4c04', (2,), ('R',), ())},
}
DATA['save', 1] = {
    0: {'ema/b': Piece('F32', (2,), (0,), (2,), None, 'a3706fbfa37046bf', (2,), ('R',), ()), 'ema/w': Piece('F32', (4,), (0,), (4,), None, '45e1ca3e45e1803eba1edabea37035bf', (2,), ('R',), ()), 'master/b': Piece('F32', (2,), (0,), (2,), None, 'a3706fbfa37046bf', (2,), ('R',), ()), 'master/w': Piece('F32', (4,), (0,), (4,), None, '45e1ca3e45e1803eba1edabea37035bf', (2,), ('R',), ()), 'meta/step': Piece('I64', (), (), (), None, '0100000000000000', (2,), ('R',), ()), 'model/b': Piece('BF16', (2,), (0,), (2,), None, '6fbf46bf', (2,), ('R',), ()), 'model/w': Piece('BF16', (4,), (0,), (4,), None, 'cb3e813edabe35bf', (2,), ('R',), ()), 'optimizer/b.m1': Piece('F32', (2,), (0,), (2,), None, '83bf29bd9c0491bd', (2,), ('R',), ()), 'optimizer/b.m2': Piece('F32', (2,), (0,), (2,), None, '72163439e86f033a', (2,), ('R',), ()), 'optimizer/w.m1': Piece('F32', (4,), (0,), (4,), None, '6945b03d9c8e8f3c02099c3dd17671bc', (2,), ('R',), ()), 'optimizer/w.m2': Piece('F32', (4,), (0,), (4,), None, 'c231423a5fcd0038a72a183a5133b637', (2,), ('R',), ()), 'rng/state': Piece('I64', (2,), (0,), (2,), None, '1c663cf4d73c4c046f07f0e9c70cab95', (2,), ('R',), ())},
    1: {'ema/b': Piece('F32', (2,), (0,), (2,), None, 'a3706fbfa37046bf', (2,), ('R',), ()), 'ema/w': Piece('F32', (4,), (0,), (4,), None, '45e1ca3e45e1803eba1edabea37035bf', (2,), ('R',), ()), 'master/b': Piece('F32', (2,), (0,), (2,), None, 'a3706fbfa37046bf', (2,), ('R',), ()), 'master/w': Piece('F32', (4,), (0,), (4,), None, '45e1ca3e45e1803eba1edabea37035bf', (2,), ('R',), ()), 'meta/step': Piece('I64', (), (), (), None, '0100000000000000', (2,), ('R',), ()), 'model/b': Piece('BF16', (2,), (0,), (2,), None, '6fbf46bf', (2,), ('R',), ()), 'model/w': Piece('BF16', (4,), (0,), (4,), None, 'cb3e813edabe35bf', (2,), ('R',), ()), 'optimizer/b.m1': Piece('F32', (2,), (0,), (2,), None, '83bf29bd9c0491bd', (2,), ('R',), ()), 'optimizer/b.m2': Piece('F32', (2,), (0,), (2,), None, '72163439e86f033a', (2,), ('R',), ()), 'optimizer/w.m1': Piece('F32', (4,), (0,), (4,), None, '6945b03d9c8e8f3c02099c3dd17671bc', (2,), ('R',), ()), 'optimizer/w.m2': Piece('F32', (4,), (0,), (4,), None, 'c231423a5fcd0038a72a183a5133b637', (2,), ('R',), ()), 'rng/state': Piece('I64', (2,), (0,), (2,), None, '1c663cf4d73c4c046f07f0e9c70cab95', (2,), ('R',), ())},
}

def tensor(p, zero=False):
    """A paddle tensor holding the piece's exact bits (or zeros of its dtype and shape: a load target)."""
    carrier, view = CARRIERS[p.dtype]
    data = np.zeros(p.shape, carrier) if zero else np.frombuffer(bytes.fromhex(p.bits), carrier).reshape(p.shape)
    t = paddle.to_tensor(data)
    return t.view(getattr(paddle, view)) if view else t


def bits_of(t):
    """(dtype name, shape, bits as hex) of a dense tensor, or of a dist tensor's local part (or such a triple)."""
    if isinstance(t, tuple):
        return t
    if getattr(t, "is_dist", lambda: False)():
        t = t._local_value()
    return str(t.dtype).split(".")[-1], list(t.shape), np.ascontiguousarray(t.numpy()).tobytes().hex()


PENDING = []  # the writers (threads, processes or futures) of async saves not waited for yet


def returned(writer, tensors, mutate_after, detach):
    """An async save returned: the caller overwrites its tensors (where the step says so), then waits for the
    writer unless the step leaves it running."""
    if writer is not None:
        PENDING.append(writer)
    if not detach:
        wait()

from paddleformers.trainer import Trainer, TrainerCallback, TrainingArguments  # noqa: E402
from paddleformers.trainer.trainer_utils import get_last_checkpoint  # noqa: E402
from paddleformers.transformers import PretrainedConfig, PretrainedModel  # noqa: E402

JOB = [None, None]  # the Trainer of the running job, and the checkpoint it last resumed from (None: the seeds)


def cast_bits(values: np.ndarray, dtype_name: str) -> np.ndarray:
    """FP32 values as the bits of ``dtype_name`` (F32, F16, or BF16 rounded to nearest even, NaNs kept quiet)."""
    values = np.asarray(values, np.float32)
    if dtype_name == "F32":
        return values.view(np.uint32).copy()
    if dtype_name == "F16":
        with np.errstate(over="ignore"):  # overflow to ±inf is the cast's defined result
            return values.astype(np.float16).view(np.uint16)
    if dtype_name == "BF16":
        bits = values.view(np.uint32).astype(np.uint64)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
        quiet = ((bits >> 16) | 0x40).astype(np.uint16)
        return np.where(np.isnan(values), quiet, rounded)
    raise ValueError(f"no cast to {dtype_name}")


def adam_update(spec: TrainingSpec, t: int, grad: np.ndarray, master: np.ndarray, m1: np.ndarray,
                m2: np.ndarray) -> None:
    """Step ``t`` of Adam on FP32 arrays, in place (a SUT whose optimizer the harness stands in for runs this)."""
    f32 = np.float32
    b1, b2 = f32(spec.beta1), f32(spec.beta2)
    m1[...] = b1 * m1 + (f32(1) - b1) * grad
    m2[...] = b2 * m2 + (f32(1) - b2) * (grad * grad)
    bc1, bc2 = f32(1.0 - spec.beta1**t), f32(1.0 - spec.beta2**t)
    step = (m1 / bc1) / (np.sqrt(m2 / bc2) + f32(spec.eps))
    master[...] = master - f32(spec.lr) * (step + f32(spec.weight_decay) * master)


def bf16_add(add):
    """A BF16 + BF16 as a GPU computes it: in FP32, rounded to nearest even (CPU Paddle has no BF16 add kernel)."""
    def shimmed(a, b):
        if isinstance(b, paddle.Tensor) and a.dtype == paddle.bfloat16 and b.dtype == paddle.bfloat16:
            return add(a.astype("float32"), b.astype("float32")).astype("bfloat16")
        return add(a, b)
    return shimmed


def adam_step(opt, block, param_and_grad):
    """AdamW's update of one parameter: the reference's Adam step with the listed gradient, on the optimizer's own
    moments, master weight and beta powers (CPU Paddle has no BF16 adamw kernel), over the elements of the flattened
    parameter this rank's optimizer holds (owned_range), written in place: where the optimizer's tensors are views
    of a fused buffer (Zero-Cost Checkpointing's workers read it), they stay views."""
    if isinstance(param_and_grad, dict):
        param_and_grad = opt._update_param_group(param_and_grad)
    param = param_and_grad[0]
    name = JOB[0].harness_names[param.name]
    t = JOB[0].state.global_step + 1
    low = opt._multi_precision and opt._is_dtype_fp16_or_bf16(param.dtype)
    master = opt._master_weights[param.name] if low else param
    m1 = opt._get_accumulator_master(opt._moment1_acc_str, param)
    m2 = opt._get_accumulator_master(opt._moment2_acc_str, param)
    arrays = [x.numpy().astype(np.float32).reshape(-1) for x in (master, m1, m2)]
    lo, hi = owned_range(param)
    grad = np.zeros(arrays[0].size, np.float32)  # past the parameter's end: padding, which no gradient reaches
    grad[:hi - lo] = np.frombuffer(bytes.fromhex(GRADIENTS[t][name]), np.float32)[lo:hi]
    adam_update(SPEC, t, grad, *arrays)
    for target, values in zip((master, m1, m2), arrays):
        target.copy_(paddle.to_tensor(values.reshape(target.shape)), False)
    for acc, beta in ((opt._beta1_pow_acc_str, SPEC.beta1), (opt._beta2_pow_acc_str, SPEC.beta2)):
        pow_acc = opt._get_accumulator_master(acc, param)
        pow_acc.copy_(pow_acc * beta, False)
    if low:
        bits = np.ascontiguousarray(cast_bits(arrays[0], PARAMS[name])).tobytes().hex()
        param.copy_(tensor(Piece(PARAMS[name], None, None, list(param.shape), None, bits, None, (), ())), False)


class HarnessConfig(PretrainedConfig):
    model_type = "ckpt_harness_trainer"


class HarnessModel(PretrainedModel):
    config_class = HarnessConfig
    base_model_prefix = "harness"

    def forward(self, x=None, labels=None):
        """The step's loss (LOSSES), and a zero gradient for every parameter (adam_step applies GRADIENTS)."""
        loss = paddle.to_tensor(np.float32(LOSSES[JOB[0].state.global_step + 1]))
        for p in self.parameters():
            loss = loss + 0.0 * p.astype("float32").sum()
        return (loss,)


def tiny_model():
    """The model at step 0: its parameters ("layers.0.w" nests sub-layers) hold the job's initial values, whole on
    every rank (data parallel), as the first save's rank 0 holds them: a resume may run on more ranks than saved."""
    model = HarnessModel(HarnessConfig())
    for name, dtype in sorted(PARAMS.items()):
        piece = DATA["save", 0][0]["model/" + name]
        layer, (*path, leaf) = model, name.split(".")
        for part in path:
            if part not in layer._sub_layers:
                layer.add_sublayer(part, paddle.nn.Layer())
            layer = layer._sub_layers[part]
        param = model.create_parameter(list(piece.shape), dtype=DTYPE_NAMES[dtype],
                                       default_initializer=paddle.nn.initializer.Constant(0.0))
        layer.add_parameter(leaf, param)
        param.set_value(tensor(piece))
    return model


class Steps:
    """The data: one dummy sample per step and rank (the loss does not read it)."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"x": np.zeros(1, np.float32), "labels": np.zeros(1, np.float32)}


class Resumed(Exception):
    """Raised as the resumed job's first step begins: a load ends where the Trainer would start training."""


class StopAtFirstStep(TrainerCallback):
    def on_step_begin(self, args, state, control, **kwargs):
        raise Resumed()


def trainer_for(max_steps, **more):
    """A Trainer over the model at step 0: the EMA without Zero-Cost Checkpointing, sharding stage 1 over every rank
    (the Trainer builds this EMA only for a hybrid-parallel job), AMP O2 for BF16 parameters (FP32 master weights),
    the case's saves only (the loop's own schedule off), no gradient clipping; ``more``: arguments beyond these."""
    world = int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))
    low = any(dtype != "F32" for dtype in PARAMS.values())
    args = TrainingArguments(**{**dict(
        output_dir=ROOT, max_steps=max_steps, save_strategy="no", save_steps=SPEC.ema_every, report_to="none",
        disable_tqdm=True, logging_steps=LOGGING_STEPS, per_device_train_batch_size=1, seed=SPEC.seed,
        learning_rate=SPEC.lr, max_grad_norm=0.0, save_checkpoint_format=FORMAT, load_checkpoint_format=FORMAT,
        zcc_save_ema_coef=SPEC.ema_decay, zcc_ema_interval=SPEC.ema_every, zcc_ema_loss_threshold=SPEC.loss_threshold,
        amp_master_grad=low, split_param=False, use_async_save=USE_ASYNC_SAVE, sharding="stage1" if world > 1 else "",
        sharding_parallel_size=world if world > 1 else -1, **({"bf16": True, "fp16_opt_level": "O2"} if low else {}),
        **({"save_sharded_model": True, "load_sharded_model": True} if FORMAT == "sharding_io" else {}),
    ), **more})
    model = tiny_model()
    samples = max_steps * max(world, 1) * args.gradient_accumulation_steps + 8
    trainer = Trainer(model=model, args=args, train_dataset=Steps(samples))
    trainer.harness_names = {param.name: name for name, param in model.named_parameters()}
    JOB[0] = trainer
    return trainer


def owned_range(param):
    """The elements of the flattened parameter this rank's optimizer updates: all of them (stage 1 keeps a
    parameter whole on the rank that owns it)."""
    return 0, int(np.prod(param.shape))


def train(to_step, pieces):
    """Train the job to ``to_step``: resumed from the checkpoint it last loaded, else from step 0. Paddle names
    parameters from a process-wide counter; each job counts from zero, as in a fresh process."""
    with paddle.utils.unique_name.guard():
        trainer = trainer_for(to_step)
        trainer.train(resume_from_checkpoint=JOB[1])
    return observe(trainer, pieces)


def ema_callback(trainer):
    return next((cb for cb in trainer.callback_handler.callbacks if hasattr(cb, "buffer")), None)


def save(name, pieces, async_save=False, detach=False):
    """What the training loop does at a save step: the EMA callback saves its buffer, then the checkpoint. With
    use_async_save the optimizer goes to the Trainer's AsyncSaver (a pool of one spawned writer); the switch is read
    per save, so a synchronous save turns it off for that save."""
    trainer = JOB[0]
    ema = ema_callback(trainer)
    if ema is not None:
        ema.buffer.save(trainer.state.global_step)
    trainer.args.use_async_save = USE_ASYNC_SAVE and async_save
    try:
        trainer._save_checkpoint(trainer.model_wrapped, metrics=None)
    finally:
        trainer.args.use_async_save = USE_ASYNC_SAVE
    if async_save and USE_ASYNC_SAVE:
        returned(trainer._async_optimizer_saver, (), False, detach)


def wait():
    """Every async save in flight, oldest first: the wait the Trainer makes before its next async save."""
    while PENDING:
        PENDING.pop(0)._wait_for_previous_result()


def load(name, pieces):
    """Resume from ``name``'s checkpoint-N (None: the one get_last_checkpoint picks) in a new job, stopped as its
    first step begins; the moments and master weights that step creates come from what the resume loaded."""
    path = get_last_checkpoint(ROOT) if name is None else os.path.join(ROOT, f"checkpoint-{name.rsplit('-', 1)[-1]}")
    if path is None:
        raise Failed(f"get_last_checkpoint found no checkpoint-N under {ROOT}")
    step = int(path.rsplit("-", 1)[-1])
    with paddle.utils.unique_name.guard():
        trainer = trainer_for(step + 1)
        trainer.add_callback(StopAtFirstStep())
        try:
            trainer.train(resume_from_checkpoint=path)
        except Resumed:
            pass
        else:
            raise Failed(f"the Trainer resumed from {path} without starting a step")
    owns = owned(trainer)
    params = [p for p in trainer.model.parameters() if owns(p) and not p.stop_gradient]
    inner_optimizer(trainer)._create_accumulators(paddle.static.default_main_program().global_block(), params)
    JOB[1] = path
    return observe(trainer, pieces)



def optimizer_slot(opt, owner, slot):
    """A moment as the job holds it: made by a step, else kept aside by the resume until the first step makes it."""
    made = opt._accumulators.get(slot, {}).get(owner)
    if made is not None:
        return made
    prefix = f"{owner}_{slot}_"
    return next((v for k, v in opt._accumulators_holder.items() if k.startswith(prefix) and k[len(prefix):].isdigit()),
                None)


def optimizers(trainer):
    chain = [trainer.optimizer]  # hybrid-parallel, sharding, AdamW
    while hasattr(chain[-1], "_inner_opt"):
        chain.append(chain[-1]._inner_opt)
    return chain


def inner_optimizer(trainer):
    return next(o for o in optimizers(trainer) if hasattr(o, "_master_weights"))


def owned(trainer):
    """Which parameters this rank's optimizer updates: under sharding stage 1 those it owns, else all."""
    sharding = next((o for o in optimizers(trainer) if hasattr(o, "_param2rank")), None)
    if sharding is None:
        return lambda param: True
    return lambda param: sharding._param2rank.get(param.name) == sharding._sharding_rank


def observe(trainer, pieces):
    """The job's state by key, as (dtype, shape, bits): the parameters, and from the rank whose optimizer owns each
    parameter its master weight, moments and EMA; a slot no rank holds yet is what the job had at step 0; the step.
    (The reference's rng/state is the stream its data comes from; the Trainer holds no such state.)"""
    opt, owns, ema = inner_optimizer(trainer), owned(trainer), ema_callback(trainer)
    named = dict(trainer.model.named_parameters())
    mine = {}
    for name, dtype in PARAMS.items():
        param = named[name]
        mine["model/" + name] = bits_of(param)
        if not owns(param):
            continue
        master = param if dtype == "F32" else opt._master_weights.get(param.name)
        if master is not None:
            mine["master/" + name] = bits_of(master)
        for slot, family in (("moment1", "m1"), ("moment2", "m2")):
            acc = optimizer_slot(opt, master.name if master is not None else param.name, slot)
            if acc is not None:
                mine[f"optimizer/{name}.{family}"] = bits_of(acc)
        if ema is not None:
            held = ema.buffer.model_params.get(name) if dtype == "F32" else ema.buffer.master_weights.get(param.name)
            if held is not None and held._is_initialized():
                mine["ema/" + name] = bits_of(held)
    gathered = [mine]
    if dist.is_initialized() and dist.get_world_size() > 1:
        gathered = []
        dist.all_gather_object(gathered, mine)
    state = {}
    for part in gathered:
        for key, value in part.items():
            state.setdefault(key, tuple(value))
    for key, p in DATA["save", 0][0].items():  # whole on every rank
        if key.split("/")[0] in ("model", "master", "optimizer", "ema"):
            state.setdefault(key, (DTYPE_NAMES[p.dtype], list(p.shape), p.bits))
    state["meta/step"] = ("int64", [], np.array(trainer.state.global_step, np.int64).tobytes().hex())
    return state








def check(step, got, pieces, also=(), should="what was saved"):
    """Every loaded piece must have the dtype and the exact bits that were saved: by one save as a whole (``also``:
    the other saves it may rightly give, after a kill in the middle of a re-save of the name). ``should`` says what
    the pieces are."""
    def held(key, p):
        dtype, shape, bits = bits_of(got[key])
        return (dtype, shape, bits) == (DTYPE_NAMES[p.dtype], list(p.shape), p.bits), (dtype, shape, bits)

    keys = [key for key in pieces if key in got]  # not in got: an empty flattened slice, nothing was asked for
    gave = {i for i, saved in enumerate((pieces, *also)) if all(held(key, saved[key])[0] for key in keys)}
    if also and dist.is_initialized():  # one save as a whole: every rank must have given the same one
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, sorted(gave))
        everyone = [g for g in everyone if g is not None]  # torch fills the list in place, Paddle appends to it
        common = set.intersection(*(set(g) for g in everyone))
        if gave and not common:
            print(f"BUG: {step} on rank {RANK}: the ranks gave different saves' data (by rank: {everyone}), "
                  "a state no save wrote")
            print(f"EXPECTED: one of the {1 + len(also)} saves it may give, on every rank")
            print(f"ACTUAL:   saves by rank (0: the save this step names, 1 on: the others) {everyone}")
            sys.exit(1)
        gave = common
    if gave:
        return
    for key in keys:
        p = pieces[key]
        same, (dtype, shape, bits) = held(key, p)
        if not same:
            print(f"BUG: {step} on rank {RANK}: {key} does not hold {should}"
                  + (f" (by any of the {1 + len(also)} saves it may give)" if also else ""))
            print(f"EXPECTED: {DTYPE_NAMES[p.dtype]} {list(p.shape)} bits {p.bits}")
            print(f"ACTUAL:   {dtype} {shape} bits {bits}")
            sys.exit(1)


class Failed(Exception):
    """A failure this script detects itself (the framework only logged it)."""


def run(step, action, *args, expect_error=False, tolerate=False, may_fail=False, also=(), **kwargs):
    """Run one step; an error where none is due (or none where one is), or a load that gives back other bits than
    were saved, shows the bug. ``may_fail``: the save it reads was killed part-way, never acknowledged, or its files
    were damaged since: an error is a right answer there, other bits are not."""
    try:
        result = action(*args, **kwargs)
    except BaseException as exc:  # torch's CheckpointException is a BaseException
        if isinstance(exc, (SystemExit, KeyboardInterrupt)):
            raise
        if traceback.extract_tb(exc.__traceback__)[-1].filename == __file__ and not isinstance(exc, Failed):
            raise  # a mistake of this script, not the framework's failure
        if tolerate:
            print(f"{step} fails on rank {RANK} too ({type(exc).__name__}: {exc}): another known bug this case "
                  "passes through on the way to the one reported; going on")
            return None
        if expect_error:
            print(f"{step}: raised as it should ({type(exc).__name__})")
            return None
        if may_fail:
            print(f"{step}: raised ({type(exc).__name__}), a right answer: the save it reads was killed part-way "
                  "or its files were damaged")
            return None
        print(f"BUG: {step} raised on rank {RANK}")
        print("EXPECTED: it succeeds")
        lines = str(exc).strip().splitlines() or [""]
        last = f" ... {lines[-1].strip()}" if len(lines) > 1 else ""
        print(f"ACTUAL:   {type(exc).__name__}: {lines[0]}{last}")
        sys.exit(1)
    if expect_error:
        print(f"BUG: {step} succeeded on rank {RANK}")
        print("EXPECTED: an error (the checkpoint it reads is not there or not whole)")
        print("ACTUAL:   no error")
        sys.exit(1)
    if action.__name__ in ("load", "train") and not tolerate:  # a job that trains: its state after the step
        check(step, result, args[-1], also, "what was saved" if action is load else "the uninterrupted run's state")

def main():
    global ROOT, PHASE, RANK
    ROOT, PHASE = sys.argv[1], int(sys.argv[2])
    paddle.set_device("cpu")
    RANK = int(os.environ.get("PADDLE_TRAINER_ID", "0"))
    if not paddle.is_compiled_with_cuda():
        paddle.Tensor.cuda = lambda self, *args, **kwargs: self.clone()
        paddle.Tensor.cpu = lambda self, *args, **kwargs: self.clone()
        paddle.Tensor.pin_memory = lambda self, *args, **kwargs: self.clone()
        paddle.device.synchronize = lambda *args, **kwargs: None
        paddle.Tensor.__add__ = bf16_add(paddle.Tensor.__add__)
        os.environ.setdefault("FLAGS_selected_gpus", os.environ.get("PADDLE_LOCAL_RANK", "0"))
    paddle.optimizer.AdamW._append_optimize_op = adam_step
    if PHASE == 0:  # 2 process(es)
        run('step 0: train to step 1', train, 1, DATA['save', 1][RANK])
        run('step 1: save step-1', save, 'step-1', DATA['save', 1][RANK])
    elif PHASE == 1:  # 4 process(es)
        run('step 2: load step-1', load, 'step-1', DATA['load', 1][RANK])
    print(f"rank {RANK}: every step of launch {PHASE} behaved as it should")


if __name__ == "__main__":
    main()
