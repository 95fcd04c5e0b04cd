"""An async ``save_state_dict`` snapshots the state with ``.cpu()``, which returns a CPU tensor itself: the writer
then reads memory the trainer goes on changing. A snapshot must be a copy on every device."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddle-dcp-async-copy",
    kind="fix",
    framework="paddle",
    version="3.3.1",
    summary="copy_dict_to_cpu: .cpu() of a CPU tensor is the tensor itself; clone it so the async save is a snapshot",
    hunks=(Hunk("paddle.distributed.flex_checkpoint.dcp.save_state_dict", "copy_dict_to_cpu", "108700b33c1bebce", (
        ("            new_dict[key] = value.cpu()\n", "            new_dict[key] = value.cpu().clone()\n"),)),),
    covers=("paddle-dcp-async-not-isolated",),
)
