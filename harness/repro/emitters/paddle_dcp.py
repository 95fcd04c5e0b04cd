"""Repro scripts for Paddle flex checkpoint (``dist.save_state_dict`` / ``dist.load_state_dict``).

Each rank builds its pieces as the adapter hands them to Paddle (harness/sut/paddle_dcp.py): a ``ShardedWeight``
with explicit offsets (flattened slices included) or a dist tensor built from the local piece with the global shape
given; the script spells out which, from the case's options.
"""

from __future__ import annotations

import re

from harness.repro.emitters import paddle_text
from harness.repro.emitters.nesting_text import NESTING
from harness.repro.render import HOLD_PROCESSES
from harness.repro.scripted_case import ReproUnsupported, ScriptedCase
from harness.sut.paddle_dcp import state_key
from properties.model.case import IDLE_RANK, PROCESS_GROUP, idle_ranks
from reference import aoa

FRAMEWORK = "paddle"
TEXT = paddle_text  # the framework's part of the script (set-up, tensors, launcher)
# Options that only shaped the case's layouts or the harness's own bounds: nothing for the script to do.
INERT = frozenset({"encoding", "experts", "commit_timeout", "op_timeout"})
RENDERED = frozenset({"format", "tensor_kind", "same_dir", "save_replicas", "unique_id", "comm_method", "nested",
                      "empty_dicts", "coordinator_rank", "offload", "mw_names", "load_api", "aoa",
                      "full_param_groups", "full_param_splits", "producer", "parallel_grids"})


def settings(scripted: ScriptedCase) -> str:
    options = scripted.options
    unknown = sorted(set(options) - INERT - RENDERED)
    if options.get(PROCESS_GROUP) in ("world", "subset"):  # the world's: Paddle's default, the script passes none
        unknown = [u for u in unknown if u not in (PROCESS_GROUP, IDLE_RANK)]
    if unknown:
        raise ReproUnsupported(f"option(s) {unknown} (the script does not render them yet)")
    kind = options.get("tensor_kind", "sharded_weight")
    if kind not in ("sharded_weight", "dist_from_local"):
        raise ReproUnsupported(f"tensor_kind {kind!r}")
    return (f"SAFETENSORS = {options.get('format') == 'safetensors'}  # the format= of the checkpoint\n"
            f"DIST_TENSORS = {kind == 'dist_from_local'}  # pieces as dist tensors (else as ShardedWeight)\n"
            f"SAME_DIR = {bool(options.get('same_dir', False))}  # every name a version (unique_id) of one directory\n"
            f"SAVE_REPLICAS = {bool(options.get('save_replicas', False))}\n"
            f"UNIQUE_ID = {options.get('unique_id')!r}\n"
            f"COMM_METHOD = {options.get('comm_method', 'broadcast')!r}\n"
            + (f"NESTED = {options['nested']!r}  # a name's parts at this separator are nested dict keys\n"
               f"EMPTY_DICTS = {list(options.get('empty_dicts', ()))!r}  # sub-dicts with nothing in them\n"
               if options.get("nested") else "")
            + (f"PARALLEL_GRIDS = {options.get('parallel_grids', 1)!r}  # parallel_broadcast's grids of groups\n"
               if options.get("comm_method") == "parallel_broadcast" else "")
            + (f"COORDINATOR_RANK = {options['coordinator_rank']!r}  # of both calls; negative: from the group's end\n"
               if "coordinator_rank" in options else "")
            + (f"IDLE_RANK = {options.get(IDLE_RANK, -1)!r}  # the launch's rank (negative: from its end) that "
               "takes no part;\n# the others are the process group of both calls\n" if idle_ranks(options) else "")
            + (f"OFFLOAD = {bool(options['offload'])}  # load_state_dict(offload=)\n" if "offload" in options else "")
            + (f"MW_NAME_COMPATIBILITY = {options['mw_names'] != 'off'}\n" if "mw_names" in options else "")
            + (f"KEYS = {_renamed(scripted)!r}  # per side, a piece's state dict key where it is not its name\n"
               if _renamed(scripted) else "")
            + (f"STORED = {_stored(scripted)!r}  # each piece's key in the checkpoint (load_merged_state_dict's)\n"
               if _merged(scripted) else "")
            + (f"AOA_CONFIG = {_aoa_config(scripted)!r}  # the checkpoint is in another model's structure\n"
               if aoa.AOA in options else "")
            + (f"PRODUCER = {scripted.options['producer']!r}  # the state is what Paddle's layers and AdamW give "
               "under this parallelism\n" if scripted.options.get("producer") else "")
            + (f"FULL_PARAM_GROUPS = {options.get('full_param_groups', 'world')!r}  # one group, or \"hv\"\n"
               f"FULL_PARAM_SPLITS = {options.get('full_param_splits', 1)!r}  # full_param(num_splits=)\n"
               if _full_param(scripted) else ""))


