"""Paddle's CPU cast to float16 (``phi::dtype::float16(float)``, the portable path a wheel built without F16C
takes) shifts a 64-bit mantissa right by ``113 - exponent``: for an FP32 value below 2^-78 (exponent 49 or less)
that is 64 bits or more, which x86 takes modulo 64, and the value becomes a subnormal float16 of garbage instead of
±0. A resume casts a weight stored in FP32 to the model's float16 in ``faster_set_state_dict`` (with
``skip_save_model_weight`` the masters are what is stored), so a tiny master comes back as another weight.

The root fix is in ``float16.h`` (no shift of 64 or more: such a value rounds to zero). Here, before the cast,
every value of magnitude 2^-25 or less, which rounds to ±0 (2^-25 itself ties to the even zero), is made that
signed zero; the cast then only meets shifts it handles."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddle-cpu-f16-cast-tiny",
    kind="workaround",
    framework="paddleformers",
    version="1.2.0",
    summary="CPU float32->float16 cast gives garbage below 2^-78 (a 64-bit shift); zero what rounds to ±0 first",
    hunks=(Hunk("paddleformers.transformers.model_utils", "faster_set_state_dict", "ee5234272dca79a4", (
        ("                    new_t = new_t.astype(v.dtype)\n",
         "                    if v.dtype == paddle.float16 and new_t.dtype == paddle.float32:\n"
         "                        # Paddle's CPU float16 cast mangles what is below 2^-78: what rounds to 0 is 0\n"
         "                        zero = paddle.zeros_like(new_t) * new_t  # signed\n"
         "                        new_t = paddle.where(new_t.abs() <= 2.0**-25, zero, new_t)\n"
         "                    new_t = new_t.astype(v.dtype)\n"),
    )),),
    covers=("paddleformers-uc-f16-resume-tiny-master",),
)
