"""A resharding load broadcasts each chunk in its own dtype, but gloo carries neither int16 nor float8 (it exits the
rank, in C++) and CPU Paddle has no float8 ``zeros_like`` for the receive buffer. Such chunks travel as a view of a
same-width dtype gloo carries (int16 as float16, float8 as uint8), which shares their bits and memory. Both
communicators that broadcast chunks do it: the world's (``broadcast``) and the worker groups'
(``multi_group_broadcast``)."""

from harness.fixes.patch import Fix, Hunk

# What a communicator gains before its loop: the wire dtypes, and a same-width view of a tensor in one.
WIRE = ("        # gloo carries neither int16 nor float8 (the rank exits) and CPU has no\n"
         "        # float8 zeros_like: such chunks travel as a same-width dtype gloo carries.\n"
         "        wire_dtypes = {\n"
         "            \"int16\": paddle.float16,\n"
         "            \"float8_e4m3fn\": paddle.uint8,\n"
         "            \"float8_e5m2\": paddle.uint8,\n"
         "        }\n"
         "\n"
         "        def on_the_wire(tensor):\n"
         "            wire = wire_dtypes.get(str(tensor.dtype).split(\".\")[-1])\n"
         "            return tensor if wire is None else tensor.view(wire)\n"
         "\n")

FIX = Fix(
    id="paddle-dcp-broadcast-wire-dtype",
    kind="workaround",
    framework="paddle",
    version="3.3.1",
    summary="broadcast communicators: no gloo int16/float8, no CPU float8 zeros_like; send same-width views",
    hunks=(Hunk("paddle.distributed.flex_checkpoint.dcp.reshard_comm", "BroadcastCommunicator.communicate",
                "747df7945b980b9f", (
        ("        total_task_len = len(comm_tasks)\n",
         "        total_task_len = len(comm_tasks)\n" + WIRE),
        ("                    src_tensor = source_tensors[(tensor_name, item.file_name)]\n",
         "                    src_tensor = on_the_wire(\n"
         "                        source_tensors[(tensor_name, item.file_name)]\n"
         "                    )\n"),
        ("                    dst_tensor = destination_tensors[\n"
         "                        (tensor_name, cur_rank, item.dst_global_offset)\n"
         "                    ]\n",
         "                    dst_tensor = on_the_wire(\n"
         "                        destination_tensors[\n"
         "                            (tensor_name, cur_rank, item.dst_global_offset)\n"
         "                        ]\n"
         "                    )\n"),
        ("                    buffer_tensor = paddle.zeros(item.slice_shape, item.dtype)\n",
         "                    buffer_tensor = paddle.zeros(\n"
         "                        item.slice_shape, wire_dtypes.get(item.dtype, item.dtype)\n"
         "                    )\n"),
    )), Hunk("paddle.distributed.flex_checkpoint.dcp.reshard_comm", "MultiGroupBroadcastCommunicator.communicate",
             "72c227e1470a331b", (
        ("        for read_items in results:\n",
         WIRE + "        for read_items in results:\n"),
        ("                    buffer_tensor = src_chunk_tensor.contiguous()\n",
         "                    buffer_tensor = on_the_wire(src_chunk_tensor.contiguous())\n"),
        ("                    dst_chunk_tensor = slice_tensor(\n"
         "                        dst_tensor, item.dst_local_offset, item.slice_shape\n"
         "                    )\n"
         "                    buffer_tensor = paddle.zeros_like(dst_chunk_tensor)\n"
         "                    paddle.assign(dst_chunk_tensor, buffer_tensor)\n",
         "                    dst_chunk_tensor = on_the_wire(\n"
         "                        slice_tensor(\n"
         "                            dst_tensor, item.dst_local_offset, item.slice_shape\n"
         "                        )\n"
         "                    )\n"
         "                    buffer_tensor = paddle.zeros_like(dst_chunk_tensor)\n"
         "                    paddle.assign(dst_chunk_tensor, buffer_tensor)\n"),
        ("                    buffer_tensor = paddle.zeros(item.slice_shape, item.dtype)\n",
         "                    buffer_tensor = paddle.zeros(\n"
         "                        item.slice_shape, wire_dtypes.get(item.dtype, item.dtype)\n"
         "                    )\n"),
    )),),
    covers=("paddle-dcp-int16-reshard-kills-rank", "paddle-dcp-fp8-broadcast-timeout"),
)
