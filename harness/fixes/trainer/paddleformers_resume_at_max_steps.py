"""A job resumed from the checkpoint of its last step (``global_step == max_steps``: a finished job restarted, or one
that died after its final save) trains one step more: ``_inner_training_loop`` skips the batches already trained and
checks ``global_step >= max_steps`` only after a step, so it takes step ``max_steps + 1`` (its weights, moments, EMA
and step count all move past the uninterrupted run's) before it stops. A job with no step left now takes none."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddleformers-resume-at-max-steps",
    kind="fix",
    framework="paddleformers",
    version="1.2.0",
    summary="a job resumed at max_steps trains one step past it; with no step left, take none",
    hunks=(
        Hunk("paddleformers.trainer.trainer", "Trainer._inner_training_loop", "245af0232e0a0caf", ((
            "        for epoch in range(epochs_trained, num_train_epochs):\n",
            "        # a job resumed at max_steps has no step left to take\n"
            "        last_epoch = (num_train_epochs if self.state.global_step < self.state.max_steps\n"
            "                      else epochs_trained)\n"
            "        for epoch in range(epochs_trained, last_epoch):\n",
        ),)),
    ),
    covers=("paddleformers-trainer-resume-at-max-steps-trains-on",),
)
