#!/usr/bin/env python3
"""Measure what Paddle's gloo backend really does in the edge cases of its collectives.

Why: an emulation of gloo (many "virtual ranks" as threads in one process) must reproduce the real backend,
including its failures, and guesses about a C++ backend are cheap to get wrong. This script launches real ranks
(``python -m paddle.distributed.launch``, CPU, gloo), one launch per scenario, each under a hard wall-clock
bound, and writes what every rank saw to a JSON file (docs/gloo.md reads it).

Run ``python docs/gloo/measure.py --out docs/gloo/semantics.json`` (``--only NAME[,NAME...]`` for some
scenarios, shell-style patterns allowed; ``--list`` names them). The launcher imports only the standard library
and psutil; the rank side (``--rank-scenario NAME``, started by Paddle's launcher) imports paddle.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psutil

MARK = "@@GLOO-MEASURE@@ "  # prefix of every result line a rank prints (its log is the only channel back)
TREE_VAR = "GLOO_MEASURE_TREE"  # token every process of one launch inherits, so strays can be found and killed
SYNC_VAR = "GLOO_MEASURE_SYNC"  # a directory the ranks of one launch share for marks (who finished what)
T0_VAR = "GLOO_MEASURE_T0"  # wall-clock time the launch started, so ranks report times on one axis
MESSAGE_HEAD = 300  # characters of an exception message kept

# --------------------------------------------------------------------------------------------------------------
# Rank side: runs inside a rank started by paddle.distributed.launch.
# --------------------------------------------------------------------------------------------------------------


def _clean(value: Any) -> Any:
    """JSON has no NaN or infinity: non-finite floats become strings, nested lists are kept."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


