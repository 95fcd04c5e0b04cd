"""Training cases (P-EMA, P-RESUME, and P-COVER over DP-MoE): the miniature loop of reference.training on drawn
parameters, layouts, hyper-parameters and crash scenarios.

Each parameter's families (model, master, moments, EMA) share one layout — sharded, replicated, flattened
(ZeRO-3/FSDP style) or an expert's on a (dp, ep) mesh — because the loop updates, without collectives, exactly the
elements a rank holds. RNG and step are replicated. The load side may use another world size and other degrees.
Everything shrinks towards one small parameter, one step, no crash.
"""

from __future__ import annotations

from collections.abc import Iterable

from hypothesis import strategies as st

from properties.generate.cases import Caps, ep_meshes, load_world_of, mesh_of, options
from properties.generate.fault_cases import faults, has_latest
from properties.generate.layouts import shapes, sharded_layouts
from properties.model.case import Case, Op, TensorCase
from reference.layout import Mesh, TensorLayout, flat_group, replicated
from reference.moe import expert_layouts
from reference.namespaces import NAMESPACES, STEP_KEY
from reference.training import PARAM_DTYPES, RNG_KEY, TrainingSpec, family_keys

DENSE = ("w", "b", "emb", "layers.0.qkv")
SCENARIOS = ("in-place", "restart", "async-restart", "fault")
FAMILIES = (*NAMESPACES, "meta")


def trainable(capabilities: Iterable[str]) -> bool:
    """A SUT can hold a training state if it stores FP32 and I64 (master weights, RNG, step) and some parameter
    dtype; a SUT that declares no dtypes is taken at its word for all."""
    caps = Caps(capabilities)
    return {"F32", "I64"} <= set(caps.dtypes) and bool(set(caps.dtypes) & set(PARAM_DTYPES))


@st.composite
def specs(draw) -> dict:
    """Hyper-parameters: the defaults first (shrinking ends there), then edge values (zero decay, β1 = 0, EMA
    every few steps, thresholds that skip some updates)."""
    return {
        "lr": draw(st.sampled_from((0.01, 0.1, 0.001))),
        "beta1": draw(st.sampled_from((0.9, 0.0, 0.5))),
        "beta2": draw(st.sampled_from((0.999, 0.95))),
        "eps": draw(st.sampled_from((1e-8, 1e-6))),
        "weight_decay": draw(st.sampled_from((0.0, 0.01))),
        "ema_every": draw(st.integers(1, 3)),
        "ema_decay": draw(st.sampled_from((0.9, 0.0, 0.5, 0.999))),
        "loss_threshold": draw(st.sampled_from((None, 1.0, 0.5, 1.5))),
        "seed": draw(st.integers(0, 2**16)),
    }


@st.composite
def _dense_params(draw, caps: Caps, min_params: int = 1) -> tuple[TensorCase, ...]:
    dtypes = [d for d in caps.dtypes if d in PARAM_DTYPES]
    names = draw(st.lists(st.sampled_from(DENSE), min_size=min_params, max_size=3, unique=True))
    return tuple(
        TensorCase(name, draw(st.sampled_from(dtypes)),
                   draw(shapes(max_side=5).filter(lambda s: caps.zero_size or 0 not in s)),
                   draw(st.integers(0, 2**16)))
        for name in names
    )


@st.composite
def _dense_layouts(draw, params: tuple[TensorCase, ...], mesh: Mesh, flat_ok: bool) -> dict[str, TensorLayout]:
    """One layout per parameter: DTensor placements, or a place in one flattened buffer."""
    out: dict[str, TensorLayout] = {}
    flat = [p for p in params if flat_ok and draw(st.booleans())]
    for p in params:
        if p not in flat:
            out[p.name] = draw(sharded_layouts(mesh, len(p.shape)))
    if flat:
        dim = draw(st.integers(0, len(mesh.shape) - 1))
        out.update(flat_group(mesh, dim, [(p.name, p.shape) for p in flat], align=draw(st.sampled_from((1, 2, 4)))))
    return out


def _state_layouts(params: dict[str, TensorLayout], mesh: Mesh) -> dict[str, dict]:
    """Every family of a parameter under the parameter's layout; RNG and step replicated."""
    out = {key: layout.to_json() for name, layout in params.items() for key in family_keys(name).values()}
    out[RNG_KEY] = out[STEP_KEY] = replicated(mesh).to_json()
    return dict(sorted(out.items()))


