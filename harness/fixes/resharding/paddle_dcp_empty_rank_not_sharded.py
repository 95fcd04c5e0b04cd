"""``is_sharded_state_dict`` calls a rank with no tensors "all sharded" (``all([])`` is True), so a world where the
other ranks hold plain tensors reads as mixed and the load fails; an empty rank has no say."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddle-dcp-empty-rank-not-sharded",
    kind="fix",
    framework="paddle",
    version="3.3.1",
    summary="is_sharded_state_dict: an empty state dict votes 'sharded' (all([]) is True); test emptiness first",
    hunks=(Hunk("paddle.distributed.flex_checkpoint.dcp.utils", "is_sharded_state_dict", "1b91e54deaccf481", (
        ("    if is_all_sharded:\n        flag = 1\n    elif len(values) == 0:\n        flag = 0\n",
         "    if len(values) == 0:\n        flag = 0\n    elif is_all_sharded:\n        flag = 1\n"),)),),
    covers=("paddle-dcp-rank-without-tensors-mixed-type",),
)
