"""``full_param(..., num_splits=k, shard_idx=i)`` builds the horizontal/vertical assembler with the split, but the
single-group assembler without it: on one process group every call gives every tensor, so an export that bounds
its memory split by split assembles and writes each tensor k times. The split is passed on."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddle-dcp-full-param-passes-splits",
    kind="fix",
    framework="paddle",
    version="3.3.1",
    summary="full_param: num_splits/shard_idx are dropped on one process group; every split gives every tensor",
    hunks=(Hunk("paddle.distributed.flex_checkpoint.dcp.full_param", "full_param", "0ec5d17e1d972525", (
        ("            sharded_state_dict, aoa_config, process_group\n        )",
         "            sharded_state_dict, aoa_config, process_group, num_splits, idx\n        )"),
    )),),
    covers=("paddle-dcp-full-param-splits-ignored",),
)