def _aoa_config(scripted: ScriptedCase) -> dict:
    """The loads' aoa_config: the statements that map the stored structure back (reference.aoa)."""
    dtypes = {n: p.dtype for (which, _), table in scripted.tables.items() if not which.endswith(":stored")
              for pieces in table.values() for n, p in pieces.items()}
    return {"aoa_statements": aoa.statements(scripted.options[aoa.AOA],
                                             lambda n: state_key(n, scripted.options, "load"), dtypes)}


def _merged(scripted: ScriptedCase) -> bool:
    return scripted.options.get("load_api") == "load_merged_state_dict"


def _full_param(scripted: ScriptedCase) -> bool:
    return scripted.options.get("load_api") == "full_param"


def _names(scripted: ScriptedCase) -> list[str]:
    return sorted({n for table in scripted.tables.values() for pieces in table.values() for n in pieces})


def _stored(scripted: ScriptedCase) -> dict[str, str]:
    return {n: state_key(n, scripted.options, "save") for n in _names(scripted)}


def _renamed(scripted: ScriptedCase) -> dict[str, dict[str, str]]:
    """The keys a side's state dict gives a piece other than its name (harness.sut.paddle_dcp.state_key)."""
    out = {side: {n: state_key(n, scripted.options, side) for n in _names(scripted)} for side in ("save", "load")}
    out = {side: {n: k for n, k in keys.items() if k != n} for side, keys in out.items()}
    return out if any(out.values()) else {}


def _call_arguments(scripted: ScriptedCase, load: bool) -> str:
    """The keyword arguments of a save or load call the case sets beyond the script's fixed ones."""
    options, out = scripted.options, []
    if "coordinator_rank" in options:
        out.append("coordinator_rank=COORDINATOR_RANK % len(members)" if idle_ranks(options)
                   else "coordinator_rank=COORDINATOR_RANK % dist.get_world_size()")
    if idle_ranks(options):
        out.append("process_group=group")
    if load and "offload" in options:  # (load_merged_state_dict takes only this one of them)
        out.append("offload=OFFLOAD")
    if load and "mw_names" in options:
        out.append("mw_name_compatibility=MW_NAME_COMPATIBILITY")
    if load and aoa.AOA in options:
        out.append("aoa_config=AOA_CONFIG")
    return "".join(f", {a}" for a in out)


