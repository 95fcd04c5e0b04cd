"""An AoA load copies each stored piece into its target through ``assign_sharded_slice``, which cuts both with
``paddle.slice`` over every axis. A 0-d tensor has no axis, and ``paddle.slice`` refuses an empty axes list ("Input
axes should not be an empty list/tuple"), so any AoA statement that is not a plain rename of a 0-d tensor (a dtype
cast) fails the load. A 0-d piece is the whole tensor: it is copied, after its postprocessing, without a slice."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddle-dcp-aoa-0d-slice",
    kind="fix",
    framework="paddle",
    version="3.3.1",
    summary="assign_sharded_slice: slices a 0-d piece over no axes, which paddle.slice refuses; copy it whole",
    hunks=(Hunk("paddle.distributed.flex_checkpoint.dcp.utils", "assign_sharded_slice", "296c517d641dd025", (
        ('    assert src_has or dst_has, "no overlap!"\n',
         '    assert src_has or dst_has, "no overlap!"\n'
         "    if not overlap_shape:  # 0-d: the whole tensor, which paddle.slice cannot cut\n"
         "        src_tensor_slice = src_shard.local_tensor\n"
         "        for ps in postprocess_list or ():\n"
         "            if isinstance(ps, str) and not is_list_string(ps)[0]:\n"
         "                src_tensor_slice = paddle.cast(src_tensor_slice, ps)\n"
         "        paddle.assign(src_tensor_slice, dst_shard.local_tensor)\n"
         "        return\n"),
    )),),
    covers=("paddle-dcp-aoa-0d-cast",),
)
