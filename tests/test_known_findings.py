"""``fuzz --skip-known``: regression cases with a signature explain failures, so a campaign looks past them; a
failure that shows anything else still counts, and bad input is named in one line."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from properties.check.anomalies import At, TensorDiffers, judged
from properties.model.verdicts import Judgement, Verdict
from properties.triage.known import KnownFindingsError, explained_by, read_known
from reference.tensor import BitsDiffer

REGRESSIONS = Path(__file__).parent / "regressions"
LOAD = At(1, "load", "step-1")
NAN = TensorDiffers("P-ROUNDTRIP", LOAD, 0, BitsDiffer("model/b", 3, 4, (0,), "0x7fc1", "0x7fc0", "nan", "nan"))
OTHER = TensorDiffers("P-ROUNDTRIP", LOAD, 1, BitsDiffer("model/w", 1, 3, (2,), "0x3f80", "0x0000", "1.0", "0.0"))


def test_the_examples_read_as_a_real_diff_does() -> None:
    assert judged([NAN, OTHER]).details == (
        "op 1 (load step-1), rank 0: model/b: 3 of 4 elements differ; first at index [0]: expected 0x7fc1 (nan), "
        "got 0x7fc0 (nan)",
        "op 1 (load step-1), rank 1: model/w: 1 of 3 elements differ; first at index [2]: expected 0x3f80 (1.0), "
        "got 0x0000 (0.0)")


def test_the_uc_findings_carry_signatures() -> None:
    """Each signature is checked against the real failure by tests/test_regressions.py."""
    assert {k.case_file for k in read_known(REGRESSIONS)} >= {"paddleformers-uc-bf16-nan-payload-sync-save.json",
                                                             "paddleformers-uc-dp2-fp32-resume-on-one-rank.json"}


def test_a_failure_is_known_only_if_every_line_is_explained() -> None:
    known = read_known(REGRESSIONS)
    silent = Verdict.SILENT_CORRUPTION
    assert explained_by(known, "paddleformers-uc", judged([NAN])) == "paddleformers-uc-bf16-nan-payload-sync-save.json"
    assert explained_by(known, "paddleformers-uc", judged([NAN, dataclasses.replace(NAN, rank=1)]))
    assert explained_by(known, "paddleformers-uc", judged([NAN, OTHER])) is None
    assert explained_by(known, "paddle-dcp", judged([NAN])) is None  # another SUT
    lost = judged([NAN])
    assert explained_by(known, "paddleformers-uc", dataclasses.replace(lost, verdict=Verdict.DATA_LOSS)) is None
    assert explained_by(known, "paddleformers-uc", Judgement("P-ROUNDTRIP", Verdict.PASS)) is None
    bare = Judgement("P-ROUNDTRIP", silent, lost.details)  # lines without anomalies: nothing to match
    assert explained_by(known, "paddleformers-uc", bare) is None


def test_bad_known_findings_are_named(tmp_path: Path) -> None:
    with pytest.raises(KnownFindingsError, match="not a directory"):
        read_known(tmp_path / "missing")
    (tmp_path / "bad.json").write_text(json.dumps({"sut": "x", "verdict": "hang", "signature": "(unclosed"}))
    with pytest.raises(KnownFindingsError, match=r"bad\.json: error"):
        read_known(tmp_path)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(KnownFindingsError, match=r"bad\.json: JSONDecodeError"):
        read_known(tmp_path)
    for signature, message in [({"anomaly": "meteor"}, "must be one of"),
                               ({"anomaly": "rank-hung", "colour": "red"}, r"no fields \['colour'\]"),
                               ({"anomaly": "rank-hung", "message": {"regex": "(unclosed"}}, "error"),
                               ({"anomaly": "rank-hung", "message": {"glob": "*"}}, "regex"),
                               (3, "TypeError")]:
        (tmp_path / "bad.json").write_text(json.dumps({"sut": "x", "verdict": "hang", "signature": signature}))
        with pytest.raises(KnownFindingsError, match=message):
            read_known(tmp_path)
    (tmp_path / "bad.json").write_text(json.dumps({"sut": "x", "verdict": "hang"}))  # no signature: left out
    assert read_known(tmp_path) == []


def test_cli_names_a_missing_known_directory_in_one_line(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "fuzz", "--sut", "reference", "--time", "1",
                           "--out", str(tmp_path / "out"), "--skip-known", str(tmp_path / "nowhere")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "is not a directory of regression cases" in proc.stderr and "Traceback" not in proc.stderr


LATEST = At(2, "load", None)
SUFFIX = At(3, "load", "step-1")


def _assert_fails(at: At, message: str):
    from properties.check.anomalies import OpFailed, SutError
    return OpFailed("P-REPEAT", at, SutError("AssertionError", f"rank 0: {message}"))


def _known(tmp_path: Path, name: str, signature: object, verdict: str = "loud-failure", **extra: object) -> None:
    data = {"sut": "paddle-dcp", "verdict": verdict, "signature": signature, **extra}
    (tmp_path / name).write_text(json.dumps(data))


def test_a_lesser_unknown_anomaly_behind_a_known_one_still_counts(tmp_path: Path) -> None:
    """The worst failure carries every other one, so a known bug at the first load cannot hide a new bug at a
    later load of the same verdict (or a lesser one)."""
    from properties.model.verdicts import worst
    _known(tmp_path, "latest.json", {"anomaly": "op-failed", "name": None, "message": {"regex": "one metadata"}})
    known = read_known(tmp_path)
    latest, suffix = _assert_fails(LATEST, "one metadata file"), _assert_fails(SUFFIX, "single metadata list")
    both = worst([judged([latest]), judged([suffix])])
    assert both is not None and both.anomalies == (latest, suffix) and len(both.details) == 2
    assert explained_by(known, "paddle-dcp", judged([latest])) == "latest.json"
    assert explained_by(known, "paddle-dcp", both) is None
    behind_corruption = worst([judged([suffix]), judged([dataclasses.replace(NAN, property="P-REPEAT")])])
    assert behind_corruption is not None and behind_corruption.verdict is Verdict.SILENT_CORRUPTION
    assert behind_corruption.anomalies[0].kind == "tensor-differs"  # the worst first, the lesser one kept


def test_several_known_findings_explain_a_failure_together(tmp_path: Path) -> None:
    """Each anomaly by some finding of the same SUT whose verdict is the anomaly's; a signature may list the ways
    one bug shows."""
    from properties.model.verdicts import worst
    from properties.triage.known import explanations
    _known(tmp_path, "a-latest.json", {"anomaly": "op-failed", "name": None, "message": {"regex": "one metadata"}})
    _known(tmp_path, "b-cache.json", [{"anomaly": "tensor-differs", "op_kind": "load"},
                                      {"anomaly": "op-failed", "name": {"regex": "^step-"},
                                       "message": {"regex": "one metadata"}}], verdict="silent-corruption",
           **{"or": [{"verdict": "loud-failure"}]})
    known = read_known(tmp_path)
    latest, follow = _assert_fails(LATEST, "one metadata file"), _assert_fails(SUFFIX, "one metadata file")
    wrong = dataclasses.replace(OTHER, property="P-REPEAT")
    j = worst([judged([latest]), judged([follow]), judged([wrong])])
    assert j is not None and explanations(known, "paddle-dcp", j) == ["b-cache.json", "a-latest.json"]
    assert explained_by(known, "paddle-dcp", worst([judged([latest]), judged([follow])])) == "a-latest.json"
    assert explanations(known, "torch-dcp", j) is None  # another SUT's findings
    odd = worst([judged([latest]), judged([_assert_fails(SUFFIX, "single metadata list")])])
    assert odd is not None and explanations(known, "paddle-dcp", odd) is None
    _known(tmp_path, "bad.json", [])
    with pytest.raises(KnownFindingsError, match="non-empty list"):
        read_known(tmp_path)


def test_a_load_failing_because_its_save_failed_is_not_a_second_bug() -> None:
    """Loads of ``s`` and of "latest" fail because the save of ``s`` did: one anomaly; ``t`` was never saved."""
    from properties.check.oracle import check_oracle
    from properties.model.case import Case, Op
    from properties.model.outcome import OpRecord, Outcome
    ops = (Op("save", "s", 0), Op("load", "s", 0), Op("load", None, 0), Op("load", "t", 0))
    case = Case("P-ROUNDTRIP", "x", (), {}, {}, ops)
    recs = [OpRecord(0, "save", "s", ok=False, error_type="ValueError", error="no"),
            OpRecord(1, "load", "s", ok=False, error_type="KeyError", error="s"),
            OpRecord(2, "load", None, ok=False, error_type="KeyError", error="latest"),
            OpRecord(3, "load", "t", ok=False, error_type="KeyError", error="t")]
    j = check_oracle(case, Outcome("x", recs))
    assert [(a.kind, a.at.op) for a in j.anomalies] == [("op-failed", 0), ("op-failed", 3)]


def test_a_known_sut_error_is_known_whichever_rule_it_breaks() -> None:
    """A load that fails with a known error is op-failed to the oracle, but an acknowledged checkpoint lost or a
    listed one that does not load in a job's history: the error names the bug, so the finding explains it there
    too (whatever verdict that rule gives); what the SUT did not say (wrong bits) it never explains."""
    from properties.check.anomalies import AcknowledgedLost, ListedIncomplete, OpFailed, SutError
    from properties.triage.known import Known, Signature

    sig = Signature.parse({"anomaly": "op-failed", "op_kind": "load", "error_type": "ValueError",
                           "message": {"regex": "strides"}})
    known = [Known("bug.json", "paddle-save", "loud-failure", sig)]
    error = SutError("ValueError", "rank 1: input.strides[0] must be 1")
    for anomaly in (OpFailed("P-EDGE", LOAD, error), AcknowledgedLost("P-LIFECYCLE", LOAD, error, 0, 0),
                    ListedIncomplete("P-ATOMIC", LOAD, error, 0)):
        assert explained_by(known, "paddle-save", judged([anomaly])) == "bug.json", anomaly
    other = SutError("KeyError", "rank 0: 'model/w'")
    assert explained_by(known, "paddle-save", judged([AcknowledgedLost("P-LIFECYCLE", LOAD, other, 0, 0)])) is None
    saving = At(0, "save", "step-0")
    assert explained_by(known, "paddle-save", judged([AcknowledgedLost("P-LIFECYCLE", saving, error, 0, 0)])) is None
    assert explained_by(known, "paddle-save", judged([NAN])) is None
    by_op_only = Known("op.json", "paddle-save", "loud-failure", Signature.parse({"anomaly": "op-failed",
                                                                                 "op_kind": "load"}))
    assert explained_by([by_op_only], "paddle-save", judged([AcknowledgedLost("P-LIFECYCLE", LOAD, error, 0, 0)])) \
        is None  # a signature that names no error recognises only its own anomaly type


def test_the_finding_that_names_the_error_explains_it_before_one_that_names_history_facts() -> None:
    """A bug may strike after another (a group wedged after a failed load): a finding recognised by facts of the
    history (a load after a failed load) and one that describes the failure itself both match; the latter explains
    it, in whichever order the findings are listed."""
    from properties.check.anomalies import AcknowledgedLost, SutError
    from properties.triage.known import Known, Signature, explanations

    by_fact = Known("cache.json", "paddle-dcp", "data-loss", Signature.parse(
        {"anomaly": "acknowledged-lost", "op_kind": "load", "after_failed_load": True}))
    by_error = Known("wedge.json", "paddle-dcp", "data-loss", Signature.parse(
        {"anomaly": "acknowledged-lost", "message": {"regex": "pair closure"}}))
    wedged = AcknowledgedLost("P-LIFECYCLE", LOAD, SutError("RuntimeError", "rank 0: Application timeout caused "
                                                            "pair closure"), 0, 0, after_failed_load=True)
    other = dataclasses.replace(wedged, error=SutError("AssertionError", "rank 0: files are not complete"))
    for known in ([by_fact, by_error], [by_error, by_fact]):
        assert explanations(known, "paddle-dcp", judged([wedged])) == ["wedge.json"]
        assert explanations(known, "paddle-dcp", judged([other])) == ["cache.json"]


def test_a_gap_is_known_when_each_of_its_failed_loads_is(tmp_path: Path) -> None:
    """"No complete checkpoint" cites no error: it is the consequence of loads that failed. When the failed loads of
    the checkpoints it names (those not excused) are known bugs, the gap is those bugs'; one whose failure is not
    known keeps it a finding, and so does a gap the SUT's listing showed or one with no failed load behind it."""
    from properties.check.anomalies import AcknowledgedLost, NoCompleteCheckpoint, SutError
    from properties.model.verdicts import worst
    from properties.triage.known import explanations
    _known(tmp_path, "wedge.json", {"anomaly": "acknowledged-lost", "message": {"regex": "pair closure"}},
           verdict="data-loss")
    known = read_known(tmp_path)
    wedged = SutError("RuntimeError", "rank 0: Application timeout caused pair closure")
    lost0 = AcknowledgedLost("P-LIFECYCLE", At(2, "load", "step-0"), wedged, 0, 0)
    lost1 = AcknowledgedLost("P-LIFECYCLE", At(3, "load", "step-1"), SutError("ValueError", "rank 0: other"), 1, 1)
    gap = NoCompleteCheckpoint("P-NOLOSS", At(1, "save", "step-1"), 0, 0, ("step-0",))

    def case(gap: NoCompleteCheckpoint, *lost: AcknowledgedLost) -> Judgement:
        j = worst([judged([gap]), *(judged([x]) for x in lost)])  # as the history checker gathers them
        assert j is not None
        return j

    assert explanations(known, "paddle-dcp", case(gap, lost0)) == ["wedge.json"]
    assert explanations(known, "paddle-dcp", case(dataclasses.replace(gap, gone=("step-0", "step-1")), lost0,
                                                  lost1)) is None
    rotated = dataclasses.replace(gap, gone=("step-0", "step-9"))  # step-9 failed by name too, excused (rotated)
    assert explanations(known, "paddle-dcp", case(rotated, lost0)) == ["wedge.json"]
    assert explanations(known, "paddle-dcp", case(dataclasses.replace(gap, gone=()), lost0)) is None
    assert explanations(known, "paddle-dcp", case(gap)) is None


