"""The reference engine as a system under test (it must pass everything: it is the oracle, run as a SUT).

Multi-rank without collectives: every rank stages its own file, and rank 0 commits once every rank's manifest
is on disk (the reference's file-based rendezvous), synchronously or from its async writer.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Collection
from pathlib import Path

import numpy as np

from harness.sut.base import RankTensor, SutAdapter, aoa_stored
from reference import (
    AsyncSaver,
    AsyncWriterError,
    CheckpointError,
    Target,
    aoa,
    commit,
    committed_checkpoints,
    load,
    new_save_id,
    save_rank,
)
from reference.disk.commit import rotate as rotate_checkpoints
from reference.disk.index import read_index
from reference.dtypes import DTYPES
from reference.engine import LocalTensor, open_checkpoint
from reference.producers import PRODUCERS
from reference.tensor import Tensor

COMMIT_TIMEOUT = 60.0


def agreed_save_id(name: str, attempt: int = 0) -> str:
    """A save id every rank derives alike without talking. It depends on the checkpoint's name (and, for a name
    saved again, on the attempt: never the staging directory of an earlier attempt, in flight or crashed), not on
    the root, so a crash point's path (relative to the root) names the same file in every replay of a case."""
    return hashlib.sha1((name if not attempt else f"{name}#{attempt}").encode()).hexdigest()[:16]


def _subclasses(cls: type) -> list[type]:
    return [cls, *(c for sub in cls.__subclasses__() for c in _subclasses(sub))]


class ReferenceSut(SutAdapter):
    name = "reference"
    launcher = "plain"
    capabilities = frozenset(
        {"reshard", "async", "zero_size", "flat", "moe", "repeat", "latest", "in_process_world", "empty_state", "aoa",
         *(f"producer:{p}" for p in PRODUCERS)}  # a producer's state is tensors and layouts like any other: the
    # reference saves them as given
        | {"rotate", "kill_writer"}
        | {f"dtype:{d}" for d in DTYPES}
    )

    clear_errors = frozenset(c.__name__ for c in _subclasses(CheckpointError))

    def setup(self, rank: int, world_size: int, options: dict) -> list[str]:
        self.rank, self.world = rank, world_size
        self.saver = AsyncSaver()
        return []

    def save(self, root: Path, name: str, tensors: dict[str, RankTensor], *, use_async: bool, options: dict):
        local = _stored_form(tensors, options)
        save_id = agreed_save_id(name, int(options.get("save_attempt", 0)))
        timeout = float(options.get("commit_timeout", COMMIT_TIMEOUT))  # how long rank 0 waits for the others
        if use_async:
            handle = self.saver.save_local(
                root,
                name,
                save_id,
                self.world,
                {self.rank: local},
                commit=self.rank == 0,
                commit_timeout=timeout,
            )
            return handle, tensors
        self.saver.drain()  # one save at a time per process, as the engine's commit assumes
        save_rank(root, name, save_id, self.rank, self.world, local)
        if self.rank == 0:
            commit(root, name, save_id, self.world, timeout=timeout)
        return None, tensors

    def wait(self, handle) -> None:
        if handle[0] is not None:
            handle[0].wait()

    def kill_pending(self, handles) -> None:
        writers = [h[0] for h in handles if h[0] is not None]
        for writer in writers:
            writer.kill()
        for writer in writers:  # reap: after this no killed writer can commit any more
            with contextlib.suppress(AsyncWriterError):
                writer.wait()

    def rotate(self, root: Path, keep: int) -> None:
        if self.rank == 0:  # the coordinator, which also commits
            rotate_checkpoints(root, keep, new_save_id())

    def mutate(self, handle) -> None:
        for rt in handle[1].values():
            np.bitwise_not(rt.local.tensor.bits, out=rt.local.tensor.bits)

    def load(self, root: Path, name: str | None, targets: dict[str, RankTensor], *, options: dict):
        if aoa.AOA in options:
            return {n: _through_aoa(root, name, options[aoa.AOA], n, rt) for n, rt in targets.items()}
        wanted = {n: Target(rt.local.tensor.dtype, rt.local.global_shape, rt.region) for n, rt in targets.items()}
        return load(root, wanted, name=name)

    def end_case(self) -> None:
        self.saver.close()  # waits for any writer still running; the next save makes a fresh buffer

    def close(self) -> None:
        self.saver.close()

    @classmethod
    def written(cls, root: Path, name: str):
        if not (root / name / "index.json").is_file():
            return None
        index = read_index(root / name, check_cover=False)
        return {n: (meta.shape, [s.region for s in index.slices_of(n)]) for n, meta in index.tensors.items()}

    @classmethod
    def complete(cls, root: Path, names: Collection[str], options: dict) -> list[str]:
        """The committed checkpoints: what ``latest``'s fallback and rotation count as finished."""
        return sorted(n for n in committed_checkpoints(root) if n in names)


def _stored_form(tensors: dict[str, RankTensor], options: dict) -> dict[str, LocalTensor]:
    """A save's pieces in the structure ``options["aoa"]`` says the checkpoint has (reference.aoa)."""
    return aoa_stored(tensors, options[aoa.AOA]) if aoa.AOA in options else {n: rt.local for n, rt in tensors.items()}


def _through_aoa(root: Path, name: str | None, transforms: list, tensor: str, rt: RankTensor) -> Tensor:
    """One target piece as the AoA statements give it: each region they read, loaded on its own (two pieces may
    read one stored tensor), put together (reference.aoa.reads, assemble). A fusion's degree is how many distinct
    pieces the checkpoint holds of the fused tensor."""
    lt = rt.local
    index = open_checkpoint(root, name)[1]
    degrees = aoa.degrees_of(transforms, lambda n: len({s.region for s in index.slices_of(n + ".aoa_fused")}))
    got = [load(root, {r.key: Target(DTYPES[r.dtype], r.global_shape, r.region)}, name=name)[r.key].bits
           for r in aoa.reads(transforms, tensor, lt.tensor.dtype.name, tuple(lt.global_shape), lt.region, degrees)]
    return Tensor(lt.tensor.dtype, aoa.assemble(transforms, tensor, lt.tensor.dtype.name, lt.region, got,
                                                np.zeros(lt.tensor.shape, lt.tensor.dtype.bits_dtype)))
