"""Virtual ranks held to real ones: run a case on both and list every difference a judge or a user could see.

The same ops, in fresh directories, on real ranks (a warm pool of launched processes) and on virtual ones
(harness.ranks.virtual_pool): each op must give the same bits on every rank, the same exceptions (type and message) on
the same ranks, the same finished-checkpoint listing, and leave the same files, names and bytes. What may differ
is only what cannot be the same, and ``normalise`` / ``file_form`` say exactly that: the checkpoint root's path
inside messages and files, how long a rank stuck behind a raiser waited, and the number in Paddle's auto-generated
tensor names (``generated_tensor_<n>``: one counter per process in Paddle's C++, so it depends on what the process
made before; it appears only in the name map ``paddle.save`` writes). Pickle files are compared opcode by opcode
with those names abstracted; safetensors files by header (parsed) and data bytes; anything else byte for byte.
"""

from __future__ import annotations

import json
import pickletools
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from harness.judging.run import run_ops
from harness.ranks.runner import RunnerSet
from properties.model.case import HARNESS_KINDS, Case
from properties.model.outcome import OpRecord, Outcome

REAL_MAX = 4  # the largest world real ranks are launched for here (2 cores); above it a finding is virtual-only


def max_world(case: Case) -> int:
    """The largest world any of the case's rank ops runs on."""
    return max((case.world_size(case.op_layouts(i)) for i, op in enumerate(case.ops) if op.kind not in HARNESS_KINDS),
               default=1)


@dataclass
class Side:
    """What one way of running the case left: its op records and its checkpoint files."""

    records: list[OpRecord]
    files: dict[str, Any] = field(default_factory=dict)  # relative path -> file_form


def run_side(case: Case, runners: RunnerSet, at: Path | None = None) -> Side:
    """Run ``case`` on ``runners`` in a fresh directory and keep its records and files. ``at``: the folder to run
    it in (emptied after), so two sides can run one after the other under the same path: the SUT may order its
    work by hashes of the paths it reads (which of two broken tensors a load names first)."""
    outcome = Outcome(sut=case.sut, launch_mode=runners.mode)
    tmp = at if at is not None else Path(tempfile.mkdtemp(prefix="ckh-fid-"))
    root = tmp / "ckpt"
    root.mkdir()
    try:
        final = run_ops(case, runners, root, range(len(case.ops)), outcome)
        files = {str(p.relative_to(final)): file_form(p.read_bytes(), final)
                 for p in sorted(final.rglob("*")) if p.is_file()}
        records = [_normalised(rec, final) for rec in outcome.records]
        return Side(records, files)
    finally:
        shutil.rmtree(root if at is not None else tmp, ignore_errors=True)
        runners.after_case()


