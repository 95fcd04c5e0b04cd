"""``load_state_dict_impl`` reads each rank's files alone and a read error leaves that rank only: its peers wait in the
next collective until gloo times out and closes the pairs for good, so no later load or save works. Each rank now
catches its read error and the ranks exchange their outcomes, so every rank raises the same RuntimeError at once."""

import textwrap

from harness.fixes.patch import Fix, Hunk

# Paddle's read loop: the fix keeps it as it is, inside a try that catches its error.
_READ_LOOP = (
    "        for file in local_load_files:\n"
    "            if offload:\n"
    "                state_dict_numpy = paddle.load(\n"
    "                    os.path.join(path, file),\n"
    "                    return_numpy=True,\n"
    "                    safetensors=safetensors,\n"
    "                )\n"
    "                source_state_dict[file] = {\n"
    "                    key: paddle.to_tensor(value, place=paddle.CPUPlace())\n"
    "                    for key, value in state_dict_numpy.items()\n"
    "                }\n"
    "            else:\n"
    "                source_state_dict[file] = paddle.load(\n"
    "                    os.path.join(path, file), safetensors=safetensors\n"
    "                )\n"
)

FIX = Fix(
    id="paddle-dcp-read-error-shared",
    kind="workaround",
    framework="paddle",
    version="3.3.1",
    summary="load_state_dict_impl: a rank's read error is never shared; gather each rank's outcome, all raise",
    hunks=(Hunk("paddle.distributed.flex_checkpoint.dcp.load_state_dict", "load_state_dict_impl", "6a7a1f9bef96e4c5", (
        ("        source_state_dict = {}\n" + _READ_LOOP,
         "        source_state_dict = {}\n"
         "        read_error = None\n"
         "        try:\n"
         + textwrap.indent(_READ_LOOP, "    ")
         + "        except Exception as e:\n"
         "            read_error = e\n"
         "        # A rank's read error must reach every rank: its peers would otherwise\n"
         "        # wait in the next collective until the group times out for good.\n"
         "        if use_dist:\n"
         "            read_errors = []\n"
         "            paddle.distributed.all_gather_object(\n"
         "                read_errors,\n"
         "                None\n"
         "                if read_error is None\n"
         "                else f\"rank {cur_rank}: {type(read_error).__name__}: {read_error}\",\n"
         "                process_group,\n"
         "            )\n"
         "            read_errors = [e for e in read_errors if e is not None]\n"
         "            if read_errors:\n"
         "                raise RuntimeError(\n"
         "                    f\"reading checkpoint {path} failed on {len(read_errors)} \"\n"
         "                    f\"rank(s): {'; '.join(read_errors)}\"\n"
         "                ) from read_error\n"
         "        elif read_error is not None:\n"
         "            raise read_error\n"),
    )),),
    covers=("paddle-dcp-one-rank-load-error-wedges-group",),
)
