"""UC's async writer rebuilds each tensor from its shared-memory layout, and for an empty one it returns
``np.array([])``, of shape (0,) whatever the tensor's: a zero-size parameter of shape (0, 4) is written as (0,) and
the resume rejects it. The empty array now keeps the shape the layout recorded."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddleformers-uc-async-zero-size-shape",
    kind="fix",
    framework="paddleformers",
    version="1.2.0",
    summary="_read_ndarray_from_buf: an empty tensor comes back as np.array([]), shape (0,); keep its recorded shape",
    hunks=(Hunk("paddleformers.trainer.unified_checkpoint.shared_memory_utils", "_read_ndarray_from_buf",
                "9463a93b63cb0430", (
                    ("            return np.array([], dtype=dtype_mapping[value.dtype])\n",
                     "            return np.empty(value.shape, dtype=dtype_mapping[value.dtype])\n"),
                )),),
    covers=("paddleformers-uc-async-zero-size-shape-lost",),
    requires=("paddle-dataparallel-zero-size-param",),  # the resumed empty parameter then meets DataParallel
)
