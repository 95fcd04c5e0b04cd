"""The adapter contract: what a system under test implements on each rank (documented in docs/sut.md).

The harness hands an adapter plain data — numpy bits, regions, layouts — and gets plain data back, so the same
worker drives Paddle, torch or the reference. The adapter owns every framework call: building distributed tensors
from local pieces, saving, waiting for async saves, loading into a target layout, and converting back to bits.
"""

from __future__ import annotations

import importlib
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from reference import aoa, nesting
from reference.engine import LocalTensor
from reference.layout import Region, TensorLayout, piece_count, whole_on_every_rank
from reference.moe import keyed_expert_id, whole_on_its_ep_ranks
from reference.tensor import Tensor


@dataclass(frozen=True)
class RankTensor:
    """One tensor as this rank sees it: its global layout, and this rank's piece (bits for saves, zeros shaped
    like the piece for loads). ``layout`` is None for a tensor that lives whole on rank 0 only."""

    name: str
    layout: TensorLayout | None
    local: LocalTensor

    @property
    def region(self) -> Region:
        return self.local.region


def aoa_stored(tensors: dict[str, RankTensor], transforms: list) -> dict[str, LocalTensor]:
    """A save's pieces as a checkpoint in another model's structure stores them (reference.aoa), each under its
    owner's name and suffix; a fusion at the degree its save layout gives it (as many pieces as the layout cuts)."""
    held = [t for t in transforms if aoa.named(t)[0] in tensors]  # an expert's owner alone holds it
    degrees = aoa.degrees_of(held, lambda n: piece_count(tensors[n].layout, tensors[n].local.global_shape))
    return aoa.stored_locals(transforms, {n: rt.local for n, rt in tensors.items()}, degrees)


