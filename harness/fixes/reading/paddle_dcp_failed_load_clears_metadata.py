"""``load_state_dict`` clears its module-wide metadata manager only when a load succeeds: after a failed load the
next one, of any checkpoint, starts from the failed load's metadata. Each load starts from none."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddle-dcp-failed-load-clears-metadata",
    kind="fix",
    framework="paddle",
    version="3.3.1",
    summary="load_state_dict: _metadata_manager is cleared only on success; clear it as each load starts",
    hunks=(Hunk("paddle.distributed.flex_checkpoint.dcp.load_state_dict", "load_state_dict", "2c141cb8304e3ddd", (
        ("    global _metadata_manager\n    use_dist = paddle.distributed.get_world_size() > 1\n",
         "    global _metadata_manager\n    _metadata_manager.clear()\n"
         "    use_dist = paddle.distributed.get_world_size() > 1\n"),)),),
    covers=("paddle-dcp-failed-load-poisons-next",),
)
