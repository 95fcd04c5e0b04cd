"""Fixes of bugs in PaddleFormers' Unified Checkpoint: its save, its async writers, and the Trainer's resume of it.
Each module imports only harness.fixes.patch."""
