"""Fixes of bugs met choosing which version of a checkpoint a load reads: unique ids, the newest id, version caches.
Each module imports only harness.fixes.patch."""