def test_a_pattern_reads_the_json_text_of_a_field_that_is_not_a_string(tmp_path: Path) -> None:
    """``versions`` is a list: a pattern over its JSON text tells a mix of a re-saved name's two versions from a
    wrong state of a name saved once."""
    from properties.check.anomalies import LoadedNoVersion
    _known(tmp_path, "mix.json", {"anomaly": "loaded-none-of-versions", "versions": {"regex": r"\d+, \d+"}},
           verdict="silent-corruption")
    known = read_known(tmp_path)
    mixed = LoadedNoVersion("P-NOLOSS", LOAD, (0, 1), 0, (OTHER,))
    assert explained_by(known, "paddle-dcp", judged([mixed])) == "mix.json"
    assert explained_by(known, "paddle-dcp", judged([dataclasses.replace(mixed, versions=(1,))])) is None


def test_a_mangled_tensor_does_not_hide_the_wrong_version_of_the_rest() -> None:
    """One bug changes a tensor's dtype on every load, another gives an older version: the load is that older
    version in every tensor that matches any version, so it is judged a wrong version (which a known version-cache
    signature can explain) beside the mangled tensor's own difference, never one diff of everything."""
    import numpy as np

    from properties.check.oracle import check_oracle
    from properties.model.case import Case, Op, TensorCase
    from properties.model.outcome import OpRecord, Outcome
    from reference.dtypes import dtype
    from reference.tensor import Tensor

    tensors = (TensorCase("a", "F32", (2, 3), 1), TensorCase("b", "F32", (4,), 2))
    ops = (Op("save", "s0", 0), Op("save", "s1", 1), Op("load", "s0", 0), Op("load", "s1", 1))
    case = Case("P-REPEAT", "x", tensors, {}, {}, ops)
    mangled = Tensor(dtype("I8"), np.zeros(4, np.uint8))
    older = {"a": case.expected(0, "load")["a"], "b": mangled}
    recs = [OpRecord(0, "save", "s0"), OpRecord(1, "save", "s1"), OpRecord(2, "load", "s0", loaded={0: older}),
            OpRecord(3, "load", "s1", loaded={0: older})]
    j = check_oracle(case, Outcome("x", recs))
    kinds = [(a.kind, a.at.op) for a in j.anomalies]
    assert ("wrong-version", 3) in kinds and ("tensor-differs", 3) in kinds and ("tensor-differs", 2) in kinds
    wrong = next(a for a in j.anomalies if a.kind == "wrong-version")
    assert (wrong.version, wrong.got, wrong.loaded_before) == (1, 0, True)
    assert all(d.difference.tensor == "a" for d in wrong.differences)
    assert [a.difference.tensor for a in j.anomalies if a.kind == "tensor-differs"] == ["b", "b"]


