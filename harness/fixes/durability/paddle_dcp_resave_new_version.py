"""``save_state_dict`` with the default ``unique_id`` reuses the newest id of the directory (its docstring promises
the next one), so a re-save overwrites a finished checkpoint's files in place under their final names: killed part
way, it leaves some ranks' files from the re-save and others' from the first save, and the old metadata fits both,
so the load returns a state no save wrote. A version whose ``<id>.metadata`` exists is finished and a new save now
takes the next id; ``get_max_id`` (the newest version, for the load too) counts only finished versions, so a killed
re-save leaves the old version whole and the newest. The metadata must land last (paddle-dcp-metadata-after-data)."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddle-dcp-resave-new-version",
    kind="fix",
    framework="paddle",
    version="3.3.1",
    summary="save_state_dict: a re-save reuses the newest id and overwrites it in place; take the next id after a "
            "finished one, and get_max_id counts finished versions only",
    hunks=(
        Hunk("paddle.distributed.flex_checkpoint.dcp.save_state_dict", "save_state_dict", "b0dc8b9a4979bca4", (
            ("                unique_id = max_unique_id\n",
             "                # A version with metadata is finished: a new save is the\n"
             "                # next version, never an overwrite in place.\n"
             "                finished = os.path.exists(\n"
             "                    os.path.join(path, f\"{max_unique_id}.metadata\")\n"
             "                )\n"
             "                unique_id = max_unique_id + 1 if finished else max_unique_id\n"),)),
        Hunk("paddle.distributed.flex_checkpoint.dcp.utils", "get_max_id", "80193346889c3fc3", (
            ("        if match:\n",
             "        if match and os.path.exists(\n"
             "            os.path.join(path, f\"{match.group(2)}.metadata\")\n"
             "        ):\n"),)),
    ),
    covers=("paddle-dcp-resave-crash-mixes-versions",),
    requires=("paddle-dcp-metadata-after-data", "paddle-dcp-latest-unique-id"),
)
