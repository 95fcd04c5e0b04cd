"""A launched rank: set the SUT up once, then serve cases from the controller until told to stop.

Started by the harness's own launcher (RANK / WORLD_SIZE) or by a framework launcher (Paddle sets
PADDLE_TRAINER_ID / PADDLE_TRAINERS_NUM). Talks to the controller over a Unix socket in a private directory.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from multiprocessing.connection import Client
from pathlib import Path

if __package__ in (None, ""):  # started as a script by a framework launcher
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from harness.coverage import measure
from harness.fixes import apply_carried, prepare
from harness.ranks.gc_freeze import GcFreezer
from harness.ranks.rankops import RankExecutor
from harness.sut import adapter_class

if __name__ == "__mp_main__":  # a process the framework spawned imports this module again: it runs fixed too
    apply_carried()
    measure.start_carried()  # and its coverage counts


def rank_and_world() -> tuple[int, int]:
    for rank_var, world_var in (("PADDLE_TRAINER_ID", "PADDLE_TRAINERS_NUM"), ("RANK", "WORLD_SIZE")):
        if rank_var in os.environ and world_var in os.environ:
            return int(os.environ[rank_var]), int(os.environ[world_var])
    return 0, 1


def _keep_control_from_children(fd: int) -> None:
    """A SUT's forked writers would inherit the control socket and keep it open after their rank dies, so the
    controller would wait for EOF until the op timed out and report a hang; in a forked child the descriptor is
    pointed at /dev/null instead (the number stays valid, so nothing else is closed by mistake)."""

    def in_child() -> None:
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, fd)
        os.close(devnull)

    os.register_at_fork(after_in_child=in_child)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--control", required=True)
    parser.add_argument("--sut", required=True)
    parser.add_argument("--options", default="{}")
    args = parser.parse_args(argv)
    rank, world = rank_and_world()
    conn = Client(args.control, family="AF_UNIX")
    _keep_control_from_children(conn.fileno())
    try:
        options = json.loads(args.options)
        measure.start(options)  # coverage, from the framework's first line (a fix imports what it patches)
        prepare(options)  # fixes (and watches) before the adapter runs any of the framework's code
        adapter = adapter_class(args.sut)()
        shims = adapter.setup(rank, world, options)
    except Exception as exc:  # the adapter does not import or set up here: the controller says why, in one line
        traceback.print_exc()  # the rank's log keeps where; the controller quotes its tail
        conn.send({"type": "setup-failed", "rank": rank, "error": f"{type(exc).__name__}: {exc}"})
        return 1
    gc_freezer = GcFreezer()
    # the framework and the SUT's set-up stay: collections a SUT asks for walk only what a case made
    gc_freezer.collect_and_freeze()
    conn.send({"type": "hello", "rank": rank, "pid": os.getpid(), "shims": shims, "info": adapter.describe(),
               "env": dict(os.environ)})
    executor = RankExecutor(adapter, rank, world)
    while True:
        try:
            msg = conn.recv()
        except EOFError:  # the controller went away: nothing left to do
            break
        kind = msg["type"]
        if kind == "stop":
            break
        if kind == "begin":
            measure.case_begins(msg["case"]["property"])
            executor.begin(msg["case"], msg["root"])
            conn.send({"type": "ok", "rank": rank})
        elif kind == "op":
            conn.send({"type": "record", **executor.op(msg["index"])})
        elif kind == "health":
            try:
                ok = adapter.healthy()
            except Exception:
                ok = False
            conn.send({"type": "health", "rank": rank, "ok": ok})
        elif kind == "end":
            executor.end()
            measure.case_ends()
            gc_freezer.collect_and_freeze()
            conn.send({"type": "ok", "rank": rank})
    executor.release()  # a held writer would keep the adapter's close waiting for ever
    adapter.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
