"""What a gloo collective gives each rank, as plain bytes: the semantics virtual ranks reproduce.

Every rule here was measured on Paddle's own gloo backend (docs/gloo.md, taken by docs/gloo/measure.py, raw results
in docs/gloo/semantics.json) and tests/test_gloo_model.py holds this model to those measurements. Framework-free:
harness.virtual_paddle turns tensors into ``Buffer`` and results back into tensors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .baton import Entry


@dataclass(frozen=True)
class Buffer:
    """A rank's tensor as the backend sees it: its bytes, its dtype code and its element count."""

    data: bytes
    code: str
    numel: int

    @property
    def nbytes(self) -> int:
        return len(self.data)


class GlooError(RuntimeError):
    """An error gloo raises on a rank (the message is the measured one, so signatures match a real run's)."""


class RankExit(SystemExit):
    """The rank's process ends here, as Paddle's gloo glue ends it (``exit(-1)``: status 255). A SystemExit, so the
    rank's executor lets it through like a real exit, and the host lets the rank die."""

    def __init__(self, why: str) -> None:
        super().__init__(255)
        self.why = why


#: Dtypes Paddle's gloo glue can hand to gloo (GENERATE_FUNC in paddle/phi/core/distributed/gloo_utils.h, Linux):
#: any other dtype makes the rank's process call exit(-1) before it communicates — silently, the message is a
#: VLOG(0) — in every collective that takes a buffer.
SUPPORTED = frozenset({"F32", "F64", "F16", "I32", "I64", "I8", "U8", "BOOL", "BF16"})


# Messages as gloo words them (docs/gloo.md). A peer that never arrives: gloo's own timeout, after which the
# group is unusable.
TIMEOUT_MESSAGE = ("[Virtual gloo] Timed out waiting for a peer in a collective ({kinds}); a real gloo group "
                   "raises here after its timeout and is unusable afterwards")

TIMEOUT_S = 30.0  # how long a gloo rank waits for a peer before it raises (docs/gloo.md)
PEER_LOST_MESSAGE = "[Virtual gloo] Connection closed by peer in a collective ({kinds})"

_SUMMABLE = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
             "U8": "u1"}


def timed_out(kinds: Sequence[str], lost: bool) -> GlooError:
    """The error of a rank whose peer never joined its collective: ``lost``, the peer's process exited (its
    connection closed), else it is alive elsewhere and the timeout passed."""
    if lost:
        return GlooError(PEER_LOST_MESSAGE.format(kinds=", ".join(kinds) or "?"))
    return GlooError(TIMEOUT_MESSAGE.format(kinds=", ".join(kinds) or "?"))


def entry_check(kind: str, buffers: list[Buffer]) -> RankExit | None:
    """What happens on a rank before it meets its peers: its process exits where a buffer's dtype is one gloo's
    glue has no case for."""
    for buf in buffers:
        if buf.code not in SUPPORTED:
            return RankExit(f"gloo {kind} of a {buf.code} buffer: Paddle's gloo glue calls exit(-1)")
    return None


def resolve(entries: Mapping[int, Entry]) -> dict[int, tuple[bool, Any]]:
    """Each member's (ok, result) of one matched collective. Results: broadcast -> the bytes the receiver's buffer
    holds afterwards; all_gather -> one bytes per member in group order; all_reduce -> the reduced bytes;
    barrier -> None."""
    kinds = {e.kind for e in entries.values()}
    if len(kinds) > 1:
        return _mismatch(entries)
    kind = kinds.pop()
    ranks = sorted(entries)
    if kind == "barrier":
        return {r: (True, None) for r in ranks}
    if kind == "broadcast":
        return _broadcast(entries)
    if kind == "all_gather":
        return _all_gather(entries)
    if kind == "all_reduce":
        return _all_reduce(entries)
    raise ValueError(f"no model of gloo's {kind}")


def _broadcast(entries: Mapping[int, Entry]) -> dict[int, tuple[bool, Any]]:
    srcs = {e.payload[0] for e in entries.values()}
    if len(srcs) > 1:
        return _fail(entries, f"broadcast with different roots {sorted(srcs)}")
    src = srcs.pop()
    data = entries[src].payload[1].data
    out: dict[int, tuple[bool, Any]] = {}
    for rank, entry in entries.items():
        own: Buffer = entry.payload[1]
        if own.nbytes != len(data):
            out[rank] = (False, GlooError(f"broadcast of {len(data)} bytes into a buffer of {own.nbytes}"))
        else:
            out[rank] = (True, data)
    return out


def _all_gather(entries: Mapping[int, Entry]) -> dict[int, tuple[bool, Any]]:
    sizes = {e.payload.nbytes for e in entries.values()}
    if len(sizes) > 1:
        return _fail(entries, f"all_gather of different sizes {sorted(sizes)}")
    gathered = [entries[r].payload.data for r in sorted(entries)]
    return {r: (True, list(gathered)) for r in entries}


def _all_reduce(entries: Mapping[int, Entry]) -> dict[int, tuple[bool, Any]]:
    bufs = [entries[r].payload for r in sorted(entries)]
    if len({(b.code, b.nbytes) for b in bufs}) > 1:
        return _fail(entries, "all_reduce of different sizes or dtypes")
    carrier = _SUMMABLE.get(bufs[0].code)
    if carrier is None:
        raise NotImplementedError(f"virtual gloo: all_reduce of {bufs[0].code} is not modelled")
    total = sum(np.frombuffer(b.data, carrier) for b in bufs[1:]) + np.frombuffer(bufs[0].data, carrier)
    data = np.asarray(total, carrier).tobytes()
    return {r: (True, data) for r in entries}


def _mismatch(entries: Mapping[int, Entry]) -> dict[int, tuple[bool, Any]]:
    return _fail(entries, "ranks called different collectives: " + ", ".join(
        f"rank {r} {e.kind}" for r, e in sorted(entries.items())))


def _fail(entries: Mapping[int, Entry], message: str) -> dict[int, tuple[bool, Any]]:
    return {r: (False, GlooError(message)) for r in entries}
