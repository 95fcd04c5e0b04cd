"""The Trainer's non-ZCC EMA buffer holds a parameter only once an update has copied it in (the first accepted
update, ``ema_start`` "first"), but its flex-checkpoint save and resume assume it holds every one. A checkpoint
saved before that update (an interval above the save step, or every loss so far above the threshold) fails the
save for an FP32 parameter (``self.model_params[name]``: KeyError), and for a BF16 one silently saves no EMA for it;
the resume then builds a load target for every parameter and fails in the resharder on what was never saved.

The save now writes what the buffer holds, and the resume loads what the checkpoint's metadata lists: a parameter
the buffer did not hold at the save is not held after the resume either, so the next accepted update copies it in,
as it would have in the job that never stopped."""

from harness.fixes.patch import Fix, Hunk

_SAVE = (
    "            ema_tensor = self.model_params[struct_name]\n",
    "            if struct_name not in self.model_params:\n"
    "                continue\n"
    "            ema_tensor = self.model_params[struct_name]\n",
)
_LOAD = (
    '        logger.info(f"[NonZCC EMA] Loading {len(ema_target)} EMA tensors',
    "        saved = set()\n"
    "        for name in os.listdir(ema_dir):\n"
    "            if name.endswith('.metadata'):\n"
    "                saved.update(paddle.load(os.path.join(ema_dir, name)).state_dict_metadata)\n"
    "        ema_target = {k: sw for k, sw in ema_target.items() if sw.key in saved}\n"
    '        logger.info(f"[NonZCC EMA] Loading {len(ema_target)} EMA tensors',
)

FIX = Fix(
    id="paddleformers-ema-saves-what-it-holds",
    kind="fix",
    framework="paddleformers",
    version="1.2.0",
    summary="EMA (flex checkpoint): save only what the buffer holds, resume only what the checkpoint lists",
    hunks=(
        Hunk("paddleformers.trainer.utils.zero_cost_checkpoint", "EMABufferFcBased._build_ema_save_sharded_state_dict",
             "f671f042a254bc80", (_SAVE,)),
        Hunk("paddleformers.trainer.utils.zero_cost_checkpoint", "EMABufferFcBased._load_fc_format",
             "c9809f32394b9777", (_LOAD,)),
    ),
    covers=("paddleformers-trainer-ema-save-before-first-update",),
    requires=("paddleformers-ema-without-master-weights",),  # its resume now reaches the buffer's conversion
)
