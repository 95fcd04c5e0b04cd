"""UC's async writer polls its flag (a lock-protected ``multiprocessing.Array``) in a loop, and a writer killed while
idle (the OOM killer, say) most likely dies holding the flag's lock: the trainer's next async save of that kind
blocks forever reading the flag, before its check that the writer is alive; a writer that died outside the lock is
handed the next save anyway (the check runs only while the flag says busy) and the file never lands.
``_file_save_async_or_sync`` now checks the writer before it touches the flag: a dead writer is replaced, with a
fresh flag, and the save goes to the new one; a writer that died in the middle of a file still raises, as before."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddleformers-uc-dead-writer-replaced",
    kind="fix",
    framework="paddleformers",
    version="1.2.0",
    summary="_file_save_async_or_sync: reads a dead writer's flag (its lock died held) or feeds it; replace it first",
    hunks=(Hunk("paddleformers.trainer.unified_checkpoint.async_handler",
                "AsyncCheckpointHandler._file_save_async_or_sync", "13adbcb4b243a6f6", (
                    ("                return\n"
                     "\n"
                     "            if state_dict_type == \"model_weight\":\n",
                     "                return\n"
                     "\n"
                     "            # A writer that died (killed while idle, say) may hold its flag's lock\n"
                     "            # for good: check it before the flag is read, and replace both.\n"
                     "            flag_name = {\n"
                     "                \"model_weight\": \"_shared_save_model_flag\",\n"
                     "                \"master_weight\": \"_shared_save_master_weight_flag\",\n"
                     "                \"optimizer_weight\": \"_shared_save_optimizer_flag\",\n"
                     "            }[state_dict_type]\n"
                     "            writer = getattr(self, f\"_process_{state_dict_type}\")\n"
                     "            if writer is not None and not writer.is_alive():\n"
                     "                was_saving = getattr(self, flag_name).get_obj()[0] == 1  # lock-free read\n"
                     "                setattr(self, flag_name, multiprocessing.Array(\"i\", 1))\n"
                     "                setattr(self, f\"_process_{state_dict_type}\", None)\n"
                     "                if was_saving:\n"
                     "                    raise RuntimeError(\n"
                     "                        f\"The process that saves {state_dict_type} has been killed \"\n"
                     "                        \"unexpectedly.\"\n"
                     "                    )\n"
                     "\n"
                     "            if state_dict_type == \"model_weight\":\n"),
                )),),
    covers=("paddleformers-uc-killed-writer-deadlocks-next-save",),
)
