"""Paddle's unmodified checkpoint code on W virtual ranks: threads of one process under harness.ranks.virtual.scheduler.

Nothing of flex checkpoint is replaced. What is faked is listed in ``FAKES`` and is only what a real launch gives
a rank from outside Python's reach of one process: its identity, its default process group, and the backend
behind that group (gloo, emulated from measurements: harness.ranks.virtual.gloo). Everything Paddle keeps at module
level — caches, the metadata manager, the async save queue, the group maps — gets one copy per rank, swapped in when
the turn passes (``RankGlobals``); a shared copy would let one rank see another's cache and report false bugs.
"""

from __future__ import annotations

import collections
import copy
import functools
import gc
import importlib
import os
import pickle
import pkgutil
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from harness.ranks.virtual.gloo import Buffer, Gloo, Prefix, VirtualUnsupported
from harness.ranks.virtual.scheduler import OneAtATimeScheduler
from harness.ranks.virtual.shared_objects import GatherCopies, SharedCalls, deepcopy_keeping_immutable, frozen_classes

FAKES: tuple[str, ...] = (
    "environment PADDLE_TRAINER_ID, PADDLE_CURRENT_ENDPOINT, PADDLE_RANK_IN_NODE, PADDLE_LOCAL_RANK: the running "
    "rank's, set at every switch (Paddle's C++ reads PADDLE_TRAINER_ID on every call)",
    "paddle.distributed.parallel._global_parallel_env: a real ParallelEnv per rank (get_rank, get_world_size)",
    "the default group: a real Group per rank, registered the way init_parallel_env registers it, so "
    "is_initialized() holds and init_parallel_env is never called",
    "the default group's process group: VirtualProcessGroup — barrier, broadcast, all_gather, "
    "all_gather_into_tensor, all_reduce(SUM) with gloo's measured semantics; any other call raises VirtualUnsupported",
    "paddle.distributed.all_gather_object: Paddle's own algorithm (pickle, all_gather the int64 lengths, all_gather "
    "the uint8 bytes padded with np.resize to the longest, unpickle each rank's prefix, append in rank order) on "
    "bytes instead of tensors: the same two gloo all_gathers, without W tensors made and read back per rank; in "
    "a world of SHARE_FROM ranks or more each distinct payload of a gather is unpickled once and every rank gets "
    "fresh containers around its immutable leaves (harness.ranks.virtual.shared_objects: strings, numbers, tuples, "
    "frozen "
    "dataclasses), or its own unpickled copy where a part cannot be proven immutable",
    "paddle.distributed.new_group: raises VirtualUnsupported (no sub-groups)",
    "the pure planners of PURE (reshard_comm's split_read_items, schedule_read_items): from SHARE_FROM ranks on, "
    "one call per collective epoch for the ranks that pass the same immutable read items; each rank gets fresh "
    "containers around the result's immutable leaves",
    "copy.deepcopy of the flex checkpoint's frozen dataclasses (LocalTensorIndex, ReadItem, ...): from SHARE_FROM "
    "ranks on, the object itself where every attribute is immutable, as deepcopy keeps a tuple of numbers (Paddle "
    "deep-copies the whole metadata on every rank's load)",
    "gc as the watched modules see it: collect() runs one full collection per collective epoch; the ranks' garbage "
    "lives in one process, so the first rank's collection frees what W would, and the other W-1 would only walk "
    "every rank's live objects again (quadratic in W; nothing a checkpoint holds can depend on it)",
    "module-level values of paddle.distributed's parallel, collective, communication and flex_checkpoint modules "
    "and of the SUT adapter's package: one copy per rank (RankGlobals)",
)

#: From this many ranks on, a gather's payloads are unpickled once and copied per rank
#: (harness.ranks.virtual.shared_objects):
#: below it W unpickles of each payload cost less than proving its leaves immutable once.
SHARE_FROM = 8
#: Paddle's static methods that are pure (the result a function of the arguments' values alone, no side effects)
#: and that every rank calls on the same gathered read items: from SHARE_FROM ranks on, computed once per collective
#: epoch for the ranks that pass the same immutable items (harness.ranks.virtual.shared_objects.SharedCalls). A real
#: rank plans over every rank's items, so W virtual ranks would plan W times over W ranks' items.
PURE = (("paddle.distributed.flex_checkpoint.dcp.reshard_comm", "AbstractCommunicator", "split_read_items"),
        ("paddle.distributed.flex_checkpoint.dcp.reshard_comm", "AbstractCommunicator", "schedule_read_items"))
