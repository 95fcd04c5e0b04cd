"""The point-to-point communicators (``send_recv``, ``grouped_send_recv``) move each chunk through gloo in its own
dtype, as the broadcast did before its workaround: gloo carries neither int16 nor float8, so the rank exits in C++
(int16) or its peer waits until gloo's timeout (float8). Such chunks travel as a same-width view gloo carries, which
shares their bits and memory. A target left without memory (an AoA temporary) is given it by ``zeros_like``, which
CPU Paddle lacks for float8; ``zeros`` of its shape and dtype has a kernel."""

from harness.fixes.communicating.paddle_dcp_broadcast_wire_dtype import WIRE
from harness.fixes.patch import Fix, Hunk

_MODULE = "paddle.distributed.flex_checkpoint.dcp.reshard_comm"

FIX = Fix(
    id="paddle-dcp-send-recv-wire-dtype",
    kind="workaround",
    framework="paddle",
    version="3.3.1",
    summary="send_recv communicators: no gloo int16/float8, no CPU float8 zeros_like; send same-width views",
    hunks=(Hunk(_MODULE, "SendRecvCommunicator._execute_p2p_ops", "80a068171c799fd8", (
        ("        p2p_ops = []\n",
         WIRE + "        p2p_ops = []\n"),
        ("                        send_tensor = batch_data.source_slices[item]\n",
         "                        send_tensor = on_the_wire(batch_data.source_slices[item])\n"),
        ("                recv_tensor = batch_data.target_slices[item]\n",
         "                recv_tensor = on_the_wire(batch_data.target_slices[item])\n"),
    )), Hunk(_MODULE, "SendRecvCommunicator._assign_received_data", "7eb7bc1a59a70f51", (
        ("                buffer = paddle.zeros_like(dest_tensor)\n",
         "                buffer = paddle.zeros(dest_tensor.shape, dest_tensor.dtype)\n"),
    ))),
    covers=("paddle-dcp-send-recv-int16-fp8",),
)
