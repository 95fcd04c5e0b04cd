"""``load_state_dict`` warns that a target key missing from the checkpoint is skipped, then ``get_read_items`` indexes
the checkpoint's metadata by it and the load dies with a bare ``KeyError``. A tensor with no elements reaches that
path in real checkpoints: Paddle's stage-1 v2 sharding optimizer omits empty flat slices on every rank, so a
zero-size parameter's states are never saved, and loading them into any other layout fails. A tensor with no
elements needs no data; every rank sees the same global shape, so all skip it alike. A missing tensor with elements
still fails as before."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddle-dcp-empty-target-needs-no-data",
    kind="fix",
    framework="paddle",
    version="3.3.1",
    summary="get_read_items: a zero-size target the checkpoint lacks dies on KeyError; it needs no data, skip it",
    hunks=(Hunk("paddle.distributed.flex_checkpoint.dcp.resharder", "get_read_items", "46c8d90641f20e17", (
        ("        cur_chunk_metadata = LocalTensorMetadata(\n",
         "        # A tensor with no elements needs no data: a checkpoint may lack\n"
         "        # it (no rank held a piece), and every rank skips it alike.\n"
         "        whole = (\n"
         "            val.global_shape if isinstance(val, ShardedWeight) else val.shape\n"
         "        )\n"
         "        if (\n"
         "            math.prod(whole) == 0\n"
         "            and tensor_name not in storage_state_dict_metadata\n"
         "        ):\n"
         "            continue\n"
         "        cur_chunk_metadata = LocalTensorMetadata(\n"),)),),
    # A zero-size tensor the save dropped (paddle-dcp-zero-size-saved's row) is missing the same way: either fix alone
    # makes that row load.
    covers=("paddle-dcp-zero-size-flat-omitted-load-fails", "paddle-dcp-zero-size-not-saved"),
)
