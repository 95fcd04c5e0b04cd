"""Judge one case's outcome against the oracle: every load must equal the reference's slice of the expected
version bitwise, every save must succeed, and what was written must cover each tensor exactly once."""

from __future__ import annotations

import dataclasses

from properties.check.anomalies import (
    At,
    OpsMissing,
    OutcomeDiffers,
    SutError,
    TensorDiffers,
    WrongVersion,
    judged,
    op_failure,
)
from properties.check.states import compare_states, cover_violations, plan_violations
from properties.model.case import Case
from properties.model.outcome import OpRecord, Outcome
from properties.model.verdicts import Judgement, Verdict, worst
from reference.engine import local_tensors
from reference.layout import layout_kind
from reference.master_weights import restored
from reference.tensor import differences
from reference.training import seen_live


def at(case: Case, rec: OpRecord) -> At:
    return At(rec.index, rec.kind, rec.name, case.op_world(rec.index), case.tensor_kinds(), case.storage_format(),
              case.op_api(rec.index))


def sut_error(rec: OpRecord) -> SutError:
    return SutError(rec.error_type, rec.error, rec.failure)


def follows_failed_save(records: list[OpRecord], index: int) -> bool:
    """Whether op ``index`` is a failed load of a checkpoint whose save failed (for "latest", the last save before
    it): its failure is that save's, already judged, not a bug of its own — so a known finding that explains the
    save's failure explains the case."""
    rec = records[index]
    if rec.ok or rec.kind != "load":
        return False
    saves = [r for r in records[:index] if r.kind == "save" and (rec.name is None or r.name == rec.name)]
    return bool(saves) and not saves[-1].ok


def follows_failed_train(records: list[OpRecord], index: int) -> bool:
    """Op ``index`` is a save or a train of a job whose training failed before it, with no load or restart between:
    the job died in that train (a SUT that trains itself), so what its script asks of it later is not judged;
    the failed train is."""
    if records[index].kind not in ("save", "train"):
        return False
    dead = False
    for rec in records[:index]:
        if rec.kind in ("load", "restart"):
            dead = False
        dead = (dead or (rec.kind == "train" and not rec.ok)) and not rec.restarted  # fresh ranks start over
    return dead


def failed_load_before(records: list[OpRecord], index: int) -> bool:
    """An earlier load of the same processes failed: no restart between it and op ``index`` (a restart op, or an op
    after which the harness replaced the ranks), so what it left in them may still be there."""
    failed = False
    for rec in records[:index]:
        failed = (failed or (rec.kind == "load" and not rec.ok)) and not (rec.restarted or rec.kind == "restart")
    return failed


def check_oracle(case: Case, outcome: Outcome) -> Judgement:
    prop = case.property
    results: list[Judgement] = []
    for op_case, rec in zip(case.ops, outcome.records):
        if follows_failed_save(outcome.records, rec.index) or follows_failed_train(outcome.records, rec.index):
            continue
        if not rec.ok:
            results.append(judged([op_failure(prop, at(case, rec), sut_error(rec),
                                              rec.kind == "load" and failed_load_before(outcome.records, rec.index))]))
            continue
        if rec.kind == "save" and rec.written:
            cover = cover_violations(prop, rec.written)
            if cover:
                results.append(judged([dataclasses.replace(c, at=at(case, rec)) for c in cover]))
        if rec.kind == "load" and rec.plans:
            plan = plan_violations(prop, case, rec, _saved_by(outcome.records, rec))
            if plan:
                results.append(judged([dataclasses.replace(v, at=at(case, rec)) for v in plan]))
        if rec.kind in ("load", "train"):  # a train record holds the live state it reached
            problems = tensor_differences(case, op_case.version, rec)
            wrong = whole_version(case, rec, problems, outcome.records) if problems and rec.kind == "load" else None
            if wrong is not None:
                version_of_rest, broken = wrong
                results.append(judged([version_of_rest, *(dataclasses.replace(d, at=at(case, rec)) for d in broken)]))
            elif problems:
                results.append(judged([dataclasses.replace(d, at=at(case, rec)) for d in problems]))
    if len(outcome.records) < len(case.ops) and not results:
        results.append(judged([OpsMissing(prop, len(outcome.records), len(case.ops))]))
    return worst(results) or Judgement(prop, Verdict.PASS)


def _saved_by(records: list[OpRecord], load: OpRecord) -> OpRecord | None:
    """The save a load reads: the last one of its name before it (for "latest", the last save)."""
    saves = [r for r in records[:load.index] if r.kind == "save" and (load.name is None or r.name == load.name)]
    return saves[-1] if saves else None