def helpers(scripted: ScriptedCase) -> str:
    """The script's functions, leaving out the branches this case never takes."""
    grid = scripted.options.get("comm_method") == "parallel_broadcast"
    blocks = [LOCATION, *([GRID] if grid or _full_param(scripted) else []),
              WORKER_GROUPS_GRID if grid else WORKER_GROUPS, ENTRY_HEAD]
    if scripted.has_flat():
        blocks.append(ENTRY_FLAT)
    blocks.append(ENTRY_DIST if scripted.options.get("tensor_kind") == "dist_from_local" else ENTRY_SHARDED)
    nested = bool(scripted.options.get("nested"))
    blocks.append(NESTING if nested else KEY_RENAMED if _renamed(scripted) else KEY)
    blocks.append(STATE_DICT_NESTED if nested else PRODUCED if scripted.options.get("producer") else STATE_DICT)
    blocks.append(SAVE_ASYNC if scripted.uses("use_async") else SAVE)
    blocks.append(LOAD_MERGED if _merged(scripted) else LOAD_NESTED if nested else LOAD_PRODUCED
                  if scripted.options.get("producer") else LOAD)
    if scripted.options.get("load_api") == "merge_sharded_state_dict":  # the load reads the merge's output
        blocks[-1] = MERGE + blocks[-1].replace('side="load"', 'side="save"').replace(
            'key(n, "load")', 'key(n, "save")').replace("location(name)", "merged(name)").replace(
            "safetensors=SAFETENSORS,", "safetensors=True,")
    if idle_ranks(scripted.options):  # the calls run on a group of all ranks but one, and on it alone
        blocks = [OWN_GROUP, *blocks[:-2], *(_on_own_group(b) for b in blocks[-2:])]
        # a dist tensor's mesh names the processes that hold it: the layouts' rank r is the group's r-th member
        blocks = [b.replace("ids = np.arange(int(np.prod(p.mesh))).reshape(p.mesh)",
                            "ids = np.asarray(own_group()[1])[np.arange(int(np.prod(p.mesh)))].reshape(p.mesh)")
                  for b in blocks]
    if _full_param(scripted):  # the load above gives the pieces full_param assembles
        blocks[-1] = blocks[-1].replace("def load(", "def load_pieces(") + "\n\n" + FULL_PARAM.replace(
            "FULL_PARAM_KEY", '".".join(n.split(NESTED))' if nested else 'key(n, "load")')
    return "".join(blocks).replace("SAVE_ARGUMENTS", _call_arguments(scripted, load=False)).replace(
        "LOAD_ARGUMENTS", _call_arguments(scripted, load=True)).replace(
        "MERGED_ARGUMENTS", ", offload=OFFLOAD" if "offload" in scripted.options else "")


def _on_own_group(block: str) -> str:
    """A save or load helper whose call runs on own_group()'s group, the idle rank calling nothing, and that must
    communicate over the world's group not at all."""
    block = re.sub(r"(def (?:save|load)\(name, pieces[^\n]*\):\n)", r"\1" + ON_OWN_GROUP, block, count=1)
    for call in ("save_state_dict", "load_state_dict"):
        block = block.replace(f"    dist.{call}(", f"    used = world_group_use()\n    dist.{call}(")
    for arguments, call in (("SAVE_ARGUMENTS)\n", "save_state_dict"), ("LOAD_ARGUMENTS)\n", "load_state_dict")):
        block = block.replace(arguments, f"{arguments}    check_own_group({call!r}, members, used)\n")
    return block


ON_OWN_GROUP = '''    group, members = own_group()
    if RANK not in members:  # the idle rank holds nothing and calls nothing
        return {}
'''

