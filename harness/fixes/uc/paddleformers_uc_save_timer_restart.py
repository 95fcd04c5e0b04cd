"""``Trainer._save_checkpoint`` starts the runtime timer ("checkpoint saving time") on entry and stops it only at the
end of its success path, and ``_load_from_checkpoint`` likewise: after one save (or load) that raises, the timer is
left running and every later checkpoint of that Trainer asserts "timer has already started" at once, so a job that
survives one failed checkpoint never writes another. The Trainer's one runtime timer is only a log of how long the
last operation took (``log()`` already stops one left running): ``RuntimeTimer.start`` now drops a timing that an
operation left running and starts the new one."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddleformers-uc-save-timer-restart",
    kind="fix",
    framework="paddleformers",
    version="1.2.0",
    summary="RuntimeTimer.start: a save that raised leaves the timer running and later saves assert; start anew",
    hunks=(Hunk("paddleformers.trainer.plugins.timer", "RuntimeTimer.start", "176397f6bff8a669", (
        ("        self.timer.name = name\n",
         "        if self.timer.started_:  # left running by an operation that raised\n"
         "            self.timer.reset()\n"
         "        self.timer.name = name\n"),
    )),),
    covers=("paddleformers-uc-failed-save-breaks-later-saves",),
)
