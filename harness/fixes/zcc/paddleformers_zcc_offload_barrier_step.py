"""Zero-Cost Checkpointing can write a checkpoint whose tensors come from a later step than its name and trainer
state: the offload barrier (``ZeroCostCheckpointManager.sync_offload_status``, called before each optimizer step
while a save is being copied out) waits until the worker echoes ``manager.global_step``, but only the worker's
first update sets that attribute. From the second save on, the worker's last echo already equals it, the barrier
never waits, and the next optimizer step writes the fused buffers while the worker still copies them: a slow
worker dumps step N+1's master weights, moments, parameters and EMA as ``checkpoint-N``, which resumes silently.
The manager's step is now the loop's at every step end, so the barrier waits for the copy of that step."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddleformers-zcc-offload-barrier-step",
    kind="fix",
    framework="paddleformers",
    version="1.2.0",
    summary="ZCC: the offload barrier compares with a step set once; set the manager's step at each step end",
    hunks=(
        Hunk("paddleformers.trainer.utils.zero_cost_checkpoint",
             "ZeroCostCheckpointCallback.on_step_end", "ddbca0b4404fc6e0", (
                 ("        if not control.should_save:\n",
                  "        self.manager.global_step = state.global_step\n"
                  "        if not control.should_save:\n"),
             )),
    ),
    covers=("paddleformers-zcc-stalled-save-torn",),
)