@pytest.mark.parametrize("prop", ["P-DIFF", "P-COVER", "P-MOE", "P-EDGE"])
def test_a_bug_of_one_world_size_and_tensor_kind_is_known_under_any_property(prop: str) -> None:
    """"A dist tensor loaded in a world of one comes back all zeros" is recognised by the job the load ran in
    (``At.world``, ``At.tensor_kinds``), whichever property met it; the same zeros in a larger world, or in a
    ShardedWeight, are not that bug and still count."""
    known = read_known(REGRESSIONS)
    zeros = BitsDiffer("rng/state", 24, 24, (0, 0), "0x3f80", "0x0000", "1.0", "0.0")

    def failure(world: int, kinds: tuple[str, ...]) -> Judgement:
        return judged([TensorDiffers(prop, At(1, "load", "step-1", world, kinds), 0, zeros)])

    assert explained_by(known, "paddle-dcp", failure(1, ("dist_from_local",))) == \
        "paddle-dcp-moe-ep2-to-ep1-dist-tensor-zeros.json"
    assert explained_by(known, "paddle-dcp", failure(2, ("dist_from_local",))) is None
    assert explained_by(known, "paddle-dcp", failure(1, ("sharded_weight",))) is None


@pytest.mark.parametrize("prop", ["P-FLAT", "P-ROUNDTRIP", "P-RESHARD", "P-REPEAT"])
def test_a_wrong_unaligned_flat_tensor_is_known_under_any_property_but_corruption(prop: str) -> None:
    """A flattened (stage-1 v2) tensor saved in pieces that are not all boxes and read back wrong is the cross-rank
    flat load bug whichever property met it (the tensor's layout kind is on its difference); the same in a tensor
    whose flat pieces are boxes, in a sharded tensor, or after a corruption, still counts."""
    known = read_known(REGRESSIONS)
    zeros = BitsDiffer("model/w", 3, 4, (1,), "0x7f", "0x00", "127", "0")
    moved = BitsDiffer("model/w", 13, 24, (10,), "0x80", "0xff", "-128", "-1")  # another piece's value

    def failure(prop: str, layout: str, difference: BitsDiffer = zeros) -> Judgement:
        return judged([TensorDiffers(prop, At(1, "load", "step-1", 2, ("sharded_weight",)), 0, difference,
                                     layout=layout)])

    assert explained_by(known, "paddle-dcp", failure(prop, "flat-unaligned")) == \
        "paddle-dcp-flat-cross-rank-load.json"
    assert explained_by(known, "paddle-dcp", failure(prop, "flat-unaligned", moved)) == \
        "paddle-dcp-flat-cross-rank-load.json"
    assert explained_by(known, "paddle-dcp", failure(prop, "flat")) is None  # pieces that are boxes: another bug
    assert explained_by(known, "paddle-dcp", failure(prop, "sharded")) is None
    assert explained_by(known, "paddle-dcp", failure("P-CORRUPT", "flat-unaligned")) is None