#: Modules whose module-level values are per rank (prefixes of module names). Of auto_parallel, only the process-wide
#: registries every ``ProcessMesh`` writes to (the default DistributedContext's mesh list, process group 0, the unique
#: mesh ids): a real rank's hold its own meshes; shared, they would hold every virtual rank's, and each new mesh's
#: linear membership scan would cover all of them (docs/design.md §16). The rest of auto_parallel (operator and cost
#: registries, configuration) is code-like, so it stays shared: copying it per rank would only cost time.
WATCHED = ("paddle.distributed.flex_checkpoint", "paddle.distributed.parallel", "paddle.distributed.parallel_helper",
           "paddle.distributed.collective", "paddle.distributed.communication", "harness.sut",
           "paddle.distributed.auto_parallel.process_mesh", "paddle.distributed.auto_parallel.static.dist_context",
           "paddle.distributed.auto_parallel.static.process_group")
_MODULE_DUNDERS = frozenset({"__name__", "__doc__", "__package__", "__loader__", "__spec__", "__file__", "__cached__",
                             "__builtins__", "__all__", "__path__", "__annotations__", "__getattr__", "__dir__"})
_IMMUTABLE = (int, float, complex, str, bytes, bool, type(None), tuple, frozenset)
_MUTABLE = (dict, list, set, bytearray, collections.deque)


class RankGlobals:
    """Every module-level value of the watched modules, one copy per rank. ``install(rank)`` saves the running
    rank's values (a module may rebind a global or mutate it) and puts ``rank``'s in place."""

    def __init__(self, world: int, extra: Sequence[tuple[Any, str]] = ()) -> None:
        self.slots: list[tuple[Any, str]] = [*extra]
        self.shared: list[str] = []  # state that could not be copied: listed, shared by all ranks
        for name, module in sorted(sys.modules.items()):
            if isinstance(module, types.ModuleType) and name.startswith(WATCHED):
                for attr, value in sorted(vars(module).items()):
                    if attr not in _MODULE_DUNDERS and _is_state(value, module):
                        self.slots.append((module, attr))
        pristine = [getattr(owner, attr) for owner, attr in self.slots]
        self.pristine = pristine
        self.values: list[list[Any]] = []
        for _ in range(world):
            self.values.append([self._copy(v, owner, attr) for v, (owner, attr) in zip(pristine, self.slots)])
        self.current: int | None = None
        self._swap = _swapper(self.slots)

    def _copy(self, value: Any, owner: Any, attr: str) -> Any:
        if isinstance(value, _IMMUTABLE):
            return value
        try:
            return copy.deepcopy(value)
        except Exception:
            label = f"{getattr(owner, '__name__', owner)}.{attr}"
            if label not in self.shared:
                self.shared.append(label)
            return value

    def install(self, rank: int) -> None:
        """Runs at every switch (W per collective): keeps what the running rank's slots hold now (a module may have
        rebound one), and puts ``rank``'s in place where they are other objects."""
        outgoing = self.values[self.current] if self.current is not None else [None] * len(self.slots)
        self._swap(outgoing, self.values[rank])
        self.current = rank

    def restore(self) -> None:
        """Put the values the modules had before any rank ran back in place."""
        for (owner, attr), value in zip(self.slots, self.pristine):
            setattr(owner, attr, value)
        self.current = None


