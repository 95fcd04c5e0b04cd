"""Fixes of bugs met finding and reading a checkpoint's files: version resolution, metadata, file formats, read
errors. Each module imports only harness.fixes.patch."""
