"""Fixes of bugs met planning and moving a load's pieces: splits, overlaps, unflattening, broadcasts. Each module
imports only harness.fixes.patch."""
