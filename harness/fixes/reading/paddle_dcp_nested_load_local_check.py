"""On its default path (pickle files, no AoA) ``load_state_dict`` asks ``check_resumable_locally`` whether each
rank's own file holds its tensors, and then ``local_load_state_dict`` reads them, both over the caller's dict as
given. Each reads it as flat: a nested state dict fails with "The value of state_dict should be a paddle.Tensor,
but got: {...}" before anything is read. Both get the flattened view (``flatten_state_dict``, as the load itself
makes): the same tensor objects, so loading them in place fills the nested dict."""

from harness.fixes.patch import Fix, Hunk

_FLAT = ("(flatten_state_dict(state_dict)[0] if any(isinstance(v, dict) for v in state_dict.values()) "
         "else state_dict)")

FIX = Fix(
    id="paddle-dcp-nested-load-local-check",
    kind="fix",
    framework="paddle",
    version="3.3.1",
    summary="load_state_dict: the local-resume check and local load read a nested state dict as flat; flatten",
    hunks=(Hunk("paddle.distributed.flex_checkpoint.dcp.load_state_dict", "load_state_dict", "2c141cb8304e3ddd", (
        ("        resumable_locally = check_resumable_locally(\n            path, state_dict,",
         f"        resumable_locally = check_resumable_locally(\n            path, {_FLAT},"),
        ("            local_load_state_dict(\n                state_dict=state_dict,",
         f"            local_load_state_dict(\n                state_dict={_FLAT},"),
    )),),
    covers=("paddle-dcp-nested-load-not-flat",),
)
