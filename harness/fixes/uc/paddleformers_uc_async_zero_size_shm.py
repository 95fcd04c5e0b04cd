"""``AsyncCheckpointHandler`` sizes each writer's shared memory by the bytes of the state it saves, and a state whose
tensors are all empty needs none: ``SharedMemory(size=0)`` raises and the async save fails where a sync save of the
same state works. The segment is now at least one byte; the empty tensors take none of it."""

from harness.fixes.patch import Fix, Hunk

_SHM = "{} = shared_memory.SharedMemory(create=True, size=buffer_size)\n"
_SHM_FIXED = "{} = shared_memory.SharedMemory(create=True, size=max(buffer_size, 1))\n"

FIX = Fix(
    id="paddleformers-uc-async-zero-size-shm",
    kind="fix",
    framework="paddleformers",
    version="1.2.0",
    summary="_file_save_async_or_sync: a state of only empty tensors asks SharedMemory for 0 bytes; ask for at least 1",
    hunks=(Hunk("paddleformers.trainer.unified_checkpoint.async_handler",
                "AsyncCheckpointHandler._file_save_async_or_sync", "13adbcb4b243a6f6", tuple(
                    (_SHM.format(f"                    self._shm_{kind}"),
                     _SHM_FIXED.format(f"                    self._shm_{kind}"))
                    for kind in ("model_weight", "master_weight", "optimizer_weight"))),),
    covers=("paddleformers-uc-async-only-zero-size-save-fails",),
)