OWN_GROUP = '''import atexit  # noqa: E402


def own_group():
    """(the calls' process group, its ranks): every rank of the launch but IDLE_RANK. Every rank makes it, the idle
    one too, as new_group requires; once per launch."""
    if not GROUP:
        size = dist.get_world_size()
        members = [r for r in range(size) if r != IDLE_RANK % size]
        GROUP.extend([dist.new_group(members), members])
        atexit.register(leave_together)
    return GROUP[0], GROUP[1]


def leave_together():
    """The launch's ranks exit together (bounded): the idle rank may host the job's TCP store, which the members
    need until their last call has returned."""
    import time

    mark = lambda rank: f"{ROOT}.left-{PHASE}-{rank}"  # noqa: E731
    open(mark(RANK), "w").close()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not all(os.path.exists(mark(r)) for r in range(dist.get_world_size())):
        time.sleep(0.1)


GROUP = []


class Recording:
    """Stands in for the world group's ProcessGroup during a call given a group of its own: forwards everything,
    notes each communicating method called."""

    def __init__(self, real, used):
        self._real, self._used = real, used

    def __getattr__(self, name):
        value = getattr(self._real, name)
        if name in ("name", "rank", "size") or name.startswith("_") or not callable(value):
            return value

        def recorded(*args, **kwargs):
            self._used.append(name)
            return value(*args, **kwargs)

        return recorded


def world_group_use():
    """Start noting the operations made over the world's process group; check_own_group ends it."""
    from paddle.distributed.communication.group import _get_global_group

    world, used = _get_global_group(), []
    world._pg = Recording(world._pg, used)
    return used


def check_own_group(call, members, used):
    """The call was given the group of ``members``: it must not have communicated over the world's group, in which
    the ranks outside its group take no part (on gloo the world group's tag counters then part)."""
    from paddle.distributed.communication.group import _get_global_group

    world = _get_global_group()
    world._pg = world._pg._real
    if used:
        raise Failed(f"{call}(process_group=<ranks {members}>) communicated over the world's process group "
                     f"({', '.join(sorted(set(used)))}), in which the ranks outside its group take no part")


'''

LOCATION = '''def location(name):
    """(directory, unique_id) of a checkpoint name: its own directory, or a version of the shared one."""
    if name is None:
        return os.path.join(ROOT, "dcp"), None  # the newest version
    if SAME_DIR:
        return os.path.join(ROOT, "dcp"), int(name.rsplit("-", 1)[-1])
    return os.path.join(ROOT, name), UNIQUE_ID


'''

GRID = '''def grid_groups(count=1):
    """The rank's row (horizontal group) and column (vertical group) of its grid: the world in ``count`` equal
    blocks of consecutive ranks, each in rows of its largest proper divisor (the whole block when its size is
    prime); with several grids, its parallel group too: the ranks at its place in every block. Every rank makes
    every group, in one order, as new_group requires."""
    size, rank = dist.get_world_size(), dist.get_rank()
    block = size // count
    row = max([d for d in range(2, block) if block % d == 0], default=block)
    rows = [list(range(start, start + row)) for start in range(0, size, row)]
    columns = [[start + r + i for r in range(0, block, row)] for start in range(0, size, block) for i in range(row)]
    parallel = [list(range(place, size, block)) for place in range(block)] if count > 1 else []
    groups = {tuple(g): dist.new_group(g) for g in rows + columns + parallel}
    mine = {"h_group": rows[rank // row], "v_group": next(c for c in columns if rank in c)}
    if parallel:
        mine["p_group"] = parallel[rank % block]
    return {name: groups[tuple(ranks)] for name, ranks in mine.items()}


'''

WORKER_GROUPS_GRID = '''def worker_groups():
    """parallel_broadcast's horizontal, vertical and parallel groups: the rank's row and column of its grid among
    PARALLEL_GRIDS, and its parallel group across them (none for one grid: the two-dimensional path)."""
    groups = grid_groups(PARALLEL_GRIDS)
    return [groups["h_group"], groups["v_group"], groups.get("p_group")]


'''

WORKER_GROUPS = '''def worker_groups():
    """multi_group_broadcast broadcasts within the groups the caller names: here the world's, the job's one group."""
    if COMM_METHOD != "multi_group_broadcast":
        return None
    from paddle.distributed.communication.group import _get_global_group

    return [_get_global_group()]


'''

ENTRY_HEAD = '''def entry(name, p, t, dist_tensors):
    """What goes in the state dict for this rank's piece ``p``, held in ``t``."""
'''

ENTRY_FLAT = '''    if p.flat is not None:  # flattened; an empty slice is left out, as Paddle's sharding optimizer does
        if p.flat[0] == p.flat[1]:
            return None
        return dist.ShardedWeight(name, t, local_shape=p.global_shape, global_shape=p.global_shape,
                                  global_offset=(0,) * len(p.global_shape), is_flattened=True,
                                  flattened_range=slice(*p.flat))
'''

