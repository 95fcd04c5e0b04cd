"""Zero-Cost Checkpointing's EMA cannot start on a rank whose optimizer holds no master weight (an FP32 job, or a
rank whose slices hold no low-precision parameter): ``ZeroCostCheckpointEMAProcessor.build_ema_buffer`` takes
``max()``/``min()`` over the master weights' offsets in the worker, which raises ``ValueError: max() arg is an empty
sequence``. The worker dies without telling its manager, so the rank waits for it for ever at the first save or
EMA step. With no master weight the EMA's master half is empty; its FP32-parameter half, built beside it, still
averages the parameters."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddleformers-zcc-ema-without-master-weights",
    kind="fix",
    framework="paddleformers",
    version="1.2.0",
    summary="ZCC's worker EMA takes max()/min() over no master weights and dies; an empty master half instead",
    hunks=(
        Hunk("paddleformers.trainer.utils.zero_cost_checkpoint", "ZeroCostCheckpointEMAProcessor.build_ema_buffer",
             "91b5a1802d9a9e03", (
                 ("        master_max_offset = max(\n"
                  "            self.optimizer_fusion_storage_helper.master_weights_meta.values(), key=lambda i: "
                  "i[\"end\"]\n"
                  "        )[\"end\"]\n"
                  "        master_min_offset = min(\n"
                  "            self.optimizer_fusion_storage_helper.master_weights_meta.values(), key=lambda i: "
                  "i[\"start\"]\n"
                  "        )[\"start\"]\n",
                  "        metas = self.optimizer_fusion_storage_helper.master_weights_meta.values()\n"
                  "        master_max_offset = max((m[\"end\"] for m in metas), default=0)\n"
                  "        master_min_offset = min((m[\"start\"] for m in metas), default=0)\n"),
             )),
    ),
    covers=("paddleformers-zcc-ema-without-master-weights",),
)
