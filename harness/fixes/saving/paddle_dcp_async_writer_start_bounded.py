"""An async ``save_state_dict`` starts its writer process with a retry that has no bound: each failed start
logs, sleeps a second and recurses. A start that keeps failing (the tensors handed to the writer go through
shared memory, so a full ``/dev/shm`` or a file-size limit fails every attempt) holds the save for about a
thousand seconds, until the recursion limit ends it, while the metadata that names the checkpoint already lies
on disk. Now a third failed start raises, as a synchronous save fails on the same condition."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddle-dcp-async-writer-start-bounded",
    kind="fix",
    framework="paddle",
    version="3.3.1",
    summary="async save_state_dict retries a failing writer start every second without bound; raise after three",
    hunks=(Hunk("paddle.distributed.flex_checkpoint.dcp.save_state_dict", "save_state_dict", "b0dc8b9a4979bca4", (
        ("                    attempt += 1\n"
         "                    time.sleep(1)\n"
         "                    return start_process()\n",
         "                    attempt += 1\n"
         "                    # A start that failed for want of shared memory or\n"
         "                    # processes rarely succeeds a second later.\n"
         "                    if attempt >= 3:\n"
         "                        raise\n"
         "                    time.sleep(1)\n"
         "                    return start_process()\n"),
    )),),
    covers=("paddle-dcp-async-writer-start-retries-forever",),
)
