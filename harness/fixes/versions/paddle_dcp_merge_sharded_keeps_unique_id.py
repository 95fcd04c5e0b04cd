"""``merge_sharded_state_dict(load_path, save_path, unique_id=k)`` reads version k's metadata to size the whole
tensors, then fills them with ``load_state_dict`` called without ``unique_id``, which reads the newest version: the
merged Hugging Face checkpoint holds another version's data with no error. The version is passed on."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddle-dcp-merge-sharded-keeps-unique-id",
    kind="fix",
    framework="paddle",
    version="3.3.1",
    summary="merge_sharded_state_dict: unique_id picks the metadata but not the data; the newest version is merged",
    hunks=(Hunk("paddle.distributed.flex_checkpoint.dcp.load_state_dict", "merge_sharded_state_dict",
                "095470c1416e4c00", (
        ("        load_path,\n        process_group,\n        offload=offload,\n",
         "        load_path,\n        process_group,\n        unique_id=unique_id,\n        offload=offload,\n"),
    )),),
    covers=("paddle-dcp-merge-sharded-ignores-unique-id",),
)
