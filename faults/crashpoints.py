"""Deterministic crash points: "SIGKILL the process at its k-th <syscall> on <path>" (docs/design.md §6).

A point is derived from a :class:`~faults.strace.Recording` so that replaying it with
``strace -P <path> -e inject=<syscall>:signal=KILL:when=<k>`` hits the same call again. strace counts ``when=k``
per process and, with ``-P``, only over calls touching that exact path, so ``k`` here is counted the same way:
within the recorded ``pid``, over ``all_calls`` of that syscall whose ``-P``-matchable paths include ``path``.
``pid`` is informational (pids differ between runs); the replay hits whichever process first makes its k-th
such call, which is the recorded one as long as no other process of the tree touches the same path with the
same syscall at least k times. :func:`hit` checks the replay landed on the intended call.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from faults.errors import FaultSpecError
from faults.strace import InjectionResult, Recording, Syscall, inject_kill


@dataclass(frozen=True)
class CrashPoint:
    """The ``k``-th ``syscall`` on ``path`` within one process; ``index`` orders points within a recording."""

    index: int
    syscall: str
    k: int
    path: str | None
    pid: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.index, int) or isinstance(self.index, bool) or self.index < 0:
            raise FaultSpecError(f"index must be an int >= 0, got {self.index!r}")
        if not isinstance(self.syscall, str) or not self.syscall.isidentifier():
            raise FaultSpecError(f"syscall must be a syscall name, got {self.syscall!r}")
        if not isinstance(self.k, int) or isinstance(self.k, bool) or self.k < 1:
            raise FaultSpecError(f"k must be an int >= 1, got {self.k!r}")
        if self.path is not None and (not isinstance(self.path, str) or not self.path):
            raise FaultSpecError(f"path must be a non-empty str or None, got {self.path!r}")
        if self.pid is not None and (not isinstance(self.pid, int) or isinstance(self.pid, bool)):
            raise FaultSpecError(f"pid must be an int or None, got {self.pid!r}")

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | Mapping[str, Any]) -> CrashPoint:
        try:
            data = json.loads(text) if isinstance(text, str) else dict(text)
        except (json.JSONDecodeError, TypeError, ValueError) as e:
            raise FaultSpecError(f"crash point is not JSON: {e}") from e
        if not isinstance(data, dict):
            raise FaultSpecError(f"crash point must be a JSON object, got {type(data).__name__}")
        fields = {"index", "syscall", "k", "path", "pid"}
        missing = {"index", "syscall", "k"} - data.keys()
        extra = data.keys() - fields
        if missing or extra:
            raise FaultSpecError(f"crash point keys: missing {sorted(missing)}, unknown {sorted(extra)}")
        return cls(index=data["index"], syscall=data["syscall"], k=data["k"], path=data.get("path"),
                   pid=data.get("pid"))


def _occurrences(all_calls: Sequence[Syscall], targets: Sequence[Syscall]) -> dict[int, int]:
    """Each target's per-process occurrence number as strace ``-P target.path`` counts it, by ``id(target)``: one
    pass over the recording (a save's trace holds tens of thousands of calls)."""
    wanted = {id(t) for t in targets}
    seen: Counter[tuple[int, str, str | None]] = Counter()
    k: dict[int, int] = {}
    for c in all_calls:
        for path in (None, *set(c.paths)):
            seen[c.pid, c.name, path] += 1
        if id(c) in wanted:
            k[id(c)] = seen[c.pid, c.name, c.path]
    missing = wanted - k.keys()
    if missing:
        raise ValueError(f"{len(missing)} target call(s) not in the recording")
    return k


def enumerate_points(recording: Recording, syscalls: Sequence[str] | None = None) -> list[CrashPoint]:
    """Every matching call of ``recording.calls`` (optionally only ``syscalls``) as a replayable crash point."""
    wanted = None if syscalls is None else set(syscalls)
    calls = [c for c in recording.calls if wanted is None or c.name in wanted]
    k = _occurrences(recording.all_calls, calls)
    return [CrashPoint(index=n, syscall=c.name, k=k[id(c)], path=c.path, pid=c.pid) for n, c in enumerate(calls)]


def run_at(cmd: Sequence[str], point: CrashPoint, *, timeout: float = 60.0, env: Mapping[str, str] | None = None,
           cwd: str | None = None) -> InjectionResult:
    """Replay ``cmd`` and SIGKILL it at ``point`` (the process that makes that call dies; others run on)."""
    return inject_kill(cmd, syscall=point.syscall, k=point.k, path_filter=point.path, timeout=timeout, env=env,
                       cwd=cwd)


def hit(result: InjectionResult, point: CrashPoint) -> bool:
    """Did the replay kill a process at exactly this point's syscall and path?"""
    c = result.injected_call
    return result.killed and c is not None and c.name == point.syscall and (point.path is None or point.path in c.paths)