def test_the_job_an_op_ran_in_survives_the_json_round_trip() -> None:
    from properties.check.anomalies import from_json

    anomaly = TensorDiffers("P-DIFF", At(3, "load", None, 7, ("dist_from_local", "sharded_weight"), "safetensors"),
                            0, BitsDiffer("w", 1, 2, (0,), "0x01", "0x00", "1", "0"))
    data = anomaly.to_json()
    assert (data["world"], data["tensor_kinds"], data["format"]) == (7, ["dist_from_local", "sharded_weight"],
                                                                     "safetensors")
    assert from_json(json.loads(json.dumps(data))) == anomaly
    older = {k: v for k, v in data.items() if k not in ("world", "tensor_kinds", "format")}  # before they were kept
    assert from_json(older).at == At(3, "load", None)
    flat = dataclasses.replace(anomaly, layout="flat")
    assert flat.to_json()["layout"] == "flat" and from_json(json.loads(json.dumps(flat.to_json()))) == flat
    assert from_json({k: v for k, v in data.items() if k != "layout"}).layout is None  # written before it was kept


def test_what_training_carries_on_from_a_known_bad_load_is_that_bugs() -> None:
    """A load that gave a rank wrong bits (its RNG state zeroed, say) sends every tensor that rank trains
    afterwards astray: those differences are the load's known bug. Training that goes wrong on a rank the load gave
    the right state, or from a load that went right everywhere, or from the seeds, is a finding of its own."""
    from properties.triage.known import Known, Signature, explanations
    zeros = Known("zeros.json", "paddle-dcp", "silent-corruption", Signature.parse(
        {"anomaly": "tensor-differs", "op_kind": "load", "rank": 0, "got_bits": "0x0000"}))
    bad_load = TensorDiffers("P-RESUME", At(2, "load", "step-5"), 0,
                             BitsDiffer("rng/state", 2, 2, (0,), "0x3f80", "0x0000", "1.0", "0.0"))
    trained = TensorDiffers("P-RESUME", At(3, "train", None), 0,
                            BitsDiffer("model/w", 1, 1, (), "0x3f80", "0x3f81", "1.0", "1.0"), state_from=2)

    def explain(*anomalies: TensorDiffers) -> list[str] | None:
        return explanations([zeros], "paddle-dcp", judged(list(anomalies)))

    assert explain(bad_load, trained) == ["zeros.json"]
    assert explain(bad_load, dataclasses.replace(trained, rank=1)) is None  # rank 1 loaded the right state
    assert explain(trained) is None  # the load went right: an optimizer or EMA bug
    assert explain(bad_load, dataclasses.replace(trained, state_from=None)) is None  # trained from the seeds
    unknown_load = dataclasses.replace(bad_load, difference=dataclasses.replace(bad_load.difference, got_bits="0x1"))
    assert explain(unknown_load, trained) is None  # what the load did wrong is not known either


