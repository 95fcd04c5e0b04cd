"""Outcome: what a run of a case recorded (the history), judged later by pure checkers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from faults.spec import Fault
from reference.layout import Region
from reference.tensor import Tensor


@dataclass
class OpRecord:
    index: int
    kind: str
    name: str | None
    ok: bool = True
    failure: str | None = None  # "hang" or "crash" when a rank stopped answering or died
    error_type: str | None = None
    error: str | None = None
    traceback: str | None = None  # the cited failed rank's (harness.judging.run.cause), for triage (never judged)
    errors: dict[int, tuple[str, str]] = field(default_factory=dict)  # every failed rank's (type, message): the
    # differential test of virtual ranks compares them rank by rank (never judged)
    symmetric: bool = True  # every rank failed the same way (or none did): collectives are still in step
    loaded: dict[int, dict[str, Tensor]] = field(default_factory=dict)  # rank -> tensors (loads)
    # loads: rank -> the SUT's own read plan for it, where the SUT exposes one (harness SutAdapter.read_plan):
    # {"tensors": keys planned for, "reads": [(tensor, dst offsets, shape, src piece offsets, offsets in it)]}
    plans: dict[int, dict] = field(default_factory=dict)
    written: dict[str, tuple[tuple[int, ...], list[Region]]] = field(default_factory=dict)  # saves: what hit disk
    seconds: float = 0.0  # for reports only, never for verdicts
    dead: tuple[int, ...] = ()  # ranks that died during the op
    silent: tuple[int, ...] = ()  # ranks that neither answered nor died within the op timeout
    applied: dict | None = None  # harness-side ops (corrupt): what the harness did, e.g. the concrete plan
    complete: tuple[str, ...] | None = None  # after the op: the names the SUT itself presents as finished (None:
    # it cannot tell); after a faulted op, on the root the fault left
    restarted: bool = False  # the harness replaced the op's ranks after it (a failed op after a fault): what they
    # had in flight (detached saves) died with them, as in a restart


@dataclass
class Outcome:
    sut: str
    records: list[OpRecord] = field(default_factory=list)
    shims: tuple[str, ...] = ()
    launch_mode: str = "in-process"
    fault: dict | None = None  # what the case's fault did (kind, mechanism, whether and where it fired)
    resolved_fault: Fault | None = None  # a drawn fault (or a seeded corruption) as the concrete one it resolved to
    trace: tuple[str, Any, dict] | None = None  # (root, strace recording of the faulted op, tid -> rank)
    cut_short: bool = False  # stopped where ranks sat stuck behind one that raised (a fuzzing judge's shortcut:
    # harness.judging.judge settles such a judgement by a run that waits them out)
    io_map: dict | None = None  # a drawn fault judged at every crash point or state: the crash-point map of its op
    # (harness/judging/iomap.py; plain JSON for the report, never judged)
    # A drawn fault's traced op broke the durability contract in its IO: (its persistence-order case, that case's
    # judgement from the recording). Never part of this case's verdict; a campaign makes it a finding of its own.
    order: tuple[Any, Any] | None = None

    @property
    def traceback(self) -> str | None:
        return next((r.traceback for r in self.records if r.traceback), None)

    @property
    def tracebacks(self) -> dict[int, str]:
        """Op index -> the cited traceback of that op (properties.triage.buckets reads the SUT frame it failed in)."""
        return {r.index: r.traceback for r in self.records if r.traceback}

    @property
    def sut_seconds(self) -> float:
        return sum(r.seconds for r in self.records)
