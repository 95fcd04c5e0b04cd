"""Paddle's gloo process group tags every send and recv with one counter per group, which every op of the group
advances (``ProcessGroupGloo::next_tag``). A send meets its recv only where both ranks made as many ops on the group
before it, so with three ranks or more the point-to-point communicators (``send_recv``, ``grouped_send_recv``) wait
forever as soon as one rank sent to another before sending to a third: a checkpoint saved on one rank and loaded
across three times out in gloo. The counter is C++; on a gloo group of three ranks or more the workaround moves
each chunk that changes rank with a broadcast from its source over the load's group, in which every rank takes
part, so the counters stay level. Two ranks keep their sends: every op there is the pair's."""

from harness.fixes.patch import Fix, Hunk

_MODULE = "paddle.distributed.flex_checkpoint.dcp.reshard_comm"

# Where the chunks of a batch move: over gloo, a broadcast of each (in its wire dtype) from its source.
_BROADCASTS = (
    "        ranks = dist.get_world_size() if group is None else group.nranks\n"
    "        if ranks > 2 and dist.get_backend(group) == \"GLOO\":\n"
    "            # gloo tags sends and recvs with one counter per group: with a\n"
    "            # third rank, a pair's tags part as soon as a rank sent to another,\n"
    "            # so every rank takes part in moving each chunk: a broadcast.\n"
    "            for item in batch_data.read_items:\n"
    "                if all(rank == item.src_rank for rank in item.dst_rank):\n"
    "                    continue\n"
    "                if item.src_rank == cur_rank:\n"
    "                    buffer = batch_data.source_slices[item]\n"
    "                elif cur_rank in item.dst_rank:\n"
    "                    buffer = batch_data.target_slices[item]\n"
    "                else:\n"
    "                    buffer = paddle.zeros(item.slice_shape, dtype=item.dtype)\n"
    "                dist.broadcast(\n"
    "                    on_the_wire(buffer), src=item.src_rank, group=group\n"
    "                )\n"
    "            return\n")

FIX = Fix(
    id="paddle-dcp-send-recv-gloo-broadcasts",
    kind="workaround",
    framework="paddle",
    version="3.3.1",
    summary="send_recv communicators on gloo: one tag counter per group parts a pair's tags; broadcast each chunk",
    hunks=(Hunk(_MODULE, "SendRecvCommunicator._execute_p2p_ops", "80a068171c799fd8", (
        ("        p2p_ops = []\n",
         "        p2p_ops = []\n" + _BROADCASTS),
    )),),
    covers=("paddle-gloo-p2p-tags-diverge",),
    # its chunks travel in the wire dtypes the first defines, over the load's group the second hands down
    requires=("paddle-dcp-send-recv-wire-dtype", "paddle-dcp-p2p-own-group"),
)
