"""Reading a checkpoint without flex metadata as a Hugging Face one (``create_hf_ckpt_metadata``), Paddle maps each
safetensors dtype code to its own through a table that lacks ``I32`` and ``I64``: a tensor of either stops the
load with "I32 is not supported yet.", though Paddle's own merge_sharded_state_dict writes them (and Hugging Face
checkpoints hold them: position ids, counters). The codes map to Paddle's int32 and int64."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddle-dcp-hf-every-dtype-read",
    kind="fix",
    framework="paddle",
    version="3.3.1",
    summary="create_hf_ckpt_metadata: no I32/I64 in its dtype table, so such a tensor is 'not supported yet'; map them",
    hunks=(Hunk("paddle.distributed.flex_checkpoint.dcp.utils", "create_hf_ckpt_metadata", "7adc98ea6a9ecc36", (
        ("        'I16': 'int16',\n",
         "        'I16': 'int16',\n"
         "        'I32': 'int32',\n"
         "        'I64': 'int64',\n"),
    )),),
    covers=("paddle-dcp-hf-load-int-dtype",),
)
