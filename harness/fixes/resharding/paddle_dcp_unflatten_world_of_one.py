"""``load_state_dict`` turns flat shards back into boxes only when the world has more than one rank: a process
alone (or a world of one) loads a flat shard as if it were a whole tensor. Unflattening does not depend on the
world size, so it runs in both branches."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddle-dcp-unflatten-world-of-one",
    kind="fix",
    framework="paddle",
    version="3.3.1",
    summary="load_state_dict: the world-of-one branch skips _unflatten_shards/_finish_unflatten; unflatten always",
    hunks=(Hunk("paddle.distributed.flex_checkpoint.dcp.load_state_dict", "load_state_dict", "2c141cb8304e3ddd", (
        ("    if not use_dist:\n        load_dict = {}\n        for key, val in state_dict.items():\n",
         "    flat_shards, nonflat_shards = _split_flat_shards(state_dict)\n"
         "    load_dict, padding_info = _unflatten_shards(flat_shards, comm_method)\n"
         "    load_dict.update(nonflat_shards)\n"
         "    if not use_dist:\n        for key, val in load_dict.items():\n"),
        ("        flat_shards, nonflat_shards = _split_flat_shards(state_dict)\n"
         "        load_dict, padding_info = _unflatten_shards(flat_shards, comm_method)\n"
         "        load_dict.update(nonflat_shards)\n"
         "        destination_state_shard_info = build_global_state_shard_info(\n",
         "        destination_state_shard_info = build_global_state_shard_info(\n"),
        ("    if use_dist:\n        _finish_unflatten(flat_shards, padding_info)\n",
         "    _finish_unflatten(flat_shards, padding_info)\n"),
    )),),
    covers=("paddle-dcp-flat-load-single-process", "paddle-dcp-0d-flat-target"),
    requires=("paddle-dcp-flatten-0d",),
)