ENTRY_SHARDED = '''    return dist.ShardedWeight(name, t, p.shape, p.global_shape, p.offsets)


'''

ENTRY_DIST = '''    if not dist_tensors:
        return dist.ShardedWeight(name, t, p.shape, p.global_shape, p.offsets)
    if p.mesh is None:
        return t  # a tensor without a layout: whole, on rank 0
    ids = np.arange(int(np.prod(p.mesh))).reshape(p.mesh)
    for mesh_dim in sorted({d for d, _ in p.owner}):  # pinned to some coordinates (an expert on its EP rank)
        ids = np.take(ids, sorted(i for d, i in p.owner if d == mesh_dim), axis=mesh_dim)
    mesh = dist.ProcessMesh(ids.tolist())
    placements = [dist.Shard(int(s[1:])) if s.startswith("S") else dist.Replicate() for s in p.placements]
    # the global shape is given: dtensor_from_local would infer local x mesh size, wrong for uneven splits
    return paddle.Tensor(t, dims=list(p.global_shape), process_mesh=mesh, placements=placements, place=t.place)


'''

KEY = '''def key(name, side):
    return name


'''

KEY_RENAMED = '''def key(name, side):
    """The state dict key of a piece on the save or load side (a master weight's in that side's naming, an AoA
    identifier), where it is not its name."""
    return KEYS[side].get(name, name)


'''

STATE_DICT = '''def state_dict(pieces, zero=False, side="save"):
    """(state dict, the dense tensors behind it) for this rank; ShardedWeight for all if any piece is flattened."""
    dist_tensors = DIST_TENSORS and not any(p.flat is not None for p in pieces.values())
    state, dense = {}, {}
    for name, p in pieces.items():
        t = tensor(p, zero)
        value = entry(key(name, side), p, t, dist_tensors)
        if value is not None:
            state[key(name, side)], dense[name] = value, t
    return state, dense


'''

STATE_DICT_NESTED = '''def state_dict(pieces, zero=False, side="save"):
    """(nested state dict, the dense tensors behind it) for this rank. A piece's key is its path joined with ".",
    the key a model's sharded_state_dict gives it."""
    dist_tensors = DIST_TENSORS and not any(p.flat is not None for p in pieces.values())
    state, dense = {}, {}
    for name, p in pieces.items():
        t = tensor(p, zero)
        value = entry(".".join(name.split(NESTED)), p, t, dist_tensors)
        if value is not None:
            state[name], dense[name] = value, t
    return nest(state), dense


'''

LOAD_NESTED = '''def load(name, pieces):
    state, dense = state_dict(pieces, zero=True, side="load")
    path, unique_id = location(name)
    dist.load_state_dict(state, path, unique_id=unique_id, safetensors=SAFETENSORS, comm_method=COMM_METHOD,
                         worker_groups=worker_groups()LOAD_ARGUMENTS)
    for empty in EMPTY_DICTS:
        if at(state, empty) != {}:
            raise Failed(f"the load changed the empty sub-dict {empty!r}")
    return {key: getattr(at(state, key), "local_tensor", at(state, key)) for key in dense}
'''

SAVE = '''def save(name, pieces):
    state, _ = state_dict(pieces)
    path, unique_id = location(name)
    dist.save_state_dict(state, path, unique_id=unique_id, safetensors=SAFETENSORS,
                         save_replicas=SAVE_REPLICASSAVE_ARGUMENTS)


'''

SAVE_ASYNC = '''from paddle.distributed.flex_checkpoint.dcp import save_state_dict as save_module  # noqa: E402


def save(name, pieces, async_save=False, mutate_after=False, detach=False):
    state, dense = state_dict(pieces)
    path, unique_id = location(name)
    dist.save_state_dict(state, path, unique_id=unique_id, async_save=async_save, safetensors=SAFETENSORS,
                         save_replicas=SAVE_REPLICASSAVE_ARGUMENTS)
    if async_save:  # Paddle keeps each save's writer process in async_save_queue
        returned(save_module.async_save_queue[-1] if save_module.async_save_queue else None, dense.values(),
                 mutate_after, detach)


def wait():
    """Join every async writer; a writer that failed is an error (Paddle itself only logs it at the next save)."""
    writers, PENDING[:] = list(PENDING), []
    for writer in writers:
        writer.join()
        if writer.exitcode != 0:
            raise Failed(f"the async save's writer process exited with {writer.exitcode}")


'''

