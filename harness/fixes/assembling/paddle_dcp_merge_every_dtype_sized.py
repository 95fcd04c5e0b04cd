"""``merge_sharded_state_dict`` sums the merged checkpoint's ``total_size`` for its index from a table of bytes per
dtype that lists only floating-point dtypes: a checkpoint holding any integer or bool tensor (a step counter, a
mask, token ids) dies of ``KeyError: 'int32'`` before anything is written. Every dtype a checkpoint can hold gets
its width."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddle-dcp-merge-every-dtype-sized",
    kind="fix",
    framework="paddle",
    version="3.3.1",
    summary="merge_sharded_state_dict: the index's bytes-per-dtype table lacks integer and bool dtypes; list them",
    hunks=(Hunk("paddle.distributed.flex_checkpoint.dcp.load_state_dict", "SavePartialSafetensors.__init__",
                "e8fbc33b348cf4f2", (
                    ('            "float8_e5m2": 1,\n',
                     '            "float8_e5m2": 1,\n'
                     '            "int64": 8,\n'
                     '            "int32": 4,\n'
                     '            "int16": 2,\n'
                     '            "int8": 1,\n'
                     '            "bool": 1,\n'),
                )),),
    covers=("paddle-dcp-merge-int-dtype",),
)
