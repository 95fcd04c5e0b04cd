"""Constructed histories for the golden judge tests: many seeded (case, outcome) pairs covering sequences, fault
cases, tensor differences, cover violations and P-DIFF, so that any change to what a user reads (property,
verdict, detail lines) shows as a failing golden test. ``python -m tests.golden_histories`` rewrites the golden file;
do that only where a change of text is intended, and say so in the commit.
"""

from __future__ import annotations

import dataclasses
import json
import random
import sys
from collections.abc import Iterator
from pathlib import Path

from properties.check.history import check_history
from properties.check.oracle import check_diff, check_oracle
from properties.model.case import Case, Op, TensorCase
from properties.model.outcome import OpRecord, Outcome
from properties.model.verdicts import Judgement
from reference.engine import local_tensors
from reference.layout import Box, Mesh, Replicate, Shard, Sharded
from reference.tensor import Tensor

GOLDEN = Path(__file__).parent / "golden" / "judgements.json"
CLEAR = ("CheckpointIncomplete", "CheckpointNotFound", "ChecksumMismatch", "AsyncWriterError")
ERRORS = (*CLEAR, "KeyError", "UnicodeDecodeError", "ValueError")
KINDS = ("save", "save", "save", "load", "load", "load", "wait", "kill", "restart", "rotate", "corrupt", "train")
FAULTS = ("kill", "error", "corrupt", "state", "stall", "kill-when")

# The fields each fault kind needs besides kind and op; the history checker reads only kind and op.
FIELDS = {
    "kill": {"syscall": "write", "k": 1},
    "error": {"syscall": "write", "k": 1, "errno": "EIO"},
    "fsize": {"limit": 64},
    "kill-when": {"delay": 0.0},
    "stall": {"duration": 1.0, "delay": 0.0},
    "state": {"state": {}},
    "corrupt": {"seed": 0, "corruption": "bitflip"},
    "point": {"index": 0},
    "power": {"index": 0},
    "record": {},
}


def _fault(kind: str, op: int) -> dict:
    return {"kind": kind, "op": op, **FIELDS[kind]}


def base_case() -> Case:
    """Two ranks, four small tensors: sharded BF16 and F32, a replicated F32 bias and replicated U8 bytes."""
    mesh = Mesh((2,))
    shard, rep = Sharded(mesh, (Shard(0),)).to_json(), Sharded(mesh, (Replicate(),)).to_json()
    tensors = (TensorCase("model/w", "BF16", (4, 2), 1), TensorCase("model/b", "F32", (3,), 2),
               TensorCase("ema/w", "F32", (4, 2), 3), TensorCase("rng/state", "U8", (8,), 4))
    layout = {"model/w": shard, "model/b": rep, "ema/w": shard, "rng/state": rep}
    return Case("P-ATOMIC", "reference", tensors, layout, layout, (), {}, 0)


BASE = base_case()


def state(version: int) -> dict[int, dict[str, Tensor]]:
    layouts = BASE.layouts("load")
    return {r: {n: lt.tensor for n, lt in local_tensors(BASE.state(version), layouts, r).items()} for r in (0, 1)}


def _loaded(rng: random.Random, versions: list[int]) -> dict[int, dict[str, Tensor]]:
    """A loaded state: some version, a mix of two, or one with a tensor missing, extra, retyped or flipped."""
    a, b = rng.choice(versions), rng.choice(versions)
    shape = rng.random()
    if shape < 0.6:
        return state(a)
    if shape < 0.6:
        return {0: state(a)[0], 1: state(b)[1]}
    out = state(a)
    rank, name = rng.choice((0, 1)), rng.choice(sorted(out[0]))
    tensors = dict(out[rank])
    edit = rng.choice(("missing", "extra", "dtype", "shape", "flip", "flip-all"))
    if edit == "missing":
        del tensors[name]
    elif edit == "extra":
        tensors["extra/t"] = Tensor.empty("F32", (2,))
    elif edit == "dtype":
        tensors[name] = Tensor.empty("I64" if tensors[name].dtype.itemsize == 8 else "U8" if
                                     tensors[name].dtype.itemsize == 1 else "I16" if tensors[name].dtype.itemsize == 2
                                     else "I32", tensors[name].shape)
    elif edit == "shape":
        tensors[name] = Tensor.empty(tensors[name].dtype, (tensors[name].bits.size + 1,))
    else:
        bits = tensors[name].bits.copy().reshape(-1)
        count = bits.size if edit == "flip-all" else 1
        for i in rng.sample(range(bits.size), count):
            bits[i] ^= 1
        tensors[name] = Tensor(tensors[name].dtype, bits.reshape(tensors[name].shape))
    out[rank] = tensors
    return out


