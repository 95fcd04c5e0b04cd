"""A pickled checkpoint file keeps a float8 tensor as int8 (numpy has no float8), and the local load assigns that
int8 tensor into the caller's float8 one, which becomes int8. The metadata records each tensor's dtype: an int8
file tensor recorded as float8 is viewed (contiguous first: a saved expanded tensor keeps stride 0) as that dtype
before it is assigned; any other dtype is left to the assignment, as before."""

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
         "        if source_tensor.dtype == paddle.int8 and dtype.startswith(\"float8\"):\n"
         "            source_tensor = source_tensor.contiguous().view(getattr(paddle, dtype))\n"),)),),
    covers=("paddle-dcp-fp8-local-load-becomes-int8",),
)
