"""Fixes of bugs in PaddleFormers' Trainer checkpoint paths: Unified Checkpoint's save, its async writers, resume.
Each module imports only harness.fixes.patch."""