LOAD = '''def load(name, pieces):
    state, dense = state_dict(pieces, zero=True, side="load")
    path, unique_id = location(name)
    dist.load_state_dict(state, path, unique_id=unique_id, safetensors=SAFETENSORS, comm_method=COMM_METHOD,
                         worker_groups=worker_groups()LOAD_ARGUMENTS)
    return {n: getattr(state[key(n, "load")], "local_tensor", state[key(n, "load")]) for n in dense}
'''

# a producer's load is read back from the model and optimizer themselves
LOAD_PRODUCED = LOAD.replace("    return {n: getattr(", "    state = sharded_state(*MADE[0])\n    return {n: getattr(")

LOAD_MERGED = '''def load(name, pieces):
    """load_merged_state_dict gives every tensor of the checkpoint whole; this rank's piece is cut from it."""
    path, unique_id = location(name)
    merged = dist.load_merged_state_dict(path, unique_id=unique_id, safetensors=SAFETENSORSMERGED_ARGUMENTS)
    out = {}
    for n, p in pieces.items():
        whole = merged[STORED[n]]
        if p.flat is not None:
            out[n] = whole.flatten()[p.flat[0]:p.flat[1]]
        elif p.shape:
            out[n] = whole[tuple(slice(o, o + s) for o, s in zip(p.offsets, p.shape))]
        else:
            out[n] = whole
    return out
'''

MERGE = '''from paddle.distributed.flex_checkpoint.dcp.load_state_dict import merge_sharded_state_dict  # noqa: E402


def merged(name):
    """merge_sharded_state_dict of the checkpoint into a Hugging Face checkpoint beside it (safetensors files and
    their index, no flex metadata); the load reads that directory, its tensors under their stored keys."""
    path, unique_id = location(name)
    out = path + ".merged" + ("" if unique_id is None else f"-{unique_id}")
    merge_sharded_state_dict(path, out, unique_id=unique_id, safetensors=SAFETENSORSMERGED_ARGUMENTS)
    return out, None


'''

