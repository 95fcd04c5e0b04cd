"""``paddle.DataParallel`` cannot wrap a model with a zero-size parameter: ``sync_params_buffers`` broadcasts it from
rank 0 and the collective rejects an empty tensor ("Size of tensor should be greater than 0"), and the gradient
reducer rejects it as uninitialised (an empty tensor has no allocation). Any data-parallel job with such a parameter
fails at wrap, so it cannot resume either. An empty parameter has nothing to synchronize and no gradient to reduce:
the reducer now leaves it out (a model whose parameters are all empty gets no reducer and syncs no gradient, where
the reducer would refuse a model with nothing to train), and its broadcast sends a one-element stand-in. The skip
belongs in ``sync_params_buffers``, but decorators hold that function in a closure, out of a patch's reach: the
broadcast itself is patched, one level down (every rank has the same empty shape in a broadcast, so all take the
same path and the caller still gets a task)."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddle-dataparallel-zero-size-param",
    kind="workaround",
    framework="paddle",
    version="3.3.1",
    summary="DataParallel: a zero-size parameter fails the broadcast and the reducer; skip it, broadcast a stand-in",
    hunks=(
        Hunk("paddle.distributed.communication.stream.broadcast", "_broadcast_in_dygraph", "14a459f949e64f93", (
            ("    if use_calc_stream:\n",
             "    if tensor._numel() == 0:\n"
             "        # Nothing to move, but the collective rejects an empty tensor: every\n"
             "        # rank (a broadcast's shapes agree) sends a one-element stand-in.\n"
             "        import paddle\n"
             "\n"
             "        tensor = paddle.zeros([1], dtype=tensor.dtype)\n"
             "    if use_calc_stream:\n"),
        )),
        Hunk("paddle.distributed.parallel", "DataParallel.init_reducer", "006e1bc8e26aff30", (
            ("        layers_param = []\n",
             "        layers_param = []\n"
             "        empty = []  # trainable parameters with no elements\n"),
            ("                if param.trainable:\n",
             "                # An empty parameter has no gradient to reduce.\n"
             "                if param.trainable and param._numel() == 0:\n"
             "                    empty.append(param)\n"
             "                elif param.trainable:\n"),
            ("        assert len(trainable_parameters) > 0, (\n",
             "        if not trainable_parameters and empty:\n"
             "            # Every parameter is empty: nothing to reduce, no gradient to sync.\n"
             "            self.grad_need_sync = False\n"
             "            return\n"
             "        assert len(trainable_parameters) > 0, (\n"),
        )),
    ),
    covers=("paddleformers-uc-zero-size-param-dp2",),
)
