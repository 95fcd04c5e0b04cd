"""Every anomaly type renders its detail line and round-trips through JSON; judgements are the rendered lines of
their anomalies."""

from __future__ import annotations

import json

import pytest

from properties.check.anomalies import (
    TYPES,
    AcknowledgedLost,
    Anomaly,
    At,
    CorruptionRedirected,
    CoverViolated,
    FailedAfterFault,
    FaultKilledRank,
    ListedIncomplete,
    LoadedNoVersion,
    LoadedUnsaved,
    LoadStopped,
    NoCompleteCheckpoint,
    OlderCameBack,
    OpFailed,
    OpsMissing,
    OutcomeDiffers,
    PersistenceOrder,
    RankDied,
    RankHung,
    ReadPlanViolated,
    ResumedRunDiffers,
    ResumeLost,
    RotationDeletedLast,
    SaveAfterFaultLost,
    SutError,
    TensorDiffers,
    UnclearError,
    WrongVersion,
    field_names,
    from_json,
    judged,
)
from reference.tensor import BitsDiffer, DtypeDiffers, Missing, ShapeDiffers, Unexpected

LOAD, SAVE = At(4, "load", None), At(2, "save", "step-1")
ERR = SutError("CheckpointIncomplete", "rank 0: no commit marker")
HANG = SutError("hang", "rank 1 did not finish op 2", "hang")
BITS = BitsDiffer("model/w", 1, 4, (0, 1), "0x3f80", "0x0000", "1.0", "0.0")
DIFFS = (TensorDiffers("P-ATOMIC", None, 0, BITS), TensorDiffers("P-ATOMIC", None, 1, Missing("ema/w")))

