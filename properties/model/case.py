"""Cases (JSON, versioned): everything needed to re-run one example exactly, and nothing bulky.

Tensors are regenerated from (dtype, shape, seed) — or from an explicit bit pattern for special values — so a
shrunk failing case is a few hundred bytes and replays bit for bit. Operations are a small sequential language:
``save`` a version of the state under a name (sync or async, optionally mutating the caller's tensors right after
an async save returns, optionally ``detach``-ed: returning without waiting), ``load`` a name (or the latest) and
expect a given version. Sequence ops (a training job's life, judged by ``properties.check.history.check_history``):
``wait`` for the detached saves, ``kill`` their writers, ``restart`` the job (fresh rank processes), ``rotate``
(keep the newest ``keep`` checkpoints) and ``corrupt`` the checkpoint root (a seeded ``faults.corrupt`` plan). A
detached save may ``stall``: its writers are held (processes stopped, threads gated before they run) from the moment
it returns until a ``resume`` (or the next wait, kill, save or restart), which makes a writer's race with training,
rotation or loading deterministic. A save's ``layout`` ("save" or "load") says which of the case's two layouts (and
world sizes) it runs under: a job that restarts on another parallel layout and saves again, perhaps into a name it
saved before.

A *training* case (``training`` holds a reference.training.TrainingSpec) runs the miniature training loop instead
of saving fixed versions: its tensors are the model's parameters, a state holds every family of each (model,
master weights, moments, EMA) plus RNG and step, a version is a step, and ``train`` advances the ranks' live state
to a step. Saves write the live state; a load replaces it (a failed one drops it, and training then starts over).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import numpy as np

from faults.corrupt import KINDS as CORRUPTIONS
from faults.errors import FaultSpecError
from faults.spec import CorruptFault, Fault, parse_fault
from reference import aoa, master_weights, nesting, producers
from reference.aoa import AOA
from reference.dtypes import DTYPES, DType
from reference.errors import LayoutError
from reference.layout import TensorLayout, layout_from_json, pieces
from reference.nesting import EMPTY_DICTS, NESTED
from reference.producers import PRODUCER
from reference.tensor import Tensor
from reference.training import Param, TrainingSpec, check_params, state_keys, trained_state

CASE_VERSION = 1

# Bit patterns worth hitting on purpose, per dtype: NaN payloads (quiet and signalling), -0.0, smallest and largest
# subnormals, infinities, extremes of integer ranges.
SPECIAL_BITS: dict[str, tuple[int, ...]] = {
    "F64": (
        0x8000000000000000,
        0x7FF8000000000001,
        0x7FF0000000000001,
        0xFFF8DEADBEEF0000,
        0x7FF0000000000000,
        0xFFF0000000000000,
        0x0000000000000001,
        0x000FFFFFFFFFFFFF,
    ),
    "F32": (0x80000000, 0x7FC00001, 0x7F800001, 0xFFC0DEAD, 0x7F800000, 0xFF800000, 0x00000001, 0x007FFFFF),
    "F16": (0x8000, 0x7E01, 0x7C01, 0xFE5A, 0x7C00, 0xFC00, 0x0001, 0x03FF),
    "BF16": (0x8000, 0x7FC1, 0x7F81, 0xFFA5, 0x7F80, 0xFF80, 0x0001, 0x007F),
    "F8_E4M3": (0x80, 0x7F, 0xFF, 0x01, 0x07, 0x7E),
    "F8_E5M2": (0x80, 0x7D, 0x7E, 0xFF, 0x7C, 0xFC, 0x01, 0x03),
    "I64": (0x8000000000000000, 0x7FFFFFFFFFFFFFFF, 0xFFFFFFFFFFFFFFFF),
    "I32": (0x80000000, 0x7FFFFFFF, 0xFFFFFFFF),
    "I16": (0x8000, 0x7FFF, 0xFFFF),
    "I8": (0x80, 0x7F, 0xFF),
    "U8": (0x00, 0xFF),
    "BOOL": (0, 1),
}


# options["process_group"] == "subset": the SUT's calls run on a process group of the ranks the layouts fix, and the
# job has one rank more that takes no part in them (a job whose other ranks do other work, or none). That idle
# rank is options["idle_rank"], counted modulo the op's world as a Python index (default -1, the last: the group is
# ranks 0..k-1; 0: ranks 1..k; in between: a group with a hole). The group's members, in rank order, take the
# layouts' ranks 0..k-1.
PROCESS_GROUP = "process_group"
IDLE_RANK = "idle_rank"


def idle_ranks(options: dict) -> int:
    """Ranks of an op's job outside the process group its calls run on."""
    return 1 if options.get(PROCESS_GROUP) == "subset" else 0


