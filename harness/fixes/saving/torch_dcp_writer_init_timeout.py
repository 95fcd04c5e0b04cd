"""``async_save`` with the process executor starts one checkpoint process per rank, and the rank waits for it to join
its peers' checkpoint processes (a TCPStore served by rank 0's, and a gloo barrier) for a fixed 1800 s, while the
background group itself uses gloo's 30-minute default. When one rank's checkpoint process is killed (the OOM
killer, say) before that rendezvous completes, its peers' processes wait on a store or barrier nobody will serve,
and their futures stay unresolved for half an hour, far past the trainer's own collective timeout. The rank now
waits for its checkpoint process no longer than the timeout of the process group the save was given (the default
group's when none), so every rank's future fails with an error, in the time the trainer allows its collectives."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="torch-dcp-writer-init-timeout",
    kind="fix",
    framework="torch",
    version="2.13.0",
    summary="process-executor async_save: a killed peer writer leaves the rest waiting 1800 s; wait the group timeout",
    hunks=(
        Hunk("torch.distributed.checkpoint._async_process_executor", "_ProcessGroupInitInfo.__init__",
             "09a804153ad91eb0", (
                 ("        self.world_size = dist.get_world_size(process_group)\n",
                  "        self.world_size = dist.get_world_size(process_group)\n"
                  "        # The checkpoint processes join their peers no slower than the\n"
                  "        # trainer's own collectives may take.\n"
                  "        import torch\n"
                  "\n"
                  "        group = process_group or dist.distributed_c10d._get_default_group()\n"
                  "        try:\n"
                  "            self.timeout = group._get_backend(torch.device(\"cpu\")).options._timeout\n"
                  "        except (AttributeError, RuntimeError):\n"
                  "            self.timeout = dist.distributed_c10d.default_pg_timeout\n"),)),
        Hunk("torch.distributed.checkpoint._async_process_executor", "_AsyncCheckpointProcess.__init__",
             "31f00da0423ac44a", (
                 ("        # Wait for the checkpoint background process to initialize.\n"
                  "        # Using default GLOO init timeout.\n"
                  "        response = self._wait_for_response(timeout=1800)\n",
                  "        # Wait for the checkpoint background process to initialize, as long\n"
                  "        # as the trainer's process group waits for its peers.\n"
                  "        response = self._wait_for_response(\n"
                  "            timeout=pg_init_info.timeout.total_seconds()\n"
                  "        )\n"),)),
    ),
    covers=("torch-dcp-killed-process-writer-hangs",),
)
