"""Coverage-guided choices: what recently added coverage of the framework's checkpoint code gets more of the
campaign — a power schedule in the spirit of AFL's and HypoFuzz's, over three kinds of arm:

* properties: a property whose recent turns added coverage gets longer turns, one whose turns add nothing shorter;
* swarm features (properties.generate.swarm): an optional capability is kept in a batch more often when the turns
  that kept it recently added more than the turns that left it out, and less often in the opposite case;
* fix subsets: a known bug's fix is left out of a round more often when turns without it recently added more than
  turns with it (the stock code's path reaches code the fixed one does not).

An arm's energy is what its last ``WINDOW`` turns added per second (new arcs, counted once campaign-wide, plus one
so an arm that has not paid off yet keeps a chance). Without coverage, unguided, or before an arm has been seen
both ways, every choice is the unguided one. Only how time and draws are split moves: no verdict reads any of it.
"""

from __future__ import annotations

from collections.abc import Iterable

from harness.campaign.results import Campaign

WINDOW = 3  # turns of an arm that count toward its energy
LOW, HIGH = 0.5, 2.0  # bounds of a property's slice factor, and of a fix's leave-out weight
KEEP_LOW, KEEP_HIGH = 0.2, 0.8  # bounds of the odds a swarm feature stays in a batch

Turns = list[tuple[int, float]]  # (new arcs, seconds) per turn


def energy(turns: Turns) -> float:
    """New arcs per second over the last ``WINDOW`` turns, the first arc free."""
    recent = turns[-WINDOW:]
    return (1 + sum(n for n, _ in recent)) / max(1.0, sum(s for _, s in recent))


def guided(campaign: Campaign) -> bool:
    return campaign.coverage_dir is not None and campaign.coverage_guided


def note_turn(campaign: Campaign, prop: str, gained: int, seconds: float, kept: Iterable[str],
              left_out: Iterable[str]) -> None:
    """What a turn added, charged to its property and to each swarm feature and fix it kept or left out."""
    turn = (gained, seconds)
    campaign.coverage_turns.setdefault(prop, []).append(turn)
    for arm, was_kept in [*((a, True) for a in kept), *((a, False) for a in left_out)]:
        turns = campaign.feature_turns.setdefault(arm, {}).setdefault(was_kept, [])
        turns.append(turn)
        del turns[:-WINDOW]  # only the window counts; an arm is met every turn


def arms(campaign: Campaign) -> dict[str, dict[str, float]]:
    """Where guidance stands: each swarm feature's keep odds and each fix's leave-out weight, for the arms seen
    both ways (the others are unguided)."""
    seen = [a for a in sorted(campaign.feature_turns) if _both_ways(campaign, a) is not None]
    return {"keep_odds": {a: round(keep_odds(campaign, a), 3) for a in seen if not a.startswith("fix:")},
            "leave_out_weight": {a.removeprefix("fix:"): round(leave_out_weight(campaign, a.removeprefix("fix:")), 3)
                                 for a in seen if a.startswith("fix:")}}


def slice_factor(campaign: Campaign, prop: str) -> float:
    """How much longer (or shorter) than its fair share ``prop``'s next turn is."""
    if not guided(campaign):
        return 1.0
    turns = campaign.coverage_turns
    if not turns.get(prop):
        return 1.0
    energies = [energy(t) for p, t in turns.items() if t and p in campaign.properties]
    mean = sum(energies) / len(energies)
    return min(HIGH, max(LOW, energy(turns[prop]) / mean)) if mean > 0 else 1.0


def _both_ways(campaign: Campaign, arm: str) -> tuple[float, float] | None:
    """The energy of the turns that kept ``arm`` and of those that left it out; None until both happened."""
    ways = campaign.feature_turns.get(arm, {}) if guided(campaign) else {}
    if not ways.get(True) or not ways.get(False):
        return None
    return energy(ways[True]), energy(ways[False])


def keep_odds(campaign: Campaign, feature: str) -> float:
    """The odds a swarm feature stays in the next batch: one half, moved toward the way that paid off more."""
    both = _both_ways(campaign, feature)
    if both is None:
        return 0.5
    kept, out = both
    return min(KEEP_HIGH, max(KEEP_LOW, kept / (kept + out)))


def leave_out_weight(campaign: Campaign, fix: str) -> float:
    """How much likelier than another ``fix`` is to be left out of a round: what turns without it added per second
    over what turns with it added."""
    both = _both_ways(campaign, f"fix:{fix}")
    if both is None:
        return 1.0
    kept, out = both
    return min(HIGH, max(LOW, out / kept))
