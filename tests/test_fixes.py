"""Fixes of known bugs (harness/fixes/): each applies only to the source it was written against, binds everywhere
the original is bound, composes with other fixes of the same function, reverts cleanly, renders as an upstream
diff, and makes the regression cases it covers pass (its proof), in fresh rank processes."""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from faults.crashstates import fs_ops
from faults.spec import RecordFault
from faults.strace import available as strace_available
from harness.campaign.explore import shape_case
from harness.campaign.fuzz import _round_fixes
from harness.campaign.results import Campaign
from harness.cli import main
from harness.fixes import FIXES, FixError, apply_fixes, in_order, own_fixes, resolve, upstream_diff
from harness.fixes.patch import Fix, Hunk, source_digest
from harness.judging import judge as judging
from harness.judging.judge import Judge, fault_fired
from harness.ranks.runners import Runners
from harness.sut import REGISTRY, adapter_class, framework_available
from properties.model.case import Case, read_case_file
from properties.model.verdicts import Excuse
from properties.triage.known import explanations, read_known
from tests.suts import buggy

REGRESSIONS = Path(__file__).parent / "regressions"
PADDLE = framework_available(REGISTRY["paddle-dcp"])
needs_paddle = pytest.mark.skipif(not PADDLE, reason="needs paddle: pip install -e '.[paddle]'")


def _per_fix(values: list, fix_of=lambda v: v, ids: list[str] | None = None) -> list:
    """Parameters each skipped where its fix's framework is not installed (PaddleFormers' fixes run in its own
    environment: README, PaddleFormers)."""
    return [pytest.param(*(v if isinstance(v, tuple) else (v,)), id=None if ids is None else ids[n],
                         marks=pytest.mark.skipif(importlib.util.find_spec(FIXES[fix_of(v)].framework) is None,
                                                  reason=f"needs {FIXES[fix_of(v)].framework}"))
            for n, v in enumerate(values)]


def _holders(func: object) -> list[str]:
    """Where ``func`` is bound: module attributes, by module and name."""
    return sorted(f"{name}.{attr}" for name, module in list(sys.modules.items())
                  for attr, value in list(getattr(module, "__dict__", {}).items())
                  if value is func and name != __name__)


ALTERNATIVES = {"paddle-dcp-zero-size-not-saved"}  # rows two fixes resolve each alone (the save keeps the tensor;
# the load needs none of it): each is proven alone, and the necessity proof leaves both out


def test_every_fix_names_real_cases_and_fixes() -> None:
    covered: dict[str, str] = {}
    for fix in FIXES.values():
        assert fix.kind in ("fix", "workaround", "detector") and fix.summary and fix.hunks
        assert set(fix.requires) <= FIXES.keys() - {fix.id}, fix.id
        for stem in fix.covers:
            assert (REGRESSIONS / f"{stem}.json").is_file(), f"{fix.id} covers {stem}: no such regression case"
            assert stem not in covered or stem in ALTERNATIVES, \
                f"{stem} is covered by {covered.get(stem)} and {fix.id}: one root cause each"
            covered[stem] = fix.id
    assert all(len(own_fixes(stem)) > 1 for stem in ALTERNATIVES)


def test_every_row_has_a_fix_or_says_why_none_can_exist() -> None:
    """A known bug is identified by its fix: a regression case no fix covers says why (``no_fix``), and the reason
    goes once a fix covers it."""
    covered = {stem for fix in FIXES.values() for stem in fix.covers}
    for path in sorted(REGRESSIONS.glob("*.json")):
        reason = json.loads(path.read_text()).get("no_fix")
        if path.stem in covered:
            assert reason is None, f"{path.name}: a fix covers it; drop its no_fix"
        else:
            assert isinstance(reason, str) and len(reason) > 40, f"{path.name}: no fix covers it and no_fix says why"


def test_findings_md_lists_every_fix_with_its_rows() -> None:
    listed = (REGRESSIONS.parent.parent / "FINDINGS.md").read_text().split("## Fixes", 1)[1].split("\n## ", 1)[0]
    for fix in FIXES.values():
        row = next((line for line in listed.splitlines() if line.startswith(f"| `{fix.id}` |")), None)
        assert row is not None, f"FINDINGS.md's Fixes section has no row for {fix.id}"
        assert all(f"`{stem}.json`" in row for stem in fix.covers), row


def test_resolve_spells_out_requirements() -> None:
    assert resolve("none") == () and resolve(None) == ()
    assert resolve("all", "paddle") == tuple(i for i, f in FIXES.items() if f.framework == "paddle")
    assert resolve("all") == ()  # a SUT of no framework (the reference) has none
    assert resolve("all", "torch") == tuple(i for i, f in FIXES.items() if f.framework == "torch")
    # a PaddleFormers campaign runs past Paddle's known bugs too: its checkpoints go through Paddle's code
    assert resolve("all", "paddleformers") == tuple(i for i, f in FIXES.items() if f.framework in ("paddle",
                                                                                                 "paddleformers"))
    with_requirements = ("paddle-dcp-flatten-0d", "paddle-dcp-unflatten-world-of-one")
    assert resolve("paddle-dcp-unflatten-world-of-one") == with_requirements
    with pytest.raises(FixError, match="unknown fixes"):
        resolve("paddle-dcp-flatten-0d,no-such-fix")