class Rank:
    """One rank of a scenario: records every step as a begin line and an end line, flushed at once, so that a
    step that never returns (a hang, a crash, a kill) is still visible in the rank's log."""

    def __init__(self, scenario: str) -> None:
        import paddle  # only ranks import paddle
        import paddle.distributed as dist

        self.paddle: Any = paddle
        self.dist: Any = dist
        self.scenario = scenario
        self.t0 = float(os.environ[T0_VAR])
        self.sync = Path(os.environ[SYNC_VAR])
        start = time.monotonic()
        dist.init_parallel_env()
        self.rank: int = dist.get_rank()
        self.world: int = dist.get_world_size()
        self.emit(event="init", seconds=round(time.monotonic() - start, 3), world=self.world, pid=os.getpid())
        # Every rank past its whole init before anything is measured: with 3 ranks on 2 cores a slow rank was
        # still inside init_parallel_env when a peer crashed in the first measured call, muddling the result.
        dist.barrier()
        self.emit(event="ready")

    def emit(self, **record: Any) -> None:
        record.setdefault("at", round(time.time() - self.t0, 3))
        print(MARK + json.dumps(record, sort_keys=True, default=repr), flush=True)

    # -- tensors and their description --------------------------------------------------------------------------

    def tensor(self, values: Any, dtype: str) -> Any:
        return self.paddle.to_tensor(values, dtype=dtype)

    def filled(self, shape: list[int], value: float, dtype: str) -> Any:
        return self.paddle.full(shape, value, dtype=dtype)

    def describe(self, x: Any) -> Any:
        """A tensor as dtype, shape and values (a summary past 16 elements; the raw bytes as hex up to 64 bytes,
        so a reinterpretation between dtypes is visible); lists element by element; anything else as JSON."""
        if isinstance(x, (list, tuple)):
            return [self.describe(v) for v in x]
        if isinstance(x, self.paddle.Tensor):
            arr = x.numpy()
            out: dict[str, Any] = {"dtype": str(x.dtype).replace("paddle.", ""), "shape": list(x.shape)}
            if arr.size <= 16:
                out["values"] = _clean(arr.tolist())
            else:
                flat = arr.reshape(-1)
                uniq = sorted(set(flat[:: max(1, flat.size // 4096)].tolist()))
                out.update(numel=int(arr.size), head=_clean(flat[:8].tolist()), tail=_clean(flat[-4:].tolist()),
                           sampled_unique=_clean(uniq[:8]), sampled_unique_count=len(uniq))
            if arr.nbytes <= 64:
                out["hex"] = arr.tobytes().hex()
            return out
        try:
            json.dumps(x)
        except (TypeError, ValueError):
            return repr(x)
        return x

    # -- steps ------------------------------------------------------------------------------------------------

    def step(self, name: str, op: str, fn: Callable[[dict[str, Any]], dict[str, Any] | None]) -> bool:
        """Run one call; record begin, then ok (with the state ``fn`` left) or raised (type, message head, state
        after the failure). Returns whether it returned normally."""
        state: dict[str, Any] = {}
        self.emit(event="begin", step=name, op=op)
        start = time.monotonic()
        try:
            extra = fn(state)
        except Exception as exc:  # any failure of the call is the measurement
            seconds = time.monotonic() - start
            text = str(exc)
            error: dict[str, Any] = {"type": f"{type(exc).__module__}.{type(exc).__qualname__}",
                                     "message_head": text.strip()[:MESSAGE_HEAD], "message_chars": len(text)}
            summary = text.split("Error Message Summary:", 1)
            if len(summary) == 2:
                error["summary"] = summary[1].strip(" -\n")[:MESSAGE_HEAD]
            self.emit(event="end", step=name, outcome="raised", seconds=round(seconds, 3), error=error,
                      state={k: self.describe(v) for k, v in state.items()})
            return False
        seconds = time.monotonic() - start
        self.emit(event="end", step=name, outcome="ok", seconds=round(seconds, 3),
                  state={k: self.describe(v) for k, v in state.items()}, **(extra or {}))
        return True

    def broadcast(self, name: str, tensor: Any, src: int) -> bool:
        def fn(state: dict[str, Any]) -> None:
            state["tensor"] = tensor
            self.dist.broadcast(tensor, src=src)

        return self.step(name, f"broadcast(src={src})", fn)

    def all_reduce(self, name: str, tensor: Any) -> bool:
        def fn(state: dict[str, Any]) -> None:
            state["tensor"] = tensor
            self.dist.all_reduce(tensor)

        return self.step(name, "all_reduce(SUM)", fn)

    def all_gather(self, name: str, tensor: Any, tensor_list: list[Any] | None = None) -> bool:
        """``tensor_list`` None: an empty list, which Paddle fills with ``empty_like`` copies itself. A given
        list is also recorded as the original objects, to show whether Paddle wrote into them."""
        out: list[Any] = [] if tensor_list is None else tensor_list
        originals = list(out)

        def fn(state: dict[str, Any]) -> dict[str, Any]:
            state["input"] = tensor
            state["list"] = out
            self.dist.all_gather(out, tensor)
            return {"list_len": len(out), "same_objects": [a is b for a, b in zip(out, originals)]}

        label = "all_gather([], t)" if tensor_list is None else f"all_gather(prefilled list of {len(out)}, t)"
        return self.step(name, label, fn)

    def barrier(self, name: str) -> bool:
        return self.step(name, "barrier()", lambda state: self.dist.barrier())

    def all_gather_object(self, name: str, obj: Any, object_list: list[Any] | None = None) -> bool:
        out: list[Any] = [] if object_list is None else object_list

        def fn(state: dict[str, Any]) -> dict[str, Any]:
            self.dist.all_gather_object(out, obj)
            return {"objects": self.describe(out)}

        return self.step(name, f"all_gather_object({'[]' if object_list is None else 'prefilled'}, obj)", fn)

    def health(self, name: str = "followup_all_reduce") -> bool:
        """An int64 all_reduce of [1, rank+1]; a usable group gives [world, world*(world+1)/2]."""
        return self.all_reduce(name, self.tensor([1, self.rank + 1], "int64"))

    # -- marks between the ranks of one launch ------------------------------------------------------------------

    def mark(self, name: str) -> None:
        (self.sync / f"{self.rank}.{name}").touch()

    def wait_mark(self, rank: int, name: str, limit: float = 600.0) -> bool:
        """Sleep (no collective) until ``rank`` set the mark; the launch's own bound ends it otherwise."""
        start = time.monotonic()
        self.emit(event="sleep", until=f"{rank}.{name}")
        while not (self.sync / f"{rank}.{name}").exists():
            if time.monotonic() - start > limit:
                return False
            time.sleep(0.05)
        self.emit(event="woke", slept=round(time.monotonic() - start, 3))
        return True

    def process_group_info(self) -> None:
        from paddle.distributed.communication.group import _get_global_group

        pg = _get_global_group().process_group
        self.emit(event="info", process_group={
            "type": type(pg).__name__, "module": type(pg).__module__,
            "mro": [f"{c.__module__}.{c.__qualname__}" for c in type(pg).__mro__],
            "dir": [n for n in dir(pg) if not (n.startswith("__") and n.endswith("__"))],
            "backend": self.dist.get_backend(),
        })


# --------------------------------------------------------------------------------------------------------------
# Scenarios: the body runs on every rank; it branches on r.rank where ranks must differ.
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    name: str
    world: int
    group: str
    description: str
    body: Callable[[Rank], None]
    timeout: float = 100.0
    env: dict[str, str] = field(default_factory=dict)


SCENARIOS: dict[str, Scenario] = {}


def scenario(name: str, world: int, group: str, description: str, body: Callable[[Rank], None],
             timeout: float = 100.0, env: dict[str, str] | None = None) -> None:
    if name in SCENARIOS:
        raise ValueError(f"duplicate scenario {name}")
    SCENARIOS[name] = Scenario(name, world, group, description, body, timeout, dict(env or {}))


NEVER_ARRIVES_TIMEOUT = 150.0  # gloo's own timeout is believed to be ~30 s; the op and its follow-up may wait twice


def _baseline(r: Rank) -> None:
    r.process_group_info()
    src_vals = [10, 11, 12, 13]
    r.broadcast("broadcast_int64", r.tensor(src_vals if r.rank == 0 else [-1] * 4, "int64"), src=0)
    r.all_gather("all_gather_empty_list", r.tensor([r.rank * 10 + i for i in range(3)], "int64"))
    r.all_gather("all_gather_prefilled_right_size", r.tensor([r.rank + 0.5] * 2, "float32"),
                 [r.filled([2], -7, "float32") for _ in range(r.world)])
    r.all_reduce("all_reduce_int64", r.tensor([1, r.rank + 1, 100 * r.rank], "int64"))
    r.all_reduce("all_reduce_float32", r.tensor([0.5, r.rank * 1.25], "float32"))
    r.barrier("barrier")
    r.health()


for _w in (2, 3):
    scenario(f"baseline_w{_w}", _w, "baseline",
             "Matching calls on every rank: the results an emulator must give when nothing is wrong; also the "
             "process group's type and methods.", _baseline)


def _ago(prefill: bool) -> Callable[[Rank], None]:
    def body(r: Rank) -> None:
        obj = {"rank": r.rank, "pad": "x" * (5 + 40 * r.rank)}  # pickles of different lengths on each rank
        r.all_gather_object("all_gather_object", obj, ["stale"] if prefill else None)
        r.health()

    return body


scenario("all_gather_object_w2", 2, "baseline",
         "all_gather_object with an empty list and objects whose pickles differ in length per rank.", _ago(False))
scenario("all_gather_object_w3", 3, "baseline", "As all_gather_object_w2 with 3 ranks.", _ago(False))
scenario("all_gather_object_prefilled_w2", 2, "baseline",
         "all_gather_object into a list that already holds one element ('stale'): appended or replaced?",
         _ago(True))

# -- 1. zero elements and 0-d ---------------------------------------------------------------------------------

_ZERO_KINDS: dict[str, tuple[list[int], str]] = {
    "empty_int64": ([0], "int64"), "empty_float32": ([0], "float32"),
    "0d_int64": ([], "int64"), "0d_float32": ([], "float32"),
}


def _zero(op: str, shape: list[int], dtype: str) -> Callable[[Rank], None]:
    def body(r: Rank) -> None:
        t = r.filled(shape, 7 if r.rank == 0 else -(r.rank + 1), dtype)  # 0-d: src 7, others -1, -2 ...
        if op == "broadcast":
            r.broadcast(op, t, src=0)
        elif op == "all_gather":
            r.all_gather(op, t)
        else:
            r.all_reduce(op, t)
        r.health()

    return body


for _op in ("broadcast", "all_gather", "all_reduce"):
    for _kind, (_shape, _dtype) in _ZERO_KINDS.items():
        scenario(f"zero_{_op}_{_kind}", 2, "zero-elements",
                 f"{_op} of a {_dtype} tensor of shape {_shape} on both ranks (rank 0 holds 7 where it has an "
                 f"element, rank 1 -2), then a follow-up all_reduce.", _zero(_op, _shape, _dtype))

def _zero_one_sided(empty_rank: int) -> Callable[[Rank], None]:
    def body(r: Rank) -> None:
        shape = [0] if r.rank == empty_rank else [4]
        r.broadcast("broadcast", r.filled(shape, 7 if r.rank == 0 else -2, "int64"), src=0)
        r.health()

    return body


scenario("zero_broadcast_src_empty_only", 2, "zero-elements", "broadcast where the sender (rank 0) has an int64 "
         "tensor of shape [0] and the receiver one of 4 elements, then a follow-up all_reduce.", _zero_one_sided(0),
         timeout=NEVER_ARRIVES_TIMEOUT)
scenario("zero_broadcast_recv_empty_only", 2, "zero-elements", "broadcast where the sender (rank 0) has 4 int64 "
         "elements and the receiver a tensor of shape [0], then a follow-up all_reduce.", _zero_one_sided(1),
         timeout=NEVER_ARRIVES_TIMEOUT)

# -- 2. mismatched sizes and dtypes ---------------------------------------------------------------------------


def _bcast_mismatch(per_rank: dict[int, tuple[list[int], str, list[Any]]]) -> Callable[[Rank], None]:
    def body(r: Rank) -> None:
        shape, dtype, values = per_rank[r.rank]
        t = r.tensor(values, dtype).reshape(shape)
        r.broadcast("broadcast", t, src=0)
        r.health()

    return body


_SRC4 = ([4], "int64", [10, 11, 12, 13])
scenario("bcast_recv_smaller", 2, "mismatch", "broadcast from rank 0 (int64, 4 elements) to a 2-element int64 "
         "receiver.", _bcast_mismatch({0: _SRC4, 1: ([2], "int64", [-1, -1])}))
scenario("bcast_recv_larger", 2, "mismatch", "broadcast from rank 0 (int64, 4 elements) to a 6-element int64 "
         "receiver.", _bcast_mismatch({0: _SRC4, 1: ([6], "int64", [-1] * 6)}))
scenario("bcast_recv_mixed_w3", 3, "mismatch", "broadcast from rank 0 (int64, 4 elements); rank 1 receives into 2 "
         "elements, rank 2 into 6.", _bcast_mismatch({0: _SRC4, 1: ([2], "int64", [-1, -1]),
                                                      2: ([6], "int64", [-1] * 6)}))
scenario("bcast_recv_other_shape_same_numel", 2, "mismatch", "broadcast from rank 0 (int64, shape [2, 2]) to an "
         "int64 receiver of shape [4].", _bcast_mismatch({0: ([2, 2], "int64", [10, 11, 12, 13]),
                                                         1: ([4], "int64", [-1] * 4)}))
scenario("bcast_dtype_int64_to_int32", 2, "mismatch", "broadcast from rank 0 (int64, 4 elements = 32 bytes) to an "
         "int32 receiver of 4 elements (16 bytes).", _bcast_mismatch({0: _SRC4, 1: ([4], "int32", [-1] * 4)}))
scenario("bcast_dtype_int32_to_int64", 2, "mismatch", "broadcast from rank 0 (int32, 4 elements = 16 bytes) to an "
         "int64 receiver of 4 elements (32 bytes).", _bcast_mismatch({0: ([4], "int32", [10, 11, 12, 13]),
                                                                      1: ([4], "int64", [-1] * 4)}))
scenario("bcast_dtype_float32_to_int32", 2, "mismatch", "broadcast from rank 0 (float32, 4 elements) to an int32 "
         "receiver of 4 elements: the same byte count.",
         _bcast_mismatch({0: ([4], "float32", [1.5, -2.0, 3.25, 0.1]), 1: ([4], "int32", [-1] * 4)}))


def _ag_sizes(sizes: dict[int, int]) -> Callable[[Rank], None]:
    def body(r: Rank) -> None:
        r.all_gather("all_gather", r.tensor([100 * (r.rank + 1) + i for i in range(sizes[r.rank])], "int64"))
        r.health()

    return body


scenario("ag_sizes_3_5", 2, "mismatch", "all_gather (empty lists) where rank 0 contributes 3 int64 elements and "
         "rank 1 contributes 5.", _ag_sizes({0: 3, 1: 5}))
scenario("ag_sizes_3_5_3_w3", 3, "mismatch", "all_gather (empty lists) with contributions of 3, 5 and 3 int64 "
         "elements.", _ag_sizes({0: 3, 1: 5, 2: 3}))


def _ag_list(sizes_by_rank: dict[int, list[int] | None]) -> Callable[[Rank], None]:
    def body(r: Rank) -> None:
        sizes = sizes_by_rank[r.rank]
        lst = None if sizes is None else [r.filled([n], -9, "int64") for n in sizes]
        r.all_gather("all_gather", r.tensor([100 * (r.rank + 1) + i for i in range(4)], "int64"), lst)
        r.health()

    return body


_AG_LISTS: dict[str, tuple[str, dict[int, list[int] | None]]] = {
    "ag_list_larger": ("every rank passes a list of 2 tensors of 6 elements", {0: [6, 6], 1: [6, 6]}),
    "ag_list_smaller": ("every rank passes a list of 2 tensors of 2 elements", {0: [2, 2], 1: [2, 2]}),
    "ag_list_mixed": ("every rank passes a list of tensors of 2 and 6 elements (8 in all, as 2x4)",
                      {0: [2, 6], 1: [2, 6]}),
    "ag_list_too_many": ("every rank passes a list of 3 tensors of 4 elements (world is 2)",
                         {0: [4, 4, 4], 1: [4, 4, 4]}),
    "ag_list_too_few": ("every rank passes a list of 1 tensor of 4 elements (world is 2)", {0: [4], 1: [4]}),
    "ag_list_asymmetric": ("rank 0 passes an empty list, rank 1 a list of 2 tensors of 6 elements",
                           {0: None, 1: [6, 6]}),
}
for _name, (_text, _sizes) in _AG_LISTS.items():
    scenario(_name, 2, "mismatch", f"all_gather of 4 int64 elements per rank where {_text}.", _ag_list(_sizes))


def _ar_mismatch(per_rank: dict[int, tuple[str, list[Any]]]) -> Callable[[Rank], None]:
    def body(r: Rank) -> None:
        dtype, values = per_rank[r.rank]
        r.all_reduce("all_reduce", r.tensor(values, dtype))
        r.health()

    return body


scenario("ar_sizes_3_5", 2, "mismatch", "all_reduce where rank 0 has 3 int64 elements and rank 1 has 5.",
         _ar_mismatch({0: ("int64", [1, 2, 3]), 1: ("int64", [10, 20, 30, 40, 50])}))
scenario("ar_sizes_5_3", 2, "mismatch", "all_reduce where rank 0 has 5 int64 elements and rank 1 has 3.",
         _ar_mismatch({0: ("int64", [1, 2, 3, 4, 5]), 1: ("int64", [10, 20, 30])}))
scenario("ar_dtype_float32_int32", 2, "mismatch", "all_reduce where rank 0 has float32 [1.5, 2.5] and rank 1 "
         "int32 [10, 20]: the same byte count.", _ar_mismatch({0: ("float32", [1.5, 2.5]), 1: ("int32", [10, 20])}))

# -- 3. a peer that never arrives -----------------------------------------------------------------------------


def _enter(r: Rank, op: str, name: str, src: int = 0) -> bool:
    """The collective the present ranks enter (4 int64 elements where there is a tensor)."""
    if op == "broadcast":
        return r.broadcast(name, r.tensor([10, 11, 12, 13] if r.rank == src else [-1] * 4, "int64"), src=src)
    if op == "all_gather":
        return r.all_gather(name, r.tensor([r.rank] * 4, "int64"))
    if op == "barrier":
        return r.barrier(name)
    return r.all_reduce(name, r.tensor([1, r.rank + 1, 3, 4], "int64"))


def _absent(op: str, variant: str, absent: int = 1, src: int = 0) -> Callable[[Rank], None]:
    """Rank ``absent`` skips the collective the others enter. exit: it returns at once (normal interpreter exit).
    sleep: it stays alive, calling nothing, until every present rank is done. rejoin: it waits until rank 0's
    collective has returned or raised, then all ranks run the follow-up all_reduce together."""

    def body(r: Rank) -> None:
        if r.rank == absent:
            if variant == "exit":
                r.emit(event="skip", note="exits without entering")
                return
            if variant == "sleep":
                for other in range(r.world):
                    if other != absent:
                        r.wait_mark(other, "done")
                return
            r.wait_mark(0, "entered_done")
            r.health()
            r.health("second_followup_all_reduce")
            return
        _enter(r, op, op, src)
        if r.rank == 0:
            r.mark("entered_done")
        r.health()
        r.health("second_followup_all_reduce")
        r.mark("done")

    return body


_ABSENT_OPS = {"broadcast_src0": ("broadcast", 0), "broadcast_src1": ("broadcast", 1),
               "all_gather": ("all_gather", 0), "barrier": ("barrier", 0), "all_reduce": ("all_reduce", 0)}
for _label, (_op, _src) in _ABSENT_OPS.items():
    for _variant in ("exit", "sleep"):
        _who = {"exit": "returns at once and its process exits normally",
                "sleep": "stays alive without calling anything until rank 0 is done"}[_variant]
        _srctext = f" (src={_src}: rank 0 is the {'sender' if _src == 0 else 'receiver'})" if _op == "broadcast" else ""
        scenario(f"absent_{_label}_{_variant}", 2, "never-arrives",
                 f"rank 0 enters {_op}{_srctext}; rank 1 never does: it {_who}. Rank 0 then runs two follow-up "
                 f"all_reduce calls alone.", _absent(_op, _variant, src=_src), timeout=NEVER_ARRIVES_TIMEOUT)
scenario("absent_broadcast_src1_rejoin", 2, "never-arrives",
         "rank 0 enters broadcast(src=1); rank 1 skips it, waits (alive) until rank 0's broadcast has returned or "
         "raised, then both run a follow-up all_reduce: does the group recover?",
         _absent("broadcast", "rejoin", src=1), timeout=NEVER_ARRIVES_TIMEOUT)
scenario("absent_all_reduce_rejoin", 2, "never-arrives",
         "rank 0 enters all_reduce; rank 1 skips it, waits (alive) until rank 0's all_reduce has returned or raised, "
         "then both run a follow-up all_reduce: does the group recover?",
         _absent("all_reduce", "rejoin"), timeout=NEVER_ARRIVES_TIMEOUT)
for _op, _src in (("broadcast", 0), ("all_reduce", 0), ("barrier", 0)):
    scenario(f"absent_{_op}_w3_sleep", 3, "never-arrives",
             f"ranks 0 and 1 enter {_op}{' (src=0)' if _op == 'broadcast' else ''}; rank 2 stays alive without "
             f"calling anything until both are done: which ranks see what?",
             _absent(_op, "sleep", absent=2, src=_src), timeout=NEVER_ARRIVES_TIMEOUT)
scenario("absent_all_reduce_sleep_pg_timeout_5s", 2, "never-arrives",
         "absent_all_reduce_sleep with PADDLE_PG_TIMEOUT=5000 (ms) in the environment: does that variable bound "
         "gloo's wait?", _absent("all_reduce", "sleep"), timeout=NEVER_ARRIVES_TIMEOUT,
         env={"PADDLE_PG_TIMEOUT": "5000"})

def _skew(kind: str) -> Callable[[Rank], None]:
    """Rank 0 alone makes a call that raises locally; then both ranks run two all_reduce calls."""

    def body(r: Rank) -> None:
        if r.rank == 0 and kind == "broadcast_empty":  # refused inside the process group (after it took a tag)
            r.broadcast("broadcast_empty_local_error", r.filled([0], 0, "int64"), src=0)
        elif r.rank == 0 and kind == "all_gather_mixed_list":  # refused by paddle.stack before the process group
            r.all_gather("all_gather_mixed_list_local_error", r.tensor([1, 2, 3, 4], "int64"),
                         [r.filled([2], -9, "int64"), r.filled([6], -9, "int64")])
        elif r.rank == 0 and kind == "all_gather_wrong_size_list":  # refused by gloo's allgather itself
            r.all_gather("all_gather_wrong_size_list_local_error", r.tensor([1, 2, 3, 4], "int64"),
                         [r.filled([6], -9, "int64"), r.filled([6], -9, "int64")])
        r.health()
        r.health("second_followup_all_reduce")

    return body


for _kind in ("broadcast_empty", "all_gather_mixed_list", "all_gather_wrong_size_list"):
    scenario(f"skew_{_kind}_then_all_reduce", 2, "sequence",
             f"rank 0 alone makes a call that raises locally ({_kind.replace('_', ' ')}); then both ranks run two "
             "all_reduce calls: does a collective that raised before communicating still count in the call "
             "sequence (gloo tag)?", _skew(_kind), timeout=NEVER_ARRIVES_TIMEOUT)

# -- 4. different collectives on different ranks ------------------------------------------------------------


def _kinds(ops: dict[int, str]) -> Callable[[Rank], None]:
    def body(r: Rank) -> None:
        op = ops[r.rank]
        if op == "broadcast_src0":
            r.broadcast(op, r.tensor([10, 11, 12, 13] if r.rank == 0 else [-1] * 4, "int64"), src=0)
        elif op == "broadcast_src1":
            r.broadcast(op, r.tensor([20, 21, 22, 23] if r.rank == 1 else [-1] * 4, "int64"), src=1)
        elif op == "all_gather":
            r.all_gather(op, r.tensor([100 * (r.rank + 1) + i for i in range(4)], "int64"))
        elif op == "barrier":
            r.barrier(op)
        else:
            r.all_reduce(op, r.tensor([100 * (r.rank + 1) + i for i in range(4)], "int64"))
        r.health()

    return body


_KINDS: dict[str, dict[int, str]] = {
    "kind_broadcast_vs_all_gather": {0: "broadcast_src0", 1: "all_gather"},
    "kind_barrier_vs_all_reduce": {0: "barrier", 1: "all_reduce"},
    "kind_all_reduce_vs_broadcast": {0: "all_reduce", 1: "broadcast_src1"},
    "kind_all_reduce_vs_broadcast_src0": {0: "all_reduce", 1: "broadcast_src0"},
}
for _name, _ops in _KINDS.items():
    scenario(_name, 2, "kind-mismatch",
             f"rank 0 calls {_ops[0]} while rank 1 calls {_ops[1]} (4 int64 elements where there is a tensor), "
             f"then both run a follow-up all_reduce.", _kinds(_ops), timeout=NEVER_ARRIVES_TIMEOUT)

# -- 5. order --------------------------------------------------------------------------------------------------


def _order(swapped: bool, numel: int) -> Callable[[Rank], None]:
    def body(r: Rank) -> None:
        srcs = [1, 0] if swapped and r.rank == 1 else [0, 1]
        for src in srcs:
            value = 10.0 * (src + 1) if r.rank == src else -1.0
            r.broadcast(f"broadcast_src{src}", r.filled([numel], value, "float32"), src=src)
        r.health()

    return body


scenario("order_same", 2, "order", "both ranks: broadcast src=0, then broadcast src=1 (4 float32 elements; the "
         "sender holds 10*(src+1)).", _order(False, 4))
scenario("order_swapped_small", 2, "order", "rank 0: broadcast src=0 then src=1; rank 1: src=1 then src=0 "
         "(4 float32 elements; the sender holds 10*(src+1)).", _order(True, 4), timeout=NEVER_ARRIVES_TIMEOUT)
scenario("order_swapped_large", 2, "order", "as order_swapped_small with 16M float32 elements (64 MiB, more than "
         "the loopback socket buffers hold).", _order(True, 16 * 1024 * 1024), timeout=NEVER_ARRIVES_TIMEOUT)


def rank_main(name: str) -> None:
    """Entry point on a rank: run the scenario's body, then say so (a rank without 'done' did not finish)."""
    r = Rank(name)
    SCENARIOS[name].body(r)
    r.emit(event="done")


# --------------------------------------------------------------------------------------------------------------
# Launcher side.
# --------------------------------------------------------------------------------------------------------------


def free_port() -> int:
    """A loopback port the kernel just handed out (never a fixed number)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _marked(token: str) -> list[psutil.Process]:
    """Every process carrying this launch's token: Paddle's launcher starts ranks in sessions of their own, so
    neither the process tree (once a parent is gone) nor the process group reaches all of them."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.pid != os.getpid() and proc.environ().get(TREE_VAR) == token:
                found.append(proc)
    return found


def kill_tree(proc: subprocess.Popen[bytes], token: str) -> int:
    """SIGKILL the launcher, everything under it and everything with its token; reap. Returns how many
    processes besides the launcher were killed."""
    victims: list[psutil.Process] = []
    if proc.poll() is None:
        with contextlib.suppress(psutil.Error):
            victims = psutil.Process(proc.pid).children(recursive=True)
    victims += [p for p in _marked(token) if p.pid not in {v.pid for v in victims}]
    for p in victims:
        with contextlib.suppress(psutil.Error):
            p.kill()
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # started with start_new_session=True
    proc.wait()
    psutil.wait_procs(victims, timeout=10)
    return len(victims)


def _launch_env(extra: dict[str, str], token: str, sync: Path, t0: float) -> dict[str, str]:
    """The caller's environment without Paddle's own settings (a PADDLE_* or FLAGS_* left over from a harness
    run would change what is measured), then the scenario's and this script's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PADDLE_", "FLAGS_", "GLOO_"))}
    env.update(PYTHONUNBUFFERED="1", **extra)
    env.update({TREE_VAR: token, SYNC_VAR: str(sync), T0_VAR: repr(t0)})
    return env


_NOISE = re.compile(r"No ccache found|warnings\.warn\(warning_message\)|Modified FLAGS detected|"
                    r"FLAGS_enable_pir_in_executor|^=+$|tcp_store\.cc|tcp_utils\.cc")


def _rank_result(log: Path, timed_out: bool, killed_at: float, t0: float, failed: dict[int, int],
                 rank: int) -> dict[str, Any]:
    """One rank's records, read back from its log in --log_dir; a step that began and never ended is closed as
    timed out by this script (if the launch hit its bound) or as ended with the process."""
    text = log.read_text(encoding="utf-8", errors="replace") if log.exists() else ""
    records, after_last = [], []  # after_last: what the rank printed after its last record (a crash, say)
    for line in text.splitlines():
        if line.startswith(MARK):
            records.append(json.loads(line[len(MARK):]))
            after_last = []
        elif line.strip() and not _NOISE.search(line):
            after_last.append(line.rstrip())
    out: dict[str, Any] = {"steps": [], "events": [], "finished": False}
    open_step: dict[str, Any] | None = None
    for rec in records:
        event = rec.pop("event")
        if event == "init":
            out["init_seconds"] = rec["seconds"]
        elif event == "ready":
            out["ready_at"] = rec["at"]
        elif event == "info":
            out["process_group"] = rec["process_group"]
        elif event == "begin":
            open_step = {"step": rec["step"], "op": rec["op"], "began_at": rec["at"]}
            out["steps"].append(open_step)
        elif event == "end" and open_step is not None:
            open_step.update({k: v for k, v in rec.items() if k not in ("step", "at")})
            open_step["ended_at"] = rec["at"]
            open_step = None
        elif event == "done":
            out["finished"] = True
        else:
            out["events"].append({"event": event, **rec})
    crash = _crash(after_last)
    if open_step is not None:
        if timed_out:
            open_step.update(outcome="timed-out-by-script",
                             seconds=round(killed_at - t0 - open_step["began_at"], 1))
        elif rank in failed or crash.get("signal") not in (None, "SIGTERM"):
            open_step.update(outcome="process-died", signal=crash.get("signal"), exit_code=failed.get(rank))
        else:  # SIGTERM (Paddle's handler prints it) or nothing: the launcher's pod.stop after a peer failed
            open_step.update(outcome="killed-by-launcher",
                             note="the launcher stopped this rank after another rank's process failed")
    if not out["events"]:
        del out["events"]
    if after_last:
        out["log_after_last_record"] = after_last[-30:]
    if crash:  # after 'done' this is the launcher's SIGTERM during interpreter exit, not a failed step
        out["signal_after_done" if out["finished"] else "crash"] = crash
    if rank in failed:
        out["exit_code"] = failed[rank]
    return out


def _crash(lines: list[str]) -> dict[str, str]:
    """What a dying rank printed: the C++ exception and its what(), Paddle's FatalError line, the signal."""
    text = "\n".join(lines)
    patterns = (("exception", r"terminate called after throwing an instance of '([^']+)'"),
                ("what", r"what\(\):(.*)"), ("summary", r"^(\w+Error: .*)$"), ("signal", r"\*\*\* (SIG[A-Z]+) "))
    return {key: m.group(1).strip() for key, pattern in patterns if (m := re.search(pattern, text, re.MULTILINE))}


def run_scenario(sc: Scenario, script: Path) -> dict[str, Any]:
    """One launch: Paddle's launcher with ``sc.world`` CPU ranks, a kernel-assigned master port, logs in a temp
    dir; killed with its whole tree when it outlives ``sc.timeout``. Nothing is left behind."""
    with tempfile.TemporaryDirectory(prefix="gloo-measure-") as tmp_name:
        tmp = Path(tmp_name)
        log_dir, sync = tmp / "log", tmp / "sync"
        sync.mkdir()
        token = uuid.uuid4().hex
        cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(sc.world),
               "--master", f"127.0.0.1:{free_port()}", "--log_dir", str(log_dir), str(script),
               "--rank-scenario", sc.name]
        t0 = time.time()
        with open(tmp / "launcher.out", "wb") as out:
            proc = subprocess.Popen(cmd, env=_launch_env(sc.env, token, sync, t0), cwd=tmp, stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        timed_out, killed_at, killed = False, 0.0, 0
        try:
            rc: int | None = proc.wait(timeout=sc.timeout)
        except subprocess.TimeoutExpired:
            timed_out, killed_at = True, time.time()
            killed = kill_tree(proc, token)
            rc = None
        wall = time.time() - t0
        strays = _marked(token)  # a rank the launcher left running after it exited
        if strays:
            killed += kill_tree(proc, token)
        launcher_text = (tmp / "launcher.out").read_text(encoding="utf-8", errors="replace")
        failed = {int(m.group(1)): int(m.group(2)) for m in
                  re.finditer(r"Container rank (\d+) status failed .*? code (-?\d+)", launcher_text)}
        ranks = {str(r): _rank_result(log_dir / f"workerlog.{r}", timed_out, killed_at, t0, failed, r)
                 for r in range(sc.world)}
        result: dict[str, Any] = {
            "world": sc.world, "group": sc.group, "description": sc.description,
            "launch": {"launcher_exit_code": rc, "timed_out_by_script": timed_out, "script_timeout_s": sc.timeout,
                       "wall_seconds": round(wall, 1), "processes_killed_by_script": killed,
                       "strays_after_launcher_exit": len(strays)},
            "ranks": ranks,
        }
        if sc.env:
            result["env"] = sc.env
        if failed:
            result["launch"]["failed_containers"] = {str(k): v for k, v in failed.items()}
        if rc not in (0, None) or timed_out or failed:
            result["launch"]["launcher_log_tail"] = [
                ln for ln in launcher_text.splitlines() if "LAUNCH" in ln and ln.strip()][-8:]
        return result


def _env_search() -> list[dict[str, str]]:
    """Environment variables Paddle's Python distributed code reads on lines about timeouts or gloo (the C++
    side takes none for gloo: ProcessGroupGloo.create gets no timeout, see docs/gloo.md)."""
    spec = importlib.util.find_spec("paddle")
    if spec is None or spec.origin is None:
        return []
    root = Path(spec.origin).parent
    files = [root / "distributed" / "parallel.py", root / "distributed" / "collective.py",
             *sorted((root / "distributed" / "communication").rglob("*.py"))]
    getenv = re.compile(r"""os\.(?:getenv|environ\.get|environ\[)\(?\s*['"]([A-Za-z0-9_]+)['"]""")
    found = []
    for path in files:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            match = getenv.search(line)
            if match and re.search(r"timeout|gloo", line, re.IGNORECASE):
                found.append({"variable": match.group(1), "where": f"{path.relative_to(root.parent)}:{number}",
                              "line": line.strip()})
    for path in files:  # how often the name a variable is read into occurs in its file (1: read, never used)
        for item in found:
            if item["where"].startswith(str(path.relative_to(root.parent)) + ":"):
                target = re.match(r"\s*([\w.]+)\s*=", item["line"])
                if target:
                    name = target.group(1).split(".")[-1]
                    item["assigned_to"] = target.group(1)
                    item["name_occurrences_in_file"] = str(len(re.findall(rf"\b{name}\b", path.read_text("utf-8"))))
    lines = (root / "distributed" / "collective.py").read_text(encoding="utf-8").splitlines()
    creator = ""
    for number, line in enumerate(lines, 1):
        made = re.search(r"core\.(ProcessGroup\w+)\.create", line)
        creator = made.group(1) if made else creator
        if "pg_timeout" in line or "ProcessGroupGloo.create" in line:
            found.append({"variable": "(use)", "where": f"paddle/distributed/collective.py:{number}",
                          "line": line.strip(), "in_call_of": creator})
    return found


def environment() -> dict[str, Any]:
    def version(dist: str) -> str | None:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None

    return {
        "paddle_version": version("paddlepaddle") or version("paddlepaddle-gpu"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "psutil": version("psutil"),
        "launcher": "python -m paddle.distributed.launch --nproc_per_node N --master 127.0.0.1:<kernel port> "
                    "--log_dir <tmp> measure.py --rank-scenario NAME (CPU build: PADDLE_DISTRI_BACKEND=gloo)",
        "launch_env_cleared": "PADDLE_*, FLAGS_*, GLOO_* of the caller are not passed to the launch",
        "gloo_timeout_env_search": _env_search(),
        "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def dumps(value: Any, indent: int = 0) -> str:
    """JSON with one key per line but lists of plain values (tensor values, shapes) on one line: readable diffs."""
    pad = " " * indent
    if isinstance(value, dict) and value:
        items = [f'{pad} {json.dumps(k)}: {dumps(v, indent + 1).lstrip()}' for k, v in value.items()]
        return pad + "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(value, list) and any(isinstance(v, (dict, list)) and v for v in value):
        return pad + "[\n" + ",\n".join(dumps(v, indent + 1) for v in value) + "\n" + pad + "]"
    return pad + json.dumps(value)


def select(patterns: list[str]) -> list[Scenario]:
    names = [n for n in SCENARIOS if not patterns or any(fnmatch.fnmatchcase(n, p) for p in patterns)]
    unknown = [p for p in patterns if not any(fnmatch.fnmatchcase(n, p) for n in SCENARIOS)]
    if unknown:
        raise SystemExit(f"no scenario matches {unknown}; --list names them")
    return [SCENARIOS[n] for n in names]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "semantics.json")
    parser.add_argument("--only", action="append", default=[],
                        help="scenario names or shell patterns, comma-separated; repeatable. With an existing "
                             "--out file, only these scenarios are replaced in it.")
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    parser.add_argument("--rank-scenario", help=argparse.SUPPRESS)  # set by this script for Paddle's launcher
    args = parser.parse_args(argv)
    if args.rank_scenario:
        rank_main(args.rank_scenario)
        return 0
    patterns = [p for item in args.only for p in item.split(",") if p]
    chosen = select(patterns)
    if args.list:
        for sc in chosen:
            print(f"{sc.name:40} world {sc.world}  bound {sc.timeout:>5.0f} s  {sc.group}")
        return 0
    doc: dict[str, Any] = {"environment": {}, "scenarios": {}}
    if patterns and args.out.exists():
        doc = json.loads(args.out.read_text(encoding="utf-8"))
    start = time.time()
    env = environment()
    for sc in chosen:
        print(f"[{time.time() - start:7.1f} s] {sc.name} (world {sc.world}) ...", end=" ", flush=True)
        res = run_scenario(sc, Path(__file__).resolve())
        doc["scenarios"][sc.name] = res
        outcomes = {r: [s.get("outcome") for s in v["steps"]] for r, v in res["ranks"].items()}
        print(f"{res['launch']['wall_seconds']} s {outcomes}", flush=True)
    env["last_run"] = {"scenarios": [sc.name for sc in chosen], "seconds": round(time.time() - start, 1)}
    env["measured_gloo_timeout_s"] = _timeouts(doc["scenarios"])
    env["leftover_processes"] = sum(1 for p in psutil.process_iter() if _has_measure_token(p))
    doc["environment"] = env
    doc["scenarios"] = {n: doc["scenarios"][n] for n in SCENARIOS if n in doc["scenarios"]}  # definition order
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(dumps(doc) + "\n", encoding="utf-8")
    print(f"wrote {args.out} ({len(chosen)} scenarios in {time.time() - start:.0f} s)")
    return 0


def _timeouts(scenarios: dict[str, Any]) -> dict[str, Any]:
    """Every step that raised a gloo TIMEOUT after waiting at least a second: how long it waited."""
    waits = sorted(step["seconds"] for sc in scenarios.values() for rank in sc["ranks"].values()
                   for step in rank["steps"] if step.get("outcome") == "raised" and step["seconds"] >= 1
                   and "TIMEOUT" in step["error"]["message_head"])
    return {"count": len(waits), "min": waits[0], "max": waits[-1]} if waits else {"count": 0}


def _has_measure_token(proc: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):
        return proc.pid != os.getpid() and TREE_VAR in proc.environ()
    return False


if __name__ == "__main__":
    sys.exit(main())
