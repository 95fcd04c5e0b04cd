"""``parallel_broadcast`` copies each chunk it received into its targets with ``assign_sharded_weight``, which cuts
source and target with ``paddle.slice`` over every axis. A 0-d tensor has none, and ``paddle.slice`` refuses an
empty axes list ("Input axes should not be an empty list/tuple"), so a load through the grid of groups fails on any
0-d tensor (a step counter, a scalar scale). A 0-d chunk is the whole tensor: it is copied without a slice."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddle-dcp-parallel-broadcast-0d",
    kind="fix",
    framework="paddle",
    version="3.3.1",
    summary="assign_sharded_weight: slices a 0-d chunk over no axes, which paddle.slice refuses; copy it whole",
    hunks=(Hunk("paddle.distributed.flex_checkpoint.dcp.resharder", "assign_sharded_weight", "5269d04be033e441", (
        ("    src_slice = paddle.slice(\n",
         "    if ndim == 0:  # a 0-d chunk is the whole tensor, which paddle.slice cannot cut\n"
         "        paddle.assign(src.local_tensor, dst.local_tensor)\n"
         "        return\n"
         "    src_slice = paddle.slice(\n"),
    )),),
    covers=("paddle-dcp-parallel-broadcast-0d",),
)
