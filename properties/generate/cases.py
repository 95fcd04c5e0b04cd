"""Strategies that draw whole Cases, one family per property, within what the SUT claims.

Seeds, not bytes, so cases stay small. A SUT's capabilities narrow the draw: dtypes it supports, whether loads
may use another layout (reshard) or world size, whether "latest" is meaningful, which options exist. Whether a
property is drawn for a SUT at all is the registry's call (``properties.registry``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from hypothesis import strategies as st

from properties.generate.layouts import DTYPE_NAMES, factorizations, shapes, sharded_layouts, state_layouts
from properties.model.case import SPECIAL_BITS, Case, Op, TensorCase
from reference import nesting
from reference.layout import Mesh, TensorLayout, flat_group, replicated
from reference.moe import expert_layouts
from reference.nesting import EMPTY_DICTS, NESTED
from reference.training import PARAM_DTYPES, family_keys

NAMES = ("model/w", "model/b", "model/emb", "optimizer/w.m1", "optimizer/w.m2", "master/w", "ema/w", "rng/state")
# With nesting ("/" splits a name into dict keys): deeper paths, dicts beside tensors, "." inside keys
NESTED_NAMES = ("model/layers/0/w", "model/layers.1/b", "model/layers/2.w", "optimizer/state/w/m1", "buffers/step")
EMPTY_DICTS_DRAWN = ("model/unused", "buffers/none", "extra", "optimizer/state/empty")
PARAMS = ("w", "b", "emb", "layers.0.qkv")  # parameter names of a trainer's state ("trainer_state" SUTs)
MAX_VERSIONS = 16  # versions in one root: ids such as 1 and 11 coexist (a suffix match tells them apart wrongly)
KEEP_LAST = (1, 2)  # rotation limits drawn for SUTs that rotate inside every save ("keep_last")

class Caps:
    """A SUT's capabilities, read for the decisions strategies make."""

    def __init__(self, caps: Iterable[str]) -> None:
        self.caps = frozenset(caps)
        dtypes = [d for d in DTYPE_NAMES if f"dtype:{d}" in self.caps]
        self.dtypes = tuple(dtypes) or DTYPE_NAMES
        self.reshard = "reshard" in self.caps
        self.zero_size = "zero_size" in self.caps
        self.latest = "latest" in self.caps
        self.formats = sorted(c.split(":", 1)[1] for c in self.caps if c.startswith("format:"))
        self.tensor_kinds = sorted(c.split(":", 1)[1] for c in self.caps if c.startswith("tensor_kind:"))
        self.save_replicas = "save_replicas" in self.caps
        self.async_executors = sorted(c.split(":", 1)[1] for c in self.caps if c.startswith("async_executor:"))
        # A trainer's state (model/<p> with its moments and, for BF16/F16, an FP32 master weight) rather than any
        # tensors under any names; held whole on every rank (data parallel), never sharded.
        self.trainer_state = "trainer_state" in self.caps
        self.replicated_only = "replicated" in self.caps
        self.keep_last = "keep_last" in self.caps
        self.flags = sorted(c.split(":", 1)[1] for c in self.caps if c.startswith("flag:"))  # boolean options
        # "exclusive:A,B": flags A and B are never both on (a pair the SUT's job cannot run)
        self.exclusive: dict[str, set[str]] = {}
        for c in self.caps:
            if c.startswith("exclusive:"):
                a, _, b = c.split(":", 1)[1].partition(",")
                self.exclusive.setdefault(a, set()).add(b)
                self.exclusive.setdefault(b, set()).add(a)
        # options with a few values: "choice:logging_steps=2" -> {"logging_steps": [.., 2, ..]} (ints stay ints);
        # "choice:KEY=V@OTHER=W": KEY is drawn only where option OTHER is W (a parameter of one API of several)
        self.choices: dict[str, list] = {}
        self.choice_when: dict[str, tuple[str, object]] = {}
        for c in sorted(self.caps):
            if c.startswith("choice:"):
                choice, _, when = c.split(":", 1)[1].partition("@")
                key, _, value = choice.partition("=")
                self.choices.setdefault(key, []).append(_value(value))
                if when:
                    other, _, wanted = when.partition("=")
                    self.choice_when[key] = (other, _value(wanted))
        # "load_world:N@KEY=V": where option KEY is V, a load runs on a world of N ranks (one of the Ns listed), as
        # a communicator that reshards within a grid of groups needs a world that has one
        self.load_worlds: dict[tuple[str, object], set[int]] = {}
        # "min_world:N": the SUT's job cannot run on fewer than N ranks (a known bug no patch fixes, or its design):
        # no world of a drawn world change is smaller
        self.min_world = max((int(c.split(":", 1)[1]) for c in self.caps if c.startswith("min_world:")), default=1)
        for c in self.caps:
            if c.startswith("load_world:"):
                size, _, when = c.split(":", 1)[1].partition("@")
                key, _, value = when.partition("=")
                self.load_worlds.setdefault((key, _value(value)), set()).add(int(size))
        # how the SUT's own training loop behaves where loops differ (reference.training.TrainingSpec fields)
        self.training: dict[str, str | int] = {}
        for c in self.caps:
            field, _, value = c.partition(":")
            if field in ("ema_start", "master_init", "ema_seen", "ema_every"):
                self.training[field] = int(value) if value.isdigit() else value


