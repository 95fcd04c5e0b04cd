"""``get_checkpoint_files`` takes every file whose name ends with ``f"{unique_id}.metadata"`` (and
``.distcp``/``.safetensors``), so version 1 also takes version 11's files and the load asserts on two metadata
files. A version's files are matched by their whole id: ``<id>.metadata`` and ``<rank>_<id>.<ext>``."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddle-dcp-unique-id-exact-match",
    kind="fix",
    framework="paddle",
    version="3.3.1",
    summary="get_checkpoint_files: unique_id is matched as a file-name suffix (1 takes 11); match the whole id",
    hunks=(Hunk("paddle.distributed.flex_checkpoint.dcp.load_state_dict", "get_checkpoint_files", "7cdb355462c7acd3", (
        ('        if file.endswith(f"{unique_id}.metadata")\n',
         '        if file.endswith(".metadata")\n'
         "        and (unique_id == '' or file == f\"{unique_id}.metadata\")\n"),
        ('        if file.endswith(f"{unique_id}.distcp")\n        or file.endswith(f"{unique_id}.safetensors")\n',
         '        if file.endswith((".distcp", ".safetensors"))\n'
         "        and (unique_id == '' or file.split(\".\")[0].endswith(f\"_{unique_id}\"))\n"),)),),
    covers=("paddle-dcp-unique-id-suffix",),
    requires=("paddle-dcp-version-cache-key",),
)
