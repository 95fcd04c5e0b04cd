"""A flex-checkpoint resume of a sharding stage 1 V2 job (the Trainer's, Zero-Cost Checkpointing's) fails on a 0-d
parameter: ``reshard.sharding_v2.merge_tensors`` puts a parameter's master weight together from the ranks' slices
and cuts it at ``np.prod(shape)``, which is the float 1.0 for the empty shape, and ``Tensor._slice`` takes ints
only. The cut is now an int. (Met only behind the Paddle fix of the same float in stage 1 V2's buffer: stock code
never trains such a job.)"""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddleformers-sharding-v2-merge-0d",
    kind="fix",
    framework="paddleformers",
    version="1.2.0",
    summary="sharding V2 resume: merge_tensors cuts a 0-d parameter at np.prod(()) = 1.0; cut at an int",
    hunks=(
        Hunk("paddleformers.trainer.utils.reshard.sharding_v2", "merge_tensors", "a11a8f0d85c78cbb", (
            ("    tensor_size = np.prod(shape)\n", "    tensor_size = int(np.prod(shape))\n"),
        )),
    ),
    covers=("paddleformers-zcc-resume-0d-parameter",),
)
