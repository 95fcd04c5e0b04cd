"""Fixes of bugs in PaddleFormers' Trainer checkpoint paths outside Unified Checkpoint: its EMA without Zero-Cost
Checkpointing, sharding IO, its resume loop, and the Paddle parallel wrappers it runs on. Each module imports only
harness.fixes.patch."""
