"""``restore_unflattened_state_dict`` fills each non-box flat piece's minimal box from the flat pieces that need
the same treatment: elements of box pieces stay zero, and two pieces whose boxes start at one element share one
temporary (the last made wins). Every flat piece now feeds the reshard, the widest temporary of a start is made last,
and each piece takes its own prefix of it."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddle-dcp-flat-box-temporaries",
    kind="fix",
    framework="paddle",
    version="3.3.1",
    summary="restore_unflattened_state_dict: box temporaries miss box pieces and collide by start; feed all, share",
    hunks=(Hunk("paddle.distributed.flex_checkpoint.dcp.load_state_dict", "restore_unflattened_state_dict",
                "1823c6382c733f22", (
        ("        if numel_in_slice == (flat_end - flat_start):\n"
         "            direct_reshape_tensors[key] = local_tensor.reshape_(\n"
         "                unflattened_local_shape\n"
         "            )\n"
         "            direct_reshape_metas[key] = unflattened_meta\n"
         "        else:\n"
         "            reshard_needed_tensors[key] = local_tensor\n"
         "            reshard_target_infos[key] = (\n"
         "                numel_in_slice,\n"
         "                slices,\n"
         "                unflattened_meta,\n"
         "            )\n",
         "        # Every flat piece feeds the reshard below: a box piece holds elements of its neighbours' boxes.\n"
         "        reshard_needed_tensors[key] = local_tensor\n"
         "        reshard_target_infos[key] = (\n"
         "            numel_in_slice,\n"
         "            slices,\n"
         "            unflattened_meta,\n"
         "        )\n"),
        ("    for key, local_tensor in reshard_needed_tensors.items():\n",
         "    # Boxes starting at one element share a temporary: the widest is made last, so it is the one kept.\n"
         "    for key, local_tensor in sorted(\n"
         "        reshard_needed_tensors.items(),\n"
         "        key=lambda item: reshard_target_infos[item[0]][0],\n"
         "    ):\n"),
        ("        final_tensor.reshape_(unflattened_meta.local_shape)\n",
         "        final_tensor = final_tensor[: reshard_target_infos[key][0]].reshape(\n"
         "            unflattened_meta.local_shape\n"
         "        )\n"),
    )),),
    covers=("paddle-dcp-flat-cross-rank-load", "paddle-dcp-flat-box-collision-reshape"),
    requires=("paddle-dcp-flat-slice-axes", "paddle-dcp-dist-local-value"),
)
