"""A job saved with ``unified_checkpoint_config`` ``ignore_merge_optimizer`` writes its optimizer unmerged: the
index holds no ``weight_map``. A resume on several cards checks for it and reads the unmerged files; a resume on
one card goes straight to ``load_single_card_optimizer``, which reads ``index["weight_map"]``: KeyError, the job
cannot resume on one card. The one-card path now takes the unmerged reader for such a checkpoint too."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddleformers-uc-single-card-non-merged",
    kind="fix",
    framework="paddleformers",
    version="1.2.0",
    summary="load_unified_optimizer: one card reads index['weight_map'] of an unmerged optimizer; KeyError",
    hunks=(Hunk("paddleformers.trainer.unified_checkpoint.unified_checkpoint",
                "UnifiedCheckpointHandler.load_unified_optimizer", "85f44df5e362c6aa", (
        ("        if paddle.distributed.get_world_size() <= 1:\n",
         "        index_file = os.path.join(resume_from_checkpoint, SAFE_OPTIMIZER_INDEX_NAME)\n"
         "        if paddle.distributed.get_world_size() <= 1 and os.path.isfile(index_file):\n"
         "            with open(index_file) as f:\n"
         "                if \"weight_map\" not in json.load(f):  # saved unmerged (ignore_merge_optimizer)\n"
         "                    return self.load_non_merge_optimizer(model, optimizer, resume_from_checkpoint,\n"
         "                                                         offload=offload)\n"
         "        if paddle.distributed.get_world_size() <= 1:\n"),
    )),),
    covers=("paddleformers-uc-non-merged-optimizer-single-card",),
)