@st.composite
def options(draw, caps: Caps, rotation: bool = False) -> dict:
    """A case's options within the SUT's claims; ``rotation``: a SUT's own rotation inside every save may be drawn
    (only history-judged cases, which know that a rotated-away checkpoint may be gone)."""
    out: dict = {}
    if caps.formats:
        out["format"] = draw(st.sampled_from(caps.formats))
    if caps.tensor_kinds:
        out["tensor_kind"] = draw(st.sampled_from(caps.tensor_kinds))
    if caps.save_replicas and draw(st.booleans()):
        out["save_replicas"] = True
    if "unique_id" in caps.caps and draw(st.booleans()):  # explicit, else the SUT's own numbering
        out["unique_id"] = draw(st.integers(0, 12))
    if caps.async_executors:
        out["async_executor"] = draw(st.sampled_from(caps.async_executors))
    if rotation and caps.keep_last and draw(st.booleans()):
        out["keep_last"] = draw(st.sampled_from(KEEP_LAST))
    for flag in caps.flags:
        if not any(out.get(other) for other in caps.exclusive.get(flag, ())) and draw(st.booleans()):
            out[flag] = True
    if "nested" in caps.caps and draw(st.booleans()):
        out[NESTED] = "/"
    for key, values in caps.choices.items():
        out[key] = draw(st.sampled_from(values))
    return unmet_choices_dropped(out, caps)


@st.composite
def load_world_of(draw, caps: Caps, opts: dict, ranks: int) -> int:
    """A load's world of ``caps.min_world``..``ranks`` ranks, among those that every drawn option fixing it allows
    ("load_world:"); any where none of them fits, which the SUT then refuses."""
    least = min(caps.min_world, ranks)
    fits = [n for n in range(least, ranks + 1)
            if all(n in sizes for (key, value), sizes in caps.load_worlds.items() if opts.get(key) == value)]
    if not fits or len(fits) == ranks - least + 1:
        return draw(st.integers(least, ranks))
    return draw(st.sampled_from(fits))


def unmet_choices_dropped(opts: dict, caps: Caps) -> dict:
    """``opts`` without the choices whose condition (``choice:KEY=V@OTHER=W``) the other options do not meet, until
    none is left: a choice whose condition was itself dropped goes too."""
    while True:
        kept = {k: v for k, v in opts.items()
                if k not in caps.choice_when or opts.get(caps.choice_when[k][0]) == caps.choice_when[k][1]}
        if kept == opts:
            return kept
        opts = kept


def _value(text: str) -> int | str:
    return int(text) if text.lstrip("-").isdigit() else text


def in_same_dir(opts: dict) -> dict:
    """``opts`` with every checkpoint a version of one directory: a name's number is its id there, so an
    explicit ``unique_id`` is dropped."""
    return {**{k: v for k, v in opts.items() if k != "unique_id"}, "same_dir": True}


def _bits(draw, dtype: str, shape: tuple[int, ...], edge: bool) -> tuple[int, ...] | None:
    if not (edge and draw(st.booleans())):
        return None
    count = math.prod(shape)
    return tuple(draw(st.lists(st.sampled_from(SPECIAL_BITS[dtype]), min_size=count, max_size=count)))


