"""One process hosting W virtual ranks (harness.ranks.virtual.paddle_world), speaking the rank protocol of
harness.ranks.worker.

It opens one control connection per rank, so the controller's pool (harness.ranks.virtual_pool) sees W ranks and needs
no other code path: every message goes to every rank, and the host runs each message's work on all its ranks
one at a time, then answers on each rank's connection. A rank whose collective timed out (no peer could join)
answers "Stuck" when the controller is fuzzing, as a real pool answers for a rank left waiting on a raiser.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
import traceback
from multiprocessing.connection import Client, Connection
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from harness.coverage import measure
from harness.fixes import apply_carried, prepare
from harness.ranks.gc_freeze import GcFreezer
from harness.ranks.rank_logs import route
from harness.ranks.rankops import RankExecutor
from harness.sut import adapter_class
from harness.sut.base import SutAdapter
from properties.model.case import Case

if __name__ == "__mp_main__":  # a process the framework spawned imports this module again: it runs fixed too
    apply_carried()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--control", required=True)
    parser.add_argument("--sut", required=True)
    parser.add_argument("--options", default="{}")
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--logs", type=Path, help="write each rank's output to workerlog.<rank> in this folder")
    args = parser.parse_args(argv)
    size, control = args.world, args.control
    cls = adapter_class(args.sut)
    options = json.loads(args.options)
    worlds: list = []  # [the world now playing the ranks] (rank logs follow its scheduler's rank; an old one is let go)
    streams = route(args.logs, lambda: worlds[-1].scheduler.current if worlds else None) if args.logs else None
    gc_freezer = GcFreezer()
    try:
        while control is not None:  # a new control address: the controller asked for a fresh world (_serve)
            conns = [Client(control, family="AF_UNIX") for _ in range(size)]
            built = _world(cls, size, options, conns)
            if built is None:
                return 1
            world, adapters, setups = built
            worlds[:] = [world]
            gc_freezer.collect_and_freeze()
            for rank, conn in enumerate(conns):
                conn.send({"type": "hello", "rank": rank, "pid": os.getpid(), "shims": setups[rank][1],
                           "info": {**adapters[rank].describe(), "virtual": "yes"},
                           "env": {**os.environ, **world.envs[rank]}})
            executors = [RankExecutor(adapters[r], r, size) for r in range(size)]
            try:
                control = _serve(world, conns, executors, gc_freezer)
            finally:
                world.run([lambda ex=ex: _close(ex) for ex in executors])
                world.close()
                for conn in conns:
                    conn.close()
    finally:
        if streams is not None:
            streams.close_logs()
    return 0


def _world(cls: type[SutAdapter], size: int, options: dict, conns: list[Connection]
           ) -> tuple[object, list[SutAdapter], list[tuple[bool, object]]] | None:
    """A fresh virtual world with every rank's adapter set up; None when set-up failed (each rank was told)."""
    world = None
    try:
        measure.start(options)  # coverage, before fixes import what they patch and the world starts its threads
        prepare(options)  # fixes (and watches) before the world copies the framework's module state for its ranks
        world = cls.virtual_world(size)
        adapters: list[SutAdapter] = [cls() for _ in range(size)]
        setups = world.run([lambda r=r: adapters[r].setup(r, size, options) for r in range(size)])
        for ok, value in setups:
            if not ok:
                raise value
        measure.thread_tracing(False)  # the host's own thread runs no framework code
        return world, adapters, setups
    except Exception as exc:
        traceback.print_exc()
        for rank, conn in enumerate(conns):
            conn.send({"type": "setup-failed", "rank": rank, "error": f"{type(exc).__name__}: {exc}"})
        if world is not None:
            world.close()
        return None


class _Ranks:
    """The host's side of each rank's control connection; a rank whose process would have exited is closed (the
    controller sees it die) and hears nothing more."""

    def __init__(self, conns: list[Connection]) -> None:
        self.conns: dict[int, Connection] = dict(enumerate(conns))

    def receive(self) -> dict | None:
        """The message every live rank got (the controller sends each the same, so one is unpickled: a 256-rank
        case's begin carries the whole case); None when the controller left."""
        msgs = []
        for conn in self.conns.values():
            try:
                msgs.append(conn.recv_bytes())
            except EOFError:
                return None
        return pickle.loads(msgs[0]) if msgs else None

    def answer(self, replies: dict[int, dict], results: list[tuple[bool, object]]) -> None:
        """Send each live rank its reply; a rank that exited (SystemExit, as Paddle's ``exit(-1)``) is closed."""
        for rank, (ok, value) in enumerate(results):
            if not ok and isinstance(value, SystemExit) and rank in self.conns:
                print(f"virtual rank {rank} exits with status {value.code}: {getattr(value, 'why', value)}",
                      flush=True)
                self.conns.pop(rank).close()
        for rank, conn in self.conns.items():
            conn.send(replies[rank])

    def tell(self, msg: dict) -> None:
        """Send every live rank's connection the same message."""
        for rank, conn in self.conns.items():
            conn.send({**msg, "rank": rank})


