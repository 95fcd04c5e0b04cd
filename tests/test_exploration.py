"""The explorer inside a fault campaign (harness/campaign/exploration.py): it takes its share from the first round,
its failures become findings, it keeps its place in the corpus and the next campaign goes on from there, and the
summary shows what it judged and how fast, with the fault properties' cases per minute."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from faults import strace
from faults.spec import RecordFault, StateFault
from harness.campaign.exploration import MAX_LEN, START_LEN, Exploration, Place, keep_place, place_file, read_place
from harness.campaign.explore import shapes
from harness.campaign.fuzz import FAULT_WEIGHT, _round_order, _slice
from harness.campaign.results import Campaign
from harness.cli import main
from harness.sut import adapter_class
from properties.model.case import read_case_file
from properties.registry import REGISTRY

needs_strace = pytest.mark.skipif(not strace.available(), reason="needs strace with ptrace permitted")
REFERENCE = frozenset(adapter_class("reference").capabilities)
BROKEN = "tests.suts.buggy:IndexFirstSut"  # publishes a checkpoint's index before its data


def test_the_place_walks_every_op_and_kind_of_every_shape_then_longer_shapes_then_again() -> None:
    exploration = Exploration("reference", REFERENCE, 2, kinds=("kill", "state"))
    seen = []
    for _ in range(10_000):
        place = exploration.place
        if place.passes:
            break
        seen.append((place.max_len, exploration.shapes()[place.shape], place.op, exploration.kinds[place.kind]))
        exploration._advance(len(exploration.shapes()[place.shape]))
    every = [(n, s, op, k) for n in range(START_LEN, MAX_LEN + 1) for s in shapes(REFERENCE, n)
             for op in range(len(s)) for k in ("kill", "state")]
    assert seen == every
    assert exploration.place == Place(passes=1, at=shapes(REFERENCE, START_LEN)[0])


def test_a_place_kept_after_a_shape_is_done_resumes_at_the_next_shape() -> None:
    """The place a campaign keeps once it moved past a shape names the shape it stands at: the next campaign
    goes on from there, not back to the shape it finished."""
    exploration = Exploration("reference", REFERENCE, 2, kinds=("state",))
    exploration.place.at = exploration.shapes()[0]  # as judging its first op sets it
    while exploration.place.shape == 0:
        exploration._advance(len(exploration.shapes()[exploration.place.shape]))
    kept = Place.from_json(json.loads(json.dumps(exploration.place.to_json())))
    resumed = Exploration("reference", REFERENCE, 2, kinds=("state",), place=kept)
    assert (resumed.place.shape, resumed.place.op) == (1, 0)
    assert resumed.shapes()[resumed.place.shape] == kept.at


def test_a_place_kept_under_another_list_of_shapes_resumes_at_its_shape() -> None:
    """A corpus place written before the SUT's shapes gained a letter (async saves) counts into the old list: the
    exploration resumes at the shape it names, and a shape the list no longer has starts its length over."""
    without_async = shapes(REFERENCE - {"async"}, 3)
    kept = Place(max_len=3, shape=without_async.index("SST"), op=2, kind=1, index=5, at="SST")
    exploration = Exploration("reference", REFERENCE, 2, place=kept)
    assert exploration.shapes()[exploration.place.shape] == "SST" != without_async[exploration.place.shape]
    assert (exploration.place.op, exploration.place.kind, exploration.place.index) == (2, 1, 5)
    gone = Exploration("reference", REFERENCE - {"async"}, 2, place=Place(max_len=3, shape=9, op=1, at="SAS"))
    assert (gone.place.shape, gone.place.op) == (0, 0)


def test_a_kept_place_reads_back_and_a_damaged_one_starts_over(tmp_path: Path) -> None:
    path = place_file(tmp_path, "pkg.mod:Sut", 2, ("b", "a"))
    assert path == place_file(tmp_path, "pkg.mod:Sut", 2, ("a", "b")) != place_file(tmp_path, "pkg.mod:Sut", 2, ())
    place = Place(max_len=3, shape=4, op=1, kind=1, index=7, judged={"SS": {"op 1 state": 7}})
    keep_place(path, place)
    assert read_place(path) == place
    path.write_text("{not json")
    assert read_place(path) is None
    path.write_text(json.dumps({"max_len": "x", "shape": []}))
    assert read_place(path) is None
    path.write_text(json.dumps({"max_len": 9}))  # a length past the explorer's: starts over too
    assert read_place(path) is None


@needs_strace
def test_a_fault_campaign_explores_from_the_first_round_and_resumes_from_the_corpus(tmp_path: Path) -> None:
    """The broken SUT's power-loss bug is found by the explorer (the finding names the exact state), starting where
    the corpus says the last night stopped (the first save's late states: the index is there, its data not yet);
    the place is kept, and the next campaign goes on from there."""
    corpus = tmp_path / "corpus"
    first = shapes(frozenset(adapter_class(BROKEN).capabilities), START_LEN)[0]
    # the last night judged the first save's IO order too (its own test is below): this night begins with states
    keep_place(place_file(corpus, BROKEN, 2, (), ("state",)),
               Place(index=120, at=first, judged={first: {"op 0 order": 1}}))
    out = tmp_path / "one"
    # 40 s: the explorer's 30 % judges states; on a loaded machine a state's replay may not recur, so it needs
    # room for a few (in 20 s, a CI run under load confirmed none)
    code = main(["fuzz", "--sut", BROKEN, "--faults", "--time", "40", "--launch", "in-process", "--no-repro",
                 "--property", "P-ROUNDTRIP", "--seed", "1", "--corpus", str(corpus), "--out", str(out)])
    summary = json.loads((out / "summary.json").read_text())
    explored = summary["exploration"]
    assert code == 1 and explored["states"] > 0 and explored["failing"] > 0, explored
    assert explored["seconds"] < 40 and explored["states_per_minute"] > 0
    findings = [read_case_file(p)[0] for p in sorted((out / "findings").glob("*.json"))]
    assert any(isinstance(c.fault, StateFault) for c in findings), [c.fault for c in findings]
    assert "Explorer:" in (out / "report.md").read_text()
    kept = read_place(place_file(corpus, BROKEN, 2, (), ("state",)))
    assert kept is not None and (kept.shape, kept.kind, kept.index) > (0, 0, 120)
    again = tmp_path / "two"
    # 10 s: the explorer's 3 s judge a state or two on a loaded machine
    main(["fuzz", "--sut", BROKEN, "--faults", "--time", "10", "--launch", "in-process", "--no-repro",
          "--property", "P-ROUNDTRIP", "--seed", "2", "--corpus", str(corpus), "--out", str(again)])
    later = read_place(place_file(corpus, BROKEN, 2, (), ("state",)))
    assert later is not None and later.passes == 0
    assert (later.max_len, later.shape, later.op, later.kind, later.index) > \
        (kept.max_len, kept.shape, kept.op, kept.kind, kept.index)


@needs_strace
def test_the_explorer_reports_each_failure_as_it_is_found_and_stops_when_told() -> None:
    """A campaign hears of a failure the moment the explorer confirms it (so it is dated truly, and a campaign
    that is done stops there), not when the explorer's turn ends. The broken SUT's first failure is the order of
    its first save's IO, judged before any state of that op: its copies are not made durable."""
    import time

    from harness.judging.judge import Judge
    from harness.ranks.runners import Runners

    exploration = Exploration(BROKEN, frozenset(adapter_class(BROKEN).capabilities), 2, kinds=("state",),
                              place=Place(index=120))
    judge = Judge(Runners(BROKEN, "in-process"), exploring=True)
    heard: list[float] = []
    try:
        start = time.monotonic()
        found = exploration.turn(judge.runners, judge, start + 120,
                                 lambda case, result: heard.append(time.monotonic()) is None)
    finally:
        judge.close()
    assert len(found) == len(heard) == 1, found
    case, result = found[0]
    assert isinstance(case.fault, RecordFault) and result.failing and "a power loss may lose it" in str(
        result.judgement.details), result.judgement.details
    assert (exploration.place.op, exploration.place.index) == (0, 120)  # it stopped there, before any state


@needs_strace
def test_without_the_explorer_a_drawn_fault_case_still_reports_its_save_order(tmp_path: Path) -> None:
    """The drawn cases' own recordings are judged for persistence order: with the explorer left out, the broken
    SUT's index-before-data save still becomes a persistence-order finding (a ``record`` case), once."""
    code = main(["fuzz", "--sut", BROKEN, "--faults", "--no-explore", "--time", "8", "--launch", "in-process",
                 "--no-repro", "--property", "P-ATOMIC", "--seed", "1", "--out", str(tmp_path)])
    findings = [read_case_file(p)[0] for p in sorted((tmp_path / "findings").glob("*.json"))]
    orders = [c for c in findings if isinstance(c.fault, RecordFault)]
    assert code == 1 and len(orders) == 1, [c.fault for c in findings]
    assert not json.loads((tmp_path / "summary.json").read_text()).get("exploration")


@needs_strace
def test_an_exploration_of_its_own_runs_no_property_and_resumes_from_a_shared_corpus(tmp_path: Path) -> None:
    """``--explore-only`` (a fleet's exploration shard): the explorer has the whole time, no property draws a case;
    with ``--explore-part 1/2`` it takes every second shape from the second, and resumes from the place the shared
    (read-only) corpus holds for that part, keeping the new place in its own corpus."""
    part = (1, 2)
    shared, own = tmp_path / "shared", tmp_path / "own"
    kept_there = Place(index=3)
    keep_place(place_file(shared, BROKEN, 2, (), ("state",), part), kept_there)
    out = tmp_path / "out"
    main(["fuzz", "--sut", BROKEN, "--faults", "--explore-only", "--explore-part", "1/2", "--time", "6",
          "--launch", "in-process", "--no-repro", "--seed", "1", "--corpus", str(own), "--corpus-readonly",
          str(shared), "--out", str(out)])
    summary = json.loads((out / "summary.json").read_text())
    assert sum(summary["cases_run"].values()) == 0, summary["cases_run"]
    explored = summary["exploration"]
    assert explored["part"] == "1/2" and explored["states"] > 0, explored
    assert set(explored["shapes"]) <= set(shapes(adapter_class(BROKEN).capabilities, MAX_LEN)[1::2])
    kept = read_place(place_file(own, BROKEN, 2, (), ("state",), part))
    assert kept is not None and (kept.shape, kept.op, kept.kind, kept.index) > (0, 0, 0, 3)  # moved on from there
    assert read_place(place_file(shared, BROKEN, 2, (), ("state",), part)) == kept_there  # never written


@pytest.mark.parametrize("argv,message", [
    (["--explore-only"], "--explore-only needs --faults"),
    (["--faults", "--explore-only", "--cases", "3"], "--explore-only needs --faults, and takes neither --cases"),
    (["--faults", "--explore-part", "2/2"], "--explore-part: explorer part 2/2: needs 0 <= K < N"),
    (["--faults", "--explore-part", "half"], "--explore-part: explorer part 'half': expected K/N"),
])
def test_explorer_options_that_cannot_run_are_one_line_exit_2(tmp_path: Path, capsys, argv, message) -> None:
    code = main(["fuzz", "--sut", "reference", "--time", "5", "--out", str(tmp_path / "out"), *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err, err


def test_a_fault_campaign_gives_its_fault_properties_the_first_and_largest_turns() -> None:
    """Fault properties as a group get FAULT_WEIGHT times the fault-free properties' seconds per round, and open
    each round: a round the deadline cuts short cuts the fault-free ones (they have the main job of their own)."""
    props = ["P-ROUNDTRIP", "P-ATOMIC", "P-EDGE", "P-NOLOSS", "P-FLAT", "P-LIVENESS"]
    campaign = Campaign("reference", 2, props, 600.0, 1, faults=True)
    order = _round_order(campaign)
    fault = [p for p in props if REGISTRY[p].fault]
    assert order == [*fault, *(p for p in props if p not in fault)]
    group = {f: sum(_slice(campaign, p) for p in props if (p in fault) == f) for f in (True, False)}
    assert group[True] == pytest.approx(FAULT_WEIGHT * group[False])
    plain = Campaign("reference", 2, props, 600.0, 1)
    assert _round_order(plain) == props and len({_slice(plain, p) for p in props}) == 1
    # the fault property with the fewest cases so far opens the next round (a cut-short round spares it)
    campaign.cases_run.update({"P-ATOMIC": 30, "P-NOLOSS": 12, "P-LIVENESS": 12, "P-ROUNDTRIP": 0})
    assert _round_order(campaign)[:3] == ["P-NOLOSS", "P-LIVENESS", "P-ATOMIC"]
