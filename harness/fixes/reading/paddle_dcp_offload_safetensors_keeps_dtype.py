"""A load with ``offload=True`` reads each safetensors file through ``paddle.load(..., return_numpy=True)``, i.e.
``safetensors.numpy``, and numpy has no bfloat16: a BF16 tensor fails the load with "data type 'bfloat16' not
understood" before any data moves. An offloaded safetensors file is read as Paddle tensors
(``safetensors.paddle``, every dtype the format records) and moved to CPU as the numpy arrays were."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddle-dcp-offload-safetensors-keeps-dtype",
    kind="fix",
    framework="paddle",
    version="3.3.1",
    summary="load_state_dict_impl: offload reads safetensors through numpy, which has no bfloat16; read to CPU",
    hunks=(Hunk("paddle.distributed.flex_checkpoint.dcp.load_state_dict", "load_state_dict_impl", "6a7a1f9bef96e4c5", (
        # the one argument, whatever wraps the read loop (paddle-dcp-read-error-shared indents it)
        ("return_numpy=True,\n", "return_numpy=not safetensors,\n"),
    )),),
    covers=("paddle-dcp-offload-safetensors-bf16",),
    after=("paddle-dcp-read-error-shared",),  # it moves the read loop whole
)
