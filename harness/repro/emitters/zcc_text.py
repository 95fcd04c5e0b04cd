"""What a script of a Zero-Cost Checkpointing job says, as script text: the Trainer script's tensors and launcher
(trainer_text), a set-up that installs ZCC's CPU stand-ins (harness/sut/zcc_shims.py, carried as text by the
emitter) on the rank, and an end of launch that ends the live job as ``Trainer.train`` ends."""

from __future__ import annotations

from harness.repro.emitters.trainer_text import CARRIERS, DTYPE_NAMES, LAUNCH, SHOW, TENSORS, carriers
from harness.repro.emitters.trainer_text import IMPORTS as TRAINER_IMPORTS

__all__ = ["CARRIERS", "DTYPE_NAMES", "IMPORTS", "LAUNCH", "SETUP", "SHOW", "TEARDOWN", "TENSORS", "WHY",
           "carriers"]

# The shims are the harness's own functions as text, type hints and all: they are never evaluated.
IMPORTS = "from __future__ import annotations\n\n" + TRAINER_IMPORTS

# TrainingArguments starts the collective itself. On a CPU-only wheel install() puts in ZCC's CPU stand-ins (each
# one's reason is in its @shim line); AdamW's step is the reference loop's on every build, on this rank's slice, in
# place; a resume's EMA file is noted as ZCC's manager hands it to its worker (observe reads it as the worker does).
SETUP = """paddle.set_device("cpu")
RANK = int(os.environ.get("PADDLE_TRAINER_ID", "0"))
install(RANK_SHIMS)
paddle.optimizer.AdamW._append_optimize_op = adam_step
zcc.ZeroCostCheckpointManager.set_ema_state_dict = noting_the_ema(zcc.ZeroCostCheckpointManager.set_ema_state_dict)
"""

# As the end of train(): the loop stops, a save in flight is finished and ZCC's workers end (they would keep the
# rank alive).
TEARDOWN = "end_job()\n"

WHY = ("CPU shims: on a CPU-only Paddle wheel repro.py stands in for the CUDA mechanisms on Zero-Cost Checkpointing's",
       "path (IPC as POSIX shared memory, async device copies as CPU copies, gloo collectives, BF16 add in FP32, in",
       "the rank and in ZCC's spawned worker); AdamW's step applies the listed gradients to the rank's slice.")