def _serve(world, conns: list[Connection], executors: list[RankExecutor], gc_freezer: GcFreezer) -> str | None:
    """Play the ranks until the controller stops (None) or asks for a fresh world on a new control address (a case
    lost ranks: a rank's exit, ranks stuck behind a raiser, a restart). A fresh world in this process is what a
    relaunch would start — new rank threads, module state, adapters — without a process to kill and fork. A host
    whose ranks hold detached saves in flight refuses and waits to be killed: a crash kills their writers with the
    process."""
    ranks = _Ranks(conns)
    while True:
        msg = ranks.receive()
        if msg is None or msg["type"] == "stop":
            return None
        kind = msg["type"]
        if kind == "rebuild":
            pending = [ex.rank for ex in executors if ex.pending]
            if pending:  # left as they are: the controller kills the host, and the writers with it
                ranks.tell({"type": "refused", "why": f"ranks {pending} hold detached saves in flight"})
                continue
            ranks.tell({"type": "rebuilding"})
            world.run([lambda ex=ex: ex.end() if ex.case is not None else None for ex in executors])
            return str(msg["control"])
        if kind == "begin":
            case = Case.from_json(msg["case"])  # once: the ranks share the immutable case
            measure.case_begins(case.property)
            recorded = measure.sampled(case.property)  # the ranks' threads traced for some cases only
            world.run([lambda on=recorded: measure.thread_tracing(on) for _ in executors])
            for ex in executors:
                ex.begin(case, msg["root"])
            results = world.run([lambda: {"type": "ok"} for _ in executors])
        elif kind == "op":
            index = msg["index"]
            results = world.run([lambda ex=ex, i=index: {"type": "record", **ex.op(i)} for ex in executors])
            _waited(world, results, msg)
        elif kind == "health":
            results = world.run([lambda ex=ex: {"type": "health", "ok": not world.broken and ex.adapter.healthy()}
                                 for ex in executors])
        elif kind == "end":
            results = world.run([lambda ex=ex: (ex.end(), {"type": "ok"})[1] for ex in executors])
            measure.case_ends()
            gc_freezer.collect_and_freeze()
        else:
            raise ValueError(f"unknown message {kind!r}")
        _raise_harness_errors(results)
        ranks.answer({r: {**value, "rank": r} for r, (ok, value) in enumerate(results) if ok}, results)


def _waited(world, results: list[tuple[bool, object]], msg: dict) -> None:
    """A rank whose collective timed out spent the backend's timeout waiting (virtual time: its record's seconds
    say so, as a real rank's would, and harness.judging.run.cause then cites the peer that raised, not the waiter). When
    the controller does not wait such ranks out (``stuck_after``), they answer "Stuck", as a real pool answers."""
    records = [value for ok, value in results if ok]
    stuck = world.scheduler.timed_out_ranks
    for record in records:
        record["seconds"] += world.scheduler.waited.get(record["rank"], 0.0)
    raised = next((r["rank"] for r in records if not r["ok"] and r["rank"] not in stuck), None)
    if msg.get("stuck_after") is None or raised is None:
        return
    for record in records:
        if not record["ok"] and record["rank"] in stuck:
            record.update(error_type="Stuck", loaded={}, stuck=True, traceback="",
                          error=f"waiting in a collective after rank {raised} raised (virtual: no peer could join)")


def _raise_harness_errors(results: list[tuple[bool, object]]) -> None:
    """A rank's SystemExit is its process ending (``_Ranks.answer``); any other error escaped the executor, which
    turns every SUT error into a record: a harness bug, which ends the host."""
    for ok, value in results:
        if not ok and not isinstance(value, SystemExit):
            raise RuntimeError(f"a virtual rank failed outside the SUT's calls: {value!r}") from value


def _close(executor: RankExecutor) -> None:
    executor.release()
    executor.adapter.close()


if __name__ == "__main__":
    sys.exit(main())