EXAMPLES: list[tuple[Anomaly, str]] = [
    (OpFailed("P-EDGE", SAVE, ERR), "op 2 (save step-1): CheckpointIncomplete: rank 0: no commit marker"),
    (OpFailed("P-DIFF", None, SutError("KeyError", "'w'")), "KeyError: 'w'"),
    (RankHung("P-LIVENESS", SAVE, HANG), "op 2 (save step-1): hang: rank 1 did not finish op 2"),
    (RankDied("P-ATOMIC", SAVE, SutError("crash", "rank 0 died", "crash")), "op 2 (save step-1): crash: rank 0 died"),
    (FailedAfterFault("P-ATOMIC", SAVE, ERR),
     "after the fault: op 2 (save step-1): CheckpointIncomplete: rank 0: no commit marker"),
    (FaultKilledRank("P-LIVENESS", SAVE, SutError("crash", "rank 0 died", "crash"), "error"),
     "a error fault killed a rank instead of an error: op 2 (save step-1): crash: rank 0 died"),
    (LoadStopped("P-LIVENESS", LOAD, HANG), "op 4 (load latest): rank 1 did not finish op 2"),
    (SaveAfterFaultLost("P-ATOMIC", LOAD, ERR, 2, 5),
     "the save after the fault does not load: op 4 (load latest): CheckpointIncomplete: rank 0: no commit marker"),
    (AcknowledgedLost("P-NOLOSS", LOAD, ERR, 1, 2), "acknowledged version 1 (op 2) no longer loads: op 4 (load "
                                                    "latest): CheckpointIncomplete: rank 0: no commit marker"),
    (UnclearError("P-CORRUPT", LOAD, ERR), "unclear error about an incomplete or damaged checkpoint: op 4 (load "
                                           "latest): CheckpointIncomplete: rank 0: no commit marker"),
    (LoadedUnsaved("P-ATOMIC", LOAD),
     "op 4 (load latest): loaded data although no checkpoint was ever acknowledged or attempted"),
    (OlderCameBack("P-ATOMIC", LOAD, 1, 2, 0, 0),
     "op 4 (load latest): an older checkpoint came back instead of acknowledged version 1 (op 2)"),
    (CorruptionRedirected("P-CORRUPT", LOAD, 1, 2, 0, 0), "op 4 (load latest): after a corruption, the older "
                                                          "version 0 (op 0) loaded silently instead of acknowledged "
                                                          "version 1 (op 2)"),
    (TensorDiffers("P-ROUNDTRIP", LOAD, 1, BITS), "op 4 (load latest), rank 1: model/w: 1 of 4 elements differ; "
                                                  "first at index [0, 1]: expected 0x3f80 (1.0), got 0x0000 (0.0)"),
    (TensorDiffers("P-DIFF", LOAD, 0, DtypeDiffers("b", "F32", "I32"), "reference"),
     "op 4 (load latest), rank 0 vs reference: b: dtype I32 != expected F32"),
    (TensorDiffers("P-DIFF", None, None, ShapeDiffers("b", (3,), (4,))), "b: shape (4,) != expected (3,)"),
    (TensorDiffers("P-DIFF", None, 0, Unexpected("extra")), "rank 0: extra: unexpected"),
    (LoadedNoVersion("P-ATOMIC", LOAD, (1, 2), 1, DIFFS),
     "op 4 (load latest): loaded state is none of versions [1, 2] (diff against version 1):\n"
     "rank 0: model/w: 1 of 4 elements differ; first at index [0, 1]: expected 0x3f80 (1.0), got 0x0000 (0.0)\n"
     "rank 1: ema/w: missing"),
    (WrongVersion("P-REPEAT", At(4, "load", "step-0"), 0, 1, True, False, DIFFS[:1]),
     "op 4 (load step-0): gave version 1 whole, the newest saved, instead of version 0:\n"
     "rank 0: model/w: 1 of 4 elements differ; first at index [0, 1]: expected 0x3f80 (1.0), got 0x0000 (0.0)"),
    (WrongVersion("P-REPEAT", At(4, "load", "step-2"), 2, 0, False, True, ()),
     "op 4 (load step-2): gave version 0 whole, which an earlier load of this job read, instead of version 2:"),
    (ResumedRunDiffers("P-RESUME", At(3, "train", None), 3, DIFFS[1:]),
     "op 3 (train latest): the resumed run differs from the uninterrupted run at step 3:\nrank 1: ema/w: missing"),
    (RotationDeletedLast("P-NOLOSS", LOAD, 0, 0, ("step-1", "step-2")),
     "op 4 (load latest): acknowledged version 0 (op 0) was rotated away, and no newer checkpoint loads either "
     "(step-1, step-2): the rotation deleted the last complete checkpoint while its successor was incomplete"),
    (ResumeLost("P-NOLOSS", LOAD, ERR, 0, 0, "step-0", 3),
     "op 4 (load latest): resume lost: latest fails although acknowledged version 0 (step-0, op 0) is intact (op "
     "3): CheckpointIncomplete: rank 0: no commit marker"),
    (ListedIncomplete("P-ATOMIC", At(3, "load", "step-1"), ERR, 2),
     "op 3 (load step-1): the SUT lists step-1 as complete (after op 2) but it does not load: CheckpointIncomplete: "
     "rank 0: no commit marker"),
    (NoCompleteCheckpoint("P-NOLOSS", At(2, "rotate", None), 0, 0, ()),
     "op 2 (rotate latest): the job is left without a complete checkpoint although version 0 (op 0) was "
     "acknowledged: the SUT lists no finished checkpoint"),
    (NoCompleteCheckpoint("P-NOLOSS", At(2, "rotate", None), 0, 0, ("step-0", "step-1")),
     "op 2 (rotate latest): the job is left without a complete checkpoint although version 0 (op 0) was "
     "acknowledged: none of step-0, step-1 loads afterwards"),
    (CoverViolated("P-ROUNDTRIP", SAVE, "w", "MissingSlices", "tensor 'w': element 4 (flat index) is in no saved "
                   "slice"), "op 2 (save step-1): tensor 'w': element 4 (flat index) is in no saved slice"),
    (ReadPlanViolated("P-RESHARD", LOAD, 1, "w", "OverlappingSlices", "reads of 'w' for the piece at [2, 0]: "
                      "element 3 is saved twice"),
     "op 4 (load latest): rank 1: reads of 'w' for the piece at [2, 0]: element 3 is saved twice"),
    (OutcomeDiffers("P-DIFF", LOAD, None, ERR),
     "op 4 (load latest): SUT succeeded; reference CheckpointIncomplete: rank 0: no commit marker"),
    (OutcomeDiffers("P-DIFF", LOAD, ERR, None),
     "op 4 (load latest): SUT CheckpointIncomplete: rank 0: no commit marker; reference succeeded"),
    (OpsMissing("P-ATOMIC", 3, 5), "only 3 of 5 ops ran"),
    (PersistenceOrder("P-ATOMIC", At(0, "save", "step-0"), "record-before-data", "step-N/N.metadata",
                      "step-N/N_N.distcp", "step-N/N_N.distcp: named before it is written",
                      ("#3 write: write step-0/0.metadata @0 +10 bytes",
                       "#7 write: write step-0/0_0.distcp @0 +8 bytes"), 1),
     "op 0 (save step-0): a power loss may lose it: step-N/N.metadata vouches for step-N/N_N.distcp before it is "
     "durable (step-N/N_N.distcp: named before it is written) (and 1 more): #3 write: write step-0/0.metadata @0 +10 "
     "bytes; #7 write: write step-0/0_0.distcp @0 +8 bytes"),
    (PersistenceOrder("P-ATOMIC", At(0, "save", "step-0"), "not-durable-at-return", "", "step-N/N_N.distcp",
                      "step-N/N_N.distcp: data written, not fsynced",
                      ("#7 write: write step-0/0_0.distcp @0 +8 bytes",)),
     "op 0 (save step-0): a power loss may lose it: step-N/N_N.distcp is not durable when the save returns "
     "(step-N/N_N.distcp: data written, not fsynced): #7 write: write step-0/0_0.distcp @0 +8 bytes"),
]


