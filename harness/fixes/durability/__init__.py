"""Fixes of bugs in what a checkpoint keeps across a crash or a power loss: the order of writes, fsyncs of files and
directories, re-saves over an existing version, writers that die. Each module imports only harness.fixes.patch."""
