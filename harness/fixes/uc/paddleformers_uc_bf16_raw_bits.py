"""``prepare_safe_save_state_dict`` (UC's sync save) converts a BF16 tensor through float32 to
``ml_dtypes.bfloat16``, and that conversion canonicalises NaNs: payloads are lost and signalling NaNs turn quiet, so
the saved bits differ from the trained ones (the async path copies raw bits and keeps them). Paddle already hands a
BF16 tensor to numpy as its raw uint16 bits: they are now viewed as bfloat16, unconverted."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddleformers-uc-bf16-raw-bits",
    kind="fix",
    framework="paddleformers",
    version="1.2.0",
    summary="prepare_safe_save_state_dict: bf16 goes through float32, which rewrites NaN payloads; view its raw bits",
    hunks=(Hunk("paddleformers.transformers.model_utils", "prepare_safe_save_state_dict", "a8150ab2877db578", (
        ("                state_dict[k] = state_dict.pop(k).astype(\"float32\").cpu().numpy()"
         ".astype(ml_dtypes.bfloat16)\n",
         "                state_dict[k] = state_dict.pop(k).cpu().numpy().view(ml_dtypes.bfloat16)\n"),
    )),),
    covers=("paddleformers-uc-bf16-nan-payload-sync-save",),
)
