"""With ``FLAG_LLM_PDC`` (PaddleCloud), ``get_last_checkpoint`` takes a checkpoint as complete only by its
``.checkpoint_done`` marker, unless the caller passes ``uc_async_save=True``, which the Trainer does only under
auto-parallel; but ``_save_checkpoint`` writes that marker for sync saves only. A job saving with UC's
``async_save`` therefore never finds its checkpoints (``resume_from_checkpoint=True``: "No valid checkpoint found";
``get_last_checkpoint(output_dir)``: None, a silent restart from step 0). A checkpoint without the marker but with
the ``.saving_info`` every PDC save writes is now judged by its async writers' done-signal files, as in async mode,
looked up in the checkpoint's own directory when no signal folder is given (``output_signal_dir``'s default)."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddleformers-uc-pdc-async-latest",
    kind="fix",
    framework="paddleformers",
    version="1.2.0",
    summary="get_last_checkpoint: on PDC an async UC save has no .checkpoint_done, never found; check its signal files",
    hunks=(Hunk("paddleformers.trainer.trainer_utils", "get_last_checkpoint", "14d186a4949bc1ff", (
        ("                    return current_path\n"
         "            else:\n",
         "                    return current_path\n"
         "            # An async UC save writes no .checkpoint_done: its writers'\n"
         "            # signal files, counted as .saving_info says, tell it is complete.\n"
         "            if uc_async_save or os.path.exists(os.path.join(current_path, \".saving_info\")):\n"),
        ("                current_signal_path = os.path.join(signal_folder, i)\n",
         "                current_signal_path = os.path.join(signal_folder or folder, i)\n"),
    )),),
    covers=("paddleformers-uc-pdc-async-no-checkpoint-found",),
)
