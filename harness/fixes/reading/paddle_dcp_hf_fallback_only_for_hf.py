"""With safetensors, ``get_checkpoint_files`` takes any directory without metadata for a HuggingFace checkpoint and
generates metadata that records each rank's shard as the whole tensor: a flex checkpoint whose metadata is missing
loads as wrong data. It falls back only where no ``<rank>_<unique_id>.safetensors`` file of a flex save is there,
and otherwise fails as a pickle checkpoint without metadata does."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddle-dcp-hf-fallback-only-for-hf",
    kind="fix",
    framework="paddle",
    version="3.3.1",
    summary="get_checkpoint_files: a flex checkpoint missing metadata is read as HF; fall back only without flex files",
    hunks=(Hunk("paddle.distributed.flex_checkpoint.dcp.load_state_dict", "get_checkpoint_files", "7cdb355462c7acd3", (
        ("    if safetensors and len(metadata_files) == 0:\n",
         "    flex_files = [\n"
         "        file\n"
         "        for file in safetensors_files\n"
         "        if file.count(\"_\") == 1\n"
         "        and file[: -len(\".safetensors\")].replace(\"_\", \"\").isdigit()\n"
         "    ]\n"
         "    if safetensors and len(metadata_files) == 0 and not flex_files:\n"),)),),
    covers=("paddle-dcp-safetensors-missing-metadata-read-as-hf",),
)