def test_a_train_op_names_the_load_its_state_came_from() -> None:
    """The last load of the job before it; none after a restart (fresh ranks train from the seeds)."""
    from properties.model.case import Case, Op
    ops = (Op("train", None, 1), Op("save", "a", 1), Op("load", "a", 1), Op("train", None, 2), Op("train", None, 3),
           Op("restart"), Op("train", None, 1))
    case = Case("P-RESUME", "paddle-dcp", (), {}, {}, ops)
    assert [case.state_source(i) for i in (0, 3, 4, 6)] == [None, 2, 2, None]


def _lifecycle(loads: list[tuple[str, dict]]):
    """A P-LIFECYCLE job: saves of versions 0..2 under s0..s2, then loads by name, each giving the given state."""
    from properties.check.history import check_history
    from properties.model.case import Case, Op, TensorCase
    from properties.model.outcome import OpRecord, Outcome

    tensors = (TensorCase("a", "F32", (2, 3), 1), TensorCase("b", "I8", (4,), 2))
    saves = [Op("save", f"s{v}", v) for v in range(3)]
    ops = (*saves, *(Op("load", name, int(name[1])) for name, _ in loads))
    case = Case("P-LIFECYCLE", "paddle-dcp", tensors, {}, {}, ops, {"same_dir": True})
    recs = [OpRecord(i, "save", f"s{i}") for i in range(3)]
    recs += [OpRecord(3 + i, "load", name, loaded={0: state}) for i, (name, state) in enumerate(loads)]
    return case, check_history(case, Outcome("paddle-dcp", recs))


