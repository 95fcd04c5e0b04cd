"""Fixes of bugs met planning a load's pieces: splits, overlaps, flattening and unflattening, AoA temporaries. Each
module imports only harness.fixes.patch; moving the pieces between ranks is harness.fixes.communicating's."""
