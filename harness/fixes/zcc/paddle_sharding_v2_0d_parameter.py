"""Sharding stage 1 V2 (``split_param``, which Zero-Cost Checkpointing's fused optimizer states need) cannot take a
0-d parameter: ``build_reduce_scatter_buffer`` sizes each parameter's slot with ``np.prod(param.shape)``, which is the
float ``1.0`` for the empty shape, so the buffer's size becomes a float and ``paddle.zeros(shape=[size])`` raises
``TypeError: full(): argument ... must be list of int, but got numpy.float64``; the job never trains. The size is
an element count: an int. Then each parameter is moved into the buffer through ``flatten_()``, which refuses a 0-d
tensor (``start_axis`` out of range); a 0-d parameter is made 1-d the way the same function restores its shape
afterwards, with ``_set_dims``."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddle-sharding-v2-0d-parameter",
    kind="fix",
    framework="paddle",
    version="3.3.1",
    summary="sharding stage 1 V2: a 0-d parameter's size is np.prod(()) = 1.0, a float buffer size; count as int",
    hunks=(
        Hunk("paddle.distributed.fleet.utils.tensor_fusion_helper", "build_reduce_scatter_buffer", "216c3ad4e50aad1c", (
            ("        size = np.prod(param.shape)\n", "        size = int(np.prod(param.shape))\n"),
        )),
        Hunk("paddle.distributed.fleet.utils.tensor_fusion_helper", "ShardingGradView._share_param_buffer",
             "c61e7579149c8dff", (
                 ("        self._param.flatten_()\n",
                  "        if len(param_shape) == 0:  # flatten_ refuses a 0-d tensor\n"
                  "            self._param.get_tensor()._set_dims([1])\n"
                  "        else:\n"
                  "            self._param.flatten_()\n"),
             )),
    ),
    covers=("paddleformers-zcc-sharding-v2-0d-parameter",),  # which goes on to the resume's own 0-d bug
)
