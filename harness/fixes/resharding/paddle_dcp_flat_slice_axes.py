"""``minimal_nd_slice`` narrows an axis to the flat range's own span when the axis just before it starts and ends
at the same index; the span is that narrow only when every axis before it does. With a size-one axis in front (or
a range crossing an outer axis), the box it returns is too small and the load leaves a shard short."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddle-dcp-flat-slice-axes",
    kind="fix",
    framework="paddle",
    version="3.3.1",
    summary="minimal_nd_slice: an axis is narrowed when the previous axis alone agrees; all earlier axes must",
    hunks=(Hunk("paddle.distributed.flex_checkpoint.dcp.utils", "minimal_nd_slice", "1a0142b9f590a975", (
        ("            if start_idx[axis - 1] == end_idx[axis - 1]:\n",
         "            if list(start_idx[:axis]) == list(end_idx[:axis]):\n"),)),),
    covers=("paddle-dcp-flat-size-one-dim-wrong-length", "paddle-dcp-flat-0d-load-breaks-next-load"),
)
