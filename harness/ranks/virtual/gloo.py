"""What a gloo collective gives each rank, as plain bytes: the semantics virtual ranks reproduce.

Every rule here was measured on Paddle 3.3.1's own gloo backend, on real ranks ([docs/gloo.md](../docs/gloo.md),
taken by docs/gloo/measure.py, every rank's record in docs/gloo/semantics.json); tests/test_gloo_model.py holds this
model to those records. Framework-free: harness.ranks.virtual.paddle_world turns tensors into ``Buffer`` and results
back.

Exceptions are the builtin types Paddle raises (``RuntimeError`` for communication and gloo's enforce failures,
``ValueError`` for Paddle's InvalidArgument checks), with the measured messages, so a virtual failure reads — and
buckets — as a real one. Two attributes ride on them for the scheduler: ``ckh_wait_s``, the seconds a real rank would
have waited before raising (the timeout), and ``ckh_breaks``, set where the failure leaves the group dead for good.
A rank whose process would die gets ``RankExit`` with the status the measurements saw.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.ranks.virtual.scheduler import Entry

TIMEOUT_S = 30.0  # gloo's fixed wait for a peer (PADDLE_PG_TIMEOUT does not reach it)
PEER_GONE_S = 0.4  # how soon a rank notices that a peer's process is gone
PORT_BASE = 6170  # the virtual endpoints' ports (harness.ranks.virtual.paddle_world): only quoted in messages

RECV_TIMEOUT = ("[/paddle/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:80] TIMEOUT self_rank = none "
                "pair_rank = -1 peer_str = none")
SEND_TIMEOUT = ("[/paddle/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:133] TIMEOUT self_rank = -1 "
                "pair_rank = none peer_str = none")
PEER_GONE = ("[/paddle/third_party/gloo/gloo/transport/tcp/pair.cc:584] TIMEOUT self_rank = {rank} pair_rank = {peer} "
             "peer_str = [127.0.0.1]:{port}")
RESET = ("[/paddle/third_party/gloo/gloo/transport/tcp/pair.cc:576] Read error [127.0.0.1]:{port}: Connection reset "
         "by peer")
PAIR_CLOSED = "Application timeout caused pair closure"
EMPTY_BROADCAST = ("(InvalidArgument) Size of tensor should be greater than 0.\n  [Hint: Expected tensor.numel() > 0, "
                   "but received tensor.numel():0 <= 0:0.] (at /paddle/paddle/phi/core/distributed/check/"
                   "static_check.cc:93)")
EMPTY_ALL_REDUCE = "[enforce fail at /paddle/third_party/gloo/gloo/allreduce.cc:105] opts.elements > 0."
ALL_GATHER_SIZE = ("[enforce fail at /paddle/third_party/gloo/gloo/allgather.cc:39] out->size == in->size * "
                   "context->size. {out} vs {expected}")
STACK_SHAPES = ("(InvalidArgument) The 0-th dimension of input[0] and input[{i}] is expected to be equal.But received "
                "input[0]'s shape = {a}, input[{i}]'s shape = {b}.")

#: Dtypes Paddle's gloo glue can hand to gloo (GENERATE_FUNC in paddle/phi/core/distributed/gloo_utils.h, Linux):
#: any other dtype makes the rank's process call exit(-1) (status 255) before it communicates.
SUPPORTED = frozenset({"F32", "F64", "F16", "I32", "I64", "I8", "U8", "BOOL", "BF16"})
_SUMMABLE = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
             "U8": "u1"}


@dataclass(frozen=True)
class Buffer:
    """A rank's tensor as the backend sees it: its bytes, its dtype code, its element count and shape."""

    data: bytes
    code: str
    numel: int
    shape: tuple[int, ...] = ()

    @property
    def nbytes(self) -> int:
        return len(self.data)


@dataclass(frozen=True)
class Prefix:
    """A broadcast result for a receiver larger than the message: its first ``len(data)`` bytes, the rest kept."""

    data: bytes


