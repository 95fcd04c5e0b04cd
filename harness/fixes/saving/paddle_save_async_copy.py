"""``paddle.async_save`` keeps a CPU tensor as it is (only CUDA tensors are pinned, which copies): the writer thread
reads memory the trainer goes on changing. A CPU tensor is cloned, as a pinned copy would be."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddle-save-async-copy",
    kind="fix",
    framework="paddle",
    version="3.3.1",
    summary="async_save: a CPU tensor is handed to the writer uncopied; clone it as pin_memory() copies a CUDA one",
    hunks=(Hunk("paddle.framework.io", "async_save", "b4387d794827b5f7", (
        ("                sd[k] = v.pin_memory() if core.is_compiled_with_cuda() else v\n",
         "                sd[k] = v.pin_memory() if core.is_compiled_with_cuda() else v.clone()\n"),
        ("        obj = obj.pin_memory() if core.is_compiled_with_cuda() else obj\n",
         "        obj = obj.pin_memory() if core.is_compiled_with_cuda() else obj.clone()\n"),
    )),),
    covers=("paddle-save-async-save-no-copy",),
)