@pytest.mark.parametrize("fix_id", _per_fix(sorted(FIXES)))
def test_a_fix_binds_everywhere_is_idempotent_and_reverts(fix_id: str) -> None:
    """Applied with the fixes it requires (some edit a function as those leave it), then reverted in reverse."""
    fix, order = FIXES[fix_id], in_order(resolve(fix_id))
    originals = [h.current() for h in fix.hunks]
    where = [_holders(f) for f in originals]
    try:
        apply_fixes(order)
        fix.apply()
        assert fix.applied()
        for hunk, original, held in zip(fix.hunks, originals, where):
            patched = hunk.current()
            assert patched is not original and patched.__ckpt_original__ is original
            assert _holders(original) == [] and _holders(patched) == held  # every module that held it
    finally:
        for fix_id_ in reversed(order):
            FIXES[fix_id_].revert()
    assert not fix.applied()
    assert [h.current() for h in fix.hunks] == originals
    assert [_holders(f) for f in originals] == where
    fix.revert()  # a fix not applied: nothing to do


@needs_paddle
def test_fixes_of_one_function_compose_and_revert_one_by_one() -> None:
    clears, unflattens = FIXES["paddle-dcp-failed-load-clears-metadata"], FIXES["paddle-dcp-unflatten-world-of-one"]
    assert {h.qualname for h in clears.hunks} & {h.qualname for h in unflattens.hunks}
    original = clears.hunks[0].current()
    try:
        apply_fixes(["paddle-dcp-failed-load-clears-metadata", "paddle-dcp-flatten-0d",
                     "paddle-dcp-unflatten-world-of-one"])
        hunk = clears.hunks[0]
        source = hunk.patched_source(hunk.applied(), "paddle-dcp-failed-load-clears-metadata")  # what is bound
        assert "_metadata_manager.clear()\n    use_dist" in source  # both fixes' edits, in one function
        assert "\n    _finish_unflatten(flat_shards, padding_info)" in source
        clears.revert()
        assert not clears.applied() and unflattens.applied()
        assert [who for who, _ in clears.hunks[0].applied()] == ["paddle-dcp-unflatten-world-of-one"]
    finally:
        for fix in FIXES.values():
            fix.revert()
    assert clears.hunks[0].current() is original


@needs_paddle
def test_a_stale_fix_refuses_and_says_why() -> None:
    fix = FIXES["paddle-dcp-flatten-0d"]
    stale = dataclasses.replace(fix, hunks=(dataclasses.replace(fix.hunks[0], digest="0" * 16),))
    with pytest.raises(FixError, match=r"stale.*_finish_unflatten.*expected 0000000000000000"):
        stale.apply()
    gone = Fix("gone", "fix", "paddle", "3.3.1", "lines no longer there", (Hunk(
        fix.hunks[0].module, fix.hunks[0].qualname, fix.hunks[0].digest, (("no such line\n", "x\n"),)),), ())
    with pytest.raises(FixError, match="occur 0 times"):
        gone.apply()
    assert not fix.applied() and not stale.applied()


