"""Repro scripts for PyTorch distributed checkpoint (``dcp.save`` / ``dcp.load`` / ``dcp.async_save``).

Each rank wraps its piece as the adapter does (harness/sut/torch_dcp.py): a DTensor on a DeviceMesh of the case's
mesh with the global shape and stride given, or the plain tensor for one that lives whole on its owners.
"""

from __future__ import annotations

from harness.repro.emitters import torch_text
from harness.repro.emitters.nesting_text import NESTING
from harness.repro.scripted_case import ReproUnsupported, ScriptedCase

FRAMEWORK = "torch"
TEXT = torch_text  # the framework's part of the script (set-up, tensors, launcher)
INERT = frozenset({"op_timeout", "commit_timeout", "collective_timeout"})
RENDERED = frozenset({"async_executor", "nested", "empty_dicts"})


def settings(scripted: ScriptedCase) -> str:
    unknown = sorted(set(scripted.options) - INERT - RENDERED)
    if unknown:
        raise ReproUnsupported(f"option(s) {unknown} (the script does not render them yet)")
    if any(step.kind == "load" and step.name is None for phase in scripted.phases for step in phase.steps):
        raise ReproUnsupported("a load of the latest checkpoint (DCP has no such notion)")
    nested = scripted.options.get("nested")
    return (f"ASYNC_EXECUTOR = {scripted.options.get('async_executor', 'thread')!r}"
            "  # dcp.async_save's checkpointer type\n"
            + (f"NESTED = {nested!r}  # a name's parts at this separator are nested dict keys\n"
               f"EMPTY_DICTS = {list(scripted.options.get('empty_dicts', ()))!r}  # sub-dicts with nothing in them\n"
               if nested else ""))


def helpers(scripted: ScriptedCase) -> str:
    if not scripted.options.get("nested"):
        return ENTRY + (SAVE_ASYNC if scripted.uses("use_async") else SAVE) + LOAD
    return (NESTING + ENTRY.replace("return {name: entry(pieces[name], t) for name, t in dense.items()}, dense",
                                    "return nest({name: entry(pieces[name], t) for name, t in dense.items()}), dense")
            + (SAVE_ASYNC if scripted.uses("use_async") else SAVE) + LOAD_NESTED)


ENTRY = '''from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import DTensor, Replicate, Shard  # noqa: E402

MESHES = {}


def entry(p, t):
    """What goes in the state dict for this rank's piece ``p`` held in ``t``."""
    if p.mesh is None or p.owner:
        return t  # whole on its owners: DCP treats it as replicated
    if p.mesh not in MESHES:
        MESHES[p.mesh] = init_device_mesh("cpu", p.mesh)
    placements = [Shard(int(s[1:])) if s.startswith("S") else Replicate() for s in p.placements]
    stride = tuple(int(np.prod(p.global_shape[i + 1:])) for i in range(len(p.global_shape)))
    return DTensor.from_local(t, MESHES[p.mesh], placements, shape=p.global_shape, stride=stride)


def state_dict(pieces, zero=False):
    dense = {name: tensor(p, zero) for name, p in pieces.items()}
    return {name: entry(pieces[name], t) for name, t in dense.items()}, dense


'''

SAVE = '''def save(name, pieces):
    state, _ = state_dict(pieces)
    dcp.save(state, checkpoint_id=os.path.join(ROOT, name))


'''

SAVE_ASYNC = '''from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType  # noqa: E402


def save(name, pieces, async_save=False, mutate_after=False, detach=False):
    state, dense = state_dict(pieces)
    path = os.path.join(ROOT, name)
    if not async_save:
        dcp.save(state, checkpoint_id=path)
        return
    group = dist.new_group(backend="gloo") if ASYNC_EXECUTOR == "thread" and dist.is_initialized() else None
    response = dcp.async_save(state, checkpoint_id=path, process_group=group,
                              async_checkpointer_type=AsyncCheckpointerType(ASYNC_EXECUTOR))
    returned(getattr(response, "upload_completion", response), dense.values(), mutate_after, detach)


def wait():
    futures, PENDING[:] = list(PENDING), []
    for future in futures:
        future.result()


'''

LOAD = '''def load(name, pieces):
    state, _ = state_dict(pieces, zero=True)
    dcp.load(state, checkpoint_id=os.path.join(ROOT, name))
    return state
'''

LOAD_NESTED = '''def load(name, pieces):
    state, _ = state_dict(pieces, zero=True)
    dcp.load(state, checkpoint_id=os.path.join(ROOT, name))
    for empty in EMPTY_DICTS:
        if at(state, empty) != {}:
            raise Failed(f"the load changed the empty sub-dict {empty!r}")
    return {name: at(state, name) for name in pieces}
'''

KILL_WRITERS = '''import multiprocessing  # noqa: E402
import signal  # noqa: E402
import time  # noqa: E402


def written(pid):
    """Bytes the process has handed to write() calls (Linux: ``wchar`` of /proc/PID/io)."""
    with open(f"/proc/{pid}/io") as f:
        return int(next(line for line in f if line.startswith("wchar:")).split()[1])


def kill_writers(after_bytes=None, timeout=60):
    """SIGKILL this rank's child processes — dcp.async_save's "process" executor writes in one — once they have
    written ``after_bytes`` bytes (mid-save), as the OOM killer would, and reap them; the rank itself goes on.
    ``None``: once the pending saves have finished (their errors lost with the writers)."""
    if after_bytes is None:
        for future in PENDING:
            try:
                future.result(timeout=timeout)
            except Exception:
                pass
    children, deadline = multiprocessing.active_children(), time.monotonic() + timeout
    while after_bytes and sum(written(c.pid) for c in children) < after_bytes and time.monotonic() < deadline:
        time.sleep(0.001)
    for child in children:
        os.kill(child.pid, signal.SIGKILL)
        child.join(10)


'''
