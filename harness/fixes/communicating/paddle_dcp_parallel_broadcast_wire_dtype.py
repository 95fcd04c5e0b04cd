"""``parallel_broadcast`` (``ThreeDCommGroupStateResharder``) moves each chunk through gloo in its own dtype: a
broadcast down the vertical group, an all-gather along the horizontal one, a broadcast across the parallel group
and one over the world for what the grids do not cover. gloo carries neither int16 nor float8, so a rank exits in
C++ with no Python error, as in the other communicators before their workarounds. Each chunk travels as a
same-width view gloo carries, which shares its bits and memory, and is viewed back in its own dtype before it is
assigned; a target left without memory is given it by ``zeros``, which CPU has for float8 (``zeros_like`` not)."""

from harness.fixes.communicating.paddle_dcp_broadcast_wire_dtype import WIRE
from harness.fixes.patch import Fix, Hunk

_MODULE = "paddle.distributed.flex_checkpoint.dcp.resharder"
_CLASS = "ThreeDCommGroupStateResharder"

FIX = Fix(
    id="paddle-dcp-parallel-broadcast-wire-dtype",
    kind="workaround",
    framework="paddle",
    version="3.3.1",
    summary="parallel_broadcast: no gloo int16/float8, no CPU float8 zeros_like; move same-width views",
    hunks=(Hunk(_MODULE, f"{_CLASS}._process_one_batch_broadcast_in_section", "9db50e5a39bb3758", (
        ("        read_item = read_items[self.cur_horizontal_index]\n",
         WIRE + "        read_item = read_items[self.cur_horizontal_index]\n"),
        ("        paddle.distributed.broadcast(\n"
         "            buffer, src=read_item.src_rank, group=self.v_group\n"
         "        )\n",
         "        dtype = buffer.dtype\n"
         "        buffer = on_the_wire(buffer)\n"
         "        paddle.distributed.broadcast(\n"
         "            buffer, src=read_item.src_rank, group=self.v_group\n"
         "        )\n"),
        ("        return tensor_list\n",
         "        return [t if t.dtype == dtype else t.view(dtype) for t in tensor_list]\n"),
    )), Hunk(_MODULE, f"{_CLASS}.broadcast_cross_p_group_and_assign", "021835998c6bd836", (
        ("        batch_read_items, allgather_type = task_batches[self.cur_parallel_index]\n",
         WIRE + "        batch_read_items, allgather_type = task_batches[self.cur_parallel_index]\n"),
        ("                paddle.distributed.broadcast(\n"
         "                    buffer, src=read_item.src_rank, group=self.p_group\n"
         "                )\n",
         "                paddle.distributed.broadcast(\n"
         "                    on_the_wire(buffer), src=read_item.src_rank, group=self.p_group\n"
         "                )\n"),
        ("                    buffer = paddle.zeros_like(\n"
         "                        target_sharded_weight.local_tensor\n"
         "                    )\n",
         "                    buffer = paddle.zeros(\n"
         "                        target_sharded_weight.local_tensor.shape,\n"
         "                        target_sharded_weight.local_tensor.dtype,\n"
         "                    )\n"),
    )), Hunk(_MODULE, f"{_CLASS}.broadcast_cross_global_group_and_assign", "bea59a3027fd9e6f", (
        ("        global_broadcast_read_items = (\n",
         WIRE + "        global_broadcast_read_items = (\n"),
        ("            paddle.distributed.broadcast(\n"
         "                buffer, src=read_item.src_rank, group=None\n"
         "            )\n",
         "            paddle.distributed.broadcast(\n"
         "                on_the_wire(buffer), src=read_item.src_rank, group=None\n"
         "            )\n"),
    ))),
    covers=("paddle-dcp-parallel-broadcast-int16-fp8",),
)
