"""``save_state_dict`` writes its metadata with ``write_to_file_if_empty``, which keeps a metadata file already there
and elects its writer by a lock file that a killed save leaves behind: a re-save into a directory (the default
unique_id is the existing one) keeps the old, damaged or crashed save's metadata, or writes none. The coordinator
rank now writes the metadata to a temporary file and renames it over the old one; ``coordinator_rank`` counts in
the save's ``process_group`` (as its collectives do), so a group without global rank 0 has a coordinator too."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddle-dcp-metadata-replace",
    kind="fix",
    framework="paddle",
    version="3.3.1",
    summary="save_state_dict: metadata already there (or a stale lock) is kept; the coordinator replaces it",
    hunks=(Hunk("paddle.distributed.flex_checkpoint.dcp.save_state_dict", "save_state_dict", "b0dc8b9a4979bca4", (
        ("        write_to_file_if_empty(\n"
         "            metadata, os.path.join(path, f\"{unique_id}.metadata\")\n"
         "        )\n",
         "        # The coordinator is the rank of that place in the save's group.\n"
         "        is_coordinator = coordinator_rank == (\n"
         "            paddle.distributed.get_rank()\n"
         "            if process_group is None\n"
         "            else process_group.rank\n"
         "        )\n"
         "        if is_coordinator:\n"
         "            metadata_path = os.path.join(path, f\"{unique_id}.metadata\")\n"
         "            paddle.save(metadata, f\"{metadata_path}.tmp\")\n"
         "            os.replace(f\"{metadata_path}.tmp\", metadata_path)\n"),)),),
    covers=("paddle-dcp-resave-keeps-stale-metadata", "paddle-dcp-stale-metadata-lock-skips-metadata",
            "paddle-dcp-resave-over-damaged-keeps-bad-metadata",
            "paddle-dcp-resave-after-crashed-async-keeps-its-metadata"),
)