PRODUCED = '''from paddle.distributed import fleet  # noqa: E402
from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer.dygraph_sharding_optimizer import (  # noqa: E402
    DygraphShardingOptimizerV2,
)
from paddle.distributed.fleet.meta_parallel import (  # noqa: E402
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
)
from paddle.distributed.fleet.utils import tensor_fusion_helper  # noqa: E402

FLEET, MADE = [], []
if not paddle.is_compiled_with_cuda():
    # sharding stage 1 V2's fused buffers know a slot alignment only for gpu, npu and xpu: the CPU takes the GPU's
    tensor_fusion_helper.alignment["cpu"] = tensor_fusion_helper.alignment["gpu"]
    tensor_fusion_helper.__current_device_type__ = "cpu"


def model_of(pieces):
    """The model of the layers the pieces belong to, with PRODUCER's parallelism over the whole world (tp: tensor
    parallelism; stage1v2: sharding stage 1 V2), and AdamW (multi_precision) where there is optimizer state."""
    if not FLEET:
        strategy = fleet.DistributedStrategy()
        degree = dist.get_world_size()
        mp, sharding = (degree, 1) if PRODUCER == "tp" else (1, degree)
        strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": mp, "pp_degree": 1, "sharding_degree": sharding}
        fleet.init(is_collective=True, strategy=strategy)
        FLEET.append(True)
    shape = {n.partition("/")[2]: p.global_shape for n, p in pieces.items() if n.startswith("model/")}
    dims = {}
    for param, names in (("emb.weight", ("vocab", "hidden")), ("up.weight", ("hidden", "ffn")),
                         ("down.weight", ("ffn", "hidden")), ("norm.weight", ("hidden",))):
        dims.update(zip(names, shape.get(param, ())))
    model = paddle.nn.Layer()
    if "emb.weight" in shape:
        model.emb = VocabParallelEmbedding(dims["vocab"], dims["hidden"])
    if "up.weight" in shape:
        model.up = ColumnParallelLinear(dims["hidden"], dims["ffn"], has_bias=True, gather_output=False)
    if "down.weight" in shape:
        model.down = RowParallelLinear(dims["ffn"], dims["hidden"], has_bias=True, input_is_parallel=True)
    if "norm.weight" in shape:
        model.norm = paddle.nn.LayerNorm(dims["hidden"])
    if any(p.dtype == "BF16" for p in pieces.values()):
        model.to(dtype="bfloat16")
    if not any(n.startswith("optimizer/") for n in pieces):
        return model, None
    opt = paddle.optimizer.AdamW(parameters=model.parameters(), multi_precision=True)
    block = paddle.static.default_main_program().global_block()
    # its state exists once a first step makes it; CPU Paddle has no bfloat16 adamw kernel to step with
    if PRODUCER == "tp":
        opt._create_accumulators(block, model.parameters())
        return model, opt
    sharded = DygraphShardingOptimizerV2(opt, fleet.get_hybrid_communicate_group())
    # as a step does: each parameter's slice is this rank's part of the fused buffer, and those with one get state
    slices = []
    for buffer in sharded._comm_buffer_list:
        for param, view in buffer._sharding_param_grad_view.items():
            if view.has_effective_slice_param:
                view.fill_slice_param(sharded._slice_params[param])
                slices.append(sharded._slice_params[param])
    opt._create_accumulators(block, slices)
    return model, sharded


def sharded_state(model, opt):
    """The model's and optimizer's sharded state as Paddle gives it now."""
    state = dict(model.sharded_state_dict())
    if opt is not None:
        state.update(opt.sharded_state_dict(model.sharded_state_dict()))
    return state


def state_dict(pieces, zero=False, side="save"):
    """The model's and optimizer's sharded state as Paddle gives it, each piece where the producer puts this
    rank's; for a save it then holds the case's bits. A rank's empty part of a flattened tensor has no entry."""
    MADE[:] = [model_of(pieces)]
    state = sharded_state(*MADE[0])
    dense = {}
    for name, p in pieces.items():
        if p.flat is not None and p.flat[0] == p.flat[1]:
            continue
        sw = state[key(name, side)]
        flat = (int(sw.flattened_range.start), int(sw.flattened_range.stop)) if sw.is_flattened else None
        gave = (tuple(sw.global_shape), tuple(sw.global_offset), tuple(sw.local_shape), flat)
        want = ((tuple(p.global_shape), (0,) * len(p.global_shape), tuple(p.global_shape), tuple(p.flat))
                if p.flat is not None else (tuple(p.global_shape), tuple(p.offsets), tuple(p.shape), None))
        if gave != want:
            raise Failed(f"{key(name, side)}: sharded_state_dict gave (global shape, offset, local shape, flattened "
                         f"range) {gave}, the producer puts {want}")
        if not zero:
            sw.local_tensor.copy_(tensor(p, False), False)
        dense[name] = sw.local_tensor
    return state, dense


'''

