"""``get_read_items`` reads whatever saved pieces overlap a target and never checks that they cover it, and nothing
checksums the metadata: a flipped bit there leaves part of a tensor unread, silently keeping the target's own values.
Each rank now measures its targets' coverage and sends its gaps with the read items it already gathers, so every rank
raises the same ValueError, naming the tensors, before any transfer."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddle-dcp-uncovered-target-detected",
    kind="detector",
    framework="paddle",
    version="3.3.1",
    summary="get_read_items: never checks saved pieces cover a target; gather gaps, raise on every rank",
    hunks=(Hunk("paddle.distributed.flex_checkpoint.dcp.resharder", "get_read_items", "46c8d90641f20e17", (
        ("    read_items = []\n",
         "    read_items = []\n"
         "    uncovered = []  # targets the saved pieces overlapping them do not cover\n"),
        ("        for storage_local_tensor_metadata in storage_state_dict_metadata[\n",
         "        pieces = set()\n"
         "        for storage_local_tensor_metadata in storage_state_dict_metadata[\n"),
        ("            cur_offsets, storage_offsets, lengths = compute_overlap(\n"
         "                cur_chunk_metadata, storage_local_tensor_metadata\n"
         "            )\n",
         "            cur_offsets, storage_offsets, lengths = compute_overlap(\n"
         "                cur_chunk_metadata, storage_local_tensor_metadata\n"
         "            )\n"
         "            pieces.add((tuple(cur_offsets), tuple(lengths)))\n"),
        ("                    dtype=storage_local_tensor_metadata.dtype,\n"
         "                ),\n"
         "            )\n",
         "                    dtype=storage_local_tensor_metadata.dtype,\n"
         "                ),\n"
         "            )\n"
         "        # Distinct overlaps smaller in sum than the target leave elements\n"
         "        # unread: they would keep the target's values (damaged metadata).\n"
         "        if sum(math.prod(shape) for _, shape in pieces) < math.prod(\n"
         "            local_shape\n"
         "        ):\n"
         "            uncovered.append(\n"
         "                f\"{tensor_name} (offset {tuple(global_offset)}, \"\n"
         "                f\"shape {tuple(local_shape)})\"\n"
         "            )\n"),
        ("        paddle.distributed.all_gather_object(tmp, read_items, process_group)\n",
         "        paddle.distributed.all_gather_object(\n"
         "            tmp, (read_items, uncovered), process_group\n"
         "        )\n"),
        ("        tmp.append(read_items)\n",
         "        tmp.append((read_items, uncovered))\n"),
        ("    for items in tmp:\n",
         "    # Every rank holds every rank's gaps: all raise the same error, before\n"
         "    # any transfer a rank alone leaving could wedge.\n"
         "    gaps = [\n"
         "        f\"rank {rank}: {gap}\"\n"
         "        for rank, (_, lost) in enumerate(tmp)\n"
         "        for gap in lost\n"
         "    ]\n"
         "    if gaps:\n"
         "        raise ValueError(\n"
         "            \"checkpoint metadata does not cover the tensors to load (corrupt or \"\n"
         "            f\"incomplete checkpoint): {'; '.join(gaps)}\"\n"
         "        )\n"
         "    for items, _ in tmp:\n"),
    )),),
    covers=("paddle-dcp-metadata-bitflip-zeros",),
)
