"""paddle-dcp: loud-failure in P-ROUNDTRIP (paddle-dcp-offload-safetensors-bf16)

The candidate fix (paddle-dcp-offload-safetensors-keeps-dtype), written by ckpt-harness: ``bash run.sh --with-fix``
runs the repro with it, repro.py calling ``apply()`` in every process before its first step. fix.diff is the same
change as a patch of the framework's source."""

import __future__

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


def compiled(original: Callable, source: str, owner: object, filename: str) -> Callable:
    """``source`` (the function's whole text) compiled in ``original``'s module globals, so it sees what the original
    sees. A method calling super() closes over its class: it is compiled inside a function that binds ``__class__``
    to ``owner``. It is compiled under the original's own ``__future__`` annotations, so annotations the module leaves
    unevaluated stay so. ``filename`` names it in tracebacks, which show its lines."""
    inner = inspect.unwrap(original)  # a decorated function: its decorators are in ``source`` and apply again
    body = textwrap.indent(textwrap.dedent(source), "    ")
    factory = f"def __ckpt_factory__(__class__):\n{body}    return {inner.__name__}\n"
    linecache.cache[filename] = (len(factory), None, factory.splitlines(True), filename)
    namespace: dict = {}
    lazy = inner.__code__.co_flags & __future__.annotations.compiler_flag
    exec(compile(factory, filename, "exec", flags=lazy, dont_inherit=True), inner.__globals__, namespace)
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
    ('paddle.distributed.flex_checkpoint.dcp.load_state_dict', 'load_state_dict_impl', '6a7a1f9bef96e4c5',
     r'''def load_state_dict_impl(
    state_dict: (
        dict[str, Tensor]
        | dict[str, ShardedWeight]
        | dict[tuple[str, tuple[int, ...]], ShardedWeight]
    ),
    path: str,
    process_group: Group | None = None,
    coordinator_rank: int = 0,
    unique_id: int | None = None,
    offload: bool = False,
    mw_name_compatibility: bool = True,
    safetensors: bool = False,
    worker_groups: list[Group] | None = None,
    comm_method: str = 'broadcast',
) -> None:
    with paddle.base.dygraph.guard():
        global _metadata_manager
        assert isinstance(state_dict, dict), (
            f"The state_dict should be a dictionary.But now the type is {type(state_dict)}."
        )
        first_key = next(iter(state_dict), None)
        if isinstance(first_key, tuple):
            flat_state_dict = state_dict
            mapping = {}
        else:
            flat_state_dict, mapping = flatten_state_dict(state_dict)

        if len(flat_state_dict) > 0:
            for val in flat_state_dict.values():
                assert isinstance(val, (paddle.Tensor, ShardedWeight)), (
                    f"The value of state_dict should be a paddle.Tensor, but got: {val}."
                )

        use_dist = True if paddle.distributed.get_world_size() > 1 else False

        if use_dist:
            # sync to avoid some ranks not write path yet
            paddle.distributed.barrier(process_group)
        if unique_id is None:
            unique_id = get_max_id(path)
        else:
            assert unique_id >= 0, f'{unique_id} should be >= 0'
        logger.info(f"The unique_id:{unique_id} is used.")

        if use_dist:
            check_unique_id(unique_id, process_group)

        metadata_files, local_data_files = get_checkpoint_files(
            path,
            unique_id=unique_id,
            process_group=process_group,
            safetensors=safetensors,
        )

        if _metadata_manager.is_metadata_list_empty():
            metadata_list = []
            for file in metadata_files:
                metadata_list.append(paddle.load(os.path.join(path, file)))
            _metadata_manager.set_metadata_list(metadata_list)

        rank_to_files, missing_keys, mw_name_compatibility_mapping = (
            get_rank_to_files(
                _metadata_manager.get_metadata_list(),
                local_data_files,
                flat_state_dict,
                process_group,
                use_dist,
                mw_name_compatibility,
            )
        )
        if len(missing_keys) > 0:
            logger.warning(
                f"The following keys:{missing_keys} are not found in checkpoint path: {path}."
            )

        cur_rank = paddle.distributed.get_rank()
        global_local_data_files = []
        if use_dist:
            paddle.distributed.all_gather_object(
                global_local_data_files,
                {cur_rank: local_data_files},
                process_group,
            )
        else:
            global_local_data_files = [{cur_rank: local_data_files}]

        rank_to_local_data_files = {}
        for d in global_local_data_files:
            rank_to_local_data_files.update(d)

        local_load_files = get_rank_to_read_files(
            rank_to_files, rank_to_local_data_files
        )

        logger.info(f"Rank {cur_rank}: loading files from {local_load_files}.")

        source_state_dict = {}
        for file in local_load_files:
            if offload:
                state_dict_numpy = paddle.load(
                    os.path.join(path, file),
                    return_numpy=not safetensors,
                    safetensors=safetensors,
                )
                source_state_dict[file] = {
                    key: paddle.to_tensor(value, place=paddle.CPUPlace())
                    for key, value in state_dict_numpy.items()
                }
            else:
                source_state_dict[file] = paddle.load(
                    os.path.join(path, file), safetensors=safetensors
                )

        metadata = _metadata_manager.get_metadata_list()[0]
        storage_metadata = metadata.storage_metadata

        replica_indexes = [
            local_tensor_index
            for local_tensor_index in storage_metadata
            if local_tensor_index.replica_id is not None
            and local_tensor_index.replica_id != 0
        ]

        for local_tensor_index in replica_indexes:
            file_name = storage_metadata[local_tensor_index]
            if file_name in source_state_dict:
                tensor_key = local_tensor_index.tensor_key
                state_dict = source_state_dict[file_name]
                if tensor_key in state_dict:
                    state_dict.pop(tensor_key)

        metadata_copy = deepcopy(metadata)
        storage_metadata_copy = metadata_copy.storage_metadata
        for local_tensor_index in replica_indexes:
            storage_metadata_copy.pop(local_tensor_index)

        new_storage_metadata = {}
        for local_tensor_index, value in storage_metadata_copy.items():
            if local_tensor_index.replica_id == 0:
                local_tensor_index_new = replace(
                    local_tensor_index, replica_id=None
                )
                new_storage_metadata[local_tensor_index_new] = value
            else:
                new_storage_metadata[local_tensor_index] = value

        metadata_copy.storage_metadata = new_storage_metadata

        _metadata_manager.set_metadata_list([metadata_copy])

        if use_dist:
            paddle.distributed.barrier(process_group)

        if _metadata_manager.has_flattened_tensors:
            logger.info("Restoring unflattened state dict.")
            source_state_dict = restore_unflattened_state_dict(
                source_state_dict,
                process_group,
                worker_groups,
                comm_method,
                offload,
            )
            logger.info("Restored unflattened state dict.")

        _load_state_dict(
            flat_state_dict,
            source_state_dict,
            _metadata_manager.get_metadata_list(),
            process_group,
            coordinator_rank,
            offload,
            worker_groups,
            comm_method,
        )

        for file_name, state_dict in source_state_dict.items():
            for key, value in state_dict.items():
                # force GC
                value._clear()

        del source_state_dict

        for flat_key, keys in mapping.items():
            if (
                mw_name_compatibility
                and flat_key in mw_name_compatibility_mapping
            ):
                flat_key = mw_name_compatibility_mapping[flat_key]
            tmp = state_dict
            for key in keys[:-1]:
                tmp = tmp[key]
            tmp[keys[-1]] = flat_state_dict[flat_key]
'''),
]


_APPLIED = []


def apply():
    """Bind every patched function where the framework holds the original (once per process). A stale fix (the
    installed framework's source is not what it was written against) stops the run with status 3 and says so."""
    if _APPLIED:
        return
    for module, qualname, digest, source in PATCHES:
        owner, _, original = target(module, qualname)
        found = source_digest(inspect.getsource(original))
        if found != digest:
            print(f"STALE FIX: {module}.{qualname} is not the source this fix was written against (sha256 {found}, "
                  f"expected {digest}): the installed framework changed there", flush=True)
            sys.exit(3)
        rebind(original, compiled(original, source, owner, f"<fix.py: {module}.{qualname}>"))
    _APPLIED.append(True)
