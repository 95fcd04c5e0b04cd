"""Fixes of bugs on Zero-Cost Checkpointing's path: PaddleFormers' ZCC manager, workers and EMA, and the Paddle
sharding stage 1 V2 it runs on. Each module imports only harness.fixes.patch."""
