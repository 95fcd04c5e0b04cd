"""An async ``save_state_dict`` writes ``<unique_id>.metadata``, the only mark of a finished checkpoint, before it
spawns the writers of the data: a writer that fails or is killed, or a power loss before the data reach the disk,
leaves a checkpoint that looks finished and does not load. paddle-dcp-metadata-after-data orders the synchronous
save only. Now the coordinator publishes the metadata from a thread that stands in the queue for its writer: once
its own writer has ended well and every rank's data file is in place (each writer renames its file in whole, with
paddle-save-durable-replace), it fsyncs those files, writes the metadata and fsyncs the directory and
its parent. A data file counts as delivered once it is another file than the one under its name when the save
began (the ranks exchange what those were): a finished version's or a crashed attempt's file is never taken for
this save's, and is left alone. A file a peer never delivers within 30 s (a writer killed) fails the save, as its
writer would have."""

from harness.fixes.patch import Fix, Hunk

_FSYNC_NAMES = (
    "{i}# The names: the metadata's in path, and each directory's in its\n"
    "{i}# parent up to the mount point (makedirs may have made several).\n"
    "{i}directory = os.path.abspath(path)\n"
    "{i}while True:\n"
    "{i}    dir_fd = os.open(directory, os.O_RDONLY)\n"
    "{i}    try:\n"
    "{i}        os.fsync(dir_fd)\n"
    "{i}    finally:\n"
    "{i}        os.close(dir_fd)\n"
    "{i}    if os.path.ismount(directory):\n"
    "{i}        break\n"
    "{i}    directory = os.path.dirname(directory)\n"
)

FIX = Fix(
    id="paddle-dcp-async-metadata-after-data",
    kind="fix",
    framework="paddle",
    version="3.3.1",
    summary="async save_state_dict: metadata lands before the writers run; the coordinator publishes it after them",
    hunks=(Hunk("paddle.distributed.flex_checkpoint.dcp.save_state_dict", "save_state_dict", "b0dc8b9a4979bca4", (
        ("        logger.debug(f\"The checkpoint is saved to file_name:{file_name}\")\n",
         "        logger.debug(f\"The checkpoint is saved to file_name:{file_name}\")\n"
         "\n"
         "        def file_identity(file_path):\n"
         "            try:\n"
         "                st = os.stat(file_path)\n"
         "            except FileNotFoundError:\n"
         "                return None\n"
         "            return (st.st_ino, st.st_mtime_ns, st.st_size)\n"
         "\n"
         "        # Every rank's data file before this save: an async save's metadata\n"
         "        # waits until each has been replaced (a finished version's or a\n"
         "        # crashed attempt's file under the name is not this save's).\n"
         "        files_before = {file_name: file_identity(os.path.join(path, file_name))}\n"
         "        if async_save and use_dist:\n"
         "            gathered_files = []\n"
         "            paddle.distributed.all_gather_object(\n"
         "                gathered_files, files_before, process_group\n"
         "            )\n"
         "            for entry in gathered_files:\n"
         "                files_before.update(entry)\n"),
        ("        if is_coordinator:\n"
         "            metadata_path = os.path.join(path, f\"{unique_id}.metadata\")\n"
         "            paddle.save(metadata, f\"{metadata_path}.tmp\")\n"
         "            os.replace(f\"{metadata_path}.tmp\", metadata_path)\n"
         "\n"
         "        if is_coordinator:\n"
         + _FSYNC_NAMES.format(i="            "),
         "        def publish_metadata():\n"
         "            metadata_path = os.path.join(path, f\"{unique_id}.metadata\")\n"
         "            paddle.save(metadata, f\"{metadata_path}.tmp\")\n"
         "            os.replace(f\"{metadata_path}.tmp\", metadata_path)\n"
         + _FSYNC_NAMES.format(i="            ")
         + "\n"
         "        # An async save's metadata waits for its writers (below).\n"
         "        if is_coordinator and not async_save:\n"
         "            publish_metadata()\n"),
        ("            p = start_process()\n"
         "            async_save_queue.append(p)\n",
         "            p = start_process()\n"
         "            if is_coordinator:\n"
         "                import threading\n"
         "\n"
         "                # Every rank's file, also one whose tensors all went to\n"
         "                # other ranks' files: what the save writes is on disk.\n"
         "                data_files = sorted(files_before)\n"
         "                data_paths = [os.path.join(path, name) for name in data_files]\n"
         "\n"
         "                class MetadataAfterData(threading.Thread):\n"
         "                    # The coordinator's writer as the queue sees it: done\n"
         "                    # once every rank's data and then the metadata are.\n"
         "                    def __init__(self, writer):\n"
         "                        threading.Thread.__init__(self, daemon=True)\n"
         "                        self.writer, self.pid = writer, writer.pid\n"
         "                        self.exitcode = None\n"
         "\n"
         "                    def run(self):\n"
         "                        self.writer.join()\n"
         "                        code = self.writer.exitcode\n"
         "                        deadline = time.time() + 30\n"
         "                        while code == 0 and not all(\n"
         "                            file_identity(os.path.join(path, name))\n"
         "                            not in (None, files_before.get(name))\n"
         "                            for name in data_files\n"
         "                        ):\n"
         "                            if time.time() > deadline:\n"
         "                                logger.error(\n"
         "                                    \"Error: data files missing after 30 s; \"\n"
         "                                    \"the metadata is not written\"\n"
         "                                )\n"
         "                                code = 1\n"
         "                            time.sleep(0.05)\n"
         "                        try:\n"
         "                            for data_path in data_paths if code == 0 else []:\n"
         "                                data_fd = os.open(data_path, os.O_RDONLY)\n"
         "                                try:\n"
         "                                    os.fsync(data_fd)\n"
         "                                finally:\n"
         "                                    os.close(data_fd)\n"
         "                            if code == 0:\n"
         "                                publish_metadata()\n"
         "                        except Exception as e:\n"
         "                            logger.error(f\"Error: metadata not written: {e}\")\n"
         "                            code = 1\n"
         "                        self.exitcode = code\n"
         "\n"
         "                p = MetadataAfterData(p)\n"
         "                p.start()\n"
         "            async_save_queue.append(p)\n"),
    )),),
    covers=("paddle-dcp-async-writer-error-leaves-metadata",),
    requires=("paddle-dcp-metadata-after-data",),
)
