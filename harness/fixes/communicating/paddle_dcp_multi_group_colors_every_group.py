"""``multi_group_broadcast`` batches its broadcasts by a coloring of the worker groups in which groups that share a
rank get different colors (``_dsatur_coloring`` over ``_build_group_conflict``). The conflict map only has entries
for groups that share a rank with another, so a group that shares none (one worker group, or disjoint ones) has no
color, and batching its first broadcast fails with ``KeyError: '<group name>'``. Every group is in the map, with no
conflicts where it has none."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddle-dcp-multi-group-colors-every-group",
    kind="fix",
    framework="paddle",
    version="3.3.1",
    summary="multi_group_broadcast: a worker group sharing no rank with another gets no color; KeyError",
    hunks=(Hunk("paddle.distributed.flex_checkpoint.dcp.reshard_comm",
                "MultiGroupBroadcastCommunicator.schedule_read_items", "7f2edf33726f5ea8", (
                    ("            group_conflict = defaultdict(set)\n",
                     "            group_conflict = defaultdict(set, {g: set() for g in group_members})\n"),
                )),),
    covers=("paddle-dcp-multi-group-broadcast-lone-group",),
)