def test_a_load_that_serves_an_earlier_load_s_wrong_state_again_is_the_cache_s() -> None:
    """A cache keyed without the version serves every later load the state the first load gave; when that state was
    wrong (another bug mangled it), later loads give none of the versions, and the history names the load they
    repeat: the version-cache finding explains them, the first wrong state stays its own bug's (here unknown)."""
    import numpy as np

    from properties.triage.known import explanations
    from reference.dtypes import dtype
    from reference.tensor import Tensor

    case, _ = _lifecycle([])
    first = {"a": case.expected(0, "load")["a"], "b": Tensor(dtype("I8"), np.zeros(4, np.uint8))}  # b zeroed
    case, judgement = _lifecycle([("s0", first), ("s2", first), ("s1", first)])
    wrong = [a for a in judgement.anomalies if a.kind == "loaded-none-of-versions"]
    assert [(a.at.op, a.repeats_load) for a in wrong] == [(3, None), (4, 3), (5, 4)]
    assert [len(a.differences) for a in wrong] == [1, 2, 2]  # every difference kept, not only those shown
    assert "the state op 3 gave" in judgement.details[[d.startswith("op 4") for d in judgement.details].index(True)]
    known = read_known(REGRESSIONS)
    cache = [k for k in known if k.case_file == "paddle-dcp-version-cache.json"]
    explained = explanations(cache, "paddle-dcp", dataclasses.replace(judgement, anomalies=tuple(wrong[1:])))
    assert explained == ["paddle-dcp-version-cache.json"]
    assert explanations(cache, "paddle-dcp", judgement) is None  # op 3's zeros are no cache's
    other = {"a": first["a"], "b": Tensor(dtype("I8"), np.ones(4, np.uint8))}
    _, judgement = _lifecycle([("s0", first), ("s2", other)])
    assert [a.repeats_load for a in judgement.anomalies if a.kind == "loaded-none-of-versions"] == [None, None]


