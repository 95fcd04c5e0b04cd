"""What torch repro scripts share, as script text: set-up (torchrun, gloo on the CPU) and tensors bit for bit."""

from __future__ import annotations

import numpy as np

from harness.sut.torch_dcp import carriers as torch_carriers

IMPORTS = """import datetime
import os
import sys
import traceback

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
"""

SETUP = """if "RANK" in os.environ:  # started by torchrun: one process per rank, gloo on the CPU
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
else:  # one plain process: a world of one (DTensors need a process group)
    store = os.path.join(os.path.dirname(os.path.abspath(ROOT)), f"store-{os.getpid()}")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
RANK = dist.get_rank()
"""

# The adapter's own table (harness/sut/torch_dcp.py), as the script spells it: the numpy dtype torch reads bit for
# bit, and the torch dtype to view it as where numpy has none; and the names torch prints.
CARRIERS = {code: (np.dtype(carrier).name, None if np.dtype(carrier).name == name else name)
            for code, (name, carrier) in torch_carriers().items()}
DTYPE_NAMES = {code: name for code, (name, _) in torch_carriers().items()}


def carriers(dtypes: set[str]) -> str:
    rows = ", ".join(f"{d!r}: {CARRIERS[d]!r}" for d in sorted(dtypes))
    return f"CARRIERS = {{{rows}}}  # numpy dtype torch reads bit for bit, and the torch dtype to view it as\n"


TENSORS = '''WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def tensor(p, zero=False):
    """A torch tensor holding the piece's exact bits (or zeros of its dtype and shape: a load target)."""
    carrier, view = CARRIERS[p.dtype]
    data = np.zeros(p.shape, carrier) if zero else np.frombuffer(bytes.fromhex(p.bits), carrier).reshape(p.shape)
    t = torch.from_numpy(data.copy())
    return t.view(getattr(torch, view)) if view else t


def bits_of(t):
    """(dtype name, shape, bits as hex) of a tensor, or of a DTensor's local part."""
    t = t.to_local() if hasattr(t, "to_local") else t
    raw = t.detach().contiguous().view(WIDTH[t.element_size()]).numpy()
    return str(t.dtype).removeprefix("torch."), list(t.shape), raw.tobytes().hex()
'''

SCRIBBLE = '''def scribble(t):
    """Overwrite the tensor in place (every bit inverted) — what training does to weights after a save returns."""
    if t.numel():
        t.view(WIDTH[t.element_size()]).bitwise_not_()
'''

WHY = ("No shims: torch runs as installed, on the CPU with gloo (torchrun starts the ranks).",)

# run.sh's launch of N > 1 processes ($2) for phase $1, its output in $WORK/launch$1.out
LAUNCH = ('env OMP_NUM_THREADS=1 python -m torch.distributed.run --standalone --nproc_per_node "$2" '
          'repro.py "$WORK/ckpt" "$1" > "$WORK/launch$1.out" 2>&1')
SHOW = 'cat "$WORK/launch$1.out"'
