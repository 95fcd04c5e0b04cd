"""``load_state_dict_impl`` frees the files it read in a loop ``for file_name, state_dict in
source_state_dict.items()``, which rebinds the caller's ``state_dict``; the walk that then puts every loaded tensor
back at its nested path starts from the last file's dict instead, so a nested state dict fails with ``KeyError``
on its first key after every byte was loaded. The loop gets names of its own."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddle-dcp-nested-load-keeps-state-dict",
    kind="fix",
    framework="paddle",
    version="3.3.1",
    summary="load_state_dict_impl: the file-freeing loop rebinds state_dict; a nested load walks it, KeyError",
    hunks=(Hunk("paddle.distributed.flex_checkpoint.dcp.load_state_dict", "load_state_dict_impl", "6a7a1f9bef96e4c5", (
        ("        for file_name, state_dict in source_state_dict.items():\n"
         "            for key, value in state_dict.items():\n",
         "        for file_name, file_state in source_state_dict.items():\n"
         "            for key, value in file_state.items():\n"),
    )),),
    covers=("paddle-dcp-nested-load-keyerror",),
)
