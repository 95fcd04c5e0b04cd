"""Fault-path defects planted in the reference engine for ``bench/detect.py --faults``: each one a general kind of
crash-consistency bug that passes every fault-free case and shows only under a fault (a crash, a power loss, a
failing call) or in the order of the save's IO.

Each defect is in the synchronous save path, built from the engine's own steps (``save_rank`` and ``commit``) with
one step wrong. Async saves run the engine in a writer process the plant does not reach, so these SUTs declare no
async capability. The patches they apply live only while their own save runs, in their own rank process: run them
on launched ranks (``pool``), never in the harness's process.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import reference.disk.stio
from harness.sut.reference import COMMIT_TIMEOUT, ReferenceSut, agreed_save_id
from reference import commit, save_rank
from reference.disk.commit import STAGING_PREFIX, protocol
from reference.disk.fsutil import fsync_dir, write_durable
from reference.engine import _manifest_file, rank_file


class _NoFsync:
    """``os`` as a writer sees it, with ``fsync`` doing nothing (a write path that forgot it)."""

    def __getattr__(self, name: str):
        return getattr(os, name)

    @staticmethod
    def fsync(fd: int) -> None:
        return None


@contextlib.contextmanager
def _patched(module, name: str, value) -> Iterator[None]:
    old = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, old)


class _PlantedSave(ReferenceSut):
    """The reference's synchronous save as two steps a defect can replace: every rank writes its part
    (``write_part``), then rank 0 commits (``publish``)."""

    capabilities = ReferenceSut.capabilities - {"async", "kill_writer"}

    def save(self, root, name, tensors, *, use_async, options):
        local = {n: rt.local for n, rt in tensors.items()}
        save_id = agreed_save_id(name, int(options.get("save_attempt", 0)))
        self.write_part(root, name, save_id, local)
        if self.rank == 0:
            self.publish(root, name, save_id, float(options.get("commit_timeout", COMMIT_TIMEOUT)))
        return None, tensors

    def write_part(self, root: Path, name: str, save_id: str, local: dict) -> None:
        save_rank(root, name, save_id, self.rank, self.world, local)

    def publish(self, root: Path, name: str, save_id: str, timeout: float) -> None:
        commit(root, name, save_id, self.world, timeout=timeout)


def _swallowing(write_all):
    def best_effort(fd: int, view: memoryview) -> None:
        with contextlib.suppress(OSError):  # a failed write is logged nowhere and the save goes on
            write_all(fd, view)
    return best_effort


class SwallowsWriteErrorReference(_PlantedSave):
    """A data file's failed write (no space, an I/O error) is ignored: the save commits a file shorter than its
    index says and returns as if it had succeeded."""

    def write_part(self, root, name, save_id, local):
        with _patched(reference.disk.stio, "_write_all", _swallowing(reference.disk.stio._write_all)):
            super().write_part(root, name, save_id, local)


class SkipsDataFsyncReference(_PlantedSave):
    """Data files are never fsynced: the index, the rename and ``latest`` are durable, the bytes they vouch for
    may not be, even after the save returned."""

    def write_part(self, root, name, save_id, local):
        with _patched(reference.disk.stio, "os", _NoFsync()):
            super().write_part(root, name, save_id, local)


class FsyncsDataAfterCommitReference(SkipsDataFsyncReference):
    """The data is fsynced, but only once the checkpoint is committed: the index, its rename and ``latest`` become
    durable before the data they vouch for (everything is durable by the time the save returns)."""

    def publish(self, root, name, save_id, timeout):
        super().publish(root, name, save_id, timeout)
        for rank in range(self.world):
            fd = os.open(root / name / rank_file(rank), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


class RotationCountsIncompleteReference(_PlantedSave):
    """Rotation keeps the newest ``keep`` directories of the root by modification time, a crashed save's staging
    directory among them, and trusts that the newest ones hold ``latest``: after a crashed save it deletes the
    last complete checkpoint."""

    def rotate(self, root, keep):
        if self.rank != 0:
            return
        dirs = [p for p in root.iterdir() if p.is_dir() and (not p.name.startswith(".")
                                                              or p.name.startswith(STAGING_PREFIX))]
        for victim in sorted(dirs, key=lambda p: p.stat().st_mtime_ns, reverse=True)[keep:]:
            shutil.rmtree(victim)
        with contextlib.suppress(OSError):
            fsync_dir(root)


class VotesBeforeDataReference(_PlantedSave):
    """A rank casts its vote (its manifest, which the coordinator commits on) before its data is written: the data
    file is created, the manifest staged, then the bytes copied in. Rank 0 commits once every vote is in, so a
    rank that dies between its vote and its data leaves a committed checkpoint with a short file."""

    PRIVATE = ".votes-first"  # where a rank prepares its part; the dot keeps it out of every listing

    def write_part(self, root, name, save_id, local):
        prepared = save_rank(root / self.PRIVATE / str(self.rank), name, save_id, self.rank, self.world, local)
        staging = protocol("rename").staging_dir(root, name, save_id)
        staging.mkdir(parents=True, exist_ok=True)
        data = (prepared / rank_file(self.rank)).read_bytes()
        fd = os.open(staging / rank_file(self.rank), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            vote = staging / f".{_manifest_file(self.rank)}.tmp"
            write_durable(vote, (prepared / _manifest_file(self.rank)).read_bytes())
            os.replace(vote, staging / _manifest_file(self.rank))
            reference.disk.stio._write_all(fd, memoryview(data))
            os.fsync(fd)
        finally:
            os.close(fd)
        shutil.rmtree(root / self.PRIVATE / str(self.rank), ignore_errors=True)


#: name -> (adapter, ranks, launch mode), as bench/planted.DEFECTS
FAULT_DEFECTS = {
    "reference-swallows-write-error": ("bench.planted_faults:SwallowsWriteErrorReference", 2, "pool"),
    "reference-skips-data-fsync": ("bench.planted_faults:SkipsDataFsyncReference", 2, "pool"),
    "reference-fsyncs-data-after-commit": ("bench.planted_faults:FsyncsDataAfterCommitReference", 2, "pool"),
    "reference-rotation-counts-incomplete": ("bench.planted_faults:RotationCountsIncompleteReference", 2, "pool"),
    "reference-votes-before-data": ("bench.planted_faults:VotesBeforeDataReference", 2, "pool"),
}
