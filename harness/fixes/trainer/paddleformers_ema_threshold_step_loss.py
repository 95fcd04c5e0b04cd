"""The EMA's loss threshold (``zcc_ema_loss_threshold``, with and without Zero-Cost Checkpointing) is compared with
``state.loss``, which the training loop sets from ``tr_loss``: the loss summed since the last log, reset only when
the loop logs. With ``logging_steps`` > 1 the sum crosses the threshold although no step's loss does, so the EMA
skips updates it promised; a resumed job starts the sum at zero, so it takes updates the uninterrupted job skipped
and its EMA differs. The loop now keeps the loss of the current step apart and hands that to the threshold."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddleformers-ema-threshold-step-loss",
    kind="fix",
    framework="paddleformers",
    version="1.2.0",
    summary="EMA loss threshold reads the loss summed since the last log; give it the step's own loss",
    hunks=(
        Hunk("paddleformers.trainer.trainer", "Trainer._inner_training_loop", "245af0232e0a0caf", (
            ("        tr_loss = paddle.to_tensor(0.0)\n",
             "        tr_loss = paddle.to_tensor(0.0)\n"
             "        zcc_step_loss = paddle.to_tensor(0.0)  # what the EMA threshold reads: this step's loss only\n"),
            ("                    else:\n"
             "                        tr_loss += tr_loss_step\n",
             "                    else:\n"
             "                        tr_loss += tr_loss_step\n"
             "                    zcc_step_loss += tr_loss_step\n"),
            ("                            * args.dataset_world_size\n"
             "                        )\n"
             "                        # For ZCC EMA\n"
             "                        if self.args.enable_zero_cost_checkpoint or self.args.zcc_save_ema_coef is not "
             "None:\n"
             "                            tr_loss_for_zcc = tr_loss.clone()\n",
             "                            * args.dataset_world_size\n"
             "                        )\n"
             "                        # For ZCC EMA\n"
             "                        if self.args.enable_zero_cost_checkpoint or self.args.zcc_save_ema_coef is not "
             "None:\n"
             "                            tr_loss_for_zcc = zcc_step_loss.clone()\n"),
            ("                        self.control = self.callback_handler.on_step_end(args, self.state, "
             "self.control)\n",
             "                        self.control = self.callback_handler.on_step_end(args, self.state, "
             "self.control)\n"
             "                        zcc_step_loss = paddle.to_tensor(0.0)\n"),
        )),
    ),
    covers=("paddleformers-trainer-ema-threshold-reads-summed-loss",),
)
