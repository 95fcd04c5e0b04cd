"""Fixes of bugs met when a checkpoint is saved: async snapshots, metadata, what each rank writes. Each module
imports only harness.fixes.patch."""
