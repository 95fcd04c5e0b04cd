"""Sharding stage 1 V2 (``split_param``, which Zero-Cost Checkpointing requires) cannot take a 0-d parameter:
``tensor_fusion_helper.build_reduce_scatter_buffer`` sizes each parameter's slot with ``np.prod(param.shape)``,
which is the float 1.0 for the empty shape, so the buffer's size is a float and ``paddle.zeros`` refuses it before
the first step; past that, ``ShardingGradView._share_param_buffer`` flattens the parameter in place, which a 0-d
tensor refuses. The size is now an int, and a 0-d parameter takes the one-element shape its flattening would give
(its shape is set back right after, as for every parameter)."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddle-sharding-v2-0d-parameter",
    kind="fix",
    framework="paddle",
    version="3.3.1",
    summary="sharding stage 1 V2: np.prod(()) is the float 1.0 and flatten_ refuses 0-d; size an int, view as [1]",
    hunks=(
        Hunk("paddle.distributed.fleet.utils.tensor_fusion_helper", "build_reduce_scatter_buffer",
             "216c3ad4e50aad1c", (
                 ("        size = np.prod(param.shape)\n",
                  "        size = int(np.prod(param.shape))\n"),
             )),
        Hunk("paddle.distributed.fleet.utils.tensor_fusion_helper", "ShardingGradView._share_param_buffer",
             "c61e7579149c8dff", (
                 ("        self._param.flatten_()\n",
                  "        if len(param_shape) == 0:  # flatten_ refuses a 0-d tensor; its one element is flat\n"
                  "            self._param.get_tensor()._set_dims([1])\n"
                  "        else:\n"
                  "            self._param.flatten_()\n"),
             )),
    ),
    covers=("paddleformers-zcc-sharding-v2-0d-parameter",),
)
