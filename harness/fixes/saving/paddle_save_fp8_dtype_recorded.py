"""``paddle.save`` stores each tensor as ``np.array(tensor)``, and numpy has no float8: a float8_e4m3fn or float8_e5m2
tensor is pickled as an int8 array of its bits, and ``paddle.load`` turns that array back into an int8 tensor, with no
error. The save now records the dtype of each float8 tensor in a table beside the name table (only when there is
one, so other files stay as they were), and the load views the loaded tensor as that dtype."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddle-save-fp8-dtype-recorded",
    kind="fix",
    framework="paddle",
    version="3.3.1",
    summary="paddle.save pickles float8 as int8 bits and load returns int8; record float8 dtypes, view them on load",
    hunks=(
        Hunk("paddle.framework.io", "_build_saved_state_dict", "efe999dd1e9f9641", (
            ("    name_table = {}\n",
             "    name_table = {}\n"
             "    dtype_table = {}  # dtypes numpy lacks: their arrays carry only the bits\n"),
            ("                save_dict[key] = np.array(value.cpu())\n",
             "                save_dict[key] = np.array(value.cpu())\n"
             "                if value.dtype in (paddle.float8_e4m3fn, paddle.float8_e5m2):\n"
             "                    dtype_table[key] = str(value.dtype).split(\".\")[-1]\n"),
            ("    save_dict[\"StructuredToParameterName@@\"] = name_table\n",
             "    save_dict[\"StructuredToParameterName@@\"] = name_table\n"
             "    if dtype_table:\n"
             "        save_dict[\"StructuredToDtype@@\"] = dtype_table\n"),
        )),
        Hunk("paddle.framework.io", "load", "07a4c7064df39a8b", (
            ("                    if \"StructuredToParameterName@@\" in load_result:\n"
             "                        for key, name in load_result[\n",
             "                    if \"StructuredToParameterName@@\" in load_result:\n"
             "                        dtype_table = load_result.pop(\"StructuredToDtype@@\", {})\n"
             "                        for key, name in load_result[\n"),
            ("                                load_result[key] = _ndarray_to_tensor(\n"
             "                                    load_result[key], config.return_numpy\n"
             "                                )\n",
             "                                load_result[key] = _ndarray_to_tensor(\n"
             "                                    load_result[key], config.return_numpy\n"
             "                                )\n"
             "                                if key in dtype_table and isinstance(\n"
             "                                    load_result[key], paddle.Tensor\n"
             "                                ):\n"
             "                                    load_result[key] = load_result[key].view(\n"
             "                                        getattr(paddle, dtype_table[key])\n"
             "                                    )\n"),
        )),
    ),
    covers=("paddle-save-fp8-dtype-lost",),
)
