"""Sharding stage 1 (``DygraphShardingOptimizer``) cannot take a 0-d parameter (a scalar gate or temperature):
``_partition_parameters`` sorts the parameters by ``reduce(lambda x, y: x * y, p.shape)``, which raises ``TypeError:
reduce() of empty iterable`` for the empty shape, so ``fleet.distributed_optimizer`` fails and the job never trains.
The numel a few lines on already passes reduce its initial 1; the sort key now does too."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddle-sharding-0d-parameter",
    kind="fix",
    framework="paddle",
    version="3.3.1",
    summary="sharding stage 1: a 0-d parameter breaks the partition's sort key (reduce of an empty shape); start at 1",
    hunks=(
        Hunk("paddle.distributed.fleet.meta_optimizers.dygraph_optimizer.dygraph_sharding_optimizer",
             "DygraphShardingOptimizer._partition_parameters", "beab583365c53561", (
                 ("key=lambda p: reduce(lambda x, y: x * y, p.shape), reverse=True",
                  "key=lambda p: reduce(lambda x, y: x * y, p.shape, 1), reverse=True"),
             )),
    ),
    covers=("paddleformers-trainer-sharding-0d-parameter",),
)
