"""The Trainer's EMA without Zero-Cost Checkpointing reads ``optimizer.state_dict()["master_weights"]`` at every
accumulation (and, resuming a flex checkpoint, again in ``_fc_to_buffer_format``), but an optimizer state has that
key only where the optimizer holds a master weight: an FP32 job has none, and under sharding stage 1 neither has a
rank whose parameters are all FP32 or owned by other ranks. Such a job dies with ``KeyError: 'master_weights'`` at
its first EMA step. A missing key now means no master weights: the EMA averages the FP32 parameters themselves,
which its model-parameter half already does."""

from harness.fixes.patch import Fix, Hunk

_GET = ('.state_dict()["master_weights"]', '.state_dict().get("master_weights", {})')

FIX = Fix(
    id="paddleformers-ema-without-master-weights",
    kind="fix",
    framework="paddleformers",
    version="1.2.0",
    summary="EMA: KeyError 'master_weights' where a rank's optimizer holds none (FP32, sharding); read it as empty",
    hunks=(
        Hunk("paddleformers.trainer.utils.zero_cost_checkpoint", "EMABufferFcBased._get_master_weight",
             "87d5e12669d0c501", (_GET,)),
        Hunk("paddleformers.trainer.utils.zero_cost_checkpoint", "EMABufferShardingIOBased._get_master_weight",
             "232d9f1836162006", (_GET,)),
        Hunk("paddleformers.trainer.utils.zero_cost_checkpoint", "EMABufferFcBased._fc_to_buffer_format",
             "1540ed28084f10a0", (_GET,)),
    ),
    covers=("paddleformers-trainer-ema-without-master-weights",),
)
