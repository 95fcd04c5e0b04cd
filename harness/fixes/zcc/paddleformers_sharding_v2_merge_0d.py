"""Resuming a sharding stage 1 V2 job (``split_param``, which Zero-Cost Checkpointing needs) with a 0-d parameter
fails: ``reshard.sharding_v2.merge_tensors`` cuts each merged optimizer slot to ``np.prod(shape)`` elements, the
float ``1.0`` for the empty shape, and ``Tensor._slice`` takes ints only (``TypeError: _slice(): incompatible
function arguments``). The size is an element count: an int."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddleformers-sharding-v2-merge-0d",
    kind="fix",
    framework="paddleformers",
    version="1.2.0",
    summary="stage 1 V2 resume: a 0-d parameter's merged slot is cut at np.prod(()) = 1.0, a float; count as int",
    hunks=(
        Hunk("paddleformers.trainer.utils.reshard.sharding_v2", "merge_tensors", "a11a8f0d85c78cbb", (
            ("    tensor_size = np.prod(shape)\n", "    tensor_size = int(np.prod(shape))\n"),
        )),
    ),
    covers=("paddleformers-zcc-resume-0d-parameter",),
)