def _swapper(slots: Sequence[tuple[Any, str]]) -> Callable[[list[Any], list[Any]], None]:
    """One function, generated for these slots, that does a switch: for each slot, read what is in place, keep it
    as the outgoing rank's where it is another object than recorded (compared by identity: an equal new object is
    still a new object), and put the incoming rank's value in place where it is another object. Straight-line
    code with each namespace a local: a loop over the slots, or over namespaces with C-level reads and updates,
    was a seventh of a 16-rank case in a switch W times per collective."""
    owners: list[Any] = []
    lines = ["def swap(outgoing, incoming):"]
    for i, (owner, attr) in enumerate(slots):
        if not any(o is owner for o in owners):
            owners.append(owner)
        k = next(j for j, o in enumerate(owners) if o is owner)
        space = vars(owner)
        lines += [f"    now = space{k}[{attr!r}]",
                  f"    if now is not outgoing[{i}]:",
                  f"        outgoing[{i}] = now",
                  f"    value = incoming[{i}]",
                  "    if value is not now:",
                  # a module's namespace is its dict; a class's is read-only: through setattr
                  f"        space{k}[{attr!r}] = value" if isinstance(space, dict)
                  else f"        setattr(owner{k}, {attr!r}, value)"]
    if not slots:
        lines.append("    pass")
    scope: dict[str, Any] = {}
    for k, owner in enumerate(owners):
        scope[f"space{k}"], scope[f"owner{k}"] = vars(owner), owner
    exec(_compiled("\n".join(lines)), scope)
    return scope["swap"]


@functools.lru_cache(maxsize=8)
def _compiled(source: str) -> types.CodeType:
    """The switch's code, compiled once per process for the same slots (a fresh world after lost ranks)."""
    return compile(source, "<virtual rank switch>", "exec")


def _is_state(value: Any, module: types.ModuleType) -> bool:
    """Data a module keeps (a cache, a counter, a registry), not code or configuration shared by design."""
    if isinstance(value, (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, type)):
        return False
    if isinstance(value, _IMMUTABLE + _MUTABLE):
        return True
    owner = getattr(type(value), "__module__", "") or ""
    return owner.startswith(WATCHED)  # an instance of the watched code's own classes (e.g. a MetadataManager)


class _Task:
    """A finished collective's task (every virtual collective is done when it returns)."""

    def wait(self, *args: Any, **kwargs: Any) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


class VirtualProcessGroup:
    """The default group's backend on one virtual rank: each call meets the peers under the scheduler."""

    def __init__(self, world: PaddleWorld, rank: int) -> None:
        self._world, self._rank = world, rank

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._world.size

    def name(self) -> str:
        return "GLOO"

    def barrier(self, device_id: Any = None) -> _Task:
        self._world.collective(self._rank, "barrier", None)
        return _Task()

    def broadcast(self, tensor: Any, src: int, sync_op: bool = True) -> _Task:
        self._write(tensor, self._world.collective(self._rank, "broadcast", (src, self._buffer(tensor))))
        return _Task()

    def all_gather(self, tensor_list: list[Any], tensor: Any, sync_op: bool = True) -> _Task:
        gathered = self._world.collective(self._rank, "all_gather",
                                          (self._buffer(tensor), [self._buffer(out) for out in tensor_list]))
        for out, data in zip(tensor_list, gathered):
            self._write(out, data)
        return _Task()

    def all_gather_into_tensor(self, out: Any, tensor: Any, sync_op: bool = True) -> _Task:
        gathered = self._world.collective(self._rank, "all_gather", (self._buffer(tensor), [self._buffer(out)]))
        self._write(out, b"".join(gathered))
        return _Task()

    def all_reduce(self, tensor: Any, op: Any = None, sync_op: bool = True) -> _Task:
        if op is not None and int(op) != 0:  # Paddle hands the process group its core ReduceOp: SUM is 0
            raise VirtualUnsupported(f"virtual gloo: all_reduce with {op}")
        self._write(tensor, self._world.collective(self._rank, "all_reduce", self._buffer(tensor)))
        return _Task()

    def _buffer(self, tensor: Any) -> Buffer:
        codec = self._world.codec
        shape = tuple(int(n) for n in tensor.shape)
        return Buffer(codec.raw_bytes(tensor), codec.dtype_code(tensor), int(np.prod(shape)), shape)

    def _write(self, tensor: Any, data: bytes | Prefix) -> None:
        """What the backend put in the receive buffer: all of it, or (a larger receiver) a prefix, the rest kept."""
        codec = self._world.codec
        if isinstance(data, Prefix):
            data = data.data + codec.raw_bytes(tensor)[len(data.data):]
        codec.write_bytes(tensor, data)

    def __getattr__(self, name: str) -> Any:
        raise VirtualUnsupported(f"virtual ranks do not emulate the process group's {name}")