class SutAdapter:
    """Base class of rank-side adapters. Subclasses set the class attributes and override the methods.

    Lifecycle on each rank: ``setup`` once per process (warm pools reuse the process for many cases), then per
    case ``save`` / ``wait`` / ``mutate`` / ``load`` in the order of the case's operations, then ``end_case``
    (drop anything per case: pending async handles, caches), and ``close`` when the process ends.
    """

    name: ClassVar[str] = "abstract"
    #: What the SUT claims: "reshard", "async", "zero_size", "flat", "moe", "repeat", "latest", "rotate",
    #: "kill_writer", "dtype:BF16", ...
    capabilities: ClassVar[frozenset[str]] = frozenset()
    #: How ranks are started: "plain" (the harness starts N processes with RANK/WORLD_SIZE set) or "paddle"
    #: (python -m paddle.distributed.launch).
    launcher: ClassVar[str] = "plain"
    #: The environment variable naming the endpoint rank 0 serves and every other rank connects to at set-up
    #: (Paddle's TCPStore). Forked ranks start together, so the others would connect before it listens and wait
    #: out the framework's retry interval; with this set, rank 0 is forked first and the others once it listens.
    master_env: ClassVar[str | None] = None
    #: A module the adapter needs; `ckpt-harness list` reports whether it is importable.
    framework: ClassVar[str | None] = None
    #: Names of the exception types that say "this checkpoint is incomplete or damaged" clearly. None: the SUT
    #: has no typed errors, so after a fault any exception a load raises counts as clear (the finding still
    #: quotes it).
    clear_errors: ClassVar[frozenset[str] | None] = None

    @classmethod
    def refuses(cls, case: Any) -> str | None:
        """Why this SUT cannot run ``case`` at all (None: it can), read from the case alone before any launch: a
        hand-written case outside what the adapter models is bad input to the harness, not a finding. Here: a
        layout other than whole tensors on every rank, for a SUT that claims only those ("replicated"); one that
        also claims "moe" holds keyed experts whole on their expert-parallel ranks too."""
        if "replicated" in cls.capabilities:
            moe = "moe" in cls.capabilities
            for which in ("save", "load"):
                for key, layout in sorted(case.layouts(which).items()):
                    expert = moe and keyed_expert_id(key) is not None and whole_on_its_ep_ranks(layout)
                    if not (whole_on_every_rank(layout) or expert):
                        return (f"the {which} layout of {key!r} is not replicated: {cls.name} holds whole tensors "
                                "on every rank (capability 'replicated')")
        return None

    @classmethod
    def virtual_plays(cls, case: Any) -> bool:
        """Capability "virtual": whether the virtual world emulates every call ``case`` makes (else its ops run on
        real ranks, as a fault case's do)."""
        return True

    @classmethod
    def process_shape(cls, case: Any, index: int) -> str:
        """What of op ``index``'s job a rank process keeps for its whole life, where ops differ in it (e.g. the
        framework's process groups, made once per process): ops of another shape run on other processes, as a
        real job of that shape is another launch. "" (the default): any warm process will do."""
        return ""

    @classmethod
    def preload(cls) -> None:
        """Import what every rank imports before ``setup`` (harness.ranks.forkserver forks fresh ranks from a process
        that did): imports only, never a device, a thread pool or a process group."""
        if cls.framework:
            importlib.import_module(cls.framework)

    @classmethod
    def launch_gpus(cls, world: int, device: str = "auto") -> int:
        """In the controller: GPUs the framework's launcher gives ``world`` ranks of one node, one per rank, or 0
        (CPU). ``device`` "cpu" forces the CPU; "gpu" insists on GPUs. Only a framework launcher places ranks on
        GPUs; with the harness's own, an adapter picks its device on the rank."""
        return 0

    @classmethod
    def virtual_world(cls, size: int) -> Any:
        """``size`` virtual ranks of this SUT inside this process (capability "virtual"; harness.ranks.virtual_host):
        an object with ``run(tasks)`` (one callable per rank, run one at a time), ``envs`` (each rank's
        environment), ``scheduler``, ``broken`` and ``close()``, as harness.ranks.virtual.paddle_world.PaddleWorld."""
        raise NotImplementedError(f"{cls.name} has no virtual ranks")

    def setup(self, rank: int, world_size: int, options: dict) -> list[str]:
        """Initialise the framework's distributed runtime for this rank; return the names of active shims."""
        return []

    def describe(self) -> dict[str, str]:
        """After ``setup``: where this rank runs, e.g. {"device": "cuda:1", "backend": "cpu:gloo,cuda:nccl"};
        reported in summaries so a GPU run shows it ran on GPUs."""
        return {"device": "cpu"}

    def save(self, root: Path, name: str, tensors: dict[str, RankTensor], *, use_async: bool, options: dict) -> Any:
        """Save this rank's tensors as checkpoint ``name`` under ``root`` (collectively with the other ranks).
        Returns a handle for ``wait`` when ``use_async``."""
        raise NotImplementedError

    def wait(self, handle: Any) -> None:
        """Block until an async save is durable; raise its error."""

    def writer_pids(self, handle: Any) -> list[int]:
        """Processes that write this async save's files but were started before it (a long-lived writer): a
        ``stall``-ed save holds them too. Writers the save itself starts are found without the adapter's help."""
        return []

    def standing_writers(self) -> list[int]:
        """Long-lived writer processes that exist before a save hands them work (Zero-Cost Checkpointing's
        workers): a ``stall``-ed save holds them from before the call, so what they do for it waits for the harness,
        not for the scheduler."""
        return []

    def kill_pending(self, handles: list[Any]) -> None:
        """SIGKILL the background writers of these async saves (returned by ``save``, never waited for) and reap
        them, as a crash of the job would: once this returns none of them may still commit. A save that committed
        before its writer died stays committed. Capability ``kill_writer``."""
        raise NotImplementedError(f"{self.name} cannot kill the writers of its async saves")

    def rotate(self, root: Path, keep: int) -> None:
        """Delete all but the newest ``keep`` (>= 1) committed checkpoints under ``root``, never the latest one
        (called on every rank; the SUT decides which rank deletes). Capability ``rotate``."""
        raise NotImplementedError(f"{self.name} does not rotate checkpoints")

    def mutate(self, handle: Any) -> None:
        """Scribble over the caller-side tensors that were passed to an async ``save`` (which has returned)."""
        raise NotImplementedError

    def begin_training(self, spec: Any, params: tuple[Any, ...]) -> None:
        """Capability "trains" (the SUT runs its own training loop): a training case's hyper-parameters
        (reference.training.TrainingSpec) and parameters, before its first op."""
        raise NotImplementedError(f"{self.name} does not train")

    def train(self, root: Path, live: dict[str, LocalTensor], to_step: int, *, options: dict) -> None:
        """Capability "trains": advance the job to step ``to_step`` and write the state it reached into ``live``
        (this rank's pieces of every training key), as the reference loop would have."""
        raise NotImplementedError(f"{self.name} does not train")

    def load(self, root: Path, name: str | None, targets: dict[str, RankTensor], *, options: dict) -> dict[str, Tensor]:
        """Load checkpoint ``name`` (None: the latest) into this rank's target pieces; return their bits."""
        raise NotImplementedError

    def read_plan(self) -> dict | None:
        """After a load: the SUT's own plan of what this rank read (the plan-level check,
        properties.check.states.plan_violations): {"tensors": the keys it planned for, "reads": one (tensor, dst
        offsets, shape, src piece offsets, offsets within that piece) per read, dst and piece in global
        coordinates}; None where the SUT does not expose one or planned nothing."""
        return None

    def healthy(self) -> bool:
        """After a failed case: is the distributed runtime still in step (e.g. a barrier completes)? A pool
        whose ranks are not healthy is relaunched."""
        return True

    def end_case(self) -> None:
        """Forget per-case state; the next case starts from a clean slate."""

    def close(self) -> None:
        """Release everything before the process exits."""

    @classmethod
    def stored_key(cls, name: str, options: dict) -> str:
        """Controller side: the key ``written`` lists tensor ``name`` under: in a nested state dict its path
        joined as reference.nesting joins it, else the name."""
        sep = options.get(nesting.NESTED)
        return nesting.stored_key(name, sep) if sep else name

    @classmethod
    def written(cls, root: Path, name: str) -> dict[str, tuple[tuple[int, ...], list[Region]]] | None:
        """Controller side: per tensor, the global shape and the regions that landed on disk (for P-COVER);
        None when the format cannot be inspected."""
        return None

    @classmethod
    def complete(cls, root: Path, names: Collection[str], options: dict) -> list[str] | None:
        """Controller side, after every op: which of the case's checkpoint ``names`` the SUT itself would treat as
        finished under ``root`` now (its commit marker, done file, metadata or index, as its own "latest" or
        resume selector reads them), so the history judge can hold it to "looks complete => loads bitwise".
        A directory listing and a few small reads at most, never a load. None: the SUT cannot tell."""
        return None