def test_every_anomaly_type_has_an_example() -> None:
    assert {a.kind for a, _ in EXAMPLES} == set(TYPES)


@pytest.mark.parametrize("anomaly, text", EXAMPLES, ids=[f"{a.kind}-{i}" for i, (a, _) in enumerate(EXAMPLES)])
def test_renders_and_round_trips(anomaly: Anomaly, text: str) -> None:
    assert anomaly.render() == text
    assert "\n".join(anomaly.lines()) == text
    data = json.loads(json.dumps(anomaly.to_json()))
    assert data["anomaly"] == anomaly.kind and data["verdict"] == anomaly.verdict.value
    assert from_json(data) == anomaly
    assert set(data) <= field_names(type(anomaly))


def test_a_judgement_is_the_lines_of_its_anomalies() -> None:
    first, second = DIFFS
    j = judged([first, second])
    assert j.details == (first.render(), second.render()) and j.anomalies == (first, second)
    assert (j.property, j.verdict.value) == ("P-ATOMIC", "silent-corruption")
    with pytest.raises(ValueError, match="agree"):
        judged([first, OpsMissing("P-ATOMIC", 1, 2)])


def test_verdicts_follow_the_facts() -> None:
    assert OutcomeDiffers("P-DIFF", LOAD, ERR, None).verdict.value == "loud-failure"
    assert OutcomeDiffers("P-DIFF", LOAD, None, ERR).verdict.value == "silent-corruption"
    assert LoadStopped("P-LIVENESS", LOAD, HANG).verdict.value == "hang"
    assert FailedAfterFault("P-ATOMIC", SAVE, HANG).verdict.value == "crash"
    assert FailedAfterFault("P-ATOMIC", SAVE, ERR).verdict.value == "loud-failure"