def test_a_load_that_gave_no_version_is_known_by_its_parts() -> None:
    """A state that is none of the versions, wrong only in tensors a known finding explains as that load's tensor
    differences (a flattened tensor of unaligned pieces read back wrong), is that finding's; not where one part is
    unexplained, even one past the lines a report shows."""
    from properties.check.anomalies import SHOWN, LoadedNoVersion
    from properties.triage.known import explanations

    at = At(3, "load", "s1", 2, ("sharded_weight",))
    flat = TensorDiffers("P-LIFECYCLE", None, 0, BitsDiffer("model/w", 3, 4, (1,), "0x7f", "0x00", "127", "0"),
                         layout="flat-unaligned")
    mixed = LoadedNoVersion("P-LIFECYCLE", at, (1,), 1, (flat, dataclasses.replace(flat, rank=1)))
    known = [k for k in read_known(REGRESSIONS) if k.case_file == "paddle-dcp-flat-cross-rank-load.json"]
    assert explanations(known, "paddle-dcp", judged([mixed])) == ["paddle-dcp-flat-cross-rank-load.json"]
    boxed = dataclasses.replace(flat, layout="flat")  # pieces that are boxes: not that bug
    assert explanations(known, "paddle-dcp", judged([dataclasses.replace(mixed, differences=(flat, boxed))])) is None
    hidden = dataclasses.replace(mixed, differences=(flat,) * SHOWN + (boxed,))  # the unexplained one not rendered
    assert len(hidden.lines()) == SHOWN + 1
    assert explanations(known, "paddle-dcp", judged([hidden])) is None


def test_a_resumed_run_that_trained_on_a_known_bad_load_is_that_bug_s() -> None:
    """A resumed run that differs because the load it resumed from zeroed a dist tensor in a world of one (known)
    is that bug's, difference by difference; a difference from the seeds, or on a rank the load got right, is not."""
    from properties.check.anomalies import LoadedNoVersion, ResumedRunDiffers
    from properties.triage.known import explanations

    zeros = BitsDiffer("master/w", 2, 2, (0,), "0xbf485189", "0x00000000", "-0.78", "0.0")
    load = LoadedNoVersion("P-RESUME", At(3, "load", "step-1", 1, ("dist_from_local", "sharded_weight")), (1,), 1,
                           (TensorDiffers("P-RESUME", None, 0, zeros),))
    trained = TensorDiffers("P-RESUME", None, 0, BitsDiffer("master/w", 2, 2, (0,), "0x3f80", "0x3f81", "1.0", "1.0"),
                            state_from=3)
    resumed = ResumedRunDiffers("P-RESUME", At(4, "train", None, 1), 1, (trained,))
    known = [k for k in read_known(REGRESSIONS) if k.case_file == "paddle-dcp-moe-ep2-to-ep1-dist-tensor-zeros.json"]
    assert explanations(known, "paddle-dcp", judged([load, resumed])) == \
        ["paddle-dcp-moe-ep2-to-ep1-dist-tensor-zeros.json"]
    for part in (dataclasses.replace(trained, state_from=None), dataclasses.replace(trained, rank=1)):
        other = dataclasses.replace(resumed, differences=(trained, part))
        assert explanations(known, "paddle-dcp", judged([load, other])) is None


