"""Zero-Cost Checkpointing in flex-checkpoint format hangs at its first save when a rank holds no slice of any
master weight (sharding stage 1 V2 splits each parameter's padded slot over the ranks, so a rank can hold padding
alone, e.g. of one small BF16 parameter): ``ZeroCostCheckpointCallbackFcBased._cache_meta_for_sharded_save`` builds
the EMA's master-weight metadata only ``if ema_master_weights_sharded`` (this rank's), and ``saved_ckptmeta``
all-gathers across the world. The ranks that hold some enter the collective, the others never do: a gloo timeout
on CPU, a hang under NCCL. Every rank now enters it when any rank has master weights."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddleformers-zcc-ema-meta-collective",
    kind="fix",
    framework="paddleformers",
    version="1.2.0",
    summary="ZCC flex: a rank-local 'if master weights' guards a world all_gather; decide it over all ranks",
    hunks=(
        Hunk("paddleformers.trainer.utils.zero_cost_checkpoint",
             "ZeroCostCheckpointCallbackFcBased._cache_meta_for_sharded_save", "85dc8521a9997f08", (
                 ("        ema_master_weights_sharded = master_weights\n"
                  "        if ema_master_weights_sharded:\n",
                  "        ema_master_weights_sharded = master_weights\n"
                  "        held = [bool(ema_master_weights_sharded)]\n"
                  "        if paddle.distributed.get_world_size() > 1:  # saved_ckptmeta is a collective\n"
                  "            held = []\n"
                  "            paddle.distributed.all_gather_object(held, bool(ema_master_weights_sharded))\n"
                  "        if any(held):\n"),
             )),
    ),
    covers=("paddleformers-zcc-ema-meta-one-rank-without-master",),
)
