"""A Zero-Cost Checkpointing worker that dies (killed mid-dump, out of memory, a raise outside its task handlers)
hangs its rank for ever: the manager learns of a failed worker only from the status the worker itself sets to
``ERROR`` (``report_error_worker``), and waits for an idle worker (``get_idle_worker_for_saving``) and for the offload
(``sync_offload_status``) in loops that sleep without looking again. A dead worker sets nothing, so the job waits
until a collective's timeout ends its peers, or for ever. The manager now counts a worker whose process has ended
as failed, and both loops check at every turn: the job stops with ZCC's own dump error instead."""

from harness.fixes.patch import Fix, Hunk

ZCC = "paddleformers.trainer.utils.zero_cost_checkpoint"
RECHECK = ("                time.sleep(1)\n",
           "                self.report_error_worker()  # a worker that died never gets there\n"
           "                time.sleep(1)\n")

FIX = Fix(
    id="paddleformers-zcc-dead-worker-raises",
    kind="fix",
    framework="paddleformers",
    version="1.2.0",
    summary="ZCC manager: a dead worker is never noticed and its rank waits for ever; count it failed, check often",
    hunks=(
        Hunk(ZCC, "ZeroCostCheckpointManager.report_error_worker", "04914917b6a140b9", (
            ("    def report_error_worker(self):\n",
             "    def report_error_worker(self):\n"
             "        for worker, process in zip(self.workers, self.processes):\n"
             "            if process.exitcode not in (None, 0):  # killed, or raised outside its task handlers\n"
             "                logger.error(f\"[ZCC manager] Worker{worker.worker_id} died: {process.exitcode}.\")\n"
             "                raise RuntimeError(f\"{PC_DUMP_ERROR}\")\n"),
        )),
        Hunk(ZCC, "ZeroCostCheckpointManager.sync_offload_status", "25675cc568f2f557", (RECHECK,)),
        Hunk(ZCC, "ZeroCostCheckpointManager.get_idle_worker_for_saving", "c91284db07828152", (
            ("            time.sleep(1)\n",
             "            self.report_error_worker()  # a worker that died never gets there\n"
             "            time.sleep(1)\n"),
        )),
    ),
    covers=("paddleformers-zcc-killed-worker-hangs-rank",),
)
