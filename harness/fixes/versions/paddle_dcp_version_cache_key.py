"""``get_checkpoint_files`` caches a directory's file lists under the path alone, so once a load has listed one
version every later load of that directory, whatever its ``unique_id``, gets the same version's files back (or
repeats the listing that made it fail). The cache is keyed by path and unique_id."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddle-dcp-version-cache-key",
    kind="fix",
    framework="paddle",
    version="3.3.1",
    summary="get_checkpoint_files: PATH_TO_CHECKPOINT_FILES is keyed by path alone; key it by (path, unique_id)",
    hunks=(Hunk("paddle.distributed.flex_checkpoint.dcp.load_state_dict", "get_checkpoint_files", "7cdb355462c7acd3", (
        ("    if use_cache and path in PATH_TO_CHECKPOINT_FILES:\n        return PATH_TO_CHECKPOINT_FILES[path]\n",
         "    if use_cache and (path, unique_id) in PATH_TO_CHECKPOINT_FILES:\n"
         "        return PATH_TO_CHECKPOINT_FILES[(path, unique_id)]\n"),
        ("        PATH_TO_CHECKPOINT_FILES[path] = (metadata_files, local_data_files)\n",
         "        PATH_TO_CHECKPOINT_FILES[(path, unique_id)] = (\n"
         "            metadata_files,\n            local_data_files,\n        )\n"),)),),
    covers=("paddle-dcp-version-cache",),
)
