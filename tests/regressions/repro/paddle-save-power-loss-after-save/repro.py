"""paddle-save: data-loss in P-ATOMIC (paddle-save-power-loss-after-save)

The signature is an empty pickle (EOFError: Ran out of input) on a load under P-ATOMIC, where power-loss states are drawn; torn or lost-dirent states raise other errors that are not named here..

Standalone reproduction written by ckpt-harness from ckpt-harness finding paddle-save-power-loss-after-save.json. Run ``bash run.sh``: it starts each launch below with fresh processes. The script prints BUG / EXPECTED / ACTUAL and exits 1 while the bug is there; every rank exits 0 once it is fixed.
"""

import os
import sys
import traceback

import numpy as np
import paddle
import paddle.distributed as dist

from collections import namedtuple

ROOT, PHASE, RANK = None, None, 0  # the checkpoint directory, which launch of run.sh this is, this rank

SAFETENSORS = False  # the safetensors= of save and load

CARRIERS = {'BF16': ('uint16', None), 'F32': ('float32', None), 'U8': ('uint8', None)}  # numpy dtype Paddle reads bit for bit, and the paddle dtype to view it as

DTYPE_NAMES = {'BF16': 'bfloat16', 'F32': 'float32', 'U8': 'uint8'}  # as the framework prints them

# One rank's piece of a tensor: dtype, global shape, offsets and shape of its box (or the [start, stop) of a
# flattened slice), its bits as hex, and for a dist tensor its mesh shape, placements and owner coordinates.
Piece = namedtuple("Piece", "dtype global_shape offsets shape flat bits mesh placements owner")

# What each rank saves, and what each load must give back: (layout, version) -> rank -> tensor -> piece
DATA = {}
DATA['load', 1] = {
    0: {'ema/w': Piece('F32', (2, 1), (0, 0), (1, 1), None, '68fd8979', (2,), ('S0',), ()), 'model/b': Piece('F32', (2,), (0,), (2,), None, 'c7779b1a4ac68487', (2,), ('R',), ()), 'model/w': Piece('BF16', (2, 1), (0, 0), (1, 1), None, '7aa9', (2,), ('S0',), ()), 'rng/state': Piece('U8', (8,), (0,), (8,), None, 'ad1ae3ff1e62f718', (2,), ('R',), ())},
    1: {'ema/w': Piece('F32', (2, 1), (1, 0), (1, 1), None, '0781ef9f', (2,), ('S0',), ()), 'model/b': Piece('F32', (2,), (0,), (2,), None, 'c7779b1a4ac68487', (2,), ('R',), ()), 'model/w': Piece('BF16', (2, 1), (1, 0), (1, 1), None, '1057', (2,), ('S0',), ()), 'rng/state': Piece('U8', (8,), (0,), (8,), None, 'ad1ae3ff1e62f718', (2,), ('R',), ())},
}
DATA['save', 0] = {
    0: {'ema/w': Piece('F32', (2, 1), (0, 0), (1, 1), None, '4243681f', (2,), ('S0',), ()), 'model/b': Piece('F32', (2,), (0,), (2,), None, 'd9be1568167f2476', (2,), ('R',), ()), 'model/w': Piece('BF16', (2, 1), (0, 0), (1, 1), None, '7737', (2,), ('S0',), ()), 'rng/state': Piece('U8', (8,), (0,), (8,), None, '1b91ef29d852b8e0', (2,), ('R',), ())},
    1: {'ema/w': Piece('F32', (2, 1), (1, 0), (1, 1), None, 'b9747d32', (2,), ('S0',), ()), 'model/b': Piece('F32', (2,), (0,), (2,), None, 'd9be1568167f2476', (2,), ('R',), ()), 'model/w': Piece('BF16', (2, 1), (1, 0), (1, 1), None, 'ad15', (2,), ('S0',), ()), 'rng/state': Piece('U8', (8,), (0,), (8,), None, '1b91ef29d852b8e0', (2,), ('R',), ())},
}
DATA['save', 1] = DATA['load', 1]  # the same pieces

def tensor(p, zero=False):
    """A paddle tensor holding the piece's exact bits (or zeros of its dtype and shape: a load target)."""
    carrier, view = CARRIERS[p.dtype]
    data = np.zeros(p.shape, carrier) if zero else np.frombuffer(bytes.fromhex(p.bits), carrier).reshape(p.shape)
    t = paddle.to_tensor(data)
    return t.view(getattr(paddle, view)) if view else t


