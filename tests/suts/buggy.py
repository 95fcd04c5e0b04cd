"""Deliberately broken SUTs: the harness must catch each bug, shrink it small, and replay it.

They wrap the reference adapter and break one thing, the way real checkpoint bugs do.
"""

from __future__ import annotations

import dataclasses
import shutil
import threading
from pathlib import Path
from typing import Any

import numpy as np

from harness.sut.paddle_dcp import PaddleDcpSut
from harness.sut.reference import COMMIT_TIMEOUT, ReferenceSut, agreed_save_id
from reference import commit, committed_checkpoints, save_rank
from reference.disk.commit import set_latest


class FlipsLastElementSut(ReferenceSut):
    """Loads return data whose last element has its lowest bit flipped (silent corruption)."""

    name = "flips-last-element"

    def load(self, root, name, targets, *, options):
        out = super().load(root, name, targets, options=options)
        for tensor in out.values():
            if tensor.bits.size:
                flat = tensor.bits.reshape(-1)
                flat[-1] ^= np.array(1, dtype=flat.dtype)
        return out


class LoadsLatestAlwaysSut(ReferenceSut):
    """Ignores the version asked for and loads the latest (a P-REPEAT bug)."""

    name = "loads-latest-always"

    def load(self, root, name, targets, *, options):
        return super().load(root, None, targets, options=options)


class NoSnapshotAsyncSut(ReferenceSut):
    """Async save that does not snapshot: the write happens only at wait(), after the caller's mutation."""

    name = "no-snapshot-async"

    def save(self, root, name, tensors, *, use_async, options):
        if not use_async:
            return super().save(root, name, tensors, use_async=False, options=options)
        return ("deferred", root, name, options), tensors

    def wait(self, handle):
        if isinstance(handle[0], tuple) and handle[0][0] == "deferred":
            _, root, name, options = handle[0]
            handle = super().save(root, name, handle[1], use_async=False, options=options)
        return super().wait(handle)


class SnapshotsInWriterSut(ReferenceSut):
    """Async save whose background thread copies the caller's tensors only when it gets to run: a training step
    right after save returns may change what is saved. The thread usually wins that race (it starts at once); a
    held writer (a ``stall``-ed save) loses it every time."""

    name = "snapshots-in-writer"

    def save(self, root, name, tensors, *, use_async, options):
        previous = getattr(self, "_writer", None)
        if previous is not None:
            previous.join()  # one save at a time per process, as the reference's commit assumes
        if not use_async:
            return super().save(root, name, tensors, use_async=False, options=options)
        box: dict = {}

        def write() -> None:
            try:
                ReferenceSut.save(self, root, name, _copied(tensors), use_async=False, options=options)
            except BaseException as exc:  # surfaced by wait()
                box["error"] = exc

        thread = self._writer = threading.Thread(target=write, name="snapshots-in-writer", daemon=True)
        thread.start()
        return ("thread", thread, box), tensors

    def wait(self, handle):
        if _in_thread(handle):
            _, thread, box = handle[0]
            thread.join()
            if "error" in box:
                raise box["error"]
            return None
        return super().wait(handle)

    def kill_pending(self, handles):
        for h in handles:  # a thread cannot be killed: it is waited for, so none commits after this returns
            if _in_thread(h):
                h[0][1].join()
        super().kill_pending([h for h in handles if not _in_thread(h)])


def _copied(tensors: dict) -> dict:
    """The caller's tensors as a snapshot (the rank pieces copied)."""
    return {k: dataclasses.replace(rt, local=dataclasses.replace(rt.local, tensor=rt.local.tensor.copy()))
            for k, rt in tensors.items()}


def _in_thread(handle) -> bool:
    return isinstance(handle[0], tuple) and handle[0][0] == "thread"


class DiesOnLoadSut(ReferenceSut):
    """Rank 1 dies (SIGKILL) when asked to load: a crash the harness must report, not hang on."""

    name = "dies-on-load"

    def load(self, root, name, targets, *, options):
        import os
        import signal

        if self.rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().load(root, name, targets, options=options)


