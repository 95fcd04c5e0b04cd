"""``get_target_tensor`` takes a dist tensor's local value only when the world has more than one rank; in a world
of one the load writes into the dist tensor wrapper, and the values the caller reads stay zeros."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddle-dcp-dist-local-value",
    kind="fix",
    framework="paddle",
    version="3.3.1",
    summary="get_target_tensor: `use_dist and` skips _local_value() in a world of one; take it for any dist tensor",
    hunks=(Hunk("paddle.distributed.flex_checkpoint.dcp.utils", "get_target_tensor", "95de75f86b5cab1a", (
        ("    return tensor._local_value() if use_dist and tensor.is_dist() else tensor\n",
         "    return tensor._local_value() if tensor.is_dist() else tensor\n"),)),),
    covers=("paddle-dcp-moe-ep2-to-ep1-dist-tensor-zeros", "paddle-dcp-replicated-lost-on-smaller-world"),
)
