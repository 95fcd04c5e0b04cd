"""``save_state_dict`` writes ``<unique_id>.metadata``, the only mark of a finished checkpoint, before any rank has
written its data file, and fsyncs nothing: a power loss after the save returned can leave the metadata and data
files empty or missing, and a crash in the middle leaves a checkpoint that looks finished and does not load. A
synchronous save now writes and fsyncs each rank's data file first, waits for every rank at a barrier, and only then
has the coordinator write the metadata (through ``paddle.save``'s durable temporary file and the rename that
paddle-dcp-metadata-replace makes) and fsync the directory and its parent: the metadata is on disk only once all
the data is."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddle-dcp-metadata-after-data",
    kind="fix",
    framework="paddle",
    version="3.3.1",
    summary="save_state_dict: metadata lands before the data, nothing is fsynced; fsync data, barrier, metadata last",
    hunks=(Hunk("paddle.distributed.flex_checkpoint.dcp.save_state_dict", "save_state_dict", "b0dc8b9a4979bca4", (
        ("        if not save_replicas:\n"
         "            dedup_tensor(\n"
         "                local_state_dict,\n"
         "                local_storage_metadata,\n"
         "                metadata.storage_metadata,\n"
         "            )\n"
         "\n"
         "        if async_save:\n",
         "        if is_coordinator:\n"
         "            # The names: the metadata's in path, and each directory's in its\n"
         "            # parent up to the mount point (makedirs may have made several).\n"
         "            directory = os.path.abspath(path)\n"
         "            while True:\n"
         "                dir_fd = os.open(directory, os.O_RDONLY)\n"
         "                try:\n"
         "                    os.fsync(dir_fd)\n"
         "                finally:\n"
         "                    os.close(dir_fd)\n"
         "                if os.path.ismount(directory):\n"
         "                    break\n"
         "                directory = os.path.dirname(directory)\n"
         "\n"
         "        if async_save:\n"),
        ("        logger.debug(f\"metadata:{metadata}\")\n",
         "        if not save_replicas:\n"
         "            dedup_tensor(\n"
         "                local_state_dict,\n"
         "                local_storage_metadata,\n"
         "                metadata.storage_metadata,\n"
         "            )\n"
         "\n"
         "        # The metadata marks a finished checkpoint: every rank's data must\n"
         "        # be on disk before it is written.\n"
         "        if not async_save:\n"
         "            paddle.save(\n"
         "                local_state_dict,\n"
         "                os.path.join(path, file_name),\n"
         "                safetensors=safetensors,\n"
         "            )\n"
         "            data_fd = os.open(os.path.join(path, file_name), os.O_RDONLY)\n"
         "            try:\n"
         "                os.fsync(data_fd)\n"
         "            finally:\n"
         "                os.close(data_fd)\n"
         "            if use_dist:\n"
         "                paddle.distributed.barrier(process_group)\n"
         "\n"
         "        logger.debug(f\"metadata:{metadata}\")\n"),
        ("            async_save_queue.append(p)\n"
         "        else:\n"
         "            paddle.save(\n"
         "                local_state_dict,\n"
         "                os.path.join(path, file_name),\n"
         "                safetensors=safetensors,\n"
         "            )\n",
         "            async_save_queue.append(p)\n"),
    )),),
    covers=("paddle-dcp-power-loss-after-save",),
    requires=("paddle-dcp-metadata-replace", "paddle-save-durable-replace"),
)