class HangsOnLoadSut(ReferenceSut):
    """Rank 1 never returns from load: a hang the harness must bound and report."""

    name = "hangs-on-load"

    def load(self, root, name, targets, *, options):
        import time

        if self.rank == 1:
            time.sleep(3600)
        return super().load(root, name, targets, options=options)


class AcksDeadWriterSut(ReferenceSut):
    """Async saves whose writer dies before it commits (an OOM kill, say), and a wait() that swallows the writer's
    error: it acknowledges checkpoints that never became durable."""

    name = "acks-dead-writer"

    def save(self, root, name, tensors, *, use_async, options):
        handle = super().save(root, name, tensors, use_async=use_async, options=options)
        if use_async and handle[0] is not None:
            handle[0].kill()
            self.wait(handle)  # dead before it could commit
        return handle

    def wait(self, handle):
        import contextlib

        from reference import AsyncWriterError

        with contextlib.suppress(AsyncWriterError):
            super().wait(handle)


class RotatesAwayNewestSut(ReferenceSut):
    """Rotation sorted the wrong way round: it keeps the oldest ``keep`` checkpoints and deletes the newest."""

    name = "rotates-away-newest"

    def rotate(self, root, keep):
        import shutil

        from reference import committed_checkpoints

        if self.rank == 0:
            found = committed_checkpoints(root)
            for victim in sorted(found, key=found.__getitem__)[keep:]:
                shutil.rmtree(root / victim)


class LoadsOldestSut(ReferenceSut):
    """Load with no name resolves "latest" to the oldest committed checkpoint."""

    name = "loads-oldest"

    def load(self, root, name, targets, *, options):
        from reference import committed_checkpoints

        if name is None:
            found = committed_checkpoints(root)
            name = min(found, key=found.__getitem__) if found else None
        return super().load(root, name, targets, options=options)


class FloatsOnlySut(ReferenceSut):
    """Restores floating-point tensors only: integer ones (the RNG state, the step counter) keep whatever the
    target held, as a loader that filters by dtype would do."""

    name = "floats-only"

    def load(self, root, name, targets, *, options):
        out = super().load(root, name, targets, options=options)
        return {k: (targets[k].local.tensor if t.dtype.kind == "int" else t) for k, t in out.items()}


class EmaFromMasterSut(ReferenceSut):
    """Writes the FP32 master weights where the EMA buffer belongs (two buffers of the same shape and dtype mixed
    up when the save maps them to keys)."""

    name = "ema-from-master"

    def save(self, root, name, tensors, *, use_async, options):
        swapped = {k: (tensors.get("master/" + k[4:], rt) if k.startswith("ema/") else rt) for k, rt in tensors.items()}
        swapped = {k: dataclasses.replace(rt, name=k) for k, rt in swapped.items()}
        return super().save(root, name, swapped, use_async=use_async, options=options)


class SavesEveryReplicaSut(ReferenceSut):
    """Every data-parallel replica writes its copy (the dedup of replicated pieces is missing)."""

    name = "saves-every-replica"

    def save(self, root, name, tensors, *, use_async, options):
        every = {k: dataclasses.replace(rt, local=dataclasses.replace(rt.local, saves=True))
                 for k, rt in tensors.items()}
        return super().save(root, name, every, use_async=use_async, options=options)


# --- bugs that show only when a save never finishes (a kill or restart before its wait) ----------------------------


def _deferred(handle) -> bool:
    return isinstance(handle[0], tuple) and handle[0][0] == "deferred"


class _FinishesAtWaitSut(ReferenceSut):
    """Not a bug by itself: an async save that snapshots the caller's tensors and writes them only when waited for
    (the background write, at its latest moment), so a ``kill`` or ``restart`` before the wait leaves exactly what
    ``started`` put on disk. Subclasses break what happens around an unfinished save; sync saves run
    ``started`` and ``finish`` back to back."""

    def save(self, root, name, tensors, *, use_async, options):
        self.started(root, name, tensors, options)
        if not use_async:
            self.finish(root, name, tensors, options)
            return None, tensors
        return ("deferred", root, name, options, _copied(tensors)), tensors

    def wait(self, handle):
        if _deferred(handle):
            _, root, name, options, snapshot = handle[0]
            self.finish(root, name, snapshot, options)
            return None
        return super().wait(handle)

    def kill_pending(self, handles):
        super().kill_pending([h for h in handles if not _deferred(h)])  # an unfinished save just never finishes

    def started(self, root, name, tensors, options) -> None:
        """What the save does before its data is written (nothing, done right)."""

    def finish(self, root, name, tensors, options) -> None:
        """Write the checkpoint: the reference's sync save, which commits it and then moves ``latest``."""
        super().save(root, name, tensors, use_async=False, options=options)