@pytest.mark.parametrize("fix_id", _per_fix(sorted(FIXES)))
def test_a_fix_reads_as_an_upstream_diff(fix_id: str) -> None:
    diff = upstream_diff(fix_id)
    files = [line for line in diff.splitlines() if line.startswith("+++ b/")]
    assert files and all(f.startswith(f"+++ b/{FIXES[fix_id].framework}/") for f in files), diff
    changed = [line for line in diff.splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    assert changed and diff.count("@@ -") >= len(FIXES[fix_id].hunks), diff


def test_bad_fixes_are_one_clear_line(capsys) -> None:
    case = REGRESSIONS / "paddle-dcp-failed-load-poisons-next.json"
    assert main(["replay", str(case), "--fixes", "no-such-fix"]) == 2
    err = capsys.readouterr().err
    assert "unknown fixes ['no-such-fix']" in err and err.count("\n") == 1


def _case(sut: str) -> Case:
    """A two-rank save and load of one small tensor (a regression case's shape), on ``sut``."""
    data = json.loads((REGRESSIONS / "paddle-dcp-rank-without-tensors-mixed-type.json").read_text())["case"]
    return Case.from_json({**data, "sut": sut, "property": "P-ROUNDTRIP", "options": {}})


def _test_fix(fix_id: str, cls: type, old: str, new: str) -> Fix:
    source = inspect.getsource(cls.load)
    return Fix(fix_id, "fix", "tests", "0", f"{cls.__name__}.load, fixed", (Hunk(
        cls.__module__, f"{cls.__name__}.load", source_digest(source), ((old, new),)),), ())


def test_replay_applies_the_fixes_a_finding_shows_behind(tmp_path: Path, monkeypatch) -> None:
    """A finding shown only behind known bugs' fixes (``needs_fixes``) replays behind them unless ``--fixes`` says
    otherwise; a finding without them, or a plain case, replays on stock code."""
    import harness.cli as cli

    seen: list[str] = []

    def runners(args, sut):
        seen.append(args.fixes)
        raise cli.HarnessError("stop here: only the fixes are under test")

    monkeypatch.setattr(cli, "_runners", runners)
    from harness.sut.paddle_dcp import PaddleDcpSut
    from harness.sut.paddleformers_trainer import PaddleFormersTrainerSut
    monkeypatch.setattr(cli, "adapter_class", lambda sut: PaddleFormersTrainerSut if "trainer" in sut else PaddleDcpSut)
    behind = REGRESSIONS / "paddleformers-trainer-sharding-io-resume-rank-without-master-weights.json"
    needs = json.loads(behind.read_text())["needs_fixes"]
    stock = REGRESSIONS / "paddle-dcp-version-cache.json"
    case_only = tmp_path / "case.json"
    case_only.write_text(json.dumps(json.loads(stock.read_text())["case"]))
    for argv in ([str(behind)], [str(behind), "--fixes", "none"], [str(stock)], [str(case_only)]):
        assert main(["replay", *argv]) == 2
    assert seen == [",".join(needs), "none", "none", "none"]


def test_a_failure_that_passes_patched_is_known_by_its_smallest_fix_set(monkeypatch) -> None:
    flipped = "                flat[-1] ^= np.array(1, dtype=flat.dtype)\n"
    flip = _test_fix("test-flip", buggy.FlipsLastElementSut, flipped, "                pass\n")
    other = _test_fix("test-other", buggy.LoadsLatestAlwaysSut, "super().load(root, None,", "super().load(root, name,")
    monkeypatch.setitem(FIXES, flip.id, flip)
    monkeypatch.setitem(FIXES, other.id, other)
    original = buggy.FlipsLastElementSut.load
    case = _case("tests.suts.buggy:FlipsLastElementSut")
    judge_case = Judge(Runners(case.sut, "in-process"), prove=("test-other", "test-flip"))
    try:
        judgement = judge_case(case)[0]
        assert judgement.ok and judgement.excuse is Excuse.KNOWN, judgement
        assert judgement.details[0].startswith("known: passes with fixes test-flip: op 1 (load step-1)")
        assert judge_case.known_hits == {"fixed by test-flip": 1}  # the summary's known buckets name it so
        assert buggy.FlipsLastElementSut.load is original  # the patched runners closed, their patches taken back
        judge_case(case)  # the bucket's core is decided once
        assert judge_case.known_hits == {"fixed by test-flip": 2} and len(judge_case.fixed_by) == 1
    finally:
        judge_case.close()
    unfixed = Judge(Runners(case.sut, "in-process"), prove=("test-other",))
    try:
        judgement = unfixed(case)[0]
        assert judgement.verdict.value == "silent-corruption" and not unfixed.known_hits
    finally:
        unfixed.close()


@pytest.mark.parametrize("needed", [(), ("f07",), ("f03", "f58"), ("f10", "f11", "f12", "f70")])
def test_a_proof_among_many_fixes_leaves_them_out_in_halves(monkeypatch, needed: tuple[str, ...]) -> None:
    """A case known by a fix or two among eighty is narrowed in a few dozen runs, not one run per fix, to a set no
    single fix of which can go; a fix leaves with every fix that requires it."""
    ids = tuple(f"f{i:02d}" for i in range(80))
    requires = {"f58": ("f57",), "f20": ("f03",)}  # f58 needs f57 applied; f20 builds on f03
    for fix_id in ids:
        monkeypatch.setitem(FIXES, fix_id, SimpleNamespace(requires=requires.get(fix_id, ())))
    runs: list[tuple[str, ...]] = []

    def passes(fixes: tuple[str, ...]) -> bool:
        runs.append(fixes)
        assert all(set(FIXES[f].requires) <= set(fixes) for f in fixes)  # never a fix without what it requires
        return set(needed) <= set(fixes)

    kept = judging._narrowed(ids, passes, lambda: False)
    assert set(kept) == set(needed) | {r for f in needed for r in requires.get(f, ())}
    assert len(runs) <= 12 * max(1, len(needed)) + 8, len(runs)
    before = len(runs)
    assert judging._narrowed(ids, passes, lambda: True) == ids and len(runs) == before  # past the deadline: no run


def _state_case() -> Case:
    """A two-rank case failing at a power-loss state, as a campaign finds one (the state names one trace's IO)."""
    state = {"id": "lost-data@3:step-1/x", "kind": "lost-data", "prefix": 3, "n_ops": 3, "shape": "0" * 16,
             "detail": {"path": "step-1/x"}}
    return dataclasses.replace(_case("reference"), property="P-ATOMIC",
                               fault={"kind": "state", "op": 0, "state": state})


@pytest.mark.parametrize("fixed_states_fail", [False, True])
def test_a_power_loss_failure_is_proven_known_on_every_state_of_the_fixed_save(monkeypatch,
                                                                                fixed_states_fail: bool) -> None:
    """A fix that makes a save durable changes its IO, so the failing state does not exist in the fixed save's
    trace and a replay of it proves nothing: the fix explains the failure where every power-loss state of the fixed
    save passes, and does not where one of them fails."""
    import harness.judging.judge as judging

    case = _state_case()
    fix = _test_fix("test-durable", buggy.FlipsLastElementSut, "flat[-1] ^=", "flat[-1] |=")
    monkeypatch.setitem(FIXES, fix.id, fix)
    failing = SimpleNamespace(ok=False, verdict=SimpleNamespace(value="data-loss"), details=("lost",), anomalies=(),
                              excuse=None)
    judge_case = Judge(Runners(case.sut, "in-process"), prove=(fix.id,))
    seen: list[tuple[str, ...]] = []

    def every_state(traced_case: Case, runners: Runners):
        seen.append(runners.fixes)
        assert traced_case.fault.op == case.fault.op  # the fault op's IO is traced afresh, with the fixes
        passing = SimpleNamespace(judged=True, judgement=SimpleNamespace(ok=True))
        failing_state = SimpleNamespace(judged=True, judgement=SimpleNamespace(ok=False))
        stock = not runners.fixes  # the save without the fix: a state loses the data
        return [passing, failing_state if fixed_states_fail or stock else passing], 3

    monkeypatch.setattr(judging, "crashstates", every_state)
    monkeypatch.setattr(Judge, "_judge", lambda self, c: (failing, judging.Outcome(c.sut)))
    monkeypatch.setattr(Judge, "_bucket", lambda self, c, j, o: judging.Bucket("data-loss|lost"))
    try:
        fixes = judge_case._smallest_fix_set(case)
    finally:
        judge_case.close()
    assert seen and fix.id in seen[0]  # the fixed save's every state, never the stale state's replay
    assert fixes == (None if fixed_states_fail else (fix.id,))


def test_a_signature_matching_while_its_rows_fix_is_applied_is_counted_apart(monkeypatch) -> None:
    """A row's signature explaining a failure although that row's fix is applied: the fix misses a variant, or the
    signature covers another bug. The case is still excused as known (signatures stay a pre-filter), but counted
    apart for the report."""
    import harness.judging.judge as judging

    other = dataclasses.replace(
        _test_fix("test-other", buggy.LoadsLatestAlwaysSut, "super().load(root, None,", "super().load(root, name,"),
        covers=("row-x",))
    monkeypatch.setitem(FIXES, other.id, other)
    monkeypatch.setattr(judging, "explained_by", lambda _k, _f, judgement: None if judgement.ok else "row-x.json")
    case = _case("tests.suts.buggy:FlipsLastElementSut")
    judge_case = Judge(Runners(case.sut, "in-process", fixes=(other.id,)))
    try:
        judgement = judge_case(case)[0]
    finally:
        judge_case.close()
    assert judgement.excuse is Excuse.KNOWN and judge_case.despite_fix == {"row-x.json": 1}
    # a row whose own fix is left out, though a fix it requires is on (a swarm round's): no disagreement
    needing = dataclasses.replace(other, id="test-needing", covers=("row-y",), requires=(other.id,))
    monkeypatch.setitem(FIXES, needing.id, needing)
    monkeypatch.setattr(judging, "explained_by", lambda _k, _f, judgement: None if judgement.ok else "row-y.json")
    judge_case = Judge(Runners(case.sut, "in-process", fixes=(other.id,)))
    try:
        judge_case(case)
    finally:
        judge_case.close()
    assert judge_case.known_hits == {"row-y.json": 1} and not judge_case.despite_fix


def test_a_campaign_counts_a_patched_pass_as_known_not_new(tmp_path: Path, monkeypatch, capsys) -> None:
    flipped = "                flat[-1] ^= np.array(1, dtype=flat.dtype)\n"
    flip = _test_fix("test-flip", buggy.FlipsLastElementSut, flipped, "                pass\n")
    monkeypatch.setitem(FIXES, flip.id, flip)
    monkeypatch.setattr(buggy.FlipsLastElementSut, "framework", "tests")  # the SUT's framework: its fixes are tried
    argv = ["fuzz", "--sut", "tests.suts.buggy:FlipsLastElementSut", "--ranks", "2", "--time", "120", "--cases", "3",
            "--out", str(tmp_path / "out"), "--property", "P-ROUNDTRIP", "--seed", "1", "--launch", "in-process",
            "--fixes", "none"]
    assert main(argv) == 0, capsys.readouterr()
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    (known,) = summary["buckets"]
    assert known["status"] == "known" and known["fixes"] == ["test-flip"] and known["cases"] >= 1
    assert summary["known_findings_skipped"] == {"fixed by test-flip": known["cases"]}
    assert "known by a patched replay, fixed by test-flip" in (tmp_path / "out" / "report.md").read_text()
    assert main([*argv, "--no-known"]) == 1  # no signatures, no proofs: the same bug is new


def test_a_campaign_runs_past_fixed_bugs_and_names_the_fixes_a_new_bug_needs(tmp_path: Path, monkeypatch,
                                                                              capsys) -> None:
    """By default a campaign applies every fix of the SUT's framework: the fixed bug never fires. A failure met
    with fixes applied is replayed on stock code; where stock code passes (here: a fix that breaks loads), the
    finding names the smallest set of fixes it needs."""
    flipped = "                flat[-1] ^= np.array(1, dtype=flat.dtype)\n"
    flip = _test_fix("test-flip", buggy.FlipsLastElementSut, flipped, "                pass\n")
    loaded = "        out = super().load(root, name, targets, options=options)\n"
    bad = _test_fix("test-bad", buggy.FlipsLastElementSut, loaded,
                    loaded + "        if out:\n            raise ValueError('broken by a fix')\n")
    monkeypatch.setattr(buggy.FlipsLastElementSut, "framework", "tests")
    argv = ["fuzz", "--sut", "tests.suts.buggy:FlipsLastElementSut", "--ranks", "2", "--time", "120", "--cases", "2",
            "--property", "P-ROUNDTRIP", "--seed", "1", "--launch", "in-process"]
    monkeypatch.setitem(FIXES, flip.id, flip)
    assert main([*argv, "--out", str(tmp_path / "fixed")]) == 0, capsys.readouterr()
    summary = json.loads((tmp_path / "fixed" / "summary.json").read_text())
    assert summary["fixes"] == ["test-flip"] and summary["buckets"] == []
    monkeypatch.setitem(FIXES, bad.id, bad)
    assert main([*argv, "--out", str(tmp_path / "broken")]) == 1, capsys.readouterr()
    summary = json.loads((tmp_path / "broken" / "summary.json").read_text())
    (new,) = summary["buckets"]
    assert new["status"] == "new (only with fixes test-bad)" and "broken by a fix" in new["title"], new
    (finding,) = (tmp_path / "broken" / "findings").glob("*.json")
    data = json.loads(finding.read_text())
    assert data["needs_fixes"] == ["test-bad"] and sorted(data["fixes"]) == ["test-bad", "test-flip"]


def test_a_swarm_round_leaves_a_fix_out_and_proves_its_bug_known(tmp_path: Path, monkeypatch, capsys) -> None:
    """Swarm rounds after the first may leave fixes out, so bugs behind a known bug's behaviour stay reachable;
    the known bug that then fires passes with the left-out fix put back: known, never a new bucket."""
    flipped = "                flat[-1] ^= np.array(1, dtype=flat.dtype)\n"
    flip = _test_fix("test-flip", buggy.FlipsLastElementSut, flipped, "                pass\n")
    monkeypatch.setitem(FIXES, flip.id, flip)
    monkeypatch.setattr(buggy.FlipsLastElementSut, "framework", "tests")
    runners = SimpleNamespace(fixes=("test-flip",))
    seed = next(s for s in range(100) if _round_fixes(Campaign("x", 2, [], 20, s), runners, 1))
    argv = ["fuzz", "--sut", "tests.suts.buggy:FlipsLastElementSut", "--ranks", "2", "--time", "12",
            "--property", "P-ROUNDTRIP", "--seed", str(seed), "--launch", "in-process", "--out", str(tmp_path)]
    assert main(argv) == 0, capsys.readouterr()
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["buckets"][0]["status"] == "known" and summary["buckets"][0]["fixes"] == ["test-flip"], summary
    assert summary["known_findings_skipped"]["fixed by test-flip"] >= 1
    without = summary["swarm_per_feature"]["fix:test-flip"]["cases"]
    assert without >= 1, summary["swarm_per_feature"]
    saving = summary["fix_savings"]["per_fix"]["test-flip"]
    assert saving["cases_without"] == without and saving["seconds_lost_without"] > 0
    assert summary["known_seconds"]["fixed by test-flip"] >= saving["seconds_lost_without"] - 0.1
    assert "put the fixes' saving at about" in (tmp_path / "report.md").read_text()
    assert summary["fixes"] == ["test-flip"]


def test_a_round_puts_its_left_out_fixes_back_once_their_bugs_were_met() -> None:
    """A left-out fix's known bug that keeps firing (a rank it kills relaunched case after case) only costs the
    campaign once met: after LEFT_OUT_HITS cases it explained, by its row or by a patched replay, the turn ends and
    the rest of the round runs with every fix. Other known bugs do not count."""
    from collections import Counter

    from harness.campaign.fuzz import LEFT_OUT_HITS, _Run

    judge = SimpleNamespace(known_hits=Counter({"paddle-dcp-int16-reshard-kills-rank.json": 5}))
    run = _Run(judge, Campaign("x", 2, [], 20, 0), frozenset(), False, 0.0, 1.0, 2.0,
               left_out=("paddle-dcp-broadcast-wire-dtype",), hits_before=Counter(judge.known_hits))
    assert not run.left_out_met()
    judge.known_hits["paddle-dcp-version-cache.json"] += 10  # another known bug: its fix is on
    judge.known_hits["fixed by paddle-dcp-broadcast-wire-dtype"] += LEFT_OUT_HITS - 1
    assert not run.left_out_met()
    judge.known_hits["paddle-dcp-int16-reshard-kills-rank.json"] += 1
    assert run.left_out_met()
    run.left_out = ()
    assert not run.left_out_met()


PROOFS = sorted((fix_id, stem) for fix_id, fix in FIXES.items() for stem in fix.covers)


def _ways(finding: dict) -> list[str]:
    return [w["expect"] for w in (finding, *finding.get("or", []))]


@pytest.mark.multirank
@pytest.mark.parametrize(("fix_id", "stem"), _per_fix(PROOFS, lambda p: p[0], [f"{f}:{s}" for f, s in PROOFS]))
def test_a_fix_makes_the_cases_it_covers_pass(fix_id: str, stem: str, warm_runners) -> None:
    """Its proof: the case fails on stock code (tests/test_regressions.py) and passes with the fix and what it
    requires, on patched warm ranks (fresh rank processes nightly, as a maintainer would run it). A case whose bug is
    set off by another known bug (a failed load poisoning the next) may still fail with that other bug's own
    failure, never with its own. A fault case's fault must have fired, else its op's crash points are judged."""
    case, finding = read_case_file(REGRESSIONS / f"{stem}.json")
    info = REGISTRY.get(case.sut)
    if info is not None and not framework_available(info):  # a Paddle fix of a bug met through PaddleFormers
        pytest.skip(f"{case.sut} needs {info.framework}")
    fixes = resolve(",".join((*(finding.get("needs_fixes") or ()), fix_id)))  # behind what the bug shows behind
    judge_case = Judge(warm_runners.get(case.sut, finding.get("launch", "fresh"), fixes))
    try:
        if case.fault is not None and case.fault.kind == "state":
            # A recorded power-loss state is a prefix of the stock save's IO; a durability fix changes that IO, so
            # the state no longer exists: every power-loss state of the fixed save is judged instead.
            _every_crash_point_passes(case, judge_case, f"{stem} with {fix_id}", warm_runners.fresh)
            return
        judgement, outcome = judge_case(case)
        if not fault_fired(case, outcome):  # a recording of the op's IO fires whenever the op ran
            _every_crash_point_passes(case, judge_case, f"{stem} with {fix_id}", warm_runners.fresh)
    finally:
        judge_case.close(runners=False)
    details = "\n".join(judgement.details)
    assert not any(e in details for e in _ways(finding)), f"{stem} with {fix_id}: still its own bug\n{details}"
    others = [e for p in REGRESSIONS.glob("*.json") if p.stem != stem for e in _ways(json.loads(p.read_text()))]
    # Another known bug the fixed case goes on to meet may show one of its racy ways (which rank's failure is seen
    # first): its signature recognises it where its expect text does not.
    known = explanations(read_known(REGRESSIONS), case.sut, judgement) or []
    assert judgement.ok or any(e in details for e in others) or (known and f"{stem}.json" not in known), \
        f"{stem} with {fix_id}: another failure\n{details}"


@pytest.mark.nightly
@pytest.mark.multirank
@pytest.mark.parametrize(("fix_id", "stem"), _per_fix(PROOFS, lambda p: p[0], [f"{f}:{s}" for f, s in PROOFS]))
def test_a_fix_is_needed_by_the_cases_it_covers(fix_id: str, stem: str, warm_runners) -> None:
    """The other half of its proof: with every other fix of its framework applied (all but it and the fixes that
    require it), the case still shows its own bug. So the fix is necessary, and no other fix masks the bug: a
    known bug is identified by exactly its own fix."""
    case, finding = read_case_file(REGRESSIONS / f"{stem}.json")
    # A row two fixes each resolve on their own (a save that drops a tensor, a load that needs none of it) leaves
    # out both: "every fix but its own".
    alternatives = set(own_fixes(stem)) - set(resolve(fix_id))
    others = tuple(i for i in resolve("all", REGISTRY[case.sut].framework)  # every fix a run of its SUT meets
                   if fix_id not in resolve(i) and not alternatives & set(resolve(i)))
    judge_case = Judge(warm_runners.get(case.sut, finding.get("launch", "fresh"), others))
    try:
        judgement, outcome = judge_case(case)
    finally:
        judge_case.close(runners=False)
    if not fault_fired(case, outcome):
        pytest.skip(f"the other fixes change the IO the fault targets ({outcome.fault}): it cannot fire here")
    details = "\n".join(judgement.details)
    assert not judgement.ok and any(e in details for e in _ways(finding)), \
        f"{stem} with every fix but {fix_id}: its own bug is gone\n{details}"


def _every_crash_point_passes(case: Case, judge_case: Judge, label: str, every: bool) -> None:
    """A fault case whose fault never fired with the fix proves nothing by passing: the fixed save no longer makes
    the faulted call (it writes no lock file, it renames a temporary). The crash is then proven fixed where it can
    still happen: the fault op killed at crash points spread over every call it makes, each judged with the fix; at
    least one must fire and every one must pass. A power-loss case: the power-loss states of the fixed op must pass.
    ``every``: all points and states (nightly); CI judges a spread: the first and last crash points, 2 states."""
    from faults import strace
    from harness.judging.fault_runs import crashpoints, crashstates

    if not strace.available():
        pytest.skip("the fault no longer fires with the fix; its crash points need strace")
    if case.fault.kind == "state":
        results = crashstates(case, judge_case.runners, limit=None if every else 2, confirm=judge_case)[0]
        assert results, f"{label}: the fixed save leaves no power-loss state to judge"
        # A state losing what another row's bug loses (directory entries where this row lost data) is that row's.
        own = _loss(case.fault.state["id"])
        results = [r for r in results if _loss(r.description) in (own, CRASHED)]
    else:
        results = crashpoints(case, judge_case, sample=None if every else 2)
        assert any(r.report.get("fired") for r in results), f"{label}: no crash point of op {case.fault.op} fired"
    failing = [f"{r.description}: {r.judgement.details[:1] if r.judgement else r.error}" for r in results
               if r.judgement is None or not r.judgement.ok]
    assert not failing, f"{label}: the fault never fired; crash points of its op fail:\n" + "\n".join(failing)


CRASHED = "a crash's prefix or torn write"


def _loss(state: str) -> str:
    """What a power-loss state (by its id, faults/crashstates.py) loses: data, directory entries, or nothing a
    crashed process would not (the IO done so far, a torn write): every row's concern."""
    kind = state.split("@", 1)[0]
    return "entries" if kind == "lost-dirent" else "data" if kind.startswith("lost-") else CRASHED


PROBE = """
import inspect, json, sys, textwrap
sys.path.insert(0, sys.argv[1])
import fix
from harness.fixes.rebind import target
originals = {(m, q): target(m, q)[2] for m, q, _, _ in fix.PATCHES}
fix.apply()
fix.apply()
held = [f"{name}.{attr}" for name, module in list(sys.modules.items()) for attr, value in
        list(getattr(module, "__dict__", {}).items()) if any(value is o for o in originals.values())]
print(json.dumps({"held": held, "patched": {f"{m}.{q}": textwrap.dedent(inspect.getsource(target(m, q)[2]))
                                            for m, q in originals}}))
"""


@needs_paddle
def test_a_fix_file_binds_what_the_harness_binds_and_refuses_when_stale(tmp_path: Path) -> None:
    """A repro's fix.py (harness/fixes/script.py), run without the harness's fixes, binds the very functions the
    harness's ranks run, every holder included (two fixes of one function stack), and a stale one stops the run."""
    import subprocess
    import textwrap

    from harness.fixes.script import fix_script

    ids = resolve("paddle-dcp-failed-load-clears-metadata,paddle-dcp-unflatten-world-of-one")
    (tmp_path / "fix.py").write_text(fix_script([FIXES[i] for i in ids], "a test's fix"))
    run = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.splitlines()[-1])
    assert got["held"] == []  # no module still holds an original
    try:
        apply_fixes(ids)
        for fix_id in ids:
            for hunk in FIXES[fix_id].hunks:
                want = hunk.patched_source(hunk.applied(), fix_id)
                assert got["patched"][f"{hunk.module}.{hunk.qualname}"] == textwrap.dedent(want)
    finally:
        for fix_id in ids:
            FIXES[fix_id].revert()
    text = (tmp_path / "fix.py").read_text()
    (tmp_path / "fix.py").write_text(text.replace(repr(FIXES[ids[0]].hunks[0].digest), repr("0" * 16), 1))
    stale = subprocess.run([sys.executable, "-c", "import fix; fix.apply()"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=120)
    assert stale.returncode == 3 and "STALE FIX" in stale.stdout and "expected 0000000000000000" in stale.stdout


@needs_paddle
def test_a_fix_file_over_a_needs_file_stacks_where_both_edit_one_function(tmp_path: Path) -> None:
    """A finding shown behind a fix that edits the function its own fix edits: needs.py binds the first, and fix.py
    binds both edits over it (checking the framework's original, not what needs.py bound), so the run with the fix
    has both."""
    import subprocess
    import textwrap

    from harness.fixes.script import fix_script

    needs, own = FIXES["paddle-dcp-nested-load-local-check"], FIXES["paddle-dcp-nested-sharded-leaves"]
    assert {(h.module, h.qualname) for h in needs.hunks} == {(h.module, h.qualname) for h in own.hunks}
    (tmp_path / "needs.py").write_text(fix_script([needs], "a test's needs"))
    (tmp_path / "fix.py").write_text(fix_script([own], "a test's fix", base=[needs]))
    probe = ("import inspect, needs, fix; needs.apply(); fix.apply()\n"
             "from paddle.distributed.flex_checkpoint.dcp import load_state_dict as m\n"
             "print(inspect.getsource(m.load_state_dict))")
    run = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    hunk = own.hunks[0]
    both = hunk.patched_source(((needs.id, needs.hunks[0].edits), (own.id, hunk.edits)), own.id)
    assert textwrap.dedent(both).strip() == textwrap.dedent(run.stdout).strip()
    assert "STALE FIX" not in run.stdout


def test_a_recompiled_function_keeps_its_modules_annotations() -> None:
    """Annotations a module leaves unevaluated (``from __future__ import annotations``) stay unevaluated in the
    recompiled function, and a module without it gets them evaluated, as the framework's own compile did."""
    from harness.fixes.rebind import compiled

    lazy_source = "def _lazy_annotated(x: NoSuchName) -> int:\n    return 1\n"
    lazy = compiled(_lazy_annotated, lazy_source, sys.modules[__name__], "<t>")
    assert lazy(0) == 1 and lazy.__annotations__["x"] == "NoSuchName"
    eager = compiled(Path.exists, "def exists(self) -> bool:\n    return True\n", Path, "<t>")
    assert eager.__annotations__["return"] is bool
    with pytest.raises(NameError):
        compiled(Path.exists, lazy_source.replace("_lazy_annotated", "exists"), Path, "<t>")


def _lazy_annotated(x: int) -> int:
    return x


@needs_paddle
@pytest.mark.skipif(not strace_available(), reason="needs strace with ptrace permitted")
@pytest.mark.parametrize("fork", [False, True], ids=["launched", "forked"])
def test_a_writer_the_framework_spawns_runs_the_ranks_fixes(fork: bool) -> None:
    """Paddle's async save spawns a writer process per rank; with ``paddle-save-durable-replace`` on the ranks, the
    writers' ``paddle.save`` is the fixed one too (each data file written to ``.tmp`` and renamed into place),
    whether the ranks were launched or forked from the fork server."""
    case = shape_case("paddle-dcp", adapter_class("paddle-dcp").capabilities, 2, "S", {"format": "pickle"})
    ops = (dataclasses.replace(case.ops[0], use_async=True), *case.ops[1:])
    case = dataclasses.replace(case, ops=ops, fault=RecordFault(op=0, capture=True))
    judge = Judge(Runners("paddle-dcp", "pool", fixes=("paddle-save-durable-replace",)), exploring=fork)
    try:
        if fork:  # the first pool of a shape is a real launch: lose it, so the next one is forked
            judge.runners.get(2, {}).ensure()
            judge.runners.discard(judge.runners.get(2, {}), graceful=False)
        _, outcome = judge(case)
        assert outcome.trace is not None and outcome.trace[1] is not None
        renames = {(op.path, op.new_path) for op in fs_ops(outcome.trace[1], outcome.trace[0]) if op.kind == "rename"}
    finally:
        judge.close()
    assert {f"step-0/{r}_0.distcp" for r in range(2)} <= {new for old, new in renames if old == f"{new}.tmp"}, renames


NEEDED, OTHER = "paddle-dcp-balanced-split", "paddle-dcp-flatten-0d"  # two fixes that need neither the other


def test_a_failure_stock_code_cannot_even_run_needs_the_fixes(monkeypatch) -> None:
    """A failure met at a power-loss state that only the fixed code's IO has: stock code cannot run the case (the
    state does not exist there), which shows nothing of the bug, so the finding needs the fixes, never "a bug of
    stock code"."""
    judge = Judge(Runners("reference", "in-process", fixes=(NEEDED, OTHER)))
    failing = SimpleNamespace(ok=False)
    runs: list[tuple[str, ...]] = []

    def judged_with(case: Case, fixes: tuple[str, ...]):
        runs.append(fixes)
        return (failing, None) if NEEDED in fixes else None  # without NEEDED the recorded state is not there

    monkeypatch.setattr(judge, "judged_with", judged_with)
    monkeypatch.setattr(judge, "bucket", lambda case, judgement, outcome: SimpleNamespace(core="core"))
    try:
        assert judge.fixes_needed(None, "core") == (NEEDED,)
    finally:
        judge.close()
    assert runs[:2] == [(), ()]  # stock code asked twice first, as for a racy pass
