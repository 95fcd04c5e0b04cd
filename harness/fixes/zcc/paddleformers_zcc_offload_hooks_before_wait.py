"""Zero-Cost Checkpointing hangs at the optimizer step after an EMA step that is no save step, when the job
accumulates one micro-batch per step: the manager splits each offload into ``pipeline_hooks_steps`` OFFLOAD tasks
(at least one) and sends them from ``on_substep_end``, which runs once per micro-batch but the last. A save step's
``on_step_end`` sends the first itself; an EMA-only step's sends none, so with one micro-batch nothing asks the
worker to offload, and ``sync_offload_status`` (``on_optimizer_begin``) waits for ever for the worker to echo the
step. The same holds whenever the hooks outnumber the micro-batches left (``zcc_pipeline_hooks_capacity_usage``
1.0). The barrier now first sends whatever OFFLOAD tasks the steps have not, as ``finalize`` does before it waits."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddleformers-zcc-offload-hooks-before-wait",
    kind="fix",
    framework="paddleformers",
    version="1.2.0",
    summary="ZCC: the offload barrier waits for hooks no micro-batch sent; send the rest before waiting",
    hunks=(
        Hunk("paddleformers.trainer.utils.zero_cost_checkpoint",
             "ZeroCostCheckpointManager.sync_offload_status", "25675cc568f2f557", (
                 ("        assert self.current_worker is not None, \"[ZCC manager] current_worker must not be None\"\n",
                  "        assert self.current_worker is not None, \"[ZCC manager] current_worker must not be None\"\n"
                  "        for i in range(self.pipeline_hooks_steps):  # those no micro-batch sent\n"
                  "            self.zcc_pipeline_hook(i)\n"),
             )),
    ),
    covers=("paddleformers-zcc-ema-step-offload-never-sent",),
)
