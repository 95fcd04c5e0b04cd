"""``unified_optimizer_into_shards`` sets the optimizer index's ``"master_weights"`` flag from whether the state it
was given exists, and for the optimizer's own call that state always does: every multi-rank UC save says it has
master weights, FP32 jobs too, which write no master-weight index. The multi-rank loader re-derives the need from
the optimizer and gets by; the single-process loader trusts the flag and cannot resume the job ("Can't find a
optimizer index (…/master_weights.safetensors.index.json)"). ``save_unified_optimizer`` now sets the flag from what
it actually saves: a master-weight index exactly when there are master weights."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddleformers-uc-master-weights-flag",
    kind="fix",
    framework="paddleformers",
    version="1.2.0",
    summary="save_unified_optimizer: the index says master_weights=True whenever an optimizer is saved; say if one was",
    hunks=(Hunk("paddleformers.trainer.unified_checkpoint.unified_checkpoint",
                "UnifiedCheckpointHandler.save_unified_optimizer", "9e085bab1d9d3692", (
                    ("        if sharded_optim_index is not None:\n"
                     "            optimizer_index_name = SAFE_OPTIMIZER_INDEX_NAME\n",
                     "        if sharded_optim_index is not None:\n"
                     "            # Whether a master-weight index is saved with this one (loaders trust it).\n"
                     "            sharded_optim_index[\"master_weights\"] = master_weight_state_dict is not None\n"
                     "            optimizer_index_name = SAFE_OPTIMIZER_INDEX_NAME\n"),
                )),),
    covers=("paddleformers-uc-dp2-fp32-resume-on-one-rank",),
)
