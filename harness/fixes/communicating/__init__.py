"""Fixes of bugs met moving a load's chunks between ranks: each of load_state_dict's communicators (broadcast,
point-to-point, worker groups, the grid of parallel_broadcast) and the collectives beneath them. Each module imports
only harness.fixes.patch (and a sibling's shared text)."""
