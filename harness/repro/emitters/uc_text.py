"""What a PaddleFormers Unified Checkpoint script says, as script text: Paddle's tensors and launcher (shared with the
Paddle scripts), and a set-up without CPU shims (the Trainer's path calls no CUDA-only API on a CPU wheel)."""

from __future__ import annotations

from harness.repro.emitters.paddle_text import CARRIERS, DTYPE_NAMES, LAUNCH, SCRIBBLE, SHOW, TENSORS, carriers

__all__ = ["CARRIERS", "DTYPE_NAMES", "IMPORTS", "LAUNCH", "SCRIBBLE", "SETUP", "SHOW", "TEARDOWN", "TENSORS", "WHY",
           "carriers"]

IMPORTS = """import os
import sys
import time
import traceback

import numpy as np
import paddle
import paddle.distributed as dist
"""

# TrainingArguments starts the collective itself (as in a training job launched with paddle.distributed.launch)
SETUP = """paddle.set_device("cpu")
RANK = int(os.environ.get("PADDLE_TRAINER_ID", "0"))
"""

# As the Trainer ends training: UC waits for its async writers and ends them (their processes would keep the rank
# alive); a writer the launch killed makes UC raise, which is said, not judged (the launch's steps are done).
TEARDOWN = """handler = getattr(JOB[0], "unified_checkpoint_handler", None) if JOB else None
if handler is not None:
    try:
        handler.unlink_shared_memory()
    except RuntimeError as exc:
        print(f"rank {RANK}: UC's end of training: {exc}")
"""

WHY = ("No shims: the Trainer's save and resume run on a CPU-only Paddle wheel as they are; each process is one",
       "data-parallel rank of the training job, and TrainingArguments starts its collective.")
