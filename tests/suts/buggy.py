"""Deliberately broken SUTs: the harness must catch each bug, shrink it small, and replay it.

They wrap the reference adapter and break one thing, the way real checkpoint bugs do.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from harness.sut.reference import ReferenceSut


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
