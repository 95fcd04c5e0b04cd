"""``full_param`` rebuilds each source tensor from the pieces ranks broadcast with
``recover_shard_tensor_from_shards``, which cuts each piece with ``paddle.slice`` over every axis. A 0-d tensor has
none, and ``paddle.slice`` refuses an empty axes list ("Input axes should not be an empty list/tuple"), so a model
holding any 0-d parameter cannot be assembled on more than one rank. A 0-d piece is the whole tensor: it is copied
without a slice. The copy into the output then needs ``paddle-dcp-aoa-0d-slice``."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddle-dcp-full-param-0d-recover",
    kind="fix",
    framework="paddle",
    version="3.3.1",
    summary="recover_shard_tensor_from_shards: slices a 0-d piece over no axes, which paddle.slice refuses",
    hunks=(Hunk("paddle.distributed.flex_checkpoint.dcp.utils", "recover_shard_tensor_from_shards",
                "8746db023a7dcb3a", (
        ("    for s in sharded_weights:\n",
         "    if not dims:  # 0-d: each piece is the whole tensor, which paddle.slice cannot cut\n"
         "        for s in sharded_weights:\n"
         "            paddle.assign(s.local_tensor, output=sw.local_tensor)\n"
         "        return sw\n"
         "    for s in sharded_weights:\n"),
    )),),
    covers=("paddle-dcp-full-param-0d",),
    requires=("paddle-dcp-aoa-0d-slice",),
)