def bits_of(t):
    """(dtype name, shape, bits as hex) of a dense tensor, or of a dist tensor's local part."""
    if getattr(t, "is_dist", lambda: False)():
        t = t._local_value()
    return str(t.dtype).split(".")[-1], list(t.shape), np.ascontiguousarray(t.numpy()).tobytes().hex()



from paddle.framework import io as paddle_io  # noqa: E402 (where paddle.async_save keeps its threads)


def path_of(name):
    return os.path.join(ROOT, name, f"rank-{RANK:05d}." + ("safetensors" if SAFETENSORS else "pdparams"))


def save(name, pieces, async_save=False, mutate_after=False, detach=False):
    state = {key: tensor(p) for key, p in pieces.items()}
    path = path_of(name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if not async_save:
        paddle.save(state, path, safetensors=SAFETENSORS)
        return
    paddle.async_save(state, path, safetensors=SAFETENSORS)
    returned(paddle_io.async_save_queue[-1], state.values(), mutate_after, detach)


def wait():
    writers, PENDING[:] = list(PENDING), []
    for writer in writers:
        writer.join()


def load(name, pieces):
    if not pieces:
        return {}
    loaded = paddle.load(path_of(name), safetensors=SAFETENSORS)
    return {key: loaded[key] for key in pieces}

def damage(edits):
    """Change the checkpoint's files as listed, between two steps: every rank has finished the step before (a save
    may return on one rank before another has written its file), rank 0 edits, the others wait."""
    if dist.is_initialized():
        dist.barrier()
    for e in edits if RANK == 0 else ():
        path = os.path.join(ROOT, e["path"])
        if e["kind"] == 'lose_data':
            if os.path.exists(path):  # written since its last fsync (never): a power loss empties it
                os.truncate(path, 0)
    if dist.is_initialized():
        dist.barrier()



def check(step, got, pieces):
    """Every loaded piece must have the dtype and the exact bits that were saved."""
    for key, p in pieces.items():
        if key not in got:
            continue  # an empty flattened slice: nothing was asked for
        dtype, shape, bits = bits_of(got[key])
        want = (DTYPE_NAMES[p.dtype], list(p.shape), p.bits)
        if (dtype, shape, bits) != want:
            print(f"BUG: {step} on rank {RANK}: {key} does not hold what was saved")
            print(f"EXPECTED: {want[0]} {want[1]} bits {want[2]}")
            print(f"ACTUAL:   {dtype} {shape} bits {bits}")
            sys.exit(1)


class Failed(Exception):
    """A failure this script detects itself (the framework only logged it)."""


def run(step, action, *args, expect_error=False, tolerate=False, **kwargs):
    """Run one step; an error where none is due (or none where one is), or a load that gives back other bits than
    were saved, shows the bug."""
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
    if action is load and not tolerate:
        check(step, result, args[-1])

def main():
    global ROOT, PHASE, RANK
    ROOT, PHASE = sys.argv[1], int(sys.argv[2])
    paddle.set_device("cpu")
    if not paddle.is_compiled_with_cuda():
        # CPU-only Paddle: the checkpoint code calls Tensor.cuda() and paddle.device.synchronize() on its reshard and
        # async paths; on a CPU wheel those raise, so they become a CPU copy and a no-op (nothing else is changed).
        paddle.Tensor.cuda = lambda self, *args, **kwargs: self.clone()
        paddle.device.synchronize = lambda *args, **kwargs: None
    if int(os.environ.get("PADDLE_TRAINERS_NUM", "1")) > 1:
        dist.init_parallel_env()
    RANK = dist.get_rank()
    if PHASE == 0:  # 2 process(es)
        run('step 0: save step-0', save, 'step-0', DATA['save', 0][RANK])
        run('step 1: save step-1', save, 'step-1', DATA['save', 1][RANK])
        run('step 1: power loss after the save returned: the data of step-1/rank-00000.pdparams, step-1/rank-00001.pdparams was never fsynced, so those files come back empty', damage, [{'kind': 'lose_data', 'path': 'step-1/rank-00000.pdparams'}, {'kind': 'lose_data', 'path': 'step-1/rank-00001.pdparams'}])
    elif PHASE == 1:  # 2 process(es)
        run('step 2: load step-1', load, 'step-1', DATA['load', 1][RANK])
    print(f"rank {RANK}: every step of launch {PHASE} behaved as it should")


if __name__ == "__main__":
    main()
