"""``load_merged_state_dict(path, unique_id=k)`` reads version k's metadata to build the whole tensors, then calls
``load_state_dict`` without ``unique_id``, which loads the newest version into them: asked for an older version of
a directory, it returns the newest one's data with no error. The version is passed on."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddle-dcp-merged-load-keeps-unique-id",
    kind="fix",
    framework="paddle",
    version="3.3.1",
    summary="load_merged_state_dict: unique_id picks the metadata but not the data; the newest version loads",
    hunks=(Hunk("paddle.distributed.flex_checkpoint.dcp.load_state_dict", "load_merged_state_dict",
                "41d40908d5cf518f", (
        ("        path,\n        offload=offload,\n",
         "        path,\n        unique_id=unique_id,\n        offload=offload,\n"),
    )),),
    covers=("paddle-dcp-merged-load-ignores-unique-id",),
)
