"""Run a case in one process (world size 1, or a SUT that can play every rank, like the reference)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from properties.case import Case
from properties.outcome import OpRecord, Outcome
from reference.index import read_index


def execute(case: Case, adapter) -> Outcome:
    """Run every op of ``case`` against ``adapter`` in a fresh directory, recording results and errors."""
    outcome = Outcome(sut=case.sut, launch_mode="in-process")
    save_layouts, load_layouts = case.layouts("save"), case.layouts("load")
    specs = case.specs()
    with tempfile.TemporaryDirectory(prefix="ckpt-case-") as tmp:
        root = Path(tmp) / "ckpt"
        for i, op in enumerate(case.ops):
            rec = OpRecord(i, op.kind, op.name)
            start = time.perf_counter()
            try:
                if op.kind == "save":
                    state = case.state(op.version)
                    handle = adapter.save_world(root, op.name, state, save_layouts, use_async=op.use_async)
                    if op.use_async:
                        if op.mutate_after:
                            for tensor in state.values():
                                np.bitwise_not(tensor.bits, out=tensor.bits)  # the caller reuses its buffers
                        handle.wait()
                    rec.written = _written(root / op.name)
                else:
                    for rank in range(_world(load_layouts)):
                        rec.loaded[rank] = adapter.load_rank(root, op.name, specs, load_layouts, rank)
            except Exception as exc:  # recorded, judged later: an exception is an outcome, not a harness error
                rec.ok, rec.error_type, rec.error = False, type(exc).__name__, str(exc)
            rec.seconds = time.perf_counter() - start
            outcome.sut_seconds += rec.seconds
            outcome.records.append(rec)
    return outcome


def _world(layouts) -> int:
    sizes = {lay.mesh.world_size for lay in layouts.values()}
    return max(sizes) if sizes else 1


def _written(ckpt: Path) -> dict:
    """Regions the save put on disk per tensor (from the reference-format index, when there is one)."""
    if not (ckpt / "index.json").is_file():
        return {}
    index = read_index(ckpt, check_cover=False)
    return {name: (meta.shape, [s.region for s in index.slices_of(name)]) for name, meta in index.tensors.items()}
