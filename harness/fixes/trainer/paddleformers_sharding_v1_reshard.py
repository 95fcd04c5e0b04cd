"""A sharding-IO resume onto another sharding degree (``ShardingIO.load_optimizer_state_with_reshard``) hands
the optimizer state to ``reshard.sharding_v1.shard``, which unwraps the stage-1 ``DygraphShardingOptimizer`` to
read its ``_param2rank`` and then asserts that this optimizer is *not* a sharding optimizer: it always is there, so
every stage-1 resume that must reshard dies with a bare ``AssertionError`` on every rank. The assertion belongs to
the other branch (no sharding optimizer to unwrap), where it stays."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddleformers-sharding-v1-reshard",
    kind="fix",
    framework="paddleformers",
    version="1.2.0",
    summary="sharding_v1.shard asserts the stage-1 optimizer it just unwrapped is no sharding optimizer; drop it",
    hunks=(
        Hunk("paddleformers.trainer.utils.reshard.sharding_v1", "shard", "bc939956ca0f8797", ((
            "        optimizer = unwrapped_optimizer\n"
            "        assert not is_sharding_opt(optimizer)\n",
            "        optimizer = unwrapped_optimizer\n",
        ),)),
    ),
    covers=("paddleformers-trainer-sharding-io-reshard-asserts",),
)
