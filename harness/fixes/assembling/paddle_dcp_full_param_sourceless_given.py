"""``full_param`` on more than one rank gives a tensor once every read its mapping needs has arrived. A zero-size
tensor's mapping needs none, so no read ever makes it ready: the export silently lacks it (on one rank the
single-card path gives it). A tensor with nothing to read is given before the reads begin, on either assembler."""

from harness.fixes.patch import Fix, Hunk

_MODULE = "paddle.distributed.flex_checkpoint.dcp.full_param"
_READY_FIRST = (
    "        yield from self._assemble_and_yield_ready_tensors(\n"
    "            [n for n, m in self.destination_sharded_mappings.items() if not m]\n"
    "        )  # nothing to read: ready now\n"
)

FIX = Fix(
    id="paddle-dcp-full-param-sourceless-given",
    kind="fix",
    framework="paddle",
    version="3.3.1",
    summary="full_param: a zero-size tensor needs no read, so it never becomes ready and is silently left out",
    hunks=(Hunk(_MODULE, "SingleCommGroupFullParamAssembler._run_distributed", "b215afa47c71bbc9", (
        ("        for item in self.read_items:\n", _READY_FIRST + "        for item in self.read_items:\n"),
    )),
           Hunk(_MODULE, "HVCommGroupFullParamAssembler.run", "0ea093f9b607dd5b", (
        ("        self.prepare()\n", "        self.prepare()\n" + _READY_FIRST),
    ))),
    covers=("paddle-dcp-full-param-zero-size-omitted",),
)
