"""paddle-dcp: silent-corruption in P-REPEAT (paddle-dcp-merge-sharded-ignores-unique-id)

merge_sharded_state_dict(load_path, save_path, unique_id=0) of a directory holding versions 0 and 1 reads version 0's metadata to size the whole tensors, then fills them with load_state_dict called without unique_id, which reads the newest version: the merged Hugging Face checkpoint holds version 1's data, whole, with no error.

Standalone reproduction written by ckpt-harness from ckpt-harness finding paddle-dcp-merge-sharded-ignores-unique-id.json. Run ``bash run.sh``: it starts each launch below with fresh processes. The script prints BUG / EXPECTED / ACTUAL and exits 1 while the bug is there; every rank exits 0 once it is fixed.
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


if os.environ.get("REPRO_WITH_FIX"):  # bash run.sh --with-fix: the candidate fix (fix.py) before any step
    import fix

    fix.apply()

ROOT, PHASE, RANK = None, None, 0  # the checkpoint directory, which launch of run.sh this is, this rank

SAFETENSORS = False  # the format= of the checkpoint
DIST_TENSORS = False  # pieces as dist tensors (else as ShardedWeight)
SAME_DIR = True  # every name a version (unique_id) of one directory
SAVE_REPLICAS = False
UNIQUE_ID = None
COMM_METHOD = 'broadcast'

CARRIERS = {'F32': ('float32', None)}  # numpy dtype Paddle reads bit for bit, and the paddle dtype to view it as

DTYPE_NAMES = {'F32': 'float32'}  # as the framework prints them

# One rank's piece of a tensor: dtype, global shape, offsets and shape of its box (or the [start, stop) of a
# flattened slice), its bits as hex, and for a dist tensor its mesh shape, placements and owner coordinates.
Piece = namedtuple("Piece", "dtype global_shape offsets shape flat bits mesh placements owner")

# What each rank saves, and what each load must give back: (layout, version) -> rank -> tensor -> piece
DATA = {}
DATA['load', 0] = {
    0: {'model/b': Piece('F32', (2,), (0,), (1,), None, 'd9be1568', (2,), ('S0',), ()), 'model/w': Piece('F32', (4,), (0,), (2,), None, '7737ad15ad5368a3', (2,), ('S0',), ())},
    1: {'model/b': Piece('F32', (2,), (1,), (1,), None, '167f2476', (2,), ('S0',), ()), 'model/w': Piece('F32', (4,), (2,), (2,), None, '9f7cc02355e48c94', (2,), ('S0',), ())},
}
DATA['save', 0] = DATA['load', 0]  # the same pieces
DATA['save', 1] = {
    0: {'model/b': Piece('F32', (2,), (0,), (1,), None, 'c7779b1a', (2,), ('S0',), ()), 'model/w': Piece('F32', (4,), (0,), (2,), None, '7aa910576f8a191c', (2,), ('S0',), ())},
    1: {'model/b': Piece('F32', (2,), (1,), (1,), None, '4ac68487', (2,), ('S0',), ()), 'model/w': Piece('F32', (4,), (2,), (2,), None, '7d51ff1720315d2b', (2,), ('S0',), ())},
}

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



def location(name):
    """(directory, unique_id) of a checkpoint name: its own directory, or a version of the shared one."""
    if name is None:
        return os.path.join(ROOT, "dcp"), None  # the newest version
    if SAME_DIR:
        return os.path.join(ROOT, "dcp"), int(name.rsplit("-", 1)[-1])
    return os.path.join(ROOT, name), UNIQUE_ID


def worker_groups():
    """multi_group_broadcast broadcasts within the groups the caller names: here the world's, the job's one group."""
    if COMM_METHOD != "multi_group_broadcast":
        return None
    from paddle.distributed.communication.group import _get_global_group

    return [_get_global_group()]


def entry(name, p, t, dist_tensors):
    """What goes in the state dict for this rank's piece ``p``, held in ``t``."""
    return dist.ShardedWeight(name, t, p.shape, p.global_shape, p.offsets)


def key(name, side):
    return name


def state_dict(pieces, zero=False, side="save"):
    """(state dict, the dense tensors behind it) for this rank; ShardedWeight for all if any piece is flattened."""
    dist_tensors = DIST_TENSORS and not any(p.flat is not None for p in pieces.values())
    state, dense = {}, {}
    for name, p in pieces.items():
        t = tensor(p, zero)
        value = entry(key(name, side), p, t, dist_tensors)
        if value is not None:
            state[key(name, side)], dense[name] = value, t
    return state, dense


def save(name, pieces):
    state, _ = state_dict(pieces)
    path, unique_id = location(name)
    dist.save_state_dict(state, path, unique_id=unique_id, safetensors=SAFETENSORS,
                         save_replicas=SAVE_REPLICAS)


from paddle.distributed.flex_checkpoint.dcp.load_state_dict import merge_sharded_state_dict  # noqa: E402


def merged(name):
    """merge_sharded_state_dict of the checkpoint into a Hugging Face checkpoint beside it (safetensors files and
    their index, no flex metadata); the load reads that directory, its tensors under their stored keys."""
    path, unique_id = location(name)
    out = path + ".merged" + ("" if unique_id is None else f"-{unique_id}")
    merge_sharded_state_dict(path, out, unique_id=unique_id, safetensors=SAFETENSORS)
    return out, None


def load(name, pieces):
    state, dense = state_dict(pieces, zero=True, side="save")
    path, unique_id = merged(name)
    dist.load_state_dict(state, path, unique_id=unique_id, safetensors=True, comm_method=COMM_METHOD,
                         worker_groups=worker_groups())
    return {n: getattr(state[key(n, "save")], "local_tensor", state[key(n, "save")]) for n in dense}







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
    if not paddle.is_compiled_with_cuda():
        # CPU-only Paddle: the checkpoint code calls Tensor.cuda(), Tensor.pin_memory() and paddle.device.synchronize()
        # on its reshard, offload and async paths; on a CPU wheel those raise, so they become CPU copies and a no-op
        # (nothing else is changed).
        paddle.Tensor.cuda = lambda self, *args, **kwargs: self.clone()
        paddle.Tensor.pin_memory = lambda self, *args, **kwargs: self.clone()
        paddle.device.synchronize = lambda *args, **kwargs: None
    if int(os.environ.get("PADDLE_TRAINERS_NUM", "1")) > 1:
        dist.init_parallel_env()
    RANK = dist.get_rank()
    if PHASE == 0:  # 2 process(es)
        run('step 0: save step-0', save, 'step-0', DATA['save', 0][RANK])
        run('step 1: save step-1', save, 'step-1', DATA['save', 1][RANK])
        run('step 2: load step-0', load, 'step-0', DATA['load', 0][RANK])
    print(f"rank {RANK}: every step of launch {PHASE} behaved as it should")


if __name__ == "__main__":
    main()
