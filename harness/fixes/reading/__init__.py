"""Fixes of bugs met finding and reading a checkpoint's files: metadata, file formats, nesting, read
errors. Each module imports only harness.fixes.patch."""
