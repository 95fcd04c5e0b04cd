"""``Trainer._load_from_checkpoint`` checks that a (non-UC) checkpoint's weights exist only on the ranks that load
them (``dataset_rank == 0``): resuming from a checkpoint that is not there raises on those ranks alone, and the
others go on into ``DataParallel``'s parameter broadcast and wait until the group times out for good, so no later
resume in those processes works. Every rank now takes part in the check (``distributed_isfile``, which sees the
files of every node), so all raise the same error at once; the ranks that load still load as before."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddleformers-uc-missing-checkpoint-all-ranks",
    kind="fix",
    framework="paddleformers",
    version="1.2.0",
    summary="_load_from_checkpoint: a missing checkpoint raises on the loading ranks only, the rest hang; check on all",
    hunks=(Hunk("paddleformers.trainer.trainer", "Trainer._load_from_checkpoint", "9367baea027b0fe5", (
        ("            else:\n"
         "                if resume_from_checkpoint is not None and (\n"
         "                    self.args.dataset_rank == 0 or self.args.use_expert_parallel\n"
         "                ):\n"
         "\n"
         "                    weights_file = os.path.join(\n"
         "                        resume_from_checkpoint, _add_variant(weight_name, self.args.weight_name_suffix)\n"
         "                    )\n"
         "                    weights_index_file = os.path.join(\n"
         "                        resume_from_checkpoint, "
         "_add_variant(weight_index_name, self.args.weight_name_suffix)\n"
         "                    )\n"
         "\n"
         "                    if not any(\n"
         "                        os.path.isfile(f)\n",
         "            else:\n"
         "                if resume_from_checkpoint is not None:\n"
         "                    weights_file = os.path.join(\n"
         "                        resume_from_checkpoint, _add_variant(weight_name, self.args.weight_name_suffix)\n"
         "                    )\n"
         "                    weights_index_file = os.path.join(\n"
         "                        resume_from_checkpoint, "
         "_add_variant(weight_index_name, self.args.weight_name_suffix)\n"
         "                    )\n"
         "\n"
         "                    # Every rank checks, the ranks that do not load too: they would\n"
         "                    # otherwise wait in the next collective until the group times out.\n"
         "                    if not any(\n"
         "                        distributed_isfile(f)\n"),
        ("                            "
         "f\"Can't find a valid checkpoint at {resume_from_checkpoint} -- {weights_file}\"\n"
         "                        )\n"
         "\n",
         "                            "
         "f\"Can't find a valid checkpoint at {resume_from_checkpoint} -- {weights_file}\"\n"
         "                        )\n"
         "\n"
         "                if resume_from_checkpoint is not None and (\n"
         "                    self.args.dataset_rank == 0 or self.args.use_expert_parallel\n"
         "                ):\n"),
    )),),
    covers=("paddleformers-uc-missing-checkpoint-wedges-group",),
)
