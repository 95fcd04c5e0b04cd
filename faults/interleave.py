"""Replaying a recorded interleaving of several processes' IO on another run of the same program.

Ranks write concurrently, so two runs of one save issue the same IO per process in different global orders, and a
crash state (an index into one run's op list) would name other ops in the next run. Each op therefore belongs to a
*stream* (the traced root process it descends from: a rank with its threads and writer children), a recording keeps
its *schedule* (the stream of each op, in order), and :func:`follow` rearranges a new run's ops into that schedule.
Within a stream the order is the program's own, so the rearranged list is the recorded interleaving applied to the
new run's ops — valid as long as each stream did the same IO (checked: :class:`TraceMismatch` otherwise).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from .errors import TraceMismatch
from .fsmodel import FsOp
from .strace import Recording

FORK_CALLS = ("clone", "clone3", "fork", "vfork")


def streams(recording: Recording, roots: Mapping[int, int]) -> dict[int, int]:
    """Thread/process id -> stream, from ``roots`` (tid -> stream of every thread the trace started with) and the
    clone/fork calls of the recording (a child joins its parent's stream)."""
    out = dict(roots)
    for call in recording.all_calls:
        if call.name in FORK_CALLS and call.pid in out:
            child = call.result.split()[0]
            if child.isdigit():
                out[int(child)] = out[call.pid]
    return out


SHARED = -2  # the stream of directory creates: ranks race to make a shared directory, and any one may win


def schedule_of(ops: Sequence[FsOp], recording: Recording, tid_stream: Mapping[int, int]) -> list[int]:
    """The stream of every op, in order (-1 for an op of a process outside every stream). A ``mkdir`` belongs to
    no rank: every rank may try it and whichever comes first makes it, differently from run to run."""
    return [SHARED if op.kind == "mkdir" else tid_stream.get(recording.all_calls[op.seq].pid, -1) for op in ops]


def follow(ops: Sequence[FsOp], recording: Recording, tid_stream: Mapping[int, int],
           schedule: Sequence[int]) -> list[FsOp]:
    """``ops`` (one run, any interleaving) rearranged into ``schedule`` (another run's interleaving); fd handles
    are renumbered to match."""
    mine = schedule_of(ops, recording, tid_stream)
    queues: dict[int, list[int]] = {}
    for index, stream in enumerate(mine):
        queues.setdefault(stream, []).append(index)
    wanted: dict[int, int] = {}
    for stream in schedule:
        wanted[stream] = wanted.get(stream, 0) + 1
    have = {s: len(q) for s, q in queues.items()}
    if wanted != have:
        raise TraceMismatch(f"ops per stream differ from the recorded schedule: recorded {sorted(wanted.items())}, "
                            f"this run {sorted(have.items())}")
    order: list[int] = []
    taken = dict.fromkeys(queues, 0)
    for stream in schedule:
        order.append(queues[stream][taken[stream]])
        taken[stream] += 1
    position = {old: new for new, old in enumerate(order)}
    return [dataclasses.replace(ops[old], handle=None if ops[old].handle is None else position[ops[old].handle])
            for old in order]
