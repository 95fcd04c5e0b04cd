"""Coverage-guided time slices: a property whose recent turns added coverage of the framework's checkpoint code
gets longer turns, one whose turns add nothing gets shorter ones — a power schedule in the spirit of AFL's and
HypoFuzz's, over properties rather than inputs.

A property's energy is what its last ``WINDOW`` turns added per second (new arcs, counted once campaign-wide, plus
one so a property that has not paid off yet keeps a chance); its slice factor is its energy over the mean energy of
the properties that had turns, within ``[LOW, HIGH]``. A property with no turn yet, or a campaign without coverage,
gets 1. Only the time split moves: every property still takes a turn every round, and no verdict reads any of it.
"""

from __future__ import annotations

from harness.campaign.results import Campaign

WINDOW = 3  # turns of a property that count toward its energy
LOW, HIGH = 0.5, 2.0  # bounds of a slice factor


def energy(turns: list[tuple[int, float]]) -> float:
    """New arcs per second over the last ``WINDOW`` turns (each (new arcs, seconds)), the first arc free."""
    recent = turns[-WINDOW:]
    return (1 + sum(n for n, _ in recent)) / max(1.0, sum(s for _, s in recent))


def slice_factor(campaign: Campaign, prop: str) -> float:
    """How much longer (or shorter) than its fair share ``prop``'s next turn is."""
    if campaign.coverage_dir is None or not campaign.coverage_guided:
        return 1.0
    turns = campaign.coverage_turns
    if not turns.get(prop):
        return 1.0
    energies = [energy(t) for p, t in turns.items() if t and p in campaign.properties]
    mean = sum(energies) / len(energies)
    return min(HIGH, max(LOW, energy(turns[prop]) / mean)) if mean > 0 else 1.0