def group_members(options: dict, world: int) -> tuple[int, ...]:
    """The ranks of a job of ``world`` processes that take part in its calls, in rank order."""
    if not idle_ranks(options):
        return tuple(range(world))
    idle = int(options.get(IDLE_RANK, -1)) % world
    return tuple(r for r in range(world) if r != idle)


def layout_rank(options: dict, rank: int, world: int) -> int | None:
    """The rank the layouts give process ``rank``'s pieces to: its place among the group's members; None for an
    idle rank, which holds nothing."""
    members = group_members(options, world)
    return members.index(rank) if rank in members else None


class CaseError(ValueError):
    """A case file is malformed; the message names the file and the field."""


def seeded_tensor(dt: DType, shape: tuple[int, ...], seed: int) -> Tensor:
    """Deterministic bits from a seed, with ~5% special values sprinkled in (same seed → same bits, always)."""
    rng = np.random.default_rng(seed)
    n = math.prod(shape)
    if dt.name == "BOOL":
        bits = rng.integers(0, 2, n, dtype=np.uint8)
    else:
        bits = rng.integers(0, 1 << (8 * dt.itemsize), n, dtype=dt.bits_dtype, endpoint=False)
        specials = np.array(SPECIAL_BITS.get(dt.name, (0,)), dtype=dt.bits_dtype)
        where = rng.random(n) < 0.05
        bits[where] = rng.choice(specials, int(where.sum()))
    return Tensor(dt, bits.reshape(shape))


@dataclass(frozen=True)
class TensorCase:
    name: str
    dtype: str
    shape: tuple[int, ...]
    seed: int = 0
    bits: tuple[int, ...] | None = None  # explicit element bit patterns (row-major); overrides the seed

    def build(self, version: int = 0) -> Tensor:
        """The tensor's bits at state ``version`` (each saved version differs, so a stale load is visible)."""
        dt = DTYPES[self.dtype]
        if self.bits is not None:
            base = np.array(self.bits, dtype=dt.bits_dtype).reshape(self.shape)
            if version and base.size and dt.name != "BOOL":
                base = base ^ np.array(version, dtype=dt.bits_dtype)  # flips low bits per version, keeps patterns
            elif version and base.size:
                base = base ^ np.uint8(version & 1)
            return Tensor(dt, base)
        return seeded_tensor(dt, self.shape, self.seed * 1_000_003 + version)


OP_KINDS = ("save", "load", "train", "wait", "kill", "restart", "rotate", "corrupt", "resume")
SEQUENCE_KINDS = ("wait", "kill", "restart", "rotate", "corrupt", "resume")  # ops beyond one save/load round
HARNESS_KINDS = ("restart", "corrupt")  # done by the harness between rank ops, not by the SUT
LAYOUTS = ("save", "load")  # an op's ``layout``: which of the case's layouts it runs under
_SEQUENCE_FIELDS = ("detach", "keep", "seed", "corruption", "stall", "layout")


