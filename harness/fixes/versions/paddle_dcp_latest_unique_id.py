"""``load_state_dict`` hands ``unique_id=None`` ("the newest version") straight to ``get_checkpoint_files``, which
reads None as every version, so loading the latest of a directory holding two versions asserts 'Only support one
metadata file now'. The newest id is resolved with ``get_max_id`` first, as ``load_state_dict_impl`` does."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddle-dcp-latest-unique-id",
    kind="fix",
    framework="paddle",
    version="3.3.1",
    summary="load_state_dict: unique_id=None reaches get_checkpoint_files as 'every version'; resolve it to get_max_id",
    hunks=(Hunk("paddle.distributed.flex_checkpoint.dcp.load_state_dict", "load_state_dict", "2c141cb8304e3ddd", (
        ("    if not safetensors and aoa_config is None:\n",
         "    if unique_id is None:\n        unique_id = get_max_id(path)\n\n"
         "    if not safetensors and aoa_config is None:\n"),)),),
    covers=("paddle-dcp-latest-version",),
)
