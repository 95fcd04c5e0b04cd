"""``load_state_dict`` decides between its two paths by asking ``is_sharded_state_dict`` of the dict as given. A
nested dict's values are dicts, not ShardedWeights, so a nested dict of ShardedWeights takes the dist-tensor path
(``load_state_dict_impl``), which flattens the nesting but never unflattens a flattened (stage-1 v2) shard: it
slices the 1-D piece with the tensor's N-D offsets ("The length of axes (1) and length of starts (3) should be
same"). The decision is made on the leaves: a nested dict of ShardedWeights loads through the sharded path under
their joined keys, the same objects, so loading them in place fills the nested dict."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddle-dcp-nested-sharded-leaves",
    kind="fix",
    framework="paddle",
    version="3.3.1",
    summary="load_state_dict: a nested dict of ShardedWeights is judged 'not sharded' by its dict values; judge leaves",
    hunks=(Hunk("paddle.distributed.flex_checkpoint.dcp.load_state_dict", "load_state_dict", "2c141cb8304e3ddd", (
        ("    if not is_sharded_state_dict(state_dict, use_dist, process_group):\n",
         "    if any(isinstance(v, dict) for v in state_dict.values()):  # nested: judge and load its leaves\n"
         "        leaves = flatten_state_dict(state_dict)[0]\n"
         "        if all(isinstance(v, ShardedWeight) for v in leaves.values()):\n"
         "            state_dict = leaves  # the same objects: loaded in place, they fill the nested dict\n"
         "    if not is_sharded_state_dict(state_dict, use_dist, process_group):\n"),
    )),),
    covers=("paddle-dcp-nested-flat-shard",),
)