class MovesLatestFirstSut(_FinishesAtWaitSut):
    """Moves ``latest`` to the new checkpoint when the save starts, before it is complete: after a crash, resuming
    from latest fails although the previous acknowledged checkpoint sits intact on disk."""

    name = "moves-latest-first"

    def started(self, root, name, tensors, options) -> None:
        if self.rank == 0:
            set_latest(root, name, agreed_save_id(name))


class IndexFirstSut(_FinishesAtWaitSut):
    """Publishes the checkpoint's index before its data files, with no staging directory: until the data lands
    (here, until the async save is waited for) a checkpoint that looks committed is missing its data. ``latest``
    moves only once the data is there, so resuming is not affected."""

    name = "index-first"
    UNPUBLISHED = ".unpublished"  # where the ranks write; the dot keeps it out of every listing

    def started(self, root, name, tensors, options) -> None:
        private = root / self.UNPUBLISHED
        local = {n: rt.local for n, rt in tensors.items()}
        save_rank(private, name, agreed_save_id(name), self.rank, self.world, local)
        if self.rank == 0:
            commit(private, name, agreed_save_id(name), self.world,
                   timeout=float(options.get("commit_timeout", COMMIT_TIMEOUT)))
            (root / name).mkdir()
            shutil.copy(private / name / "index.json", root / name / "index.json")

    def finish(self, root, name, tensors, options) -> None:
        if self.rank != 0:
            return
        for data in (root / self.UNPUBLISHED / name).iterdir():
            if data.name != "index.json":
                shutil.copy(data, root / name / data.name)
        set_latest(root, name, agreed_save_id(name))


class ZeroSizeIndexFirstSut(IndexFirstSut):
    """IndexFirstSut that also cannot load a zero-size tensor (a loud failure with no fault at all): a crash
    exploration must not let the plain failure excuse the atomicity bug behind it."""

    name = "zero-size-index-first"

    def load(self, root, name, targets, *, options):
        empty = sorted(n for n, t in targets.items() if 0 in t.local.global_shape)
        if empty:
            raise ValueError(f"cannot load zero-size tensor {empty[0]!r}")
        return super().load(root, name, targets, options=options)


class RotationCountsUnfinishedSut(_FinishesAtWaitSut):
    """Rotation counts saves still in flight as checkpoints (and ignores ``latest``): with a save pending it deletes
    the last complete checkpoint, so a crash before that save finishes leaves the job with none."""

    name = "rotation-counts-unfinished"

    def started(self, root, name, tensors, options) -> None:
        self.unfinished = [*getattr(self, "unfinished", []), name]

    def finish(self, root, name, tensors, options) -> None:
        super().finish(root, name, tensors, options)
        self.unfinished.remove(name)

    def rotate(self, root, keep):
        if self.rank == 0:
            found = committed_checkpoints(root)
            newest_first = [*reversed(getattr(self, "unfinished", [])), *sorted(found, key=found.__getitem__,
                                                                                 reverse=True)]
            for victim in newest_first[keep:]:
                if victim in found:
                    shutil.rmtree(root / victim)


class RaisesWhilePeerWaitsSut(ReferenceSut):
    """On load rank 0 raises at once and rank 1 waits for it, as a peer left in a collective does (gloo gives up
    after 30 s, NCCL much later)."""

    name = "raises-while-peer-waits"

    def load(self, root, name, targets, *, options):
        import time

        if self.rank == 1:
            time.sleep(3600)
        raise ValueError("rank 0 cannot read its shard")


