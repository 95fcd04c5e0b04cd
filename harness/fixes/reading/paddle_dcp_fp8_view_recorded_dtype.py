"""A pickled checkpoint file keeps a float8 tensor as int8 (numpy has no float8), and the local load assigns that
int8 tensor into the caller's float8 one, which becomes int8. The metadata records each tensor's dtype: the file
tensor is viewed as that dtype before it is assigned."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddle-dcp-fp8-view-recorded-dtype",
    kind="fix",
    framework="paddle",
    version="3.3.1",
    summary="local_load_state_dict: float8 pickles as int8 and is assigned so; view it as the recorded dtype",
    hunks=(Hunk("paddle.distributed.flex_checkpoint.dcp.load_state_dict", "local_load_state_dict", "99b52dad2491f961", (
        ("        source_tensor = source_tensor.to(local_tensor.place)\n",
         "        source_tensor = source_tensor.to(local_tensor.place)\n"
         "        dtype = _metadata_manager.get_metadata_list()[0].state_dict_metadata[key][0].dtype\n"
         "        if str(source_tensor.dtype).split(\".\")[-1] != dtype:\n"
         "            source_tensor = source_tensor.view(getattr(paddle, dtype))\n"),)),),
    covers=("paddle-dcp-fp8-local-load-becomes-int8",),
)
