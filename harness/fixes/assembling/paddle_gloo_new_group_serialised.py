"""``new_group`` on gloo: the process group's constructor connects its own full mesh through the world's store with
no prefix (the communication context it also makes uses one, the group id), so every group rendezvouses on the
same keys as the world and every group before it. Groups made in turn, and disjoint groups made at once, read
each other's addresses: ranks die of ``Connection refused`` or hang in a ``TIMEOUT``. Fleet's hybrid groups
(2 × 2 on 4 ranks) and full_param's horizontal and vertical groups meet it.

The upstream fix is the prefix in ``ProcessGroupGloo``'s constructor (C++). From Python, each gloo group's making
is finished on every rank before the next begins: every rank calls ``new_group`` for every group, so a barrier of
the world after it holds the groups' rendezvous apart."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddle-gloo-new-group-serialised",
    kind="workaround",
    framework="paddle",
    version="3.3.1",
    summary="new_group on gloo: the group's mesh meets on unprefixed store keys; finish each group's making first",
    hunks=(Hunk("paddle.distributed.collective", "new_group", "fcf4b3b615b4b09b", (
        ("        group = Group(rank, gid, ranks, pg=pg, name=group_name)\n",
         "        if size > 1 and (backend or _default_backend) == 'gloo':  # its mesh's store keys are the world's\n"
         "            paddle.distributed.barrier()\n"
         "        group = Group(rank, gid, ranks, pg=pg, name=group_name)\n"),
    )),),
    covers=("paddle-gloo-new-group-race",),
)
