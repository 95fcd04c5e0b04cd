"""``not_overlap`` calls two pieces disjoint only when one ends before the other starts, so an empty target piece
lying inside a saved piece "overlaps" it: the load plans a zero-element read and the collective refuses the empty
buffer. Pieces are disjoint when their intersection is empty on some axis, which an empty piece always is."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddle-dcp-empty-overlap-no-read",
    kind="fix",
    framework="paddle",
    version="3.3.1",
    summary="not_overlap: an empty piece inside a saved one overlaps it, so it gets a read; test the intersection",
    hunks=(Hunk("paddle.distributed.flex_checkpoint.dcp.resharder", "not_overlap", "2bcb8da1dc1532eb", (
        ("        if (\n"
         "            cur_offset >= (storage_offset + storage_len)\n"
         "            or (cur_offset + cur_len) <= storage_offset\n"
         "        ):\n",
         "        if max(cur_offset, storage_offset) >= min(\n"
         "            cur_offset + cur_len, storage_offset + storage_len\n"
         "        ):\n"),)),),
    covers=("paddle-dcp-nested-uneven-dist-target-negative-piece",),
    requires=("paddle-dcp-balanced-split",),
)
