"""``full_param``'s assemblers broadcast (and all-gather) each chunk in its own dtype, as the load's communicators
did before their workarounds: gloo carries neither int16 nor float8, so a rank exits in C++ (int16), or CPU Paddle
lacks a float8 kernel the collective needs. Such chunks travel as a same-width view gloo carries, which shares their
bits and memory; what an all-gather returns is viewed back as the chunk's dtype."""

from harness.fixes.communicating.paddle_dcp_broadcast_wire_dtype import WIRE
from harness.fixes.patch import Fix, Hunk

_MODULE = "paddle.distributed.flex_checkpoint.dcp.full_param"

FIX = Fix(
    id="paddle-dcp-full-param-wire-dtype",
    kind="workaround",
    framework="paddle",
    version="3.3.1",
    summary="full_param assemblers: no gloo int16/float8; broadcast and all-gather same-width views",
    hunks=(Hunk(_MODULE, "SingleCommGroupFullParamAssembler._run_distributed", "b215afa47c71bbc9", (
        ("        for item in self.read_items:\n",
         WIRE + "        for item in self.read_items:\n"),
        ("            paddle.distributed.broadcast(\n"
         "                local_tensor, src=cur_src_rank, group=self.process_group\n"
         "            )\n",
         "            paddle.distributed.broadcast(\n"
         "                on_the_wire(local_tensor), src=cur_src_rank, group=self.process_group\n"
         "            )\n"),
    )), Hunk(_MODULE, "HVCommGroupFullParamAssembler._process_one_batch", "a097b9102b69e72c", (
        ("        batch_items, batch_indices, op_type = self.get_batch_read_items()\n",
         "        batch_items, batch_indices, op_type = self.get_batch_read_items()\n" + WIRE),
        ("                paddle.distributed.broadcast(\n"
         "                    buffer, src=read_item.src_rank, group=self.v_group\n"
         "                )\n",
         "                paddle.distributed.broadcast(\n"
         "                    on_the_wire(buffer), src=read_item.src_rank, group=self.v_group\n"
         "                )\n"),
        ("            paddle.distributed.all_gather(\n"
         "                tensor_list, buffer, group=self.h_group\n"
         "            )\n",
         "            paddle.distributed.all_gather(\n"
         "                tensor_list, on_the_wire(buffer), group=self.h_group\n"
         "            )\n"
         "            tensor_list = [\n"
         "                t if t.dtype == buffer.dtype else t.view(buffer.dtype)\n"
         "                for t in tensor_list\n"
         "            ]\n"),
        ("                    paddle.distributed.broadcast(\n"
         "                        buffer, src=src_rank, group=self.v_group\n"
         "                    )\n",
         "                    paddle.distributed.broadcast(\n"
         "                        on_the_wire(buffer), src=src_rank, group=self.v_group\n"
         "                    )\n"),
        ("            paddle.distributed.broadcast(\n"
         "                buffer, src=src_rank, group=self.h_group\n"
         "            )\n",
         "            paddle.distributed.broadcast(\n"
         "                on_the_wire(buffer), src=src_rank, group=self.h_group\n"
         "            )\n"),
    ))),
    covers=("paddle-dcp-full-param-int16",),
    requires=("paddle-dcp-broadcast-wire-dtype",),  # the load reads its chunks through the broadcast first
)