@dataclass(frozen=True)
class Op:
    kind: str  # one of OP_KINDS
    name: str | None = None  # checkpoint name; None on load means "latest"
    version: int = 0  # save: which state version; load: which version is expected; train: the step to reach
    use_async: bool = False
    mutate_after: bool = False  # async save: scribble on the caller's tensors as soon as save returns
    detach: bool = False  # async save that returns without waiting: a later wait / kill / restart settles it
    keep: int = 0  # rotate: keep the newest ``keep`` checkpoints
    seed: int = 0  # corrupt: seed of the faults.corrupt plan drawn on the root's files at that point
    corruption: str = "bitflip"  # corrupt: a kind of faults.corrupt
    stall: bool = False  # detached save: its writers are held from its return until a ``resume``
    layout: str | None = None  # "save" or "load": the case's layouts this op runs under (None: its kind decides)

    def corruption_fault(self, index: int) -> CorruptFault:
        """A ``corrupt`` op (at op ``index``) is a seeded corrupt fault applied between two ops."""
        return CorruptFault(op=index, seed=self.seed, corruption=self.corruption)

    def to_json(self) -> dict:
        """The sequence fields are left out at their defaults, so a plain save/load case file carries none."""
        defaults = {f.name: f.default for f in fields(self)}
        return {k: v for k, v in asdict(self).items() if k not in _SEQUENCE_FIELDS or v != defaults[k]}

    def check(self) -> None:
        """Raise ValueError naming what is wrong with this op."""
        where = f"op {self.kind!r}"
        if self.kind not in OP_KINDS:
            raise ValueError(f"unknown operation {self.kind!r} (known: {', '.join(OP_KINDS)})")
        for name in ("use_async", "mutate_after", "detach", "stall"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{where}: field {name!r} must be true or false, got {getattr(self, name)!r}")
        for name in ("version", "keep", "seed"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{where}: field {name!r} must be a non-negative integer, got {value!r}")
        if self.name is not None and not isinstance(self.name, str):
            raise ValueError(f"{where}: field 'name' must be a string or null, got {self.name!r}")
        if self.detach and not (self.kind == "save" and self.use_async):
            raise ValueError(f"{where}: 'detach' is for async saves (use_async true) only")
        if self.stall and not self.detach:
            raise ValueError(f"{where}: 'stall' is for detached async saves (detach true) only: a held writer "
                             "never finishes a save that is waited for")
        if self.layout is not None and self.layout not in LAYOUTS:
            raise ValueError(f"{where}: field 'layout' must be one of {', '.join(LAYOUTS)} or null, "
                             f"got {self.layout!r}")
        if self.kind == "rotate" and self.keep < 1:
            raise ValueError(f"{where}: field 'keep' must be at least 1, got {self.keep}")
        if self.kind == "corrupt" and self.corruption not in CORRUPTIONS:
            raise ValueError(f"{where}: field 'corruption' {self.corruption!r} is not one of {', '.join(CORRUPTIONS)}")


@dataclass(frozen=True)
class Case:
    property: str
    sut: str
    tensors: tuple[TensorCase, ...]
    save_layout: dict[str, dict]
    load_layout: dict[str, dict]
    ops: tuple[Op, ...]
    options: dict = field(default_factory=dict)
    seed: int = 0
    version: int = CASE_VERSION
    #: The fault injected into one of the ops; None for a fault-free case. Given as its JSON object, it is parsed
    #: (faults.spec.parse_fault; a malformed one raises FaultSpecError) when the case is made.
    fault: Fault | None = None
    #: A training case's loop (reference.training.TrainingSpec as JSON); None for saves of fixed versions.
    training: dict | None = None

    def __post_init__(self) -> None:
        if self.fault is not None:
            object.__setattr__(self, "fault", parse_fault(self.fault, len(self.ops)))

    @property
    def sequence(self) -> bool:
        """Whether the case uses the sequence ops (detached saves, wait, kill, restart, rotate, corrupt)."""
        return any(op.kind in SEQUENCE_KINDS or op.detach for op in self.ops)

    def state(self, version: int = 0) -> dict[str, Tensor]:
        """The whole state at ``version`` (a training case: the uninterrupted run after that many steps).

        Built once per case object and version: the W virtual ranks of one host (and the judges) share the immutable
        case, and rebuilding every tensor on every rank was a sixth of a 16-rank case. The bits are made read-only,
        so a caller that wrote into them would fail loudly instead of changing what another rank or judge sees."""
        memo: dict[int, dict[str, Tensor]] = self.__dict__.setdefault("_states", {})
        if version not in memo:
            built = (trained_state(self.spec(), self.params(), version) if self.training is not None
                     else {t.name: t.build(version) for t in self.tensors})
            for tensor in built.values():
                tensor.bits.flags.writeable = False
            memo[version] = built
        return dict(memo[version])

    def expected(self, version: int, which: str) -> dict[str, Tensor]:
        """The state a load (or the live state) under ``which`` layouts holds: a training case's layouts may name a
        subset of its keys (a load of the EMA alone); other cases hold every tensor."""
        state = self.state(version)
        if self.training is None:
            return state
        return {k: state[k] for k in self.layouts(which)}

    def restored(self, version: int, which: str) -> dict[str, Tensor]:
        """What a load of ``version`` under ``which`` layouts gives back: the state saved, as a resume restores it
        where the case's flags (reference.master_weights) saved a weight or its master in place of the other."""
        return master_weights.restored(self.expected(version, which), self.restoring(version))

    def restoring(self, version: int) -> list[str]:
        """The master-weight flags a resume of ``version`` restores by (reference.master_weights): those the case
        turns on, where that version's last save ran on more than one rank (a one-rank save keeps both)."""
        flags = [f for f in master_weights.FLAGS if self.options.get(f)]
        saves = [i for i, op in enumerate(self.ops) if op.kind == "save" and op.version == version]
        if flags and saves and (self.op_world(saves[-1]) or 1) - idle_ranks(self.options) > 1:
            return flags
        return []

    def spec(self) -> TrainingSpec:
        if self.training is None:
            raise ValueError("not a training case")
        return TrainingSpec.from_json(self.training)

    def params(self) -> tuple[Param, ...]:
        return tuple(Param(t.name, t.dtype, t.shape, t.seed) for t in self.tensors)

    def check_aoa(self) -> None:
        """Raise reference.aoa.AoaError unless the case's AoA transformations fit its tensors, and each fusion's
        degree under every layout a save runs under divides what it splits (a smaller mesh may not) and counts
        pieces that all hold elements (an empty piece makes the degree the checkpoint shows ambiguous); a fused
        model tensor's degree is the count of distinct pieces every load gives it, none empty."""
        tensors = {t.name: (t.dtype, tuple(t.shape)) for t in self.tensors}
        saves = {self.op_layouts(i) for i, op in enumerate(self.ops) if op.kind == "save"}
        for which in sorted(saves or {"save"}):
            layouts = self.layouts(which)
            cut = {n: pieces(layouts.get(n), tensors[n][1]) for n in aoa.degreed_leads(self.options[AOA])}
            empty = sorted(n for n, regions in cut.items() if any(r.numel == 0 for r in regions))
            if empty:
                raise aoa.AoaError(f"aoa: {empty[0]!r}'s {which} layout leaves a rank an empty piece: its fusion's "
                                   "degree is ambiguous")
            aoa.check(self.options[AOA], tensors, {n: len(regions) for n, regions in cut.items()})
        loads = {self.op_layouts(i) for i, op in enumerate(self.ops) if op.kind == "load"}
        for which in sorted(loads):
            layouts = self.layouts(which)
            for name, degree in aoa.model_degrees(self.options[AOA]).items():
                regions = pieces(layouts.get(name), tensors[name][1])
                if len(regions) != degree or any(r.numel == 0 for r in regions):
                    raise aoa.AoaError(f"aoa: {name!r}'s {which} layout gives it {len(regions)} pieces (empty ones "
                                       f"too), not its fusion's degree {degree}, which Paddle takes from them")

    def op_layouts(self, index: int) -> str:
        """Which layouts (and world) op ``index`` runs under: the op's own ``layout`` where it names one; else loads
        the load layouts; in a training case the live state lives under the save layouts until the first load and
        under the load layouts after it."""
        op = self.ops[index]
        if op.layout is not None:
            return op.layout
        if op.kind == "load":
            return "load"
        if self.training is not None and any(o.kind == "load" for o in self.ops[:index]):
            return "load"
        return "save"

    def state_source(self, index: int) -> int | None:
        """The load whose state train op ``index`` carries on: the last load of its job before it (None: the job
        trains from the seeds, after a restart or the fault that started fresh ranks). What that load gave wrong,
        training carries into every tensor of the rank it reached (the RNG state drives every gradient)."""
        for n in range(index - 1, -1, -1):
            if self.ops[n].kind == "restart" or (self.fault is not None and self.fault.op == n):
                return None
            if self.ops[n].kind == "load":
                return n
        return None

    def specs(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        return {t.name: (t.dtype, t.shape) for t in self.tensors}

    def layouts(self, which: str) -> dict[str, TensorLayout]:
        """Parsed once per case object (layouts are frozen; every rank and op of a host asks again); a new dict
        each call, so a caller may change its own."""
        memo: dict[str, dict[str, TensorLayout]] = self.__dict__.setdefault("_layouts", {})
        if which not in memo:
            raw = self.save_layout if which == "save" else self.load_layout
            memo[which] = {name: layout_from_json(data) for name, data in raw.items()}
        return dict(memo[which])

    def layout_rank(self, rank: int, which: str) -> int | None:
        """The layouts' rank of process ``rank`` in an op under ``which`` layouts (None: an idle rank)."""
        return layout_rank(self.options, rank, self.world_size(which))

    def op_world(self, index: int) -> int | None:
        """How many ranks op ``index`` runs on (None: the harness does it between rank ops)."""
        return None if self.ops[index].kind in HARNESS_KINDS else self.world_size(self.op_layouts(index))

    def tensor_kinds(self) -> tuple[str, ...]:
        """The kinds of tensor the case asks the SUT to save and load (``tensor_kind``, or one per family in
        ``tensor_kinds``), sorted; empty where it leaves the choice to the SUT."""
        per_family = self.options.get("tensor_kinds", {})
        kinds = set(per_family.values()) if isinstance(per_family, dict) else set()
        if "tensor_kind" in self.options:
            kinds.add(self.options["tensor_kind"])
        return tuple(sorted(str(k) for k in kinds))

    def storage_format(self) -> str | None:
        """The file format the case asks of the SUT (``format``: "safetensors", "pickle"); None: its default."""
        value = self.options.get("format")
        return None if value is None else str(value)

    def op_api(self, index: int) -> str | None:
        """The SUT call op ``index`` makes where the case chose one (a load's ``load_api``); None: its default."""
        value = self.options.get("load_api") if self.ops[index].kind == "load" else None
        return None if value is None else str(value)

    def world_size(self, which: str) -> int:
        """The ranks a ``which`` op runs on: those its layouts fix, and the idle ranks of the case's options."""
        sizes = {lay.mesh.world_size for lay in self.layouts(which).values()}
        fixed = sizes.pop() if len(sizes) == 1 else int(self.options.get(f"{which}_world_size", 1))
        return fixed + idle_ranks(self.options)

    def to_json(self) -> dict:
        """A new dict each call (a caller may change its own); built once per case object, as JSON text: the
        controller sends a case to its ranks at every begin, and ``asdict`` over its tensors and ops was a
        twentieth of a 2-rank virtual case."""
        text = self.__dict__.get("_json_text")
        if text is None:
            text = json.dumps(self._build_json())
            self.__dict__["_json_text"] = text
        return json.loads(text)

    def _build_json(self) -> dict:
        data = asdict(self)
        for optional in ("fault", "training"):
            if data[optional] is None:
                del data[optional]
        if self.fault is not None:
            data["fault"] = self.fault.to_json()
        data["tensors"] = [{k: v for k, v in asdict(t).items() if v is not None} for t in self.tensors]
        data["ops"] = [op.to_json() for op in self.ops]
        return data

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, data: object, source: str = "<case>") -> Case:
        if not isinstance(data, dict):
            raise CaseError(f"{source}: a case is a JSON object")
        if data.get("version") != CASE_VERSION:
            raise CaseError(f"{source}: case version {data.get('version')!r} is not {CASE_VERSION}")
        try:
            tensors = tuple(
                TensorCase(
                    str(t["name"]),
                    _dtype(t["dtype"]),
                    tuple(int(s) for s in t["shape"]),
                    int(t.get("seed", 0)),
                    tuple(int(b) for b in t["bits"]) if t.get("bits") is not None else None,
                )
                for t in data["tensors"]
            )
            ops = tuple(Op(**op) for op in data["ops"])
            fault = _fault(data.get("fault"))
            case = cls(
                str(data["property"]),
                str(data["sut"]),
                tensors,
                dict(data["save_layout"]),
                dict(data["load_layout"]),
                ops,
                dict(data.get("options", {})),
                int(data.get("seed", 0)),
                training=_training(data.get("training")),
            )
            for t in tensors:
                if any(s < 0 for s in t.shape) or (t.bits is not None and len(t.bits) != math.prod(t.shape)):
                    raise ValueError(f"tensor {t.name!r}: shape {list(t.shape)} and bits disagree")
            case.layouts("save"), case.layouts("load")  # validate
            unknown = [op.kind for op in ops if op.kind not in OP_KINDS]
            if unknown:
                raise ValueError(f"unknown operations {unknown}")
            for n, op in enumerate(ops):
                try:
                    op.check()
                except ValueError as exc:
                    raise ValueError(f"ops[{n}]: {exc}") from None
            if fault is not None:
                try:
                    case = replace(case, fault=fault)
                except FaultSpecError as exc:
                    raise CaseError(f"{source}: bad fault: {exc}") from None
            if IDLE_RANK in case.options and (case.options.get(PROCESS_GROUP) != "subset"
                                              or type(case.options[IDLE_RANK]) is not int):
                raise ValueError(f"option {IDLE_RANK} {case.options[IDLE_RANK]!r}: an int, with process_group "
                                 "\"subset\" alone")
            if NESTED in case.options:
                nesting.check([t.name for t in tensors], case.options[NESTED], case.options.get(EMPTY_DICTS, ()))
            if AOA in case.options:
                case.check_aoa()
            if PRODUCER in case.options:
                if case.options[PRODUCER] not in producers.PRODUCERS:
                    raise ValueError(f"unknown producer {case.options[PRODUCER]!r} (known: "
                                     f"{', '.join(producers.PRODUCERS)})")
                producers.check(case.options[PRODUCER], case.specs(), {w: case.layouts(w) for w in ("save", "load")})
            if case.training is not None:
                _check_training(case)
            elif any(op.kind == "train" for op in ops):
                raise ValueError("a 'train' op needs a training case (a 'training' object)")
        except CaseError:
            raise
        except (KeyError, TypeError, ValueError, LayoutError) as exc:
            raise CaseError(f"{source}: malformed case ({type(exc).__name__}: {exc})") from None
        return case

    @classmethod
    def load(cls, path: str | Path) -> Case:
        return read_case_file(path)[0]


def read_case_file(path: str | Path) -> tuple[Case, dict]:
    """A case from a case file, or from a finding file (which carries it under "case") with the finding."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CaseError(f"{path}: no such case file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CaseError(f"{path}: not a JSON case file ({exc})") from None
    if isinstance(data, dict) and "case" in data:
        return Case.from_json(data["case"], str(path)), data
    return Case.from_json(data, str(path)), {}


def _dtype(name: object) -> str:
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}")
    return str(name)


def _training(raw: object) -> dict | None:
    return None if raw is None else TrainingSpec.from_json(raw).to_json()


def _check_training(case: Case) -> None:
    """A training case is well formed when its layouts name its keys and every save writes a known step: the live
    state's step is known after a ``train`` (its target) or a named load (its version), and lost after a load of
    "latest" or a partial one (then a ``train`` must come first: it starts over where the state is gone)."""
    if any(t.bits is not None for t in case.tensors):
        raise ValueError("training parameters are seeded, not given as bits")
    check_params(case.params())
    keys = set(state_keys(case.params()))
    save_keys, load_keys = set(case.save_layout), set(case.load_layout)
    if save_keys != keys:
        raise ValueError(f"the save layouts must name exactly the training keys {sorted(keys)}; "
                         f"missing {sorted(keys - save_keys)}, unknown {sorted(save_keys - keys)}")
    if not load_keys <= keys or not load_keys:
        raise ValueError(f"the load layouts name unknown keys {sorted(load_keys - keys)} or none")
    partial = load_keys != keys
    live: int | None = 0  # the live state's step; None: unknown or partial
    for n, op in enumerate(case.ops):
        if op.kind == "train":
            if live is not None and op.version < live:
                raise ValueError(f"ops[{n}]: train to step {op.version}, but the state is at step {live}")
            live = op.version
        elif op.kind == "save" and live != op.version:
            raise ValueError(f"ops[{n}]: save of step {op.version}, but the live state is at step "
                             f"{'unknown (train first)' if live is None else live}")
        elif op.kind == "load":
            live = None if (op.name is None or partial) else op.version
        if op.kind == "restart" or (case.fault is not None and case.fault.op == n):
            live = 0  # fresh ranks (a restart, or the one after a fault) start over from the seeds
        if op.kind in ("train", "save") and partial and case.op_layouts(n) == "load":
            raise ValueError(f"ops[{n}]: the load layouts hold part of the state, so nothing can train or save "
                             "after a load")


def _fault(raw: object) -> dict | None:
    if raw is not None and not isinstance(raw, dict):
        raise ValueError(f"fault must be a JSON object, got {type(raw).__name__}")
    return raw