@st.composite
def _layouts(draw, caps: Caps, ranks: int, moe: bool, opts: dict):
    """(parameters, save layouts, load layouts, save world): dense parameters on any mesh, or DP-MoE on (dp, ep)
    meshes where the experts keep their global ids across EP degrees. A SUT that reshards saves on a world of its
    own too (a job resumed on more ranks than it saved on grows; on fewer, shrinks)."""
    fewer = draw(st.integers(0, ranks - min(caps.min_world, ranks))) if caps.reshard else 0  # shrinks to none
    save_world = ranks - fewer
    load_world = draw(load_world_of(caps, opts, ranks)) if caps.reshard else ranks
    flat_ok = "flat" in caps.caps
    dense = draw(_dense_params(caps, min_params=0 if moe else 1))
    if not moe:
        save_mesh = draw(mesh_of(save_world))
        load_mesh = draw(mesh_of(load_world)) if caps.reshard else save_mesh
        if caps.replicated_only:  # whole on every rank (data parallel)
            save = {p.name: replicated(save_mesh) for p in dense}
            load = {p.name: replicated(load_mesh) for p in dense}
        else:
            save = draw(_dense_layouts(dense, save_mesh, flat_ok))
            load = draw(_dense_layouts(dense, load_mesh, flat_ok)) if caps.reshard else save
        return dense, _state_layouts(save, save_mesh), _state_layouts(load, load_mesh), save_world

    save_mesh = draw(ep_meshes(save_world))
    # "ep_change": the load may run on another EP degree of the same world (a SUT that cannot change world size)
    ep_change = caps.reshard or "ep_change" in caps.caps
    load_mesh = draw(ep_meshes(load_world)) if ep_change else save_mesh
    experts = save_mesh.shape[1] * load_mesh.shape[1] * draw(st.integers(1, 2))
    dtype = draw(st.sampled_from([d for d in caps.dtypes if d in PARAM_DTYPES]))
    inner = draw(st.lists(st.integers(1, 3), min_size=0, max_size=2).map(tuple))
    seed = draw(st.integers(0, 2**16))
    stacked = "moe:keyed" not in caps.caps and draw(st.booleans())  # "moe:keyed": one parameter per expert
    save_experts, load_experts = (expert_layouts(m, "ep", experts, "moe", "w1", stacked=stacked)
                                  for m in (save_mesh, load_mesh))
    shape = (experts, *inner) if stacked else inner
    params = dense + tuple(TensorCase(n, dtype, shape, seed + i) for i, n in enumerate(sorted(save_experts)))
    # Dense parameters are replicated over dp and ep (data parallel for them): the coordinator saves them, and
    # ranks with ep > 0 save their experts only.
    save = {p.name: replicated(save_mesh) for p in dense} | save_experts
    load = {p.name: replicated(load_mesh) for p in dense} | load_experts
    return params, _state_layouts(save, save_mesh), _state_layouts(load, load_mesh), save_world


@st.composite
def training_cases(draw, prop: str, sut: str, ranks: int, capabilities: Iterable[str] = (), *,
                   with_faults: bool = False, ptrace: bool = True) -> Case:
    """A P-EMA, P-RESUME or (DP-MoE) P-COVER case. ``with_faults``: P-RESUME may crash a rank or writer in the
    save after the first one (a fault drawn as P-ATOMIC draws it) and resume from whatever loads."""
    caps = Caps(capabilities)
    moe = "moe" in caps.caps and (prop == "P-COVER" or draw(st.booleans()))
    opts = draw(options(caps))
    params, save, load, save_world = draw(_layouts(caps, ranks, moe, opts))
    if "split_families" in caps.caps and draw(st.booleans()):  # one checkpoint per family, a kind for each
        opts["split_families"] = True
        if caps.tensor_kinds:
            opts["tensor_kinds"] = {ns: draw(st.sampled_from(caps.tensor_kinds)) for ns in FAMILIES}
    spec = TrainingSpec.from_json(draw(specs()) | caps.training).to_json()  # every field, as a case file reads
    use_async = "async" in caps.caps and draw(st.booleans())
    s = draw(st.integers(1, 6))
    name = f"step-{s}"
    if prop in ("P-EMA", "P-COVER"):
        if prop == "P-EMA" and draw(st.booleans()):  # restore the EMA on its own, as ZCC reloads its buffer
            load = {k: v for k, v in load.items() if k.startswith("ema/")}
        if prop == "P-COVER":
            load = save
        ops = (Op("train", None, s), Op("save", name, s, use_async), Op("load", name, s))
        return Case(prop, sut, params, save, load, ops, opts, spec["seed"], training=spec)
    if prop != "P-RESUME":
        raise ValueError(f"no training strategy for property {prop!r}")
    n = s + draw(st.integers(0, 5))
    scenarios = [sc for sc in SCENARIOS if sc != "fault" or with_faults]
    scenario = draw(st.sampled_from(scenarios))
    latest = has_latest(caps.caps, opts) and draw(st.booleans())
    fault = None
    if scenario == "in-place":
        ops = (Op("train", None, s), Op("save", name, s, use_async), Op("load", name, s), Op("train", None, n))
    elif scenario == "restart":
        ops = (Op("train", None, s), Op("save", name, s, use_async), Op("restart"),
               Op("load", None if latest else name, s), Op("train", None, n))
    elif scenario == "async-restart" and "async" in caps.caps:
        # Zero-Cost-Checkpointing style: the writer works while training goes on, in place, then the job dies.
        ahead = s + draw(st.integers(1, 3))
        # stall: the writer is held while the job trains on (so a job that does not wait for it races it for
        # sure), and let go once the job waits on it (rankops)
        ops = (Op("train", None, s), Op("save", name, s, True, detach=True, stall=draw(st.booleans())),
               Op("train", None, ahead), Op("wait"), Op("restart"), Op("load", None if latest else name, s),
               Op("train", None, max(n, ahead)))
    else:
        s2 = s + draw(st.integers(1, 3))
        ops = (Op("train", None, s), Op("save", name, s), Op("train", None, s2),
               Op("save", f"step-{s2}", s2, use_async), Op("load", None if latest else name, s2 if latest else s),
               Op("train", None, max(n, s2)))
        if scenario == "fault":
            fault = draw(faults("P-ATOMIC", save_world, use_async, ptrace, op=3))  # a rank of the saving job
    if spec.get("ema_seen") == "saved":  # only a checkpoint shows such an EMA: the resumed job saves one more step
        end = ops[-1].version + 1
        ops = (*ops, Op("train", None, end), Op("save", f"step-{end}", end), Op("load", f"step-{end}", end))
    return Case(prop, sut, params, save, load, ops, opts, spec["seed"], fault=fault, training=spec)
