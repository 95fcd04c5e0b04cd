"""What both Paddle repro scripts share, as script text: set-up with the CPU shims, and building tensors bit for bit.

The text is what a Paddle maintainer reads, so it uses only Paddle's public API (and says so where it does not).
"""

from __future__ import annotations

import numpy as np

from harness.sut._paddle_common import carriers as paddle_carriers

IMPORTS = """import os
import sys
import traceback

import numpy as np
import paddle
import paddle.distributed as dist
"""

SETUP = """paddle.set_device("cpu")
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
"""

# The adapter's own table (harness/sut/_paddle_common.py), as the script spells it: the numpy dtype Paddle reads bit
# for bit, and the paddle dtype to view it as where numpy has none.
CARRIERS = {code: (np.dtype(carrier).name, view) for code, (_, carrier, view) in paddle_carriers().items()}

TENSORS = '''def tensor(p, zero=False):
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
'''

SCRIBBLE = '''def scribble(t):
    """Overwrite the tensor in place (every bit inverted) — what training does to weights after a save returns."""
    if t.numel():
        t.view({1: paddle.uint8, 2: paddle.int16, 4: paddle.int32, 8: paddle.int64}[t.element_size()]).bitwise_not_()
'''


def carriers(dtypes: set[str]) -> str:
    rows = ", ".join(f"{d!r}: {CARRIERS[d]!r}" for d in sorted(dtypes))
    return f"CARRIERS = {{{rows}}}  # numpy dtype Paddle reads bit for bit, and the paddle dtype to view it as\n"


DTYPE_NAMES = {code: name for code, (name, _, _) in paddle_carriers().items()}  # as Paddle prints them


WHY = ("CPU shims: on a CPU-only Paddle wheel repro.py turns Tensor.cuda() and Tensor.pin_memory() into CPU copies",
       "and device.synchronize() into a no-op, because the checkpoint code calls them on the paths the bug needs.")

# run.sh's launch of N > 1 processes ($2) for phase $1, its output in log files $WORK/log$1/workerlog.*
LAUNCH = ('python -m paddle.distributed.launch --nproc_per_node "$2" --log_dir "$WORK/log$1" '
          'repro.py "$WORK/ckpt" "$1" > "$WORK/launch$1.out" 2>&1')
SHOW = 'for log in "$WORK/log$1"/workerlog.*; do echo "== $log"; grep -v "\\] \\[ *INFO\\]" "$log"; done'

