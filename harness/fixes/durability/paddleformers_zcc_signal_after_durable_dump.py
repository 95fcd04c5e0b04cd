"""A Zero-Cost Checkpointing save is not durable when ZCC says it is done: the worker's dump
(``ZeroCostCheckpointWorker.process_dump_task_impl``) writes the model config, the flex-checkpoint shards, the
trainer state, RNG and scheduler files, then ``saved_signal_<rank>``, the file by which a job (and the harness's
wait) knows the save finished, and fsyncs nothing. After a power loss the signal can survive while files it vouches
for are empty or missing. The dump now fsyncs every file and directory under the checkpoint, and the directory
above it, before it writes the signal, and the signal and its directory after."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddleformers-zcc-signal-after-durable-dump",
    kind="fix",
    framework="paddleformers",
    version="1.2.0",
    summary="ZCC dump: saved_signal marks a dump that nothing fsynced; fsync the dump, then write the signal",
    hunks=(
        Hunk("paddleformers.trainer.utils.zero_cost_checkpoint", "ZeroCostCheckpointWorker.process_dump_task_impl",
             "4bad281efd4cfc29", (
                 ("        # Step3: dump save signals\n",
                  "        # Step3: dump save signals, once what they vouch for is on disk\n"
                  "        for root, _, files in os.walk(output_dir, topdown=False):\n"
                  "            for name in [*files, os.curdir]:  # another rank's worker may rename its files\n"
                  "                try:\n"
                  "                    fd = os.open(os.path.join(root, name), os.O_RDONLY)\n"
                  "                except FileNotFoundError:\n"
                  "                    continue\n"
                  "                try:\n"
                  "                    os.fsync(fd)\n"
                  "                finally:\n"
                  "                    os.close(fd)\n"
                  "        fd = os.open(os.path.dirname(os.path.abspath(output_dir)), os.O_RDONLY)\n"
                  "        try:\n"
                  "            os.fsync(fd)\n"
                  "        finally:\n"
                  "            os.close(fd)\n"),
                 ("        with open(saved_signal_path, mode=\"w+\") as f:\n"
                  "            f.write(\"1\")\n",
                  "        with open(saved_signal_path, mode=\"w+\") as f:\n"
                  "            f.write(\"1\")\n"
                  "            f.flush()\n"
                  "            os.fsync(f.fileno())\n"
                  "        fd = os.open(output_dir, os.O_RDONLY)\n"
                  "        try:\n"
                  "            os.fsync(fd)\n"
                  "        finally:\n"
                  "            os.close(fd)\n"),
             )),
    ),
    covers=("paddleformers-zcc-dump-not-durable-at-signal",),
)