class TensorBytes(Protocol):
    """How the SUT's adapter turns a dense tensor into bytes and back, bit for bit (harness.sut._paddle_common)."""

    def dtype_code(self, x: Any) -> str: ...

    def raw_bytes(self, x: Any) -> bytes: ...

    def write_bytes(self, x: Any, data: bytes) -> None: ...


class PaddleWorld:
    """W virtual ranks of a Paddle job in this process: their identities, groups and globals, and the scheduler
    running them one at a time."""

    def __init__(self, size: int, codec: TensorBytes, share: bool = True) -> None:
        """``share=False``: nothing shared between ranks at any size (to show that sharing changes nothing)."""
        import paddle.distributed as dist
        from paddle.distributed import collective, parallel, parallel_helper
        from paddle.distributed.communication import group as group_mod

        self.size, self.codec = size, codec
        _import_all("paddle.distributed.flex_checkpoint")
        self._env = {k: os.environ.get(k) for k in ("PADDLE_TRAINERS_NUM", "PADDLE_TRAINER_ENDPOINTS",
                                                   "PADDLE_WORLD_DEVICE_IDS", "PADDLE_LOCAL_SIZE", "PADDLE_TRAINER_ID",
                                                   "PADDLE_CURRENT_ENDPOINT", "PADDLE_RANK_IN_NODE",
                                                   "PADDLE_LOCAL_RANK")}
        endpoints = [f"127.0.0.1:{6170 + r}" for r in range(size)]  # named, never connected to
        os.environ.update({"PADDLE_TRAINERS_NUM": str(size), "PADDLE_TRAINER_ENDPOINTS": ",".join(endpoints),
                           "PADDLE_WORLD_DEVICE_IDS": "", "PADDLE_LOCAL_SIZE": str(size)})
        self.envs = [{"PADDLE_TRAINER_ID": str(r), "PADDLE_CURRENT_ENDPOINT": endpoints[r],
                      "PADDLE_RANK_IN_NODE": str(r), "PADDLE_LOCAL_RANK": str(r)} for r in range(size)]
        extra = [(group_mod._GroupManager, "group_map_by_id"), (group_mod._GroupManager, "global_group_id")]
        self.globals = RankGlobals(size, extra)
        for r in range(size):  # each rank's copy gets what init_parallel_env would have registered
            self._switch(r)
            parallel._global_parallel_env = parallel.ParallelEnv()
            group = group_mod.Group(r, 0, list(range(size)), pg=VirtualProcessGroup(self, r),
                                    name=collective._default_group_name)
            collective._set_group_map_by_name(collective._default_group_name, group)
            collective._set_group_map(0, group)
            collective._set_group_map_backend(group, "gloo")
            group_mod._add_new_group(group)
            parallel_helper._set_parallel_ctx(True)
        all_gather_mod = sys.modules["paddle.distributed.communication.all_gather"]
        # (owner, name, original) of every function replaced, put back by close()
        self._patched = [(dist, "new_group", dist.new_group), (collective, "new_group", collective.new_group),
                         (dist, "all_gather_object", dist.all_gather_object),
                         (all_gather_mod, "all_gather_object", all_gather_mod.all_gather_object)]
        dist.new_group = collective.new_group = _no_new_group
        dist.all_gather_object = all_gather_mod.all_gather_object = self.all_gather_object
        self.scheduler = OneAtATimeScheduler(size, self._switch, Gloo(size))
        self.copies = GatherCopies()
        self.calls = SharedCalls(lambda: self.scheduler.completed)
        self._dispatched: list[type] = []  # classes given copy.deepcopy's immutable shortcut, taken back by close()
        self.sharing = share and size >= SHARE_FROM
        if self.sharing:
            self._share_pure_planners()
        self.gc = _EpochGc(self.scheduler)
        for name, module in list(sys.modules.items()):
            if name.startswith(WATCHED) and getattr(module, "gc", None) is gc:
                self._patched.append((module, "gc", gc))
                module.gc = self.gc

    def _share_pure_planners(self) -> None:
        """Every static method of PURE that this Paddle has, computed once per collective epoch (SharedCalls); the
        flex checkpoint's frozen dataclasses deep-copied as the objects themselves where immutable."""
        for module, owner, name in PURE:
            cls = getattr(sys.modules.get(module), owner, None)
            original = None if cls is None else cls.__dict__.get(name)
            if isinstance(original, staticmethod):
                self._patched.append((cls, name, original))
                setattr(cls, name, staticmethod(self.calls.wrap(original.__func__)))
        modules = [m for n, m in list(sys.modules.items()) if n.startswith(WATCHED[0]) and m is not None]
        for cls in frozen_classes(modules):
            if cls not in copy._deepcopy_dispatch:  # type: ignore[attr-defined]
                copy._deepcopy_dispatch[cls] = deepcopy_keeping_immutable  # type: ignore[attr-defined]
                self._dispatched.append(cls)

    def _switch(self, rank: int) -> None:
        self.globals.install(rank)
        os.environ.update(self.envs[rank])

    def collective(self, rank: int, kind: str, payload: Any) -> Any:
        return self.scheduler.collective(rank, kind, payload)

    def all_gather_object(self, object_list: list[Any], obj: Any, group: Any = None) -> None:
        """Paddle's all_gather_object, step for step, on bytes (see FAKES)."""
        if group is not None and not _is_default(group):
            raise VirtualUnsupported("virtual ranks have only the default group (all_gather_object on another)")
        rank = self.scheduler.current
        assert rank is not None
        data = pickle.dumps(obj)
        lengths = self.collective(rank, "all_gather", Buffer(np.int64(len(data)).tobytes(), "I64", 1, ()))
        sizes = np.frombuffer(b"".join(lengths), np.int64).tolist()  # one array, not W: W ranks read W lengths
        longest = max(sizes)
        gathered = self.collective(rank, "all_gather", Buffer(_resized(data, longest), "U8", longest, (longest,)))
        if not self.sharing:
            object_list.extend(pickle.loads(raw[:size]) for raw, size in zip(gathered, sizes))
            return
        epoch = self.scheduler.completed  # the same for every rank reading this gather (the next cannot complete yet)
        object_list.extend(self.copies.loads(raw, epoch, sender, size)
                           for sender, (raw, size) in enumerate(zip(gathered, sizes)))

    def run(self, tasks: Sequence[Callable[[], Any]]) -> list[tuple[bool, Any]]:
        return self.scheduler.run(tasks)

    @property
    def broken(self) -> bool:
        """A collective timed out: as after a real gloo timeout, the group is out of step for good."""
        return self.scheduler.timeouts > 0

    def close(self) -> None:
        """End the rank threads and leave the process as it was (a test may make a world in its own process)."""
        self.scheduler.close()
        self.globals.restore()
        for owner, name, original in self._patched:
            setattr(owner, name, original)
        for cls in self._dispatched:
            copy._deepcopy_dispatch.pop(cls, None)  # type: ignore[attr-defined]
        for key, value in self._env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class _EpochGc(types.ModuleType):
    """The ``gc`` module for the watched modules: ``collect()`` at most once between two collectives."""

    def __init__(self, scheduler: OneAtATimeScheduler) -> None:
        super().__init__("gc")
        self._scheduler, self._epoch = scheduler, -1

    def collect(self, generation: int = 2) -> int:
        if self._scheduler.completed == self._epoch:
            return 0
        self._epoch = self._scheduler.completed
        return gc.collect(generation)

    def __getattr__(self, name: str) -> Any:
        return getattr(gc, name)


def _resized(data: bytes, size: int) -> bytes:
    """The bytes of ``np.resize(np.frombuffer(data, np.uint8), [size])``, as Paddle pads a payload: repeated to
    fill, zeros where there is nothing to repeat (made without numpy's Python-level resize, W per gather)."""
    if not data:
        return bytes(size)
    return (data * -(-size // len(data)))[:size]


def _is_default(group: Any) -> bool:
    return getattr(group, "id", None) == 0


def _no_new_group(*args: Any, **kwargs: Any) -> Any:
    raise VirtualUnsupported("virtual ranks have only the default group (new_group is not emulated)")


@functools.cache
def _import_all(package: str) -> None:
    """Import every submodule now, so each one's module-level state is copied per rank before any rank runs (once
    a process: a module stays imported)."""
    pkg = importlib.import_module(package)
    for info in pkgutil.walk_packages(pkg.__path__, package + "."):
        importlib.import_module(info.name)
