"""Exhaustive crash points of one save: record its syscalls under strace, then replay it once per point with a
SIGKILL there, and judge what a load finds afterwards (P-ATOMIC, P-NOLOSS), plus whether the next save recovers.

Every replay starts from a byte-identical copy of the same root at the same path (strace matches paths
exactly), holding one acknowledged checkpoint. Reference SUT only in this version: other SUTs need their own
save command (a framework launch) to be traced.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from faults.crashpoints import CrashPoint, enumerate_points, hit, run_at
from faults.strace import record
from properties.atomic import judge_after_crash
from properties.case import Case, Op, TensorCase
from properties.verdicts import Judgement
from reference import CheckpointError, load_global, save
from reference.layout import Mesh, Replicate, Shard, Sharded


def standard_case(rows: int = 4) -> Case:
    """The crash-point case of the issue and the benchmark: a 2-rank save of 4 tensors (sharded bf16 weights and
    fp32 EMA, a replicated bias, replicated RNG bytes); ``rows`` scales the sharded tensors."""
    mesh = Mesh((2,))
    shard, rep = Sharded(mesh, (Shard(0),)).to_json(), Sharded(mesh, (Replicate(),)).to_json()
    tensors = (
        TensorCase("model/w", "BF16", (rows, rows // 2), 1),
        TensorCase("model/b", "F32", (rows // 2 + 1,), 2),
        TensorCase("ema/w", "F32", (rows, rows // 2), 3),
        TensorCase("rng/state", "U8", (8,), 4),
    )
    layout = {"model/w": shard, "model/b": rep, "ema/w": shard, "rng/state": rep}
    return Case("P-ATOMIC", "reference", tensors, layout, layout, (Op("save", "step-1", 1),), {}, 0)


@dataclass
class PointResult:
    point: CrashPoint
    where: str  # the point's path relative to the checkpoint root ("." for the root itself)
    killed: bool
    judgement: Judgement
    recovered: bool  # the next save committed and loads back


def crashpoints(case: Case, *, use_async: bool = False, timeout: float = 60.0) -> list[PointResult]:
    if case.sut != "reference":
        raise ValueError(f"crash points are implemented for the reference SUT only in this version, not {case.sut!r}")
    v0, v1, v2 = case.state(0), case.state(1), case.state(2)
    layouts = case.layouts("save")
    with tempfile.TemporaryDirectory(prefix="ckh-crash-") as tmp:
        tmp_path = Path(tmp)
        base, root = tmp_path / "base", tmp_path / "root"
        save(base, v0, layouts, name="step-0")  # the acknowledged checkpoint
        case_file = tmp_path / "case.json"
        case_file.write_text(case.dumps())
        cmd = [
            sys.executable,
            "-m",
            "harness.crash_save",
            "--case",
            str(case_file),
            "--root",
            str(root),
            "--name",
            "step-1",
            "--version",
            "1",
        ] + (["--async"] if use_async else [])
        _reset(base, root)
        recording = record(cmd, path_filter=str(root), timeout=timeout, cwd=_repo())
        if recording.returncode != 0:
            raise RuntimeError(f"the uninterrupted save failed (exit {recording.returncode}): {recording.stderr}")
        results = []
        for point in enumerate_points(recording):
            _reset(base, root)
            outcome = run_at(cmd, point, timeout=timeout, cwd=_repo())
            latest = _load(root, None)
            previous = _load(root, "step-0")
            judgement = judge_after_crash(v0, v1, latest, previous, (CheckpointError,))
            where = os.path.relpath(point.path, root) if point.path else "-"
            results.append(PointResult(point, where, hit(outcome, point), judgement, _recovers(root, v2, layouts)))
        return results


def _reset(base: Path, root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(base, root, symlinks=True)


def _load(root: Path, name: str | None):
    try:
        return load_global(root, name=name)
    except Exception as exc:  # judged: a clear CheckpointError is allowed, anything else is not
        return exc


def _recovers(root: Path, state, layouts) -> bool:
    """The save after a crash must commit and collect what the crash left behind."""
    try:
        save(root, state, layouts, name="step-2")
        loaded = load_global(root)
    except Exception:
        return False
    return all(loaded[k] == v for k, v in state.items()) and not any(
        p.name.startswith(".staging-") for p in root.iterdir()
    )


def _repo() -> str:
    return str(Path(__file__).resolve().parent.parent)
