"""What a script of PaddleFormers' Trainer training itself says, as script text: Paddle's tensors and launcher
(shared with the Paddle scripts), and the CPU shims the harness's ``paddleformers-trainer`` SUT runs under
(harness/sut/paddleformers_trainer.py; docs/paddleformers-notes.md, "The Trainer's EMA on CPU")."""

from __future__ import annotations

from harness.repro.emitters.paddle_text import CARRIERS, DTYPE_NAMES, LAUNCH, SHOW, carriers
from harness.repro.emitters.paddle_text import TENSORS as PADDLE_TENSORS

__all__ = ["CARRIERS", "DTYPE_NAMES", "IMPORTS", "LAUNCH", "SETUP", "SHOW", "TENSORS", "WHY", "carriers"]

IMPORTS = """import os
import sys
import traceback

import numpy as np
import paddle
import paddle.distributed as dist
"""

# TrainingArguments starts the collective itself. On a CPU-only wheel the EMA's CUDA calls become copies, a BF16 add
# runs in FP32 rounded to nearest even (no CPU BF16 add kernel), and FLAGS_selected_gpus is the local rank, as
# Paddle's launcher sets it on GPUs. AdamW's step is the reference loop's on every build (adam_step: the loss and
# gradients are the reference's data, the forward gives zero gradients).
SETUP = """paddle.set_device("cpu")
RANK = int(os.environ.get("PADDLE_TRAINER_ID", "0"))
if not paddle.is_compiled_with_cuda():
    paddle.Tensor.cuda = lambda self, *args, **kwargs: self.clone()
    paddle.Tensor.cpu = lambda self, *args, **kwargs: self.clone()
    paddle.Tensor.pin_memory = lambda self, *args, **kwargs: self.clone()
    paddle.device.synchronize = lambda *args, **kwargs: None
    paddle.Tensor.__add__ = bf16_add(paddle.Tensor.__add__)
    os.environ.setdefault("FLAGS_selected_gpus", os.environ.get("PADDLE_LOCAL_RANK", "0"))
paddle.optimizer.AdamW._append_optimize_op = adam_step
"""

TENSORS = PADDLE_TENSORS.replace('''def bits_of(t):
    """(dtype name, shape, bits as hex) of a dense tensor, or of a dist tensor's local part."""
''', '''def bits_of(t):
    """(dtype name, shape, bits as hex) of a dense tensor, or of a dist tensor's local part (or such a triple)."""
    if isinstance(t, tuple):
        return t
''')
if TENSORS == PADDLE_TENSORS:
    raise ImportError("trainer_text: paddle_text.TENSORS no longer has the bits_of this module extends")

WHY = ("CPU shims: on a CPU-only Paddle wheel repro.py turns Tensor.cuda/cpu/pin_memory into copies, runs a BF16",
       "add in FP32 rounded to nearest even, and sets FLAGS_selected_gpus; AdamW's step applies the listed gradients.")
