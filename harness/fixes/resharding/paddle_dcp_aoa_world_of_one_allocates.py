"""A load through an AoA config reads each source slice a transformation needs (a part of a concat, ...) into a
temporary. Under the point-to-point communicators (``send_recv``, ``grouped_send_recv``, ``parallel_broadcast``)
``_handle_aoa`` leaves each temporary without memory (``_clear_to_zero_allocation``): the communicator allocates it
when its data arrives. In a world of one no communicator fills them, so the transformation then reads a tensor of
no memory ("Tensor's dimension is out of bound ... memory's size is 0"). Alone, the temporaries are allocated."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddle-dcp-aoa-world-of-one-allocates",
    kind="fix",
    framework="paddle",
    version="3.3.1",
    summary="_handle_aoa: send_recv-style loads leave AoA temporaries unallocated; in a world of one none fills them",
    hunks=(Hunk("paddle.distributed.flex_checkpoint.dcp.load_state_dict", "_handle_aoa", "990fef090435535d", (
        ("    using_not_init_tensor = (\n"
         "        True if comm_method in _UNINIT_TENSOR_MODES else False\n"
         "    )\n",
         "    using_not_init_tensor = (\n"
         "        comm_method in _UNINIT_TENSOR_MODES\n"
         "        and paddle.distributed.get_world_size() > 1  # alone, nothing allocates them\n"
         "    )\n"),
    )),),
    covers=("paddle-dcp-aoa-send-recv-world-of-one",),
)
