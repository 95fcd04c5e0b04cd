"""Ranks played inside the controller: world size 1 for any SUT, any world size for SUTs that need no
collectives (capability ``in_process_world``). No processes, so no faults; the fastest way to run a case."""

from __future__ import annotations

import contextlib

from harness.coverage import measure
from harness.fixes import FIXES, prepare
from harness.ranks.rankops import RankExecutor
from harness.ranks.runner import Runner
from harness.sut import adapter_class


class InProcessRunner(Runner):
    mode = "in-process"
    launched = False

    def __init__(self, sut: str, world: int, options: dict) -> None:
        super().__init__()
        cls = adapter_class(sut)
        # The controller's own process: fixes applied here are taken back when the ranks close.
        self.fixes = [FIXES[f] for f in options.get("fixes", ()) if not FIXES[f].applied()]
        self.unwatch = prepare({**options, "fixes": [f.id for f in self.fixes]})
        # Coverage in the controller's own process: traced only while it plays the ranks, stopped with them.
        self.recording = bool(options.get(measure.COVERAGE_OPTION))
        measure.start(options)
        measure.thread_tracing(False)
        self.executors = []
        for rank in range(world):
            adapter = cls()
            with measure.traced():
                self.shims = adapter.setup(rank, world, options)
            self.info[rank] = adapter.describe()
            self.executors.append(RankExecutor(adapter, rank, world))
        # Play the coordinator (rank 0) last, so file-based rendezvous (the reference) finds the others done.
        self.order = list(reversed(self.executors))

    def begin(self, case_json: dict, root: str) -> None:
        measure.case_begins(case_json["property"])
        with measure.traced():
            for ex in self.executors:
                ex.begin(case_json, root)

    def op(self, index: int, timeout: float, fail_fast: bool = True, stuck_after: float | None = None,
           idle_limit: float | None = None) -> list[dict]:
        with measure.traced():
            return sorted((ex.op(index) for ex in self.order), key=lambda r: r["rank"])

    def end(self) -> None:
        with measure.traced():
            for ex in self.executors:
                ex.end()
        measure.case_ends()

    def close(self, graceful: bool = True) -> None:
        if not graceful:  # the job dies: its ranks live in this process, so their in-flight async saves end here
            with contextlib.suppress(Exception):
                self.end()
        for ex in self.executors:
            ex.release()  # a held writer would keep the adapter's close waiting for ever
            ex.adapter.close()
        self.unwatch()
        for fix in reversed(self.fixes):
            fix.revert()
        if self.recording:
            measure.stop()