def test_a_load_after_a_failed_load_of_the_same_processes_says_so() -> None:
    """The oracle marks a failed load that follows a failed load of the same processes (what the first left in a
    module-global may have broken it), not one after a restart between; the poisoned-metadata finding then explains
    whatever such a safetensors load raises, on every rank or on one while the others wait."""
    from properties.check.anomalies import SutError, op_failure
    from properties.check.oracle import check_oracle, failed_load_before
    from properties.model.case import Case, Op
    from properties.model.outcome import OpRecord, Outcome
    from properties.triage.known import explanations

    ops = (Op("save", "s", 0), Op("load", "s", 0), Op("load", "s", 0), Op("restart"), Op("load", "s", 0))
    case = Case("P-REPEAT", "paddle-dcp", (), {}, {}, ops, {"format": "safetensors"})
    recs = [OpRecord(0, "save", "s"), OpRecord(1, "load", "s", ok=False, error_type="ValueError", error="x"),
            OpRecord(2, "load", "s", ok=False, error_type="KeyError", error="rank 1: ('w', '1_0.safetensors')"),
            OpRecord(3, "restart", None), OpRecord(4, "load", "s", ok=False, error_type="KeyError", error="y")]
    assert [failed_load_before(recs, i) for i in range(5)] == [False, False, True, True, False]
    j = check_oracle(case, Outcome("paddle-dcp", recs))
    assert [(a.at.op, a.after_failed_load) for a in j.anomalies] == [(1, False), (2, True), (4, False)]
    known = [k for k in read_known(REGRESSIONS) if k.case_file == "paddle-dcp-failed-load-poisons-next.json"]
    poisoned = next(a for a in j.anomalies if a.at.op == 2)
    hung = op_failure("P-REPEAT", poisoned.at, SutError("KeyError", "rank 1: ('w', '1_0.safetensors')", "hang"),
                      after_failed_load=True)
    for anomaly in (poisoned, hung):
        assert explanations(known, "paddle-dcp", judged([anomaly])) == ["paddle-dcp-failed-load-poisons-next.json"]
    assert explanations(known, "paddle-dcp", judged([dataclasses.replace(poisoned, after_failed_load=False)])) is None


def test_a_load_that_fails_as_an_earlier_load_of_another_checkpoint_failed_is_the_cache_s() -> None:
    """A corruption breaks checkpoint s0 and its load fails (excused); a cache keyed without the version then makes
    the load of s1, saved later, fail with s0's very error: the history names the load it repeats, and the
    version-cache finding explains it. A load of s1 that fails otherwise stays a finding."""
    from properties.check.history import check_history
    from properties.model.case import Case, Op
    from properties.model.outcome import OpRecord, Outcome
    from properties.triage.known import explanations

    ops = (Op("save", "s0", 0), Op("corrupt"), Op("load", "s0", 0), Op("save", "s1", 1), Op("load", "s1", 1))
    case = Case("P-LIFECYCLE", "paddle-dcp", (), {}, {}, ops, {"same_dir": True})
    error = "rank 0: No module named 'paddle.distributed.fmex_checkpoint'"

    def judge(second: str):
        recs = [OpRecord(0, "save", "s0"), OpRecord(1, "corrupt", None),
                OpRecord(2, "load", "s0", ok=False, error_type="ModuleNotFoundError", error=error),
                OpRecord(3, "save", "s1"),
                OpRecord(4, "load", "s1", ok=False, error_type="ModuleNotFoundError", error=second)]
        return check_history(case, Outcome("paddle-dcp", recs))

    known = [k for k in read_known(REGRESSIONS) if k.case_file == "paddle-dcp-version-cache.json"]
    repeated = judge(error)
    assert [(a.kind, a.at.op, a.repeats_failure) for a in repeated.anomalies] == [("acknowledged-lost", 4, 2)]
    assert explanations(known, "paddle-dcp", repeated) == ["paddle-dcp-version-cache.json"]
    other = judge("rank 0: No module named 'paddle.distributed.flex_checkpoint.x'")
    assert [a.repeats_failure for a in other.anomalies] == [None]
    assert explanations(known, "paddle-dcp", other) is None
