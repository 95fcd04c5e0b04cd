"""Zero-Cost Checkpointing with an EMA hangs its ranks when no parameter has FP32 master weights (an all-FP32
model, or a job without master weights): ``ZeroCostCheckpointEMAProcessor.build_ema_buffer`` takes ``max``/``min``
of the master-weight metadata, which is empty, so the worker raises ``max() arg is an empty sequence`` in its
first EMA step. The manager checks its workers' status messages, never whether a worker lives, so the rank waits for
an acknowledgement that never comes. The master-weight EMA buffer is now empty when there are no master weights;
the FP32 parameters' own EMA buffers are built as before."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddleformers-zcc-ema-buffer-without-master",
    kind="fix",
    framework="paddleformers",
    version="1.2.0",
    summary="ZCC EMA: max/min over empty master-weight metadata kills the worker; size an empty buffer",
    hunks=(
        Hunk("paddleformers.trainer.utils.zero_cost_checkpoint",
             "ZeroCostCheckpointEMAProcessor.build_ema_buffer", "91b5a1802d9a9e03", (
                 ("        master_max_offset = max(\n"
                  "            self.optimizer_fusion_storage_helper.master_weights_meta.values(), "
                  "key=lambda i: i[\"end\"]\n"
                  "        )[\"end\"]\n"
                  "        master_min_offset = min(\n"
                  "            self.optimizer_fusion_storage_helper.master_weights_meta.values(), "
                  "key=lambda i: i[\"start\"]\n"
                  "        )[\"start\"]\n",
                  "        metas = list(self.optimizer_fusion_storage_helper.master_weights_meta.values())\n"
                  "        master_max_offset = max((m[\"end\"] for m in metas), default=0)\n"
                  "        master_min_offset = min((m[\"start\"] for m in metas), default=0)\n"),
             )),
    ),
    covers=("paddleformers-zcc-ema-fp32-worker-dies",),
)