def run_sides(case: Case, real: RunnerSet, virtual: RunnerSet) -> tuple[Side, Side]:
    """The case on real ranks, then on virtual ones, under one path."""
    tmp = Path(tempfile.mkdtemp(prefix="ckh-fid-"))
    try:
        return run_side(case, real, tmp), run_side(case, virtual, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def normalise(text: str, root: Path) -> str:
    """A message as both sides can agree on it: the root's path (each side has its own) as <root>, a peer's
    port in gloo's messages (a real pool's are free ports, the virtual world's made up) as <port>, and an object's
    address in its repr (where the allocator put it) as <address>."""
    text = _PORT.sub(r"\1<port>", text.replace(str(root), "<root>"))
    return _ADDRESS_TAIL.sub(r"\1<address>", _ADDRESS.sub(r"\1<address>", text))


_PORT = re.compile(r"(\[127\.0\.0\.1\]:)\d+")
_ADDRESS = re.compile(r"(object at )0x?[0-9a-f]*")  # whole, or cut short where a long message is shortened
_ADDRESS_TAIL = re.compile(r"(\.\.\. )(?:0?x)?[0-9a-f]*(?=>)")  # the rest of one, after the shortening's " ... "


#: Names Paddle makes up from a per-process counter (``unique_name``-style): the number is history, not state.
_GENERATED = re.compile(r"\b(generated_tensor|eager_tmp|tmp)_\d+\b")


def file_form(data: bytes, root: Path) -> Any:
    """What of a checkpoint file both sides must agree on (module docstring)."""
    data = data.replace(str(root).encode(), b"<root>")
    if data[:1] == b"\x80":
        try:
            return ("pickle", [(op.name, _GENERATED.sub(r"\1_<n>", arg) if isinstance(arg, str) else arg)
                               for op, arg, _ in pickletools.genops(data) if op.name != "FRAME"])
        except Exception:
            return data
    if len(data) >= 8:
        size = int.from_bytes(data[:8], "little")
        if 2 <= size <= len(data) - 8 and data[8:9] == b"{":
            try:
                header = json.loads(_GENERATED.sub(r"\1_<n>", data[8:8 + size].decode()))
            except ValueError:
                return data
            return ("safetensors", header, data[8 + size:])
    return data


def _normalised(rec: OpRecord, root: Path) -> OpRecord:
    rec.errors = {r: (t, "" if t == "Stuck" else normalise(m, root)) for r, (t, m) in rec.errors.items()}
    rec.error = normalise(rec.error, root) if rec.error else rec.error
    return rec


def differences(real: Side, virtual: Side) -> list[str]:
    """Every way the virtual run differs from the real one, in words; empty when they agree."""
    out: list[str] = []
    if len(real.records) != len(virtual.records):
        out.append(f"{len(real.records)} ops ran on real ranks, {len(virtual.records)} on virtual ones")
    for a, b in zip(real.records, virtual.records):
        where = f"op {a.index} ({a.kind} {a.name})"
        if (a.ok, a.failure) != (b.ok, b.failure):
            out.append(f"{where}: real ok={a.ok} failure={a.failure}, virtual ok={b.ok} failure={b.failure}")
        if _errors(a, b) != _errors(b, a):
            out.append(f"{where}: errors by rank differ: real {_short(a.errors)}, virtual {_short(b.errors)}")
        if a.complete != b.complete:
            out.append(f"{where}: finished checkpoints listed: real {a.complete}, virtual {b.complete}")
        if a.written != b.written:
            out.append(f"{where}: regions written differ")
        out.extend(f"{where}: {d}" for d in _loaded_differences(a, b))
    names = sorted(set(real.files) | set(virtual.files))
    for name in names:
        if name not in virtual.files:
            out.append(f"file {name} only on real ranks")
        elif name not in real.files:
            out.append(f"file {name} only on virtual ranks")
        elif real.files[name] != virtual.files[name]:
            out.append(f"file {name} differs")
    return out


def _errors(rec: OpRecord, other: OpRecord) -> dict[int, tuple[str, str]]:
    """The errors to compare: where a rank died, which of its peers answered before the controller gave up on the
    op depends on timing on real ranks too, so only ranks both sides heard from count."""
    if "crash" in (rec.failure, other.failure):
        return {r: e for r, e in rec.errors.items() if r in other.errors}
    return rec.errors


def _loaded_differences(a: OpRecord, b: OpRecord) -> list[str]:
    out = []
    for rank in sorted(set(a.loaded) | set(b.loaded)):
        x, y = a.loaded.get(rank, {}), b.loaded.get(rank, {})
        if sorted(x) != sorted(y):
            out.append(f"rank {rank} loaded {sorted(x)} real, {sorted(y)} virtual")
            continue
        for name in sorted(x):
            tx, ty = x[name], y[name]
            if tx.dtype != ty.dtype or tx.shape != ty.shape or not np.array_equal(tx.bits, ty.bits):
                out.append(f"rank {rank} {name}: real {tx.dtype.name}{list(tx.shape)}, virtual "
                           f"{ty.dtype.name}{list(ty.shape)}, bits {'equal' if _same_bits(tx, ty) else 'differ'}")
    return out


def _same_bits(a, b) -> bool:
    return a.bits.tobytes() == b.bits.tobytes()


def _short(errors: dict[int, tuple[str, str]]) -> str:
    return "{" + ", ".join(f"{r}: {t}: {' '.join(m.split())[:160]}" for r, (t, m) in sorted(errors.items())) + "}"
