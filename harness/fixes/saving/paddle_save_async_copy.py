"""``paddle.async_save`` keeps a CPU tensor as it is (only CUDA tensors are pinned, which copies): the writer thread
reads memory the trainer goes on changing. A CPU tensor is cloned, as a pinned copy would be, into a new dict: the
caller's dict keeps the tensors it holds (rebinding its entries to the copies would hand its later writes to the
writer again)."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddle-save-async-copy",
    kind="fix",
    framework="paddle",
    version="3.3.1",
    summary="async_save: a CPU tensor reaches the writer uncopied; clone it into a new dict, as pin_memory() copies",
    hunks=(Hunk("paddle.framework.io", "async_save", "b4387d794827b5f7", (
        ("    def move_state_dict_to_cpu(sd):\n"
         "        for k, v in sd.items():\n"
         "            if isinstance(v, dict):\n"
         "                move_state_dict_to_cpu(v)\n"
         "            elif isinstance(v, core.eager.Tensor):\n"
         "                sd[k] = v.pin_memory() if core.is_compiled_with_cuda() else v\n",
         "    def move_state_dict_to_cpu(sd):\n"
         "        sd = sd.copy()\n"
         "        for k, v in sd.items():\n"
         "            if isinstance(v, dict):\n"
         "                sd[k] = move_state_dict_to_cpu(v)\n"
         "            elif isinstance(v, core.eager.Tensor):\n"
         "                sd[k] = v.pin_memory() if core.is_compiled_with_cuda() else v.clone()\n"
         "        return sd\n"),
        ("        move_state_dict_to_cpu(obj)\n",
         "        obj = move_state_dict_to_cpu(obj)\n"),
        ("        obj = obj.pin_memory() if core.is_compiled_with_cuda() else obj\n",
         "        obj = obj.pin_memory() if core.is_compiled_with_cuda() else obj.clone()\n"),
    )),),
    covers=("paddle-save-async-save-no-copy",),
)
