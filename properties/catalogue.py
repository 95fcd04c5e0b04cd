"""The property catalogue (docs/design.md §5): stable IDs used by reports and case files."""

from __future__ import annotations

PROPERTIES: dict[str, str] = {
    "P-ROUNDTRIP": "save then load, same layout: every tensor bitwise equal (dtype, shape, bytes)",
    "P-RESHARD": "save under layout A, load under layout B (other mesh/placements/world size): bitwise equal",
    "P-EDGE": "empty state_dict, zero-size tensors, empty local shards, 0-d tensors, special bit patterns",
    "P-COVER": "what was written covers each tensor exactly once (no lost or duplicated slices)",
    "P-MOE": "expert tensors keep their global ids across EP/DP degree changes",
    "P-FLAT": "flattened (stage-1 v2) slices round-trip and reshard to unflattened layouts and back",
    "P-REPEAT": "repeated saves to one directory load the version asked for",
    "P-DIFF": "the SUT's loaded state equals the reference engine's for the same case",
    "P-ASYNC-ISOLATION": "mutating tensors after async save returns does not change what is saved",
    "P-ATOMIC": "a crash at any point of a save leaves the last acknowledged checkpoint, a newer one, or a clear error",
    "P-NOLOSS": "a crash during save or rotation never destroys the previous complete checkpoint",
    "P-CORRUPT": "bit flips, truncation, deleted files, stale markers: a clear error, never silent wrong data",
    "P-LIVENESS": "a killed rank or writer turns into an error within a bound, never a hang",
    "P-EMA": "EMA buffers restore bitwise, also under reshard",
    "P-RESUME": "train, save, crash, resume == uninterrupted run, bitwise",
}
