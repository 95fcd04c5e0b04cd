"""``paddle.distributed.all_gather`` of an empty tensor on a gloo group kills every rank with SIGFPE ("Erroneous
arithmetic operation") inside the process group's kernel. ``full_param``'s horizontal/vertical assembler
all-gathers each rank's piece, and an uneven split leaves a rank an empty one. All-gather requires one shape on
every rank, so all ranks hold an empty tensor alike: there is nothing to move, and the list is filled without the
collective."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddle-gloo-all-gather-empty",
    kind="fix",
    framework="paddle",
    version="3.3.1",
    summary="all_gather of an empty tensor on gloo dies of SIGFPE; with nothing to move, skip the collective",
    hunks=(Hunk("paddle.distributed.communication.stream.all_gather", "_all_gather_in_dygraph", "1b4ce79cca1d8910", (
        ("    if use_calc_stream:\n",
         "    if tensor.numel() == 0 and sync_op:  # every rank's piece is empty (one shape on all): nothing to move\n"
         "        return None\n"
         "    if use_calc_stream:\n"),
    )),),
    covers=("paddle-dcp-full-param-hv-empty-piece",),
)
