"""The Trainer's ``AsyncSaver`` (``use_async_save``) hands each optimizer save to a ``multiprocessing`` pool of one
spawned writer and, before the next save, waits for it with ``self.result.get()``. A pool whose worker dies mid-task
(killed, out of memory) replaces the worker but never fails the task it held, so the wait never returns: the job
hangs at its next checkpoint, for ever. The wait now looks at the writers the task was handed to: one that ended
before the task did stops the job with a clear error. It is not retried: a writer the kernel killed for its memory
would be killed again with the same state, and the saver's retries are for errors its task raised."""

from harness.fixes.patch import Fix, Hunk

ASYNC = "paddleformers.trainer.utils.async_save"

FIX = Fix(
    id="paddleformers-async-saver-dead-writer",
    kind="fix",
    framework="paddleformers",
    version="1.2.0",
    summary="AsyncSaver: a writer that dies mid-save leaves its result pending and the next save waits for ever; "
            "raise instead",
    hunks=(
        Hunk(ASYNC, "AsyncSaver.run", "5dc0fbe4a5482fd1", (
            ("        self.result = self.pool.apply_async(\n",
             "        self._writers = list(self.pool._pool)  # the task goes to one of these\n"
             "        self.result = self.pool.apply_async(\n"),
        )),
        Hunk(ASYNC, "AsyncSaver._wait_for_previous_result", "febae0c2eef7bd5d", (
            ("        if self.result is not None:\n",
             "        if self.result is not None:\n"
             "            while not self.result.ready():\n"
             "                self.result.wait(1)\n"
             "                if not self.result.ready() and any(\n"
             "                        w.exitcode is not None for w in getattr(self, '_writers', ())):\n"
             "                    raise RuntimeError('The async save writer died before the save finished.')\n"),
        )),
    ),
    covers=("paddleformers-trainer-async-saver-killed-writer-hangs",),
    requires=("paddleformers-sharding-io-saves-what-it-resumes",),  # the case resumes a sharding-IO checkpoint
)
