"""Which fixes a run reaches: a fix replaces exact lines of functions, and a run whose control never comes to those
lines runs the same code with the fix as without it. So a fix table replays a fix alone only on the cases whose
stock run reaches one of its edits.

Every function the watched fixes patch is bound to a recorder. While a recorded call runs, the thread traces the
frames of watched code only (their nested comprehensions and lambdas included), and notes each edit whose replaced
lines execute. Where that cannot be seen, the edit counts as reached as soon as its function is called: a replaced
line that compiles to no line event of its own (an ``else:``, a closing line, a signature: its effect shows where
no event does, e.g. after the branch before an ``else:`` falls through), a generator or coroutine (its body runs
after the call returns), a function already patched, or a thread another tracer owns.

A rank records into the directory its set-up options name (``REACH_OPTION``): one file per process, a line per
function called and per edit reached, the first time in that process. Processes forked from a rank inherit the
recorder and write beside it; processes it spawns take the watch up again from their environment
(``harness.fixes.apply_carried``).
"""

from __future__ import annotations

import dis
import functools
import inspect
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from types import CodeType, FrameType

from harness.fixes.rebind import EDITS_ATTR, ORIGINAL_ATTR, rebind, target

REACH_OPTION = "reach"  # set-up option: {"dir": where the ranks write, "fixes": the ids whose functions to watch}
WATCHED_ATTR = "__ckpt_watched__"  # on a recorder: the function it calls
_LAZY = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


# One fix's edits of one function: (fix id, module, qualified name, ((old lines, new lines), ...)).
Watched = tuple[str, str, str, tuple[tuple[str, str], ...]]


class _Notes:
    """What this process has recorded, and where it writes."""

    def __init__(self, directory: str) -> None:
        self.directory, self.seen = directory, set()

    def note(self, keys: Iterable[str]) -> None:
        """No lock (a fork while another thread held it would leave the child stuck): two threads noting one key
        at once write it twice, which the reader does not mind; one appending write per note."""
        new = [k for k in keys if k not in self.seen]
        if not new:
            return
        self.seen.update(new)
        with open(os.path.join(self.directory, str(os.getpid())), "a") as out:
            out.write("".join(k + "\n" for k in new))


class _Tracer:
    """The global trace function of a thread inside a recorded call: watched frames get a line tracer that notes
    the edits whose lines run and stops once every edit of the frame's code is noted."""

    def __init__(self, notes: _Notes) -> None:
        self.notes = notes
        self.spans: dict[CodeType, list[tuple[str, frozenset[int]]]] = {}

    def __call__(self, frame: FrameType, event: str, arg: object):
        spans = self.spans.get(frame.f_code)
        if event != "call" or spans is None or self._done(spans):
            return None
        return functools.partial(self._line, spans)

    def _done(self, spans: list[tuple[str, frozenset[int]]]) -> bool:
        return all(key in self.notes.seen for key, _ in spans)

    def _line(self, spans: list[tuple[str, frozenset[int]]], frame: FrameType, event: str, arg: object):
        if event == "line":
            self.notes.note(key for key, lines in spans if frame.f_lineno in lines)
            if self._done(spans):
                return None
        return functools.partial(self._line, spans)


def watch(watched: Iterable[Watched], directory: str) -> Callable[[], None]:
    """Bind a recorder over every function these edits change (as it is bound now); returns what binds the
    functions back. A function several fixes edit is watched once, each fix's edits apart."""
    notes, bound = _Notes(directory), []
    tracer = _Tracer(notes)
    edits: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for fix_id, module, qualname, changes in watched:
        edits.setdefault((module, qualname), []).extend(
            (f"{module}.{qualname}#{fix_id}#{n}", old) for n, (old, _) in enumerate(changes))
    for (module, qualname), spans in sorted(edits.items()):
        func = target(module, qualname)[2]
        key = f"{module}.{qualname}"
        if getattr(func, WATCHED_ATTR, None) is not None:
            continue
        traced, on_call = _spans(func, spans)
        if traced:
            for code in _codes(func.__code__):
                tracer.spans[code] = traced
        recorder = _recorder(func, [key, *on_call], [k for k, _ in traced], notes, tracer)
        rebind(func, recorder)
        bound.append((recorder, func))

    def unwatch() -> None:
        for recorder, func in bound:
            rebind(recorder, func)

    return unwatch


def _spans(func: Callable, edits: list[tuple[str, str]]) -> tuple[list[tuple[str, frozenset[int]]], list[str]]:
    """The edits whose lines a tracer can see run (key, absolute line numbers), and those noted on every call."""
    code = func.__code__
    if getattr(func, EDITS_ATTR, None) or code.co_flags & _LAZY:
        return [], [key for key, _ in edits]
    lines, first = inspect.getsourcelines(func)
    source = "".join(lines)
    starts = {line for c in _codes(code) for _, line in dis.findlinestarts(c) if line is not None}
    starts.discard(code.co_firstlineno)  # the call itself, not a line of the body
    traced, on_call = [], []
    for key, old in edits:
        if old not in source:  # text a fix it requires writes: no line of the stock run is it, so every call counts
            on_call.append(key)
            continue
        begin = first + source[:source.index(old)].count("\n")
        lines = range(begin, begin + old.rstrip("\n").count("\n") + 1)
        span = frozenset(lines) & starts
        code = [n for n, text in zip(lines, old.splitlines()) if text.strip() and not text.strip().startswith("#")]
        # A replaced line with no line event of its own (``else:``, a closing line, a signature) changes control
        # where no event shows it (an ``else:`` turned ``if``: after the branch before it falls through).
        if span and all(n in starts for n in code):
            traced.append((key, span))
        else:
            on_call.append(key)
    return traced, on_call


def _codes(code: CodeType) -> list[CodeType]:
    """A function's code and every code object nested in it."""
    return [code, *(c for const in code.co_consts if isinstance(const, CodeType) for c in _codes(const))]


def _recorder(func: Callable, on_call: list[str], traced: list[str], notes: _Notes, tracer: _Tracer) -> Callable:
    """``func`` noting ``on_call`` at every call, and tracing the thread for ``traced`` while it runs."""

    @functools.wraps(func)  # keeps the patch's own attributes: the fixes machinery reads the bound function
    def recorded(*args, **kwargs):
        notes.note(on_call)
        current = sys.gettrace()
        if not traced or current is tracer:  # nothing to trace, or inside another recorded call of this thread
            return func(*args, **kwargs)
        if current is not None:  # another tracer (a debugger, coverage) owns the thread: the edits count as run
            notes.note(traced)
            return func(*args, **kwargs)
        sys.settrace(tracer)
        try:
            return func(*args, **kwargs)
        finally:
            sys.settrace(None)

    setattr(recorded, WATCHED_ATTR, func)
    setattr(recorded, ORIGINAL_ATTR, getattr(func, ORIGINAL_ATTR, func))  # a fix applied later patches the real one
    return recorded


def reached_keys(directory: str | Path) -> set[str]:
    """Every watched function some process of the run called, and every edit it reached."""
    return {line for path in Path(directory).iterdir() if path.is_file()
            for line in path.read_text().splitlines() if line}


def reached(directory: str | Path) -> tuple[str, ...]:
    """The fixes one of whose edits the run reached: the only ones that can change its outcome."""
    return tuple(sorted({key.split("#")[1] for key in reached_keys(directory) if "#" in key}))
