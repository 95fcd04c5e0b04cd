"""The point-to-point communicators (``send_recv``, ``grouped_send_recv``) send and receive over the world's
process group whatever ``process_group`` the load was given: ``_execute_p2p_ops`` names no group, so ``dist.send``,
``dist.recv`` and each ``P2POp`` fall back to the default one, while the same load's collectives run on the group
it was given. The ranks outside that group take no part in the traffic; on gloo the world group's tag counters
then part between them and the ranks that sent, and the next load whose pair crosses that line waits until gloo's
timeout. The fix hands the load's group down to every send and receive (their peers stay global ranks, as
``dist.send`` takes them)."""

from harness.fixes.patch import Fix, Hunk

_MODULE = "paddle.distributed.flex_checkpoint.dcp.reshard_comm"

FIX = Fix(
    id="paddle-dcp-p2p-own-group",
    kind="fix",
    framework="paddle",
    version="3.3.1",
    summary="send_recv communicators send and receive over the world's group, not the load's process_group",
    hunks=(Hunk(_MODULE, "SendRecvCommunicator.communicate", "50b185709a46da3d", (
        ("                batch_data, cur_rank, use_group=self.use_group\n",
         "                batch_data,\n"
         "                cur_rank,\n"
         "                use_group=self.use_group,\n"
         "                group=process_group,\n"),
    )), Hunk(_MODULE, "SendRecvCommunicator._execute_p2p_ops", "80a068171c799fd8", (
        ("    def _execute_p2p_ops(self, batch_data, cur_rank, use_group):\n",
         "    def _execute_p2p_ops(self, batch_data, cur_rank, use_group, group=None):\n"),
        ("                                dist.P2POp(dist.isend, send_tensor, rank)\n",
         "                                dist.P2POp(dist.isend, send_tensor, rank, group)\n"),
        ("                            dist.send(send_tensor, rank)\n",
         "                            dist.send(send_tensor, rank, group=group)\n"),
        ("                        dist.P2POp(dist.irecv, recv_tensor, item.src_rank)\n",
         "                        dist.P2POp(\n"
         "                            dist.irecv, recv_tensor, item.src_rank, group\n"
         "                        )\n"),
        ("                    dist.recv(recv_tensor, item.src_rank)\n",
         "                    dist.recv(recv_tensor, item.src_rank, group=group)\n"),
    ))),
    covers=("paddle-dcp-p2p-world-group",),
)