def _record(rng: random.Random, index: int, op: Op, versions: list[int]) -> OpRecord:
    rec = OpRecord(index, op.kind, op.name)
    roll = rng.random()
    if op.kind in ("load", "train") and roll < 0.6:
        rec.loaded = _loaded(rng, versions)
    elif roll < 0.75 and op.kind not in ("load", "train"):
        pass
    elif roll < 0.9:
        error = rng.choice(CLEAR) if rng.random() < 0.6 else rng.choice(ERRORS)
        rec.ok, rec.error_type, rec.error = False, error, f"rank {rng.choice((0, 1))}: e{index}"
    else:
        failure = rng.choice(("hang", "crash"))
        rec.ok, rec.failure, rec.error_type = False, failure, failure
        rec.error = f"{failure}: rank 0 did not finish op {index}"
    return rec


def _ops(rng: random.Random) -> list[Op]:
    ops: list[Op] = []
    saves = 0
    for n in range(rng.randint(1, 9)):
        kind = "save" if n == 0 and rng.random() < 0.85 else rng.choice(KINDS)
        if kind == "save":
            detach = rng.random() < 0.35
            ops.append(Op("save", f"step-{saves}", saves, use_async=detach, detach=detach))
            saves += 1
        elif kind == "load":
            name = None if rng.random() < 0.5 or not saves else f"step-{rng.randrange(saves)}"
            ops.append(Op("load", name, rng.randrange(saves + 1)))
        elif kind == "rotate":
            ops.append(Op("rotate", keep=rng.randint(1, 3)))
        elif kind == "corrupt":
            ops.append(Op("corrupt", seed=rng.randrange(100)))
        elif kind == "train":
            ops.append(Op("train", version=rng.randrange(saves + 1)))
        else:
            ops.append(Op(kind))
    return ops


def history(seed: int) -> tuple[Case, Outcome, tuple[str, ...] | None]:
    """One seeded history for check_history: ops, records (perhaps fewer than ops), a fault, keep_last, clear."""
    rng = random.Random(seed)
    ops = _ops(rng)
    recs = [_record(rng, i, op, sorted({o.version for o in ops[:i] if o.kind == "save"} | {rng.randrange(3)}))
            for i, op in enumerate(ops)]
    if rng.random() < 0.1:
        recs = recs[:rng.randrange(len(recs) + 1)]
    changes: dict = {"ops": tuple(ops)}
    if rng.random() < 0.25:
        changes["options"] = {"keep_last": rng.randint(1, 2)}
    outcome = Outcome("reference", recs)
    saves = [i for i, op in enumerate(ops) if op.kind == "save"]
    if saves and rng.random() < 0.4:
        kind = rng.choice(FAULTS)
        changes["fault"] = _fault(kind, rng.choice(saves))
        outcome.fault = {"kind": kind, "fired": True}
        if rng.random() < 0.3:
            outcome.fault["acknowledged"] = rng.random() < 0.5
    clear = None if rng.random() < 0.15 else CLEAR
    return dataclasses.replace(BASE, **changes), outcome, clear