class RankExit(SystemExit):
    """The rank's process ends here (no Python exception on real ranks): ``status`` 255 for Paddle's exit(-1), -6
    for gloo's abort (SIGABRT), -8 for SIGFPE. A SystemExit, so the rank's executor lets it through like a real exit
    and the host lets the rank die."""

    def __init__(self, status: int, why: str) -> None:
        super().__init__(status)
        self.why = why


class VirtualUnsupported(NotImplementedError):
    """A case the measurements do not pin down (e.g. all_reduce of two dtypes): never guessed."""


def _error(cls: type[Exception], message: str, wait_s: float = 0.0, breaks: str | None = None,
           peer: int | None = None) -> Exception:
    exc = cls(message)
    exc.ckh_wait_s = wait_s  # type: ignore[attr-defined]
    exc.ckh_breaks = breaks  # type: ignore[attr-defined]
    exc.ckh_peer = peer  # type: ignore[attr-defined]
    return exc


def _port(rank: int) -> int:
    return PORT_BASE + rank


class Gloo:
    """The backend model the scheduler consults: what a rank meets before, at and after a collective."""

    def __init__(self, size: int) -> None:
        self.size = size  # the world: gloo's context size
        self.pending_reset: int | None = None  # a peer aborted mid-collective: the survivors' next call is reset

    # -- before the peers ---------------------------------------------------------------------------------------

    def entry(self, rank: int, kind: str, payload: Any) -> tuple[BaseException | None, bool]:
        """What happens on a rank before it communicates: (the error or exit, whether the call used up the rank's
        tag). Checks run in the order Paddle's glue runs them (broadcast: size, then dtype; others: dtype first)."""
        if kind == "barrier":
            return None, False
        if kind == "all_gather" and isinstance(payload, tuple):  # (input, the list it fills)
            buf, outs = payload
            shapes = [o.shape for o in outs]
            odd = next((i for i, s in enumerate(shapes) if s != shapes[0]), None)
            if odd is not None:  # paddle.stack refuses it before the process group is called: no tag used
                return _error(ValueError, STACK_SHAPES.format(i=odd, a=list(shapes[0]), b=list(shapes[odd]))), False
        buf = payload[1] if kind == "broadcast" else payload[0] if isinstance(payload, tuple) else payload
        if kind == "broadcast" and buf.numel == 0:
            return _error(ValueError, EMPTY_BROADCAST), True
        if buf.code not in SUPPORTED:
            return RankExit(255, f"gloo {kind} of a {buf.code} buffer: Paddle's gloo glue calls exit(-1)"), True
        if kind == "all_reduce" and buf.numel == 0:
            return _error(RuntimeError, EMPTY_ALL_REDUCE), True
        if kind == "all_gather":
            if buf.numel == 0:
                return RankExit(-8, "gloo allgather of zero elements: SIGFPE"), True
            if isinstance(payload, tuple):
                out = sum(o.nbytes for o in payload[1])
                if out != buf.nbytes * self.size:
                    return _error(RuntimeError, ALL_GATHER_SIZE.format(out=out, expected=buf.nbytes * self.size)), True
        return None, False

    # -- with the peers -----------------------------------------------------------------------------------------

    def resolve(self, entries: Mapping[int, Entry]) -> dict[int, tuple[bool, Any]]:
        """Each member's (ok, result) of one matched collective: broadcast -> bytes (or a Prefix) for the buffer;
        all_gather -> one bytes per member in group order; all_reduce -> the reduced bytes; barrier -> None."""
        kinds = {e.kind for e in entries.values()}
        roots = {e.payload[0] for e in entries.values() if e.kind == "broadcast"}
        if len(kinds) > 1 or len(roots) > 1:  # never pair: every rank waits out the timeout
            return {r: (False, self.timeout(r, e, None)) for r, e in entries.items()}
        kind = kinds.pop()
        if kind == "barrier":
            return {r: (True, None) for r in entries}
        if kind == "broadcast":
            return self._broadcast(entries, roots.pop())
        bufs = {r: _input(e) for r, e in entries.items()}
        if kind == "all_gather":
            return self._all_gather(bufs)
        return self._all_reduce(bufs)

    def _all_gather(self, bufs: Mapping[int, Buffer]) -> dict[int, tuple[bool, Any]]:
        """gloo's allgather is a ring: at step k rank r receives, from r-1, the block of rank r-k. A rank handed a
        block larger than its own aborts (SIGABRT); if that happens before the last step, every survivor's ring
        breaks (a reset), else the survivors return with whatever arrived and their next call is reset."""
        order = sorted(bufs)
        data = [bufs[r].data for r in order]
        size = len(order)
        if len({len(d) for d in data}) == 1:  # no rank is handed more than it holds: the ring runs through
            return {r: (True, data) for r in order}
        for step in range(1, size):
            dead = {order[i] for i in range(size) if bufs[order[(i - step) % size]].nbytes > bufs[order[i]].nbytes}
            if dead:
                out: dict[int, tuple[bool, Any]] = {}
                for r in order:
                    if r in dead:
                        got = bufs[order[(order.index(r) - step) % size]].nbytes
                        out[r] = (False, RankExit(-6, f"gloo allgather: op.preamble.length <= op.nbytes. {got} vs "
                                                      f"{bufs[r].nbytes} (SIGABRT)"))
                    else:
                        out[r] = (True, [_fit(d, bufs[r].nbytes) for d in data])
                return self._after_aborts(out, reset_now=step < size - 1)
        return {r: (True, data) for r in order}

    def _broadcast(self, entries: Mapping[int, Entry], root: int) -> dict[int, tuple[bool, Any]]:
        data = entries[root].payload[1].data
        out: dict[int, tuple[bool, Any]] = {}
        for rank, entry in entries.items():
            own: Buffer = entry.payload[1]
            if own.nbytes < len(data):
                out[rank] = (False, RankExit(-6, f"gloo::EnforceNotMet: op.preamble.length <= op.nbytes. "
                                                 f"{len(data)} vs {own.nbytes} (SIGABRT)"))
            else:
                out[rank] = (True, data if own.nbytes == len(data) else Prefix(data))
        return self._after_aborts(out)

    def _after_aborts(self, out: dict[int, tuple[bool, Any]], reset_now: bool = False) -> dict[int, tuple[bool, Any]]:
        """Where a rank aborted mid-collective, the survivors' next call (``reset_now``: this one) sees the reset."""
        dead = [r for r, (ok, v) in out.items() if not ok and isinstance(v, RankExit)]
        if not dead:
            return out
        for rank, (ok, _) in list(out.items()):
            if ok and reset_now:
                out[rank] = (False, _error(RuntimeError, RESET.format(port=_port(dead[0])), breaks="reset",
                                           peer=dead[0]))
            elif ok:
                self.pending_reset = dead[0]
        return out

    def _all_reduce(self, bufs: Mapping[int, Buffer]) -> dict[int, tuple[bool, Any]]:
        codes = {b.code for b in bufs.values()}
        if len(codes) > 1 and len({b.nbytes for b in bufs.values()}) == 1:
            raise VirtualUnsupported("virtual gloo: all_reduce of two dtypes (real ranks swap bits, by timing)")
        ordered = [bufs[r] for r in sorted(bufs)]
        carrier = _SUMMABLE.get(ordered[0].code)
        if carrier is None:
            raise VirtualUnsupported(f"virtual gloo: all_reduce of {ordered[0].code} is not modelled")
        biggest = max(b.nbytes for b in ordered)
        if all(b.nbytes == biggest for b in ordered):
            total = np.frombuffer(ordered[0].data, carrier).copy()
            for b in ordered[1:]:
                total = total + np.frombuffer(b.data, carrier)
            return {r: (True, np.asarray(total, carrier).tobytes()) for r in bufs}
        # Unequal sizes: a rank sent more than its buffer holds aborts; the rest end partly reduced or reset, by
        # timing on real ranks (docs/gloo.md): a crash and a reset here, never made-up data.
        out: dict[int, tuple[bool, Any]] = {
            r: (False, RankExit(-6, f"gloo allreduce: op.preamble.length <= op.nbytes. {biggest} vs {b.nbytes} "
                                    "(SIGABRT)")) if b.nbytes < biggest else (True, None)
            for r, b in bufs.items()}
        return self._after_aborts(out, reset_now=True)

    # -- without the peers ---------------------------------------------------------------------------------------

    def unfinished(self, entries: Mapping[int, Entry], members: tuple[int, ...], gone: int | None
                   ) -> dict[int, tuple[bool, Any]]:
        """A collective some members never entered: a broadcast whose root entered still delivers to the
        receivers that did (the root sends to each in turn, then waits on the absent one); every other rank waits
        out the timeout, or notices a peer's exit."""
        roots = {e.payload[0] for e in entries.values() if e.kind == "broadcast"}
        kinds = {e.kind for e in entries.values()}
        if kinds == {"broadcast"} and len(roots) == 1 and (root := roots.pop()) in entries:
            delivered = self._broadcast({r: e for r, e in entries.items()}, root)
            return {r: (delivered[r] if r != root else (False, self.timeout(r, entries[r], gone, members, entries)))
                    for r in entries}
        return {r: (False, self.timeout(r, e, gone, members, entries)) for r, e in entries.items()}

    def timeout(self, rank: int, entry: Entry, gone: int | None, members: tuple[int, ...] = (),
                entered: Mapping[int, Entry] | None = None) -> Exception:
        """The error of a rank whose peers never completed its collective: ``gone``, a member whose process
        exited (noticed within PEER_GONE_S), else the timeout (TIMEOUT_S; the message names the side that
        waited: a sender, i.e. a broadcast root, or an all_gather rank whose right-hand neighbour in gloo's ring
        is absent — its first send never completes — or a receiver: every other rank, an all_gather rank included
        whose left-hand neighbour is the one absent, as 3 real ranks show)."""
        if gone is not None:
            return _error(RuntimeError, PEER_GONE.format(rank=rank, peer=gone, port=_port(gone)), PEER_GONE_S, "gone",
                          gone)
        right = members[(members.index(rank) + 1) % len(members)] if rank in members else None
        sender = (entry.kind == "all_gather" and (right is None or entered is None or right not in entered)) \
            or (entry.kind == "broadcast" and entry.payload[0] == rank)
        return _error(RuntimeError, SEND_TIMEOUT if sender else RECV_TIMEOUT, TIMEOUT_S, "timeout")

    def after_break(self, rank: int, how: str, peer: int | None, waited: bool, late: bool = False) -> Exception:
        """Any later collective of a dead group: after a timeout, "pair closure" at once for a rank that timed out
        itself (``waited``: in any op since), a pair.cc TIMEOUT at once for one that arrives after the timeout
        passed (``late``: in a later op; it names its ring's left-hand neighbour, as 3 real ranks show), while a
        rank that had finished its part in the same op blocks until the others time out and then raises the
        timeout; after a peer's exit the first error again; after a peer's abort the reset."""
        if how == "timeout":
            if waited:
                return _error(RuntimeError, PAIR_CLOSED)
            if late:
                left = (rank - 1) % self.size
                return _error(RuntimeError, PEER_GONE.format(rank=rank, peer=left, port=_port(left)))
            return _error(RuntimeError, RECV_TIMEOUT, TIMEOUT_S)
        if how == "reset" and peer is not None:
            return _error(RuntimeError, RESET.format(port=_port(peer)))
        return _error(RuntimeError, PEER_GONE.format(rank=rank, peer=peer, port=_port(peer or 0)))


def _fit(data: bytes, nbytes: int) -> bytes | Prefix:
    """A block as a receiver of ``nbytes`` holds it (a smaller block: a prefix, the rest as it was)."""
    return data if len(data) == nbytes else Prefix(data[:nbytes])


def _input(entry: Entry) -> Buffer:
    return entry.payload[0] if isinstance(entry.payload, tuple) else entry.payload
