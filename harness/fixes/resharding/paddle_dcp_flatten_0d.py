"""Flex checkpoint's unflatten ends with ``flatten_()`` on each flat shard, which a 0-d tensor refuses; reshaping
to one axis gives every tensor, 0-d included, the same flat view."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddle-dcp-flatten-0d",
    kind="fix",
    framework="paddle",
    version="3.3.1",
    summary="_finish_unflatten: flatten_() fails on a 0-d flat shard; reshape_([-1]) flattens any rank",
    hunks=(Hunk("paddle.distributed.flex_checkpoint.dcp.load_state_dict", "_finish_unflatten", "351daa37fbe380dc",
                (("        flat_shard.local_tensor.flatten_()\n",
                  "        flat_shard.local_tensor.reshape_([-1])\n"),)),),
    covers=("paddle-dcp-0d-flat-safetensors-roundtrip",),
)