@st.composite
def trainer_state_cases(draw, caps: Caps, max_params: int = 3, min_params: int = 0, edge: bool = False):
    """A trainer's state: per parameter its weights, both Adam moments (F32) and, for a BF16/F16 parameter, an FP32
    master weight; each drawn whole (edge: special bit patterns in any of them)."""
    dtypes = [d for d in caps.dtypes if d in PARAM_DTYPES]
    names = draw(st.lists(st.sampled_from(PARAMS), min_size=min_params, max_size=max_params, unique=True))
    out = []
    for param in names:
        dtype = draw(st.sampled_from(dtypes))
        shape = draw(shapes(max_side=5).filter(lambda s: caps.zero_size or 0 not in s))
        keys = family_keys(param)
        members = [(keys["model"], dtype), (keys["m1"], "F32"), (keys["m2"], "F32")]
        if dtype != "F32":
            members.append((keys["master"], "F32"))
        for key, dt in members:
            out.append(TensorCase(key, dt, shape, draw(st.integers(0, 2**16)), _bits(draw, dt, shape, edge)))
    return tuple(out)


@st.composite
def tensor_cases(draw, caps: Caps, max_tensors: int = 4, min_tensors: int = 0, edge: bool = False,
                 opts: dict | None = None):
    """Tensors under drawn names; where ``opts`` ask for nesting, names of deeper paths too, and the empty
    sub-dicts beside them (drawn into ``opts``)."""
    if caps.trainer_state:
        return draw(trainer_state_cases(caps, max_params=max(1, max_tensors // 2), min_params=min(min_tensors, 1),
                                        edge=edge))
    sep = (opts or {}).get(NESTED)
    pool = NAMES + NESTED_NAMES if sep else NAMES
    names = draw(st.lists(st.sampled_from(pool), min_size=min_tensors, max_size=max_tensors, unique=True)
                 .filter(lambda ns: not sep or _nests(ns, sep)))
    if sep:
        empty = draw(st.lists(st.sampled_from(EMPTY_DICTS_DRAWN), max_size=2, unique=True)
                     .filter(lambda es: _nests(names, sep, es)))
        if empty:
            opts[EMPTY_DICTS] = sorted(empty)
    out = []
    for name in names:
        dtype = draw(st.sampled_from(caps.dtypes))
        shape = draw(shapes(max_side=6).filter(lambda s: caps.zero_size or 0 not in s))
        out.append(TensorCase(name, dtype, shape, draw(st.integers(0, 2**16)), _bits(draw, dtype, shape, edge)))
    return tuple(out)


def _nests(names: list[str], sep: str, empty: list[str] = ()) -> bool:
    try:
        nesting.check(names, sep, empty)
    except nesting.NestingError:
        return False
    return True


@st.composite
def mesh_of(draw, world: int) -> Mesh:
    return Mesh(draw(st.sampled_from(factorizations(world))))


def _json(layouts: dict[str, TensorLayout]) -> dict[str, dict]:
    return {name: lay.to_json() for name, lay in sorted(layouts.items())}


@st.composite
def _layouts_for(draw, tensors: tuple[TensorCase, ...], mesh: Mesh, caps: Caps,
                 allow_flat: bool | None = None) -> dict[str, dict]:
    """A layout per tensor within what the SUT holds (``allow_flat`` None: flattened where it claims "flat")."""
    allow_flat = "flat" in caps.caps if allow_flat is None else allow_flat
    if caps.replicated_only:
        return _json({t.name: replicated(mesh) for t in tensors})
    fake = {t.name: t.build() for t in tensors}
    if allow_flat:
        return _json(draw(state_layouts(fake, mesh)))
    return _json({n: draw(sharded_layouts(mesh, len(t.shape))) for n, t in fake.items()})


def _save_load(version: int = 0, name: str = "step-1", use_async: bool = False, mutate: bool = False):
    return (Op("save", name, version, use_async, mutate), Op("load", name, version))


@st.composite
def cases(draw, prop: str, sut: str, ranks: int, capabilities: Iterable[str] = ()) -> Case:
    """One case for ``prop``: saves run on ``ranks`` ranks; loads reshard onto 1..ranks ranks if the SUT can."""
    caps = Caps(capabilities)
    opts = draw(options(caps))
    save_mesh = draw(mesh_of(ranks))
    load_mesh = draw(mesh_of(draw(load_world_of(caps, opts, ranks)))) if caps.reshard else save_mesh
    seed = draw(st.integers(0, 2**16))
    flat_ok = "flat" in caps.caps

    def same_or_other(tensors, allow_flat=flat_ok):
        save = draw(_layouts_for(tensors, save_mesh, caps, allow_flat))
        return save, (draw(_layouts_for(tensors, load_mesh, caps, allow_flat)) if caps.reshard else save)

    if prop == "P-MOE":
        return draw(_moe_case(sut, ranks, caps, seed, opts))
    tensors = draw(tensor_cases(caps, edge=prop == "P-EDGE", min_tensors=0 if prop == "P-EDGE" else 1, opts=opts))
    if prop == "P-ROUNDTRIP":
        layout = draw(_layouts_for(tensors, save_mesh, caps))
        return Case(prop, sut, tensors, layout, layout, _save_load(), opts, seed)
    if prop in ("P-RESHARD", "P-COVER", "P-EDGE", "P-DIFF"):
        save, load = same_or_other(tensors)
        return Case(prop, sut, tensors, save, load, _save_load(), opts, seed)
    if prop == "P-FLAT":
        group = [(t.name, t.shape) for t in tensors]
        align = draw(st.sampled_from((1, 2, 4)))

        def flat(mesh: Mesh) -> dict[str, dict]:
            return _json(flat_group(mesh, draw(st.integers(0, len(mesh.shape) - 1)), group, align))

        if not caps.reshard:  # flattened slices round-trip in place
            save = flat(save_mesh)
            load = save
        elif draw(st.booleans()):  # flattened -> unflattened
            save, load = flat(save_mesh), draw(_layouts_for(tensors, load_mesh, caps, allow_flat=False))
        else:  # unflattened -> flattened
            save, load = draw(_layouts_for(tensors, save_mesh, caps, allow_flat=False)), flat(load_mesh)
        return Case(prop, sut, tensors, save, load, _save_load(), opts, seed)
    if prop == "P-REPEAT":
        if "same_dir" in caps.caps:  # versions of one directory: the SUT's own notion of "latest"
            opts = in_same_dir(opts)
        layout = draw(_layouts_for(tensors, save_mesh, caps))
        versions = draw(st.integers(2, MAX_VERSIONS))
        ops = [Op("save", f"step-{v}", v) for v in range(versions)]
        # Every version by name and the newest as the SUT resolves it, in a drawn order: a by-name load that comes
        # first shows what a resolver gives on its own, before any load could have cached the newest.
        loads = [Op("load", f"step-{v}", v) for v in range(versions)]
        loads.append(Op("load", None if caps.latest else f"step-{versions - 1}", versions - 1))
        ops += draw(st.permutations(loads))
        return Case(prop, sut, tensors, layout, layout, tuple(ops), opts, seed)
    if prop == "P-ASYNC-ISOLATION":
        save, load = same_or_other(tensors)
        ops = (*_save_load(use_async=True, mutate=True), Op("save", "step-2", 1, True, True), Op("load", "step-2", 1))
        return Case(prop, sut, tensors, save, load, ops, opts, seed)
    raise ValueError(f"no case strategy for property {prop!r}")


@st.composite
def ep_meshes(draw, world: int) -> Mesh:
    """A (dp, ep) mesh of ``world`` ranks, with any EP degree that divides it."""
    ep = draw(st.sampled_from([d for d in range(1, world + 1) if world % d == 0]))
    return Mesh((world // ep, ep), ("dp", "ep"))


@st.composite
def _moe_case(draw, sut: str, ranks: int, caps: Caps, seed: int, opts: dict) -> Case:
    """Experts on a (dp, ep) mesh of ``ranks`` ranks, loaded on another EP degree (global ids must hold)."""

    save_mesh = draw(ep_meshes(ranks))
    load_mesh = draw(ep_meshes(draw(load_world_of(caps, opts, ranks)))) if caps.reshard else save_mesh
    lcm = save_mesh.shape[1] * load_mesh.shape[1]
    experts = lcm * draw(st.integers(1, 2))
    encoding = draw(st.sampled_from(("stacked", "keyed")))
    dtype = draw(st.sampled_from(caps.dtypes))
    inner = draw(st.lists(st.integers(1, 3), min_size=0, max_size=3).map(tuple))  # stacked experts up to 4-d

    save, load = (expert_layouts(m, "ep", experts, "model/moe", "w1", stacked=encoding == "stacked")
                  for m in (save_mesh, load_mesh))
    shape = (experts, *inner) if encoding == "stacked" else inner
    tensors = tuple(TensorCase(n, dtype, shape, seed + i) for i, n in enumerate(sorted(save)))
    return Case(
        "P-MOE",
        sut,
        tensors,
        _json(save),
        _json(load),
        _save_load(),
        {**opts, "experts": experts, "encoding": encoding},
        seed,
    )
