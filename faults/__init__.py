"""Fault injectors: how a save breaks. They know processes, syscalls and files, never checkpoint formats.

- ``corrupt``: post-commit corruption (bit flips, truncation, appended garbage, deleted files, stale markers),
  planned from a seed so every fault replays exactly.
- ``spec``: a case's fault as typed data, one dataclass per kind, parsed once from (and written back to) its JSON.
- ``strace`` / ``crashpoints``: deterministic SIGKILL or errno injection at the k-th matching syscall of a
  process tree, and enumeration of every such point from a recorded run.
"""
