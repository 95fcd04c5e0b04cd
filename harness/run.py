"""Run a case: pick runners (in-process, fresh launch, or warm pool) for its save and load worlds, run its ops
in lock-step across ranks, and assemble the Outcome the checkers judge."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from properties.case import Case
from properties.outcome import OpRecord, Outcome

from .pool import InProcessRunner, PoolFailure, RankPool
from .rankops import unpack
from .sut import resolve

MODES = ("pool", "fresh", "in-process")
OP_TIMEOUT = 120.0


class Runners:
    """Runners by (world size, setup options), created on demand and reused across cases (warm)."""

    def __init__(self, sut: str, mode: str = "pool", op_timeout: float = OP_TIMEOUT) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown launch mode {mode!r}; known: {', '.join(MODES)}")
        self.sut, self.mode, self.op_timeout = sut, mode, op_timeout
        self.cls = resolve(sut)
        self._runners: dict[tuple[int, str], InProcessRunner | RankPool] = {}
        self._retired_launches = 0

    def get(self, world: int, options: dict):
        setup = {"shims": options.get("shims", True)}
        key = (world, json.dumps(setup, sort_keys=True))
        runner = self._runners.get(key)
        if runner is None:
            in_process = self.mode == "in-process" and (world == 1 or "in_process_world" in self.cls.capabilities)
            runner = InProcessRunner(self.sut, world, setup) if in_process else RankPool(self.sut, world, setup)
            self._runners[key] = runner
        return runner

    def discard(self, runner) -> None:
        runner.close()
        self._retired_launches += getattr(runner, "launches", 0)
        self._runners = {k: r for k, r in self._runners.items() if r is not runner}

    def after_case(self) -> None:
        if self.mode == "fresh":
            self.close()

    @property
    def launches(self) -> int:
        return self._retired_launches + sum(getattr(r, "launches", 0) for r in self._runners.values())

    def close(self) -> None:
        for runner in list(self._runners.values()):
            self.discard(runner)


def run_case(case: Case, runners: Runners) -> Outcome:
    """Run every op of ``case`` in a fresh directory; failures of the SUT become records, not exceptions."""
    outcome = Outcome(sut=case.sut, launch_mode=runners.mode)
    worlds = {"save": case.world_size("save"), "load": case.world_size("load")}
    tmp = Path(tempfile.mkdtemp(prefix="ckh-case-"))
    root = tmp / "ckpt"
    root.mkdir()
    active: list = []
    try:
        for i, op in enumerate(case.ops):
            runner = runners.get(worlds["save" if op.kind == "save" else "load"], case.options)
            rec = OpRecord(i, op.kind, op.name)
            try:
                if runner not in active:
                    runner.begin(case.to_json(), str(root))
                    active.append(runner)
                    outcome.shims = tuple(runner.shims)
                replies = runner.op(i, runners.op_timeout)
                _merge(rec, replies)
                if op.kind == "save" and rec.ok:
                    rec.written = runners.cls.written(root, op.name) or {}
            except PoolFailure as failure:
                rec.ok, rec.failure, rec.error_type, rec.error = False, failure.kind, failure.kind, str(failure)
                if runner in active:
                    active.remove(runner)
                runners.discard(runner)
                outcome.records.append(rec)
                if failure.kind == "setup":
                    raise
                break
            outcome.records.append(rec)
    finally:
        # After a failed op the ranks may disagree about where they are in a collective (one raised, another
        # still waits): such a pool is poisoned for the next case. It stays warm only if every rank failed the
        # same way and a collective health check passes; otherwise it is relaunched.
        failed = any(not r.ok for r in outcome.records)
        suspect = any(not r.symmetric or r.failure for r in outcome.records)
        for runner in active:
            try:
                runner.end()
                if failed and isinstance(runner, RankPool) and (suspect or not runner.healthy()):
                    runners.discard(runner)
            except PoolFailure:
                runners.discard(runner)
        shutil.rmtree(tmp, ignore_errors=True)
        runners.after_case()
    return outcome


def _merge(rec: OpRecord, replies: list[dict]) -> None:
    rec.seconds = max((r["seconds"] for r in replies), default=0.0)
    for r in replies:
        if not r["ok"] and rec.ok:
            rec.ok, rec.error_type, rec.traceback = False, r["error_type"], r.get("traceback")
            rec.error = f"rank {r['rank']}: {r['error']}"
        rec.loaded[r["rank"]] = {name: unpack(p) for name, p in r["loaded"].items()}
    rec.symmetric = len({(r["ok"], r.get("error_type")) for r in replies}) <= 1