class RaisesWhilePeerTimesOutSut(ReferenceSut):
    """On load rank 0 raises at once; rank 1 waits for it, idle, until its "backend" gives up after 4 s (gloo's
    30 s, shortened), as a peer left in a collective does."""

    name = "raises-while-peer-times-out"

    def load(self, root, name, targets, *, options):
        import time

        if self.rank == 1:
            time.sleep(4.0)
            raise RuntimeError("[gloo/transport/tcp/pair.cc:598] TIMEOUT waiting for rank 0")
        raise ValueError(f"rank 0 cannot read its shard of {name}")


class RaisesWhilePeerComputesSut(ReferenceSut):
    """On load rank 0 raises at once while rank 1 computes for two seconds and then loads: a busy peer is not a
    stuck one, however long it takes."""

    name = "raises-while-peer-computes"

    def load(self, root, name, targets, *, options):
        import time

        if self.rank == 0:
            raise ValueError("rank 0 cannot read its shard")
        end = time.process_time() + 2.0
        while time.process_time() < end:
            pass
        return super().load(root, name, targets, options=options)


class TwoBugsSut(FlipsLastElementSut):
    """Two bugs at once: a load of a checkpoint holding a 0-d tensor raises, any other load flips a bit. A
    campaign must report both, not stop at whichever it meets first."""

    name = "two-bugs"

    def load(self, root, name, targets, *, options):
        if any(len(t.local.global_shape) == 0 for t in targets.values()):
            raise ValueError(f"cannot load scalar {sorted(targets)[0]!r} from {root}")
        return super().load(root, name, targets, options=options)


class NewGroupSut(PaddleDcpSut):
    """paddle-dcp that makes a sub-group before it saves: a call virtual ranks do not emulate."""

    name = "new-group"

    def save(self, root: Path, name: str, tensors: dict, *, use_async: bool, options: dict) -> Any:
        import paddle.distributed as dist

        dist.new_group(list(range(dist.get_world_size())))
        return super().save(root, name, tensors, use_async=use_async, options=options)


class ComputesOnLoadSut(ReferenceSut):
    """Rank 1 computes for three seconds of CPU before it loads: slow, never stalled."""

    name = "computes-on-load"

    def load(self, root, name, targets, *, options):
        import time

        if self.rank == 1:
            end = time.process_time() + 3.0
            while time.process_time() < end:
                pass
        return super().load(root, name, targets, options=options)


class WaitsOutEveryFaultSut(ReferenceSut):
    """Never gives up: a save or load that fails (a call failing, a file it cannot read) waits forever instead of
    raising, a peer's missing part is waited for as long as the case allows (``commit_timeout``), and a load first
    waits for every async save still running, however long that takes. Under any fault it hangs without using CPU,
    so only the harness's own bounds can end the case."""

    name = "waits-out-every-fault"

    def save(self, root, name, tensors, *, use_async, options):
        try:
            return super().save(root, name, tensors, use_async=use_async, options=options)
        except Exception:
            threading.Event().wait()
            raise

    def wait(self, handle):
        try:
            return super().wait(handle)
        except Exception:
            threading.Event().wait()
            raise

    def load(self, root, name, targets, *, options):
        try:
            self.saver.drain()
            return super().load(root, name, targets, options=options)
        except Exception:
            threading.Event().wait()
            raise


class TrainsItselfSut(ReferenceSut):
    """Not broken: trains itself (the reference loop) and keeps its job in the rank process, as a Trainer does, so a
    save in a process that never trained this case's job has nothing to save and says so."""

    name = "trains-itself"
    capabilities = ReferenceSut.capabilities | {"trains"}

    def begin_training(self, spec: Any, params: tuple[Any, ...]) -> None:
        self._job: tuple[Any, tuple[Any, ...]] | None = (spec, params)
        self._trained = False

    def train(self, root: Path, live: dict, to_step: int, *, options: dict) -> None:
        from reference.training import train

        spec, params = self._job
        train(spec, params, live, to_step)
        self._trained = True

    def save(self, root, name, tensors, *, use_async, options):
        if not getattr(self, "_trained", False):
            raise RuntimeError("no trained job in this process to save")
        return super().save(root, name, tensors, use_async=use_async, options=options)

    def load(self, root, name, targets, *, options):
        got = super().load(root, name, targets, options=options)
        self._trained = True  # a resumed job
        return got

    def end_case(self) -> None:
        self._job, self._trained = None, False
        super().end_case()
