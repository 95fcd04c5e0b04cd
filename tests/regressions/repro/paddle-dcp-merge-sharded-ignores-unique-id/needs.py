"""paddle-dcp: silent-corruption in P-REPEAT (paddle-dcp-merge-sharded-ignores-unique-id)

Known bugs' fixes (paddle-dcp-latest-unique-id, paddle-dcp-version-cache-key) this finding shows only behind,
written by ckpt-harness: repro.py calls ``apply()`` in every process before its first step, since on stock code the
run stops at a known bug first. needs.diff is the same change as a patch of the framework's source."""

import __future__

import ast
import contextlib
import hashlib
import importlib
import inspect
import linecache
import sys
import textwrap
import types
from collections.abc import Callable, Iterator

EDITS_ATTR = "__ckpt_fixes__"  # on a patched function: ((fix id, edits), ...) in the order they were applied
ORIGINAL_ATTR = "__ckpt_original__"  # ... and the framework's own function it replaces


def source_digest(text: str) -> str:
    """The first 16 hex digits of the sha256 of a function's source, as ``inspect.getsource`` gives it."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def target(module: str, qualname: str) -> tuple[object, str, Callable]:
    """Where the function is bound in its own module (the module or the class), its name, and the function (a
    static method's own function: rebinding keeps it static)."""
    owner: object = importlib.import_module(module)
    *path, name = qualname.split(".")
    for part in path:
        owner = getattr(owner, part)
    func = inspect.getattr_static(owner, name)
    return owner, name, func.__func__ if isinstance(func, staticmethod) else func


def compiled(original: Callable, source: str, owner: object, filename: str, lines: list | None = None) -> Callable:
    """``source`` (the function's whole text) compiled in ``original``'s module globals, so it sees what the original
    sees. A method calling super() closes over its class: it is compiled inside a function that binds ``__class__``
    to ``owner``. It is compiled under the original's own ``__future__`` annotations, so annotations the module leaves
    unevaluated stay so. ``filename`` names it in tracebacks, which show its lines; with ``lines`` (the line of
    ``filename`` each line of ``source`` stands for), ``filename`` is the original's own file and the code reports
    those lines, so a line tracer (coverage) counts the patched function's run toward the framework's file."""
    inner = inspect.unwrap(original)  # a decorated function: its decorators are in ``source`` and apply again
    body = textwrap.indent(textwrap.dedent(source), "    ")
    factory = f"def __ckpt_factory__(__class__):\n{body}    return {inner.__name__}\n"
    tree = ast.parse(factory, filename)
    if lines:  # the factory's line n + 2 is the source's line n (from 0); its own two lines stand for the first
        def line(n: int) -> int:
            return lines[min(max(n - 2, 0), len(lines) - 1)]

        for node in ast.walk(tree):
            if getattr(node, "lineno", None) is None:
                continue
            node.lineno = line(node.lineno)
            if getattr(node, "end_lineno", None) is not None:  # an edit may fold a node's span onto one line
                node.end_lineno = max(line(node.end_lineno), node.lineno)
                if node.end_lineno == node.lineno and node.end_col_offset is not None:
                    node.end_col_offset = max(node.end_col_offset, node.col_offset)
    else:
        linecache.cache[filename] = (len(factory), None, factory.splitlines(True), filename)
    namespace: dict = {}
    lazy = inner.__code__.co_flags & __future__.annotations.compiler_flag
    exec(compile(tree, filename, "exec", flags=lazy, dont_inherit=True), inner.__globals__, namespace)
    func = namespace["__ckpt_factory__"](owner)
    func.__qualname__, func.__module__ = original.__qualname__, original.__module__
    return func


_pending: list | None = None  # inside batched(): the (old, new) pairs still to be bound beyond their owners


@contextlib.contextmanager
def batched() -> Iterator[None]:
    """Rebinds made inside take effect where each function is defined at once, and everywhere else in one scan of
    the loaded modules when the outermost block ends: with a framework loaded a scan costs tens of milliseconds,
    and a rank applies dozens of fixes."""
    global _pending
    if _pending is not None:
        yield
        return
    _pending = []
    try:
        yield
    finally:
        pending, _pending = _pending, None
        _rebind_all(pending)


def rebind(old: Callable, new: Callable, owner: object = None, name: str = "") -> None:
    """Every module attribute and class attribute that is ``old`` becomes ``new``; inside ``batched()``, where
    ``owner`` (the module or class defining it) holds it as ``name`` at once, and elsewhere when the block ends."""
    if _pending is None or owner is None:
        _rebind_all([(old, new)])
        return
    namespace = vars(owner) if isinstance(owner, types.ModuleType) else _ClassNamespace(owner)
    if _bound(namespace.get(name)) is old:
        _set(namespace, name, new)
    _pending.append((old, new))


def _rebind_all(pairs: list) -> None:
    """One scan binding each ``old`` of ``pairs`` to the last function it was replaced by (a function patched
    twice in a batch goes from the original to the second version)."""
    final: dict[int, Callable] = {}
    for old, new in pairs:  # the pairs hold every old function alive, so ids stay unique meanwhile
        for key, value in final.items():
            if value is old:
                final[key] = new
        final[id(old)] = new
    for namespace in _namespaces():
        for name, value in list(namespace.items()):
            new = final.get(id(_bound(value)))
            if new is not None and new is not _bound(value):
                _set(namespace, name, new)


def _namespaces() -> Iterator[dict]:
    """The dicts of every loaded module and of the classes defined in them."""
    for module in list(sys.modules.values()):
        if not isinstance(module, types.ModuleType):
            continue
        try:
            namespace = vars(module)
        except TypeError:
            continue
        yield namespace
        for value in list(namespace.values()):
            if isinstance(value, type) and getattr(value, "__module__", None) == module.__name__:
                yield _ClassNamespace(value)


class _ClassNamespace(dict):
    """A class's attributes, read as a dict and written through ``setattr`` (a mappingproxy is read-only)."""

    def __init__(self, cls: type) -> None:
        super().__init__(vars(cls))
        self.cls = cls


def _bound(value: object) -> object:
    """The function a name holds: a static method's own function, anything else as it is."""
    return value.__func__ if isinstance(value, staticmethod) else value


def _set(namespace: dict, name: str, value: object) -> None:
    if isinstance(namespace, _ClassNamespace):
        held = inspect.getattr_static(namespace.cls, name, None)
        setattr(namespace.cls, name, staticmethod(value) if isinstance(held, staticmethod) else value)
    else:
        namespace[name] = value


# (module, function, sha256[:16] of the source it was written against, the patched function)
PATCHES = [
    ('paddle.distributed.flex_checkpoint.dcp.load_state_dict', 'load_state_dict', '2c141cb8304e3ddd',
     r'''def load_state_dict(
    state_dict: dict[str, Tensor] | dict[str, ShardedWeight],
    path: str,
    process_group: Group | None = None,
    coordinator_rank: int = 0,
    unique_id: int | None = None,
    offload: bool = False,
    mw_name_compatibility: bool = True,
    aoa_config: dict[str, list[str]] | None = None,
    safetensors: bool = False,
    worker_groups: list[Group] | None = None,
    comm_method: str = "broadcast",
) -> None:
    r"""
    Load the state_dict inplace from a checkpoint path.

    Args:
        state_dict(Dict[str, paddle.Tensor]): The state_dict to load. It will be modified inplace after loading.
        path(str): The directory to load checkpoint files.
        process_group(paddle.distributed.collective.Group): ProcessGroup to be used for cross-rank synchronization. Use the default process group which contains all cards.
        coordinator_rank(int): The rank used to coordinate the checkpoint. Rank0 is used by default.
        unique_id(int): The unique id of checkpoint, used to distinguish between different checkpoint versions. Default is None, in which case the id the max id of given path, and the newest version checkpoint is loaded.
        offload(bool): Whether to offload the checkpoint data from GPU to CPU.
        mw_name_compatibility(bool): Enable name compatibility between dynamic and static graph semi-automatic parallel. Default is True.
        aoa_config(dict[str, list[str]]): AOA config to change parameters. Default is None.
        safetensors(bool): Whether to use safetensors format. Default is False.
        worker_groups (list[paddle.distributed.collective.Group]): Communication groups used for tensor communications; if multiple are provided, an appropriate group is chosen; if None, the process_group group is used.
        comm_method (str): Communication method for resharding. Choices are "send_recv", "broadcast", "multi_group_broadcast", and "grouped_send_recv". Default is "broadcast".
    Example:
        .. code-block:: python

            >>> # doctest: +SKIP('run in distributed mode.')
            >>> import paddle
            >>> import paddle.distributed as dist
            >>> ckpt_path = "./checkpoint"
            >>> w1 = paddle.arange(32).reshape([4, 8])
            >>> mesh = dist.ProcessMesh([0, 1])
            >>> sharded_w1 = dist.shard_tensor(w1, mesh, [dist.Shard(0)])
            >>> state_dict = {"w1": sharded_w1}
            >>> dist.save_state_dict(state_dict, ckpt_path)
            >>> w1_to_load = paddle.zeros_like(w1)
            >>> sharded_w1_to_load = dist.shard_tensor(w1, mesh, [dist.Replicate()])
            >>> state_dict_to_load = {"w1": sharded_w1_to_load}
            >>> dist.load_state_dict(state_dict_to_load, ckpt_path)
            >>> print(f"state_dict_to_load:{state_dict_to_load}")
            state_dict_to_load:{'w1': Tensor(shape=[4, 8], dtype=int64, place=Place(gpu:0), stop_gradient=True, dist_attr={process_mesh: {shape: [2], process_ids: [0,1], dim_names: [d0]}, dims_mappings: [-1,-1], batch_dim: 0, dynamic_dims: [0,0], annotated: [dims_mapping: 1,process_mesh: 1], partial: [].}, GlobalDenseTensor=
            [[0 , 1 , 2 , 3 , 4 , 5 , 6 , 7 ],
            [8 , 9 , 10, 11, 12, 13, 14, 15],
            [16, 17, 18, 19, 20, 21, 22, 23],
            [24, 25, 26, 27, 28, 29, 30, 31]])}
            >>> # doctest: -SKIP
    """
    global _metadata_manager
    use_dist = paddle.distributed.get_world_size() > 1

    valid_methods = [
        "send_recv",
        "broadcast",
        "multi_group_broadcast",
        "grouped_send_recv",
        "parallel_broadcast",
    ]
    assert comm_method in valid_methods, (
        f"Invalid communication method '{comm_method}'. "
        f"Please choose from {valid_methods}."
    )

    if use_dist and process_group is None and not is_initialized():
        # Init the default global process group
        paddle.distributed.init_parallel_env()

    if use_dist:
        paddle.distributed.barrier(process_group)

    if unique_id is None:
        unique_id = get_max_id(path)

    if not safetensors and aoa_config is None:
        metadata_files, _ = get_checkpoint_files(path, unique_id=unique_id)
        assert len(metadata_files) == 1, "Only support one metadata file now."
        metadata = paddle.load(os.path.join(path, metadata_files[0]))
        _metadata_manager.set_metadata_list([metadata])
        resumable_locally = check_resumable_locally(
            path, state_dict, _metadata_manager, use_dist, process_group
        )
        if resumable_locally:
            logger.info(
                f"Checkpoint '{path}' resumable locally, skipping reshard."
            )
            local_load_state_dict(
                state_dict=state_dict,
                path=path,
                offload=offload,
                use_dist=use_dist,
            )
            logger.info("Checkpoint successfully loaded locally!")
            _metadata_manager.clear()
            gc.collect()
            return

    if not is_sharded_state_dict(state_dict, use_dist, process_group):
        load_state_dict_impl(
            state_dict=state_dict,
            path=path,
            process_group=process_group,
            coordinator_rank=coordinator_rank,
            unique_id=unique_id,
            offload=offload,
            mw_name_compatibility=mw_name_compatibility,
            safetensors=safetensors,
            worker_groups=worker_groups,
            comm_method=comm_method,
        )
        _metadata_manager.clear()
        gc.collect()
        return

    if not use_dist:
        load_dict = {}
        for key, val in state_dict.items():
            assert val.local_shape == val.global_shape, (
                f"{key} is not replicated!"
            )
            load_dict[key] = val
        destination_state_shard_info = defaultdict(list)
        for key, val in load_dict.items():
            desc = build_shard_desc(val)
            destination_state_shard_info[key].append(desc)
    else:
        flat_shards, nonflat_shards = _split_flat_shards(state_dict)
        load_dict, padding_info = _unflatten_shards(flat_shards, comm_method)
        load_dict.update(nonflat_shards)
        destination_state_shard_info = build_global_state_shard_info(
            state_dict, process_group
        )

    if aoa_config is not None:
        _handle_aoa(
            load_dict,
            destination_state_shard_info,
            path,
            process_group,
            worker_groups,
            coordinator_rank,
            unique_id,
            offload,
            aoa_config,
            safetensors,
            comm_method,
        )
    else:
        load_state_dict_impl(
            state_dict=load_dict,
            path=path,
            process_group=process_group,
            coordinator_rank=coordinator_rank,
            unique_id=unique_id,
            offload=offload,
            mw_name_compatibility=mw_name_compatibility,
            safetensors=safetensors,
            worker_groups=worker_groups,
            comm_method=comm_method,
        )
    if use_dist:
        _finish_unflatten(flat_shards, padding_info)

    _metadata_manager.clear()
    gc.collect()
'''),
    ('paddle.distributed.flex_checkpoint.dcp.load_state_dict', 'get_checkpoint_files', '7cdb355462c7acd3',
     r'''def get_checkpoint_files(
    path, use_cache=True, unique_id=None, process_group=None, safetensors=False
):
    # if unique_id is None, all file ends with .metadata and .distcp is returned
    if unique_id is None:
        unique_id = ''
    global PATH_TO_CHECKPOINT_FILES
    if use_cache and (path, unique_id) in PATH_TO_CHECKPOINT_FILES:
        return PATH_TO_CHECKPOINT_FILES[(path, unique_id)]
    accessible_files = os.listdir(path)
    metadata_files = [
        file
        for file in accessible_files
        if file.endswith(f"{unique_id}.metadata")
    ]

    safetensors_files = [
        file for file in accessible_files if file.endswith(".safetensors")
    ]

    if safetensors and len(metadata_files) == 0:
        logger.info(
            f"Found HuggingFace-format checkpoint with files: {', '.join(safetensors_files)}"
        )
        metadata_files = [
            file
            for file in accessible_files
            if file.endswith(".auto_generated.metadata")
        ]
        if len(metadata_files) == 0:
            logger.info(
                f"No metadata file found in the checkpoint directory: {path}. Creating one now."
            )
            create_hf_ckpt_metadata(path, process_group=process_group)
            accessible_files = os.listdir(path)
            metadata_files = [
                file
                for file in accessible_files
                if file.endswith(".auto_generated.metadata")
            ]
            logger.info(
                f"Created metadata file: {metadata_files[0]} successfully."
            )
        return (metadata_files, safetensors_files)

    assert len(metadata_files) > 0, (
        f"No metadata file ends with '{unique_id}.metadata' found in the checkpoint directory: {path}."
    )
    local_data_files = [
        file
        for file in accessible_files
        if file.endswith(f"{unique_id}.distcp")
        or file.endswith(f"{unique_id}.safetensors")
    ]
    # Check that local_data_files does not contain both .distcp and .safetensors files at the same time
    if any(file.endswith('.distcp') for file in local_data_files) and any(
        file.endswith('.safetensors') for file in local_data_files
    ):
        raise ValueError(
            f"Checkpoint directory cannot contain both .distcp and .safetensors files simultaneously in {path}."
        )

    if use_cache:
        PATH_TO_CHECKPOINT_FILES[(path, unique_id)] = (
            metadata_files,
            local_data_files,
        )
    return (metadata_files, local_data_files)
'''),
]


_APPLIED = []


def apply():
    """Bind every patched function where the framework holds the original (once per process). A stale fix (the
    installed framework's source is not what it was written against) stops the run with status 3 and says so."""
    if _APPLIED:
        return
    for module, qualname, digest, source in PATCHES:
        owner, _, current = target(module, qualname)
        original = getattr(current, ORIGINAL_ATTR, current)  # needs.py may have patched it first
        found = source_digest(inspect.getsource(original))
        if found != digest:
            print(f"STALE FIX: {module}.{qualname} is not the source this fix was written against (sha256 {found}, "
                  f"expected {digest}): the installed framework changed there", flush=True)
            sys.exit(3)
        patched = compiled(original, source, owner, f"<fix.py: {module}.{qualname}>")
        setattr(patched, ORIGINAL_ATTR, original)
        rebind(current, patched)
    _APPLIED.append(True)
