"""The crash-point map of one traced op (``report.html``, ``summary["io_map"]``): the op's recorded IO as a timeline
per rank and writer process — files, syscalls, fsyncs, renames — with every crash point placed on the call it
kills and every power-loss state at the place in the IO where it cuts, each with its verdict. A reader sees at once
where in a save the SUT is unsafe (after the data writes but before the rename's fsync, say).

Built from what a crashpoints run already has (harness/judging/fault_runs.py ``Traced``: the strace recording, the op's
file-system ops, which traced thread belongs to which rank); plain JSON, so summary.json carries it and the page
renders it without this module.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Protocol

from faults.crashstates import CrashState, FsOp
from faults.interleave import FORK_CALLS, streams
from faults.spec import ErrorFault, Fault, KillFault, StateFault
from faults.strace import DEFAULT_SYSCALLS, Recording, Syscall
from properties.model.outcome import Outcome
from properties.model.verdicts import Judgement


class TracedOp(Protocol):
    """What the map reads of a traced op (harness.judging.fault_runs.Traced)."""

    op: int
    outcome: Outcome

    @property
    def root(self) -> str: ...

    @property
    def recording(self) -> Recording: ...

    @property
    def fs_ops(self) -> Sequence[FsOp]: ...


class JudgedFault(Protocol):
    """What the map reads of one judged crash point or state (harness.judging.fault_runs.CrashResult)."""

    fault: Fault
    description: str
    judgement: Judgement | None
    error: str | None

    @property
    def failing(self) -> bool: ...

KINDS = {"write": ("write", "pwrite64", "writev", "pwritev", "pwritev2"),
         "fsync": ("fsync", "fdatasync", "sync", "syncfs", "sync_file_range"),
         "rename": ("rename", "renameat", "renameat2"), "open": ("openat", "open", "creat"),
         "unlink": ("unlink", "unlinkat", "rmdir"), "mkdir": ("mkdir", "mkdirat"),
         "truncate": ("ftruncate", "truncate")}
_KIND_OF = {call: kind for kind, calls in KINDS.items() for call in calls}


def timeline(t: TracedOp, sut: str) -> dict:
    """The traced op's IO under its root: lanes (one per rank process, thread or writer) and events in order. The
    ``calls`` key (all_calls index -> event) is for ``place`` and is dropped from the JSON."""
    root, recording = t.root, t.recording
    roots = t.outcome.trace[2] or {}
    stream = streams(recording, roots)
    kinds = _children(recording.all_calls)
    wanted = {op.seq for op in t.fs_ops if op.seq >= 0}
    wanted |= {i for i, c in enumerate(recording.all_calls) if c.name in DEFAULT_SYSCALLS and _rel(root, c)}
    lanes: dict[int, int] = {}
    lane_info: list[dict] = []
    events, calls = [], {}
    for i in sorted(wanted):
        c = recording.all_calls[i]
        if c.pid not in lanes:
            rank = stream.get(c.pid, -1)
            role = "rank" if c.pid in roots else kinds.get(c.pid, "process")
            lanes[c.pid] = len(lane_info)
            lane_info.append({"rank": rank, "pid": c.pid, "role": role,
                              "label": f"{'rank ' + str(rank) if rank >= 0 else 'other'}"
                                       f"{'' if role == 'rank' else ' ' + role} (pid {c.pid})"})
        calls[i] = len(events)
        events.append({"t": len(events), "lane": lanes[c.pid], "call": c.name, "kind": _KIND_OF.get(c.name, "other"),
                       "path": _rel(root, c) or ""})
    order = sorted(range(len(lane_info)), key=lambda n: (lane_info[n]["rank"] < 0, lane_info[n]["rank"],
                                                         lane_info[n]["role"] != "rank", lane_info[n]["pid"]))
    renumber = {old: new for new, old in enumerate(order)}
    for e in events:
        e["lane"] = renumber[e["lane"]]
    return {"sut": sut, "op": t.op, "lanes": [lane_info[n] for n in order], "events": events, "marks": [],
            "calls": calls, "fs_seq": [op.seq for op in t.fs_ops]}


def place(io_map: dict, results: Sequence[JudgedFault], all_calls: Sequence[Syscall], root: str) -> dict:
    """``io_map`` with a mark per judged crash point (on the call it kills) and power-loss state (where its
    prefix of the IO ends), coloured by verdict; JSON-ready (internal keys dropped)."""
    calls, seqs, events = io_map.pop("calls"), io_map.pop("fs_seq"), io_map["events"]
    for r in results:
        verdict = None if r.judgement is None else (r.judgement.verdict.value if r.failing else "pass")
        if isinstance(r.fault, KillFault | ErrorFault):
            index = _kth_call(all_calls, r.fault.syscall, r.fault.k, os.path.normpath(os.path.join(root, r.fault.path)))
            if index is None or index not in calls:
                continue
            e = events[calls[index]]
            io_map["marks"].append({"kind": "point", "t": e["t"], "lane": e["lane"], "verdict": verdict,
                                    "label": r.description})
        elif isinstance(r.fault, StateFault):
            state = CrashState.from_json(r.fault.state)
            seq = seqs[state.prefix] if state.prefix < len(seqs) else None
            t = calls.get(seq, len(events)) if seq is not None else len(events)
            io_map["marks"].append({"kind": "state", "t": t, "lane": None, "verdict": verdict,
                                    "label": r.description})
    return io_map


def crash_rows(results: Sequence[JudgedFault]) -> list[dict]:
    """The table under the map: every point or state, its verdict, and what the judge or the run said."""
    rows = []
    for r in results:
        detail = r.error or ("; ".join(r.judgement.details)[:300] if r.judgement and not r.judgement.ok else "")
        rows.append({"kind": "state" if isinstance(r.fault, StateFault) else "point", "label": r.description,
                     "verdict": None if r.judgement is None else (r.judgement.verdict.value if r.failing else "pass"),
                     "detail": detail, "fault": {k: v for k, v in json.loads(json.dumps(r.fault.to_json())).items()
                                                 if k != "schedule"}})
    return rows


def _rel(root: str, c: Syscall) -> str | None:
    for p in c.paths:
        if p == root:
            return "."
        if p.startswith(root + os.sep):
            return os.path.relpath(p, root)
    return None


def _children(all_calls: Sequence[Syscall]) -> dict[int, str]:
    """Which traced ids are threads and which processes (a writer process a rank forked or spawned)."""
    out = {}
    for c in all_calls:
        if c.name in FORK_CALLS:
            child = c.result.split()[0]
            if child.isdigit():
                out[int(child)] = "thread" if "CLONE_THREAD" in c.args else "writer"
    return out


def _kth_call(all_calls: Sequence[Syscall], syscall: str, k: int, path: str) -> int | None:
    """The call a kill at "the k-th ``syscall`` on ``path``" hits: the first to be some process's k-th such call."""
    seen: dict[int, int] = {}
    for i, c in enumerate(all_calls):
        if c.name == syscall and path in c.paths:
            seen[c.pid] = seen.get(c.pid, 0) + 1
            if seen[c.pid] == k:
                return i
    return None
