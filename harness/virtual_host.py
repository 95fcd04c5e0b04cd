"""One process hosting W virtual ranks (harness.virtual_paddle), speaking the rank protocol of harness.worker.

It opens one control connection per rank, so the controller's pool (harness.virtual_pool) sees W ranks and needs
no other code path: every message goes to every rank, and the host runs each message's work on all its ranks
under the baton, then answers on each rank's connection. A rank whose collective timed out (no peer could join)
answers "Stuck" when the controller is fuzzing, as a real pool answers for a rank left waiting on a raiser.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import traceback
from multiprocessing.connection import Client, Connection
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.rankops import FATAL, RankExecutor
from harness.sut import adapter_class
from harness.sut.base import SutAdapter


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--control", required=True)
    parser.add_argument("--sut", required=True)
    parser.add_argument("--options", default="{}")
    parser.add_argument("--world", type=int, required=True)
    args = parser.parse_args(argv)
    size = args.world
    conns = [Client(args.control, family="AF_UNIX") for _ in range(size)]
    cls = adapter_class(args.sut)
    try:
        world = cls.virtual_world(size)
        adapters: list[SutAdapter] = [cls() for _ in range(size)]
        options = json.loads(args.options)
        setups = world.run([lambda r=r: adapters[r].setup(r, size, options) for r in range(size)])
        for ok, value in setups:
            if not ok:
                raise value
    except Exception as exc:
        traceback.print_exc()
        for rank, conn in enumerate(conns):
            conn.send({"type": "setup-failed", "rank": rank, "error": f"{type(exc).__name__}: {exc}"})
        return 1
    gc.collect()
    gc.freeze()
    for rank, conn in enumerate(conns):
        conn.send({"type": "hello", "rank": rank, "pid": os.getpid(), "shims": setups[rank][1],
                   "info": {**adapters[rank].describe(), "virtual": "yes"}, "env": {**os.environ, **world.envs[rank]}})
    executors = [RankExecutor(adapters[r], r, size) for r in range(size)]
    try:
        _serve(world, conns, executors)
    finally:
        world.run([lambda r=r: _close(executors[r]) for r in range(size)])
        world.close()
    return 0


def _serve(world, conns: list[Connection], executors: list[RankExecutor]) -> None:
    size = len(conns)
    while True:
        try:
            msgs = [conn.recv() for conn in conns]
        except EOFError:
            return
        kind = msgs[0]["type"]
        if kind == "stop":
            return
        if kind == "begin":
            for ex in executors:
                ex.begin(msgs[0]["case"], msgs[0]["root"])
            replies = [{"type": "ok", "rank": r} for r in range(size)]
        elif kind == "op":
            replies = _op(world, executors, msgs[0])
        elif kind == "health":
            results = world.run([executors[r].adapter.healthy for r in range(size)])
            replies = [{"type": "health", "rank": r, "ok": not world.broken and ok and value is True}
                       for r, (ok, value) in enumerate(results)]
        elif kind == "end":
            _raise_fatal(world.run([ex.end for ex in executors]))
            replies = [{"type": "ok", "rank": r} for r in range(size)]
        else:
            raise ValueError(f"unknown message {kind!r}")
        for conn, reply in zip(conns, replies):
            conn.send(reply)


def _op(world, executors: list[RankExecutor], msg: dict) -> list[dict]:
    results = _raise_fatal(world.run([lambda ex=ex: ex.op(msg["index"]) for ex in executors]))
    records = [{"type": "record", **value} for _, value in results]
    stuck = world.baton.timed_out_ranks
    raised = next((r["rank"] for r in records if not r["ok"] and r["rank"] not in stuck), None)
    if msg.get("stuck_after") is None or raised is None:
        return records
    for record in records:  # what a real pool answers for a rank left waiting on a peer that raised
        if not record["ok"] and record["rank"] in stuck:
            record.update(error_type="Stuck", loaded={}, stuck=True, traceback="",
                          error=f"waiting in a collective after rank {raised} raised (virtual: no peer could join)")
    return records


def _raise_fatal(results: list[tuple[bool, object]]) -> list[tuple[bool, object]]:
    """A rank that ends for real (SystemExit) ends the host, as it would end its process."""
    for ok, value in results:
        if not ok and isinstance(value, FATAL):
            raise value
        if not ok:
            raise RuntimeError(f"a virtual rank failed outside the SUT's calls: {value!r}") from value
    return results


def _close(executor: RankExecutor) -> None:
    executor.release()
    executor.adapter.close()


if __name__ == "__main__":
    sys.exit(main())
