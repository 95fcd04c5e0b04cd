"""Root-cause buckets (properties.triage.buckets) and campaigns that keep exploring: one finding per bucket, later cases
of a bucket counted, known bugs counted apart, exit 1 only for new buckets."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from hypothesis.database import DirectoryBasedExampleDatabase

from harness.cli import main
from properties.check.anomalies import At, OpFailed, RankDied, SutError, TensorDiffers
from properties.model.case import Case, Op, TensorCase
from properties.triage.buckets import Bucket, abstract, bucket_of, innermost_frame
from reference.layout import Mesh, replicated
from reference.tensor import BitsDiffer, DtypeDiffers

TB = '''Traceback (most recent call last):
  File "/repo/harness/rankops.py", line 108, in op
  File "/py/site-packages/paddle/distributed/flex_checkpoint/dcp/load_state_dict.py", line 831, in load_state_dict
  File "/py/site-packages/paddle/distributed/flex_checkpoint/dcp/reshard_comm.py", line 262, in communicate
  File "/usr/lib/python3.11/json/decoder.py", line 9, in decode
RuntimeError: boom'''
LOAD = At(1, "load", "step-0")


def _case(world_save: int = 2, world_load: int = 2, **options) -> Case:
    tensors = (TensorCase("w", "F32", (4,), 1), TensorCase("s", "F32", (), 2))
    save = {t.name: replicated(Mesh((world_save,))).to_json() for t in tensors}
    load = {t.name: replicated(Mesh((world_load,))).to_json() for t in tensors}
    return Case("P-ROUNDTRIP", "reference", tensors, save, load, (Op("save", "step-0"), Op("load", "step-0")), options)


def test_messages_are_abstracted_and_the_innermost_sut_frame_found() -> None:
    assert abstract("rank 1: cannot read '/tmp/x/step-3/1_0.distcp' at offset 4096 (0x1f)") == \
        "rank <n>: cannot read <name> at offset <n> (<hex>)"
    assert abstract("key `model.w` missing in /tmp/abc/def") == "key <name> missing in <path>"
    assert innermost_frame(TB) == "paddle/distributed/flex_checkpoint/dcp/reshard_comm.py:communicate"
    assert innermost_frame("no traceback") is None


def test_names_a_run_generates_are_abstracted_and_dtypes_kept() -> None:
    """One bug met through another generated tensor name, temp directory or uuid is one bucket; a dtype name
    (float8_e5m2, bfloat16) carries meaning and stays."""
    messages = [f"Variable [ eager_tmp_{i} ] of float8_e5m2 read as int8 from {tmp} ({uid})" for i, tmp, uid in (
        (0, "tmpab12cd_9", "3f2a9c1e-1b2c-4d5e-8f90-0123456789ab"),
        (17, "tmpzz99yy00", "00000000-1111-2222-3333-444444444444"))]
    assert abstract(messages[0]) == abstract(messages[1]) == \
        "Variable [ eager_tmp_<n> ] of float8_e5m2 read as int8 from <tmp> (<id>)"
    assert abstract("linear_3.w_0 digest 9f86d081884c7d65 bfloat16") == "linear_<n>.w_<n> digest <hex> bfloat16"
    errors = [OpFailed("P-ROUNDTRIP", LOAD, SutError("ValueError", m)) for m in messages]
    assert bucket_of(_case(), errors[:1]) == bucket_of(_case(), errors[1:])


def test_one_error_is_one_bucket_whatever_the_numbers_names_and_rule() -> None:
    a = OpFailed("P-ROUNDTRIP", LOAD, SutError("KeyError", "rank 0: 'model/w' not in step-3"))
    b = OpFailed("P-NOLOSS", At(4, "load", None), SutError("KeyError", "rank 1: 'ema/x' not in step-12"))
    c = OpFailed("P-ROUNDTRIP", LOAD, SutError("ValueError", "rank 0: 'model/w' not in step-3"))
    ba, bb, bc = (bucket_of(_case(), [x], {1: TB, 4: TB}) for x in (a, b, c))
    assert ba == bb and ba.covers(bb) and not ba.covers(bc)
    assert "reshard_comm.py:communicate" in ba.title
    died = [bucket_of(_case(), [RankDied("P-ROUNDTRIP", LOAD, SutError("crash", m, "crash"))]) for m in
            ("rank 1 died during op 1; logs: a", "rank 0 died during op 3 (ranks [1] still busy); logs: b")]
    assert died[0] == died[1]  # the harness's own words about a death do not split it


def test_wrong_bits_split_on_structure_and_code_path_not_on_values() -> None:
    flip = TensorDiffers("P-ROUNDTRIP", LOAD, 0, BitsDiffer("w", 1, 4, (3,), "0x3f800000", "0x3f800001", "1", "1"))
    zero = TensorDiffers("P-ROUNDTRIP", LOAD, 0, BitsDiffer("w", 4, 4, (0,), "0x3f800000", "0x00000000", "1", "0"))
    dtype = TensorDiffers("P-ROUNDTRIP", LOAD, 0, DtypeDiffers("w", "F8_E5M2", "I8"))
    plain, zeros, lost_dtype = (bucket_of(_case(), [x]) for x in (flip, zero, dtype))
    assert plain.covers(zeros) and "zeros" in zeros.title  # the value pattern is shown, it splits nothing
    assert not plain.covers(lost_dtype) or lost_dtype.features >= plain.features
    assert lost_dtype.features == {"dtype:F8_E5M2->I8"}
    resharded = bucket_of(_case(2, 1), [flip])
    assert "world-change" in resharded.title and plain.covers(resharded)  # shown, not split on
    assert not Bucket("c", frozenset({"async"})).covers(Bucket("c", frozenset({"world-change"})))


def test_a_campaign_finds_both_bugs_of_a_sut_and_exits_by_new_buckets(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    code = main(["fuzz", "--sut", "tests.suts.buggy:TwoBugsSut", "--ranks", "2", "--time", "20", "--out", str(out),
                 "--property", "P-ROUNDTRIP", "--property", "P-EDGE", "--seed", "3", "--launch", "in-process"])
    assert code == 1, capsys.readouterr()
    summary = json.loads((out / "summary.json").read_text())
    new = [b for b in summary["buckets"] if b["status"] == "new"]
    titles = sorted(b["title"].split(":")[0] for b in new)
    assert titles == ["error", "silent-corruption"], new  # the campaign went on after the first finding
    assert sum(b["cases"] for b in new) >= len(new)
    assert set(summary["seconds_per_property"]) == {"P-ROUNDTRIP", "P-EDGE"}
    assert len(list((out / "findings").glob("*.json"))) == 2
    # Hypothesis's observations per property: it drew at least the cases judged, and shrank a failure.
    seen = summary["hypothesis_per_property"]
    assert all(seen[p]["test_cases"] >= n for p, n in summary["cases_run"].items())
    assert sum(seen[p]["while_shrinking"] for p in seen) > 0 and sum(seen[p]["failed"] for p in seen) > 0
    assert "| drawn (gave up) |" in (out / "report.md").read_text()


def test_known_bugs_are_counted_apart_and_exit_1_only_when_asked(tmp_path: Path, capsys) -> None:
    known = tmp_path / "known"
    known.mkdir()
    (known / "flips.json").write_text(json.dumps({
        "sut": "tests.suts.buggy:FlipsLastElementSut", "verdict": "silent-corruption",
        "signature": {"anomaly": "tensor-differs", "op_kind": "load"}}))
    argv = ["fuzz", "--sut", "tests.suts.buggy:FlipsLastElementSut", "--ranks", "2", "--time", "4", "--out",
            str(tmp_path / "out"), "--property", "P-ROUNDTRIP", "--seed", "1", "--launch", "in-process",
            "--known", str(known)]
    assert main(argv) == 0, capsys.readouterr()
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert [b["status"] for b in summary["buckets"]] == ["known"] and summary["buckets"][0]["cases"] > 0
    assert main([*argv, "--fail-on-known"]) == 1
    assert main([*argv[:-2], "--no-known"]) == 1  # the same bug, new without a known set


def test_a_corpus_carries_buckets_and_examples_to_the_next_campaign(tmp_path: Path, capsys) -> None:
    corpus = tmp_path / "corpus"
    argv = ["fuzz", "--sut", "tests.suts.buggy:TwoBugsSut", "--ranks", "2", "--time", "15", "--property",
            "P-ROUNDTRIP", "--property", "P-EDGE", "--launch", "in-process", "--corpus", str(corpus)]
    assert main([*argv, "--out", str(tmp_path / "night1"), "--seed", "3"]) == 1, capsys.readouterr()
    stored = sorted((corpus / "buckets" / "tests.suts.buggy_TwoBugsSut").glob("*.json"))
    assert len(stored) == 2
    # Hypothesis's own database keeps the examples of each shrunk failure, under a key of the SUT and property.
    database = DirectoryBasedExampleDatabase(corpus / "hypothesis")
    shrunk_by = {json.loads(p.read_text())["case"]["property"] for p in stored}
    for prop in shrunk_by:
        assert list(database.fetch(hashlib.sha256(f"tests.suts.buggy:TwoBugsSut|{prop}".encode()).digest()))
    # A CI job reading it as a shared corpus writes only to its own.
    shared_files = sorted(p for p in corpus.rglob("*"))
    ci = [str(tmp_path / "ci") if a == str(corpus) else "3" if a == "15" else a for a in argv]
    assert main([*ci, "--corpus-readonly", str(corpus), "--out", str(tmp_path / "ci-out"), "--seed", "5"]) == 0, (
        capsys.readouterr())
    assert sorted(p for p in corpus.rglob("*")) == shared_files
    # The next night: both bugs are replayed first and still fail; nothing new, so exit 0.
    assert main([*argv, "--out", str(tmp_path / "night2"), "--seed", "4"]) == 0, capsys.readouterr()
    summary = json.loads((tmp_path / "night2" / "summary.json").read_text())
    assert sorted(r["status"] for r in summary["corpus"]) == ["still failing", "still failing"]
    assert not [b for b in summary["buckets"] if b["status"] == "new"]
    # Fixed upstream: the same case on a SUT without the bug passes.
    fixed = json.loads(stored[0].read_text())
    fixed["case"]["sut"] = "reference"
    (corpus / "buckets" / "reference").mkdir()
    (corpus / "buckets" / "reference" / stored[0].name).write_text(json.dumps(fixed))
    assert main(["fuzz", "--sut", "reference", "--ranks", "2", "--time", "2", "--property", "P-ROUNDTRIP",
                 "--launch", "in-process", "--corpus", str(corpus), "--out", str(tmp_path / "fixed")]) == 0
    rows = json.loads((tmp_path / "fixed" / "summary.json").read_text())["corpus"]
    assert [r["status"] for r in rows] == ["passing"]


def test_a_broken_corpus_file_is_named(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "corpus" / "buckets" / "reference"
    bad.mkdir(parents=True)
    (bad / "x.json").write_text("{not json")
    assert main(["fuzz", "--sut", "reference", "--time", "1", "--launch", "in-process", "--corpus",
                 str(tmp_path / "corpus"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "x.json" in err and "not a bucket case" in err and err.count("\n") == 1
