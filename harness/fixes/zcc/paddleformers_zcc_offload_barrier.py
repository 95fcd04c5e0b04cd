"""Zero-Cost Checkpointing's offload barrier waits only once, so a checkpoint can mix two steps. The manager's
``global_step`` is set only by its first worker update; the OFFLOAD tasks carry that stale step, the worker echoes
it, and ``sync_offload_status`` (called before each optimizer step) compares the echo with the same stale value, so
from the second EMA or save step on it never waits: the next optimizer step changes the fused buffers while the
worker still copies them, and the checkpoint (and the EMA) takes some tensors from the step after the one saved.
Later upstream versions set the manager's step at each step's end, before the worker is prepared; so does this."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddleformers-zcc-offload-barrier",
    kind="fix",
    framework="paddleformers",
    version="1.2.0",
    summary="ZCC's offload barrier compares the worker's echo with a step set once; set it at every step's end",
    hunks=(
        Hunk("paddleformers.trainer.utils.zero_cost_checkpoint", "ZeroCostCheckpointCallback.on_step_end",
             "ddbca0b4404fc6e0", (
                 ("    def on_step_end(self, args, state, control, model, lr_scheduler, optimizer, **kwargs):\n",
                  "    def on_step_end(self, args, state, control, model, lr_scheduler, optimizer, **kwargs):\n"
                  "        self.manager.global_step = state.global_step  # what the offload barrier waits for\n"),
             )),
    ),
    covers=("paddleformers-zcc-torn-checkpoint",),
)
