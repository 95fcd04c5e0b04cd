"""``extract_tensor_metadata`` reads "not initialized" as "placed on a mesh without this rank" and skips the tensor,
but a zero-size tensor is never initialized either: the save drops it without a word and the load of that
checkpoint fails with ``KeyError``. A tensor with no elements is empty, not absent, so only one with elements is
skipped. Saved, the empty tensor reaches the loader of empty safetensors tensors, whose own fix it needs."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddle-dcp-zero-size-saved",
    kind="fix",
    framework="paddle",
    version="3.3.1",
    summary="extract_tensor_metadata: a zero-size tensor is uninitialized, so skipped as on another mesh; keep it",
    hunks=(Hunk("paddle.distributed.flex_checkpoint.dcp.utils", "extract_tensor_metadata", "d0b1a623dc983868", (
        ("        if not val._is_initialized():\n",
         "        if not val._is_initialized() and 0 not in val.shape:\n"),)),),
    covers=("paddle-dcp-zero-size-not-saved",),
    requires=("paddle-load-empty-safetensors",),  # the saved empty tensor then meets the empty-safetensors loader
)
