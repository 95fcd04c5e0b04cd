"""``balanced_split`` gives every piece the ceil-sized chunk and takes the whole shortfall from the last one, so an
uneven split goes past the end and then negative ([2, 2, 2, -1] for 5 over 4): a dist tensor's pieces are recorded
(and read into) at the wrong size. Ceil-sized chunks clipped at what is left, [2, 2, 1, 0], are the pieces a rank
holds."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddle-dcp-balanced-split",
    kind="fix",
    framework="paddle",
    version="3.3.1",
    summary="balanced_split: the last piece takes the whole remainder (5 over 4: [2, 2, 2, -1]); clip ceil chunks at 0",
    hunks=(Hunk("paddle.distributed.flex_checkpoint.dcp.utils", "balanced_split", "6724d61aee7b60c1", (
        ("    has_remainder = total_nums % num_of_pieces != 0\n"
         "    result = [(total_nums + num_of_pieces - 1) // num_of_pieces] * num_of_pieces\n"
         "    if has_remainder:\n"
         "        last_value = result[-1]\n"
         "        result[-1] = last_value - (last_value * num_of_pieces - total_nums)\n"
         "    return result\n",
         "    chunk = (total_nums + num_of_pieces - 1) // num_of_pieces\n"
         "    return [\n"
         "        max(0, min(chunk, total_nums - i * chunk)) for i in range(num_of_pieces)\n"
         "    ]\n"),)),),
    covers=("paddle-dcp-uneven-dist-tensor-4-ranks", "paddle-dcp-empty-piece-gets-a-read"),
)