def rotation(seed: int) -> tuple[Case, Outcome, tuple[str, ...]]:
    """Saves under a rotation (an op, or keep_last inside each save), perhaps the last one killed, then loads by
    name that find a checkpoint, find none, or find it incomplete: what a rotation may and may not delete."""
    rng = random.Random(seed)
    count = rng.randint(2, 4)
    ops = [Op("save", f"step-{v}", v) for v in range(count)]
    recs = [OpRecord(v, "save", f"step-{v}") for v in range(count)]
    changes: dict = {}
    outcome = Outcome("reference")
    if rng.random() < 0.5:
        changes["options"] = {"keep_last": rng.randint(1, 2)}
    else:
        ops.append(Op("rotate", keep=rng.randint(1, 2)))
        recs.append(OpRecord(count, "rotate", None))
    if rng.random() < 0.5:
        changes["fault"] = _fault("kill", count - 1)
        outcome.fault = {"kind": "kill", "fired": True}
        recs[count - 1] = OpRecord(count - 1, "save", f"step-{count - 1}", ok=False, error_type="Killed", error="k")
    for v in rng.sample(range(count), rng.randint(1, count)):
        i = len(ops)
        ops.append(Op("load", f"step-{v}", v))
        rec = OpRecord(i, "load", f"step-{v}")
        roll = rng.random()
        if roll < 0.4:
            rec.loaded = state(v)
        elif roll < 0.5:
            failure = rng.choice(("hang", "crash"))
            rec.ok, rec.failure, rec.error_type, rec.error = False, failure, failure, f"rank 1 did not finish op {i}"
        else:
            rec.ok, rec.error_type, rec.error = False, rng.choice(CLEAR[:2]), f"rank 0: e{i}"
        recs.append(rec)
    if rng.random() < 0.2:
        ops.append(Op("corrupt", seed=1))
        recs.append(OpRecord(len(recs), "corrupt", None))
    outcome.records = recs
    return dataclasses.replace(BASE, ops=tuple(ops), **changes), outcome, CLEAR


def plain(seed: int) -> tuple[Case, Outcome]:
    """A save/load case for check_oracle(): loads of any state, failures, and saves whose regions may not cover."""
    rng = random.Random(seed)
    ops, recs = [], []
    for i in range(rng.randint(1, 4)):
        op = Op("save", f"step-{i}", i) if rng.random() < 0.5 else Op("load", f"step-{i}", rng.randrange(i + 1))
        rec = _record(rng, i, op, list(range(i + 1)))
        if op.kind == "save" and rec.ok and rng.random() < 0.5:
            rows = rng.choice(((0, 2), (0, 3), (1, 4), (0, 4)))
            rec.written = {"model/w": ((4, 2), [Box((0, 0), (2, 2)), Box((rows[0], 0), (rows[1] - rows[0], 2))]),
                           "model/b": ((3,), [Box((0,), (3,))])}
        ops.append(op)
        recs.append(rec)
    if rng.random() < 0.15:
        recs = recs[:-1]
    return dataclasses.replace(BASE, ops=tuple(ops), property="P-ROUNDTRIP"), Outcome("reference", recs)


def differential(seed: int) -> tuple[Case, Outcome, Outcome]:
    """A P-DIFF case: the SUT's and the reference's records of the same ops."""
    case, sut = plain(seed)
    _, ref = plain(seed + 1_000_000)
    ref.records = [dataclasses.replace(r, index=s.index, kind=s.kind, name=s.name)
                   for r, s in zip(ref.records, sut.records)]
    return dataclasses.replace(case, property="P-DIFF"), sut, ref


HISTORIES, ROTATIONS, PLAINS, DIFFS = 700, 200, 150, 150


def judgements() -> Iterator[tuple[str, Judgement]]:
    for seed in range(HISTORIES):
        case, outcome, clear = history(seed)
        yield f"history-{seed}", check_history(case, outcome, clear)
    for seed in range(ROTATIONS):
        yield f"rotation-{seed}", check_history(*rotation(seed))
    for seed in range(PLAINS):
        yield f"judge-{seed}", check_oracle(*plain(seed))
    for seed in range(DIFFS):
        yield f"diff-{seed}", check_diff(*differential(seed))


def as_json(j: Judgement) -> list:
    return [j.property, j.verdict.value, list(j.details)]


if __name__ == "__main__":
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps({k: as_json(j) for k, j in judgements()}, indent=0) + "\n", encoding="utf-8")
    sys.stdout.write(f"wrote {GOLDEN.name}\n")