FULL_PARAM = '''import hashlib  # noqa: E402

from paddle.distributed.flex_checkpoint.dcp.full_param import full_param  # noqa: E402


def full_param_groups():
    """full_param's groups: the world's as its one process group, or grid_groups()."""
    return {} if FULL_PARAM_GROUPS == "world" else grid_groups()


def load(name, pieces):
    """The load, then full_param over the pieces it gave (as a model's sharded_state_dict gives them), split by
    split as an export bounds its memory: each tensor must come in exactly one split, alike on every rank. This
    rank's piece is cut from it; a flat slice is optimizer state no model hands full_param, read from the load."""
    loaded = load_pieces(name, pieces)
    keys = {n: FULL_PARAM_KEY for n, p in pieces.items() if p.flat is None and n in loaded}
    sharded = {k: dist.ShardedWeight(k, loaded[n], pieces[n].shape, pieces[n].global_shape, pieces[n].offsets)
               for n, k in keys.items()}
    whole, split_of = {}, {}
    for index in range(FULL_PARAM_SPLITS):
        for k, t in full_param(sharded, num_splits=FULL_PARAM_SPLITS, shard_idx=index, **full_param_groups()):
            if k in split_of:
                raise Failed(f"full_param(num_splits={FULL_PARAM_SPLITS}) gave {k!r} in split {split_of[k]} and "
                             f"again in split {index}")
            split_of[k], whole[k] = index, t
    missing = sorted(set(sharded) - set(whole))
    if missing:
        raise Failed(f"full_param(num_splits={FULL_PARAM_SPLITS}) never gave {missing}")
    if dist.get_world_size() > 1:
        mine = {k: hashlib.sha256(str(t.dtype).encode() + t.numpy().tobytes()).hexdigest() for k, t in whole.items()}
        every = []
        dist.all_gather_object(every, mine)
        differ = sorted(k for k in mine if any(theirs.get(k) != mine[k] for theirs in every))
        if differ:
            raise Failed(f"full_param gave the ranks different bits of {differ}")
    out = dict(loaded)
    for n, k in keys.items():
        p = pieces[n]
        out[n] = whole[k][tuple(slice(o, o + s) for o, s in zip(p.offsets, p.shape))] if p.shape else whole[k]
    return out
'''

CHECK_RECORDED = '''import glob  # noqa: E402
import pickle  # noqa: E402


def check_recorded(name):
    """The metadata the save wrote must tile each tensor exactly once: every recorded piece inside the tensor's
    shape, every element in one piece (declared extra replicas aside). Rank 0 reads it once every rank has saved."""
    if dist.is_initialized():
        dist.barrier()
    path, unique_id = location(name)
    numbered = [f for f in glob.glob(os.path.join(path, "*.metadata")) if os.path.basename(f).split(".")[0].isdigit()]
    if RANK != 0 or not numbered:
        return
    newest = max(numbered, key=lambda f: int(os.path.basename(f).split(".")[0]))
    with open(newest if unique_id is None else os.path.join(path, f"{unique_id}.metadata"), "rb") as f:
        meta = pickle.load(f)
    shapes = {key: tuple(metas[0].global_shape) for key, metas in meta.state_dict_metadata.items() if metas}
    count = {key: np.zeros(shape, np.int64) for key, shape in shapes.items()}
    for index in meta.storage_metadata:
        if index.replica_id not in (None, 0):
            continue
        key, offset, local = index.tensor_key, tuple(index.global_offset), tuple(index.local_shape or ())
        if any(o < 0 or o + n > g for o, n, g in zip(offset, local, shapes[key])):
            raise Failed(f"{key}: a recorded piece at offset {list(offset)} of shape {list(local)} runs past the "
                         f"tensor's shape {list(shapes[key])}")
        piece = np.ones(local, np.int64)
        if index.is_flattened:  # only its [start, stop) of the box's row-major elements
            piece = np.zeros(int(np.prod(local)), np.int64)
            piece[index.flattened_range] = 1
            piece = piece.reshape(local)
        count[key][tuple(slice(o, o + n) for o, n in zip(offset, local))] += piece
    for key, times in count.items():
        if times.size and not (times == 1).all():
            raise Failed(f"{key}: the recorded pieces cover its elements {sorted(set(times.ravel().tolist()))} "
                         "times, not once each")


'''


HOLD = HOLD_PROCESSES  # Paddle's async writer is a spawned process: the script stops it as the harness does