def tensor_differences(case: Case, version: int, rec: OpRecord) -> list[TensorDiffers]:
    """How what each rank of ``rec`` holds (loaded, or trained to) differs from its slice of ``version`` under the
    layouts the op ran with (empty: bitwise equal); the anomalies name the rank, not the op."""
    which = case.op_layouts(rec.index)
    layouts = case.layouts(which)
    state = case.restored(version, which) if rec.kind == "load" else case.expected(version, which)
    source = case.state_source(rec.index) if rec.kind == "train" else None
    out: list[TensorDiffers] = []
    spec = case.spec() if rec.kind == "train" and case.training is not None else None
    for rank, got in sorted(rec.loaded.items()):
        expected = {n: lt.tensor for n, lt in local_tensors(state, layouts, rank).items()
                    if spec is None or seen_live(spec, n)}
        out += [TensorDiffers(case.property, None, rank, d, layout=op_layout_kind(case, rec.index, d.tensor),
                              state_from=source)
                for d in differences(expected, dict(got))]
    return out


def op_layout_kind(case: Case, index: int, name: str) -> str | None:
    """The layout kind of tensor ``name`` in op ``index``; "flat-unaligned" where the case saves it flat in pieces
    not all boxes, the shape of piece a loader must rebuild through a box (whatever layout the load asks for)."""
    shape = tuple(case.specs().get(name, ("", ()))[1])
    if layout_kind(case.layouts("save").get(name), shape) == "flat-unaligned":
        return "flat-unaligned"
    return layout_kind(case.layouts(case.op_layouts(index)).get(name), shape)


def whole_version(case: Case, rec: OpRecord, problems: list[TensorDiffers], records: list[OpRecord]
                  ) -> tuple[WrongVersion, list[TensorDiffers]] | None:
    """The load gave another version saved before it, bitwise on every rank (newest first), in every tensor that
    matches any version at all: that fact, with the differences of the tensors that match none (their own bug,
    e.g. a dtype the load changed, judged beside it); or None. So one bug that mangles a tensor cannot hide another
    that returns the wrong version of the rest. ``loaded_before``: an earlier load of the same job (no restart
    between) gave that version, as asked or not (a cache keeps what was read, right or wrong)."""
    got, broken = _gave(case, rec)
    if got is None or got == case.ops[rec.index].version:
        return None
    version = case.ops[rec.index].version
    saved = {op.version for op in case.ops[:rec.index] if op.kind == "save"}
    job = max((i for i in range(rec.index) if case.ops[i].kind == "restart"), default=-1)
    earlier = {_gave(case, r)[0] for r in records[job + 1:rec.index] if r.kind == "load" and r.ok}
    rest = [d for d in problems if d.difference.tensor not in broken]
    wrong = WrongVersion(case.property, at(case, rec), version, got, got == max(saved) and got > version,
                         got in earlier, tuple(dataclasses.replace(d, at=None) for d in rest[:8]))
    return wrong, [d for d in problems if d.difference.tensor in broken]


def _gave(case: Case, rec: OpRecord) -> tuple[int | None, set[str]]:
    """The version a load gave back, and the tensors that match no saved version (left out of the comparison): the
    one it asked for, else another saved before it (newest first); None if the tensors that match some version do
    not all match one, or every tensor matches none."""
    version = case.ops[rec.index].version
    saved = sorted({op.version for op in case.ops[:rec.index] if op.kind == "save"} - {version}, reverse=True)
    candidates = [version, *saved]
    differing = {v: {d.difference.tensor for d in tensor_differences(case, v, rec)} for v in candidates}
    broken = set.intersection(*differing.values())
    if broken and broken >= {t.name for t in case.tensors}:
        return None, broken
    return next((v for v in candidates if differing[v] <= broken), None), broken


def mismatch(case: Case, version: int, rec: OpRecord) -> list[str]:
    """Differences between what each rank of ``rec`` holds (loaded, or trained to) and its slice of ``version``
    under the layouts the op ran with, one line each (empty: bitwise equal)."""
    return [d.render() for d in tensor_differences(case, version, rec)]


def check_diff(case: Case, sut: Outcome, ref: Outcome) -> Judgement:
    """P-DIFF: every load must give what the reference engine's own run of the same case gave, as a resume restores
    it where the case's flags saved a weight or its master in place of the other (the reference engine saves
    both: reference.master_weights)."""
    results: list[Judgement] = []
    for rec, ref_rec in zip(sut.records, ref.records):
        if follows_failed_save(sut.records, rec.index):
            continue
        if rec.ok != ref_rec.ok:
            results.append(judged([OutcomeDiffers(case.property, at(case, rec), None if rec.ok else sut_error(rec),
                                                  None if ref_rec.ok else sut_error(ref_rec))]))
            continue
        flags = case.restoring(case.ops[rec.index].version) if rec.kind == "load" else []
        for rank, got in sorted(rec.loaded.items()):
            j = compare_states(case.property, restored(ref_rec.loaded.get(rank, {}), flags), got)
            if not j.ok:
                results.append(judged([dataclasses.replace(a, at=at(case, rec), rank=rank, against="reference",
                                                           layout=op_layout_kind(case, rec.index, a.difference.tensor))
                                       if isinstance(a, TensorDiffers) else a for a in j.anomalies]))
    return worst(results) or check_oracle(case, sut)
