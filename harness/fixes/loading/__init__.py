"""Fixes of bugs met when a checkpoint is loaded: version resolution, unflattening, resharding reads. Each
module imports only harness.fixes.patch."""
