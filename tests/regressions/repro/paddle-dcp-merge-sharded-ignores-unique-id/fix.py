"""paddle-dcp: silent-corruption in P-REPEAT (paddle-dcp-merge-sharded-ignores-unique-id)

The candidate fix (paddle-dcp-merge-sharded-keeps-unique-id), written by ckpt-harness: ``bash run.sh --with-fix``
runs the repro with it, repro.py calling ``apply()`` in every process before its first step. fix.diff is the same
change as a patch of the framework's source."""

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
    ('paddle.distributed.flex_checkpoint.dcp.load_state_dict', 'merge_sharded_state_dict', '095470c1416e4c00',
     r'''def merge_sharded_state_dict(
    load_path: str,
    save_path: str,
    prefix: str | None = None,
    safetensor_prefix: str = 'model',
    skip_postfix_list: list = [],
    process_group: Group | None = None,
    unique_id: int | None = None,
    offload: bool = False,
    aoa_config: dict[str, list[str]] | None = None,
    safetensors: bool = False,
) -> None:
    """
    Load the distributed checkpoint and merge it to unsharded state_dict then save as safetensors.

    Note:
        save files are:
            model-00001-of-00008.safetensors
            model-00002-of-00008.safetensors
            ...
            model-00008-of-00008.safetensors
            model.safetensors.index.json
        model is safetensor_prefix; 00008 is file_num which same ad dist total_size.

    Args:
        load_path(str): The directory to load checkpoint files.
        save_path(str): The directory to save merged_checkpoint files.
        prefix(str): The flat_mapping prefix of state_dict key. e.g., 'model', Default None.
        safetensor_prefix(str): The safetensors file prefix e.g., Default 'model'.
        skip_postfix_list(list(str)): The skip postfix list of state_dict key. e.g., ['moment1_0', 'beta1_pow_acc_0'], Default [].
        process_group(paddle.distributed.collective.Group): ProcessGroup to be used for cross-rank synchronization. Use the default process group which contains all cards.
        unique_id(int): The unique id of checkpoint, used to distinguish between different checkpoint versions. Default is None, in which case the id the max id of given path, and the newest version checkpoint is loaded.
        offload(bool): Whether to offload the checkpoint data from GPU to CPU, set to True if GPU memory is not enough.
        aoa_config(dict[str, list[str]]): AOA config to change parameters. Default is None.
        safetensors(bool): Whether to use safetensors format. Default is False.
    Returns:
        None.

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
            >>> dist.save_state_dict(state_dict, ckpt_path) # save sharded checkpoint

            >>> # doctest: +SKIP('run in single-card mode.')
            >>> import paddle
            >>> import paddle.distributed as dist
            >>> ckpt_path = "./checkpoint"
            >>> save_path = "./merged_checkpoint"
            >>> dist.flex_checkpoint.dcp.load_state_dict.merge_sharded_state_dict(ckpt_path, save_path)  # load unsharded and save to safetensors
            >>> # doctest: -SKIP
    """
    if unique_id is None:
        unique_id = get_max_id(load_path)
    else:
        assert unique_id >= 0, f'{unique_id} should be >= 0'

    use_dist = True if paddle.distributed.get_world_size() > 1 else False

    if use_dist and process_group is None and not is_initialized():
        # Init the default global process group
        paddle.distributed.init_parallel_env()

    if use_dist:
        # sync to avoid some ranks not write path yet
        paddle.distributed.barrier(process_group)

    metadata_files, local_data_files = get_checkpoint_files(
        load_path, unique_id=unique_id, safetensors=safetensors
    )

    metadata_list = []
    for file in metadata_files:
        metadata_list.append(paddle.load(os.path.join(load_path, file)))
    file_num = paddle.distributed.get_world_size()

    # create target state_dict by local_tensor_meta
    def slice_dict(d, start, end):
        """Slice the dictionary keys and return the corresponding sub-dictionary"""
        keys = list(d.keys())[start:end]
        return {k: d[k] for k in keys}

    all_state_dict = []
    local_state_dict_to_save = {}
    SaveSafetensor = SavePartialSafetensors(
        save_path, process_group, safetensor_prefix
    )

    for metadata in metadata_list:
        state_dict_metadata = metadata.state_dict_metadata
        origin_size = len(state_dict_metadata)
        rm_key_list = []
        for key in state_dict_metadata.keys():
            if endswith(key, skip_postfix_list):
                rm_key_list.append(key)
        for key in rm_key_list:
            state_dict_metadata.pop(key)
        cur_size = len(state_dict_metadata)
        logger.info(
            f"state_dict_metadata origin_size: {origin_size}, cur_size: {cur_size} skip {origin_size - cur_size}"
        )

        positions = divide_positions(len(state_dict_metadata), file_num)
        rank = paddle.distributed.get_rank()

        partial_state_dict_metadata = slice_dict(
            state_dict_metadata, positions[rank], positions[rank + 1]
        )
        for (
            tensor_key,
            local_tensor_meta,
        ) in partial_state_dict_metadata.items():
            if prefix is None or tensor_key.startswith(prefix):
                global_shape = compute_global_shape(local_tensor_meta)
                t = paddle.zeros(global_shape, dtype=local_tensor_meta[0].dtype)
                if offload:
                    t = t.cpu()
                local_state_dict_to_save[tensor_key] = (
                    make_replicated_sharded_weight(
                        key=tensor_key,
                        tensor=t,
                    )
                )
            else:
                continue

        logger.info(
            f"rank :{rank} , local_state_dict_to_save.size :{len(local_state_dict_to_save)}"
        )

        if paddle.distributed.get_rank() == 0:
            for ii in range(len(positions) - 1):
                shard_file = f"{safetensor_prefix}-{ii + 1:05d}-of-{file_num:05d}.safetensors"
                for key in list(state_dict_metadata.keys())[
                    positions[ii] : positions[ii + 1]
                ]:
                    SaveSafetensor.index["weight_map"][key] = shard_file
                    local_tensor_meta = state_dict_metadata[key]
                    shape_ = compute_global_shape(local_tensor_meta)
                    dtype_ = local_tensor_meta[0].dtype
                    SaveSafetensor.index["metadata"]["total_size"] += int(
                        np.prod(shape_)
                        * SaveSafetensor.paddle_dtype_map[str(dtype_)]
                    )

            weight_size = len(SaveSafetensor.index["weight_map"])
            logger.info(
                f"SaveSafetensor.index[weight_map] size = {weight_size}."
            )

    if paddle.distributed.get_rank() == 0:
        SaveSafetensor.save_index_json()

    if use_dist:
        paddle.distributed.barrier(process_group)
        paddle.distributed.all_gather_object(
            all_state_dict, len(local_state_dict_to_save), process_group
        )
    else:
        all_state_dict = [len(local_state_dict_to_save)]

    if paddle.distributed.get_rank() == 0:
        total_keys = sum(size for size in all_state_dict)
        total_meta_items = sum(
            len(metadata.state_dict_metadata.items())
            for metadata in metadata_list
        )

        assert total_meta_items == total_keys, (
            f'split state dict filed :{total_meta_items} should seem as {total_keys}'
        )
        assert file_num == len(all_state_dict), (
            f'file_num:{file_num} should seem as len(all_state_dict):{len(all_state_dict)}'
        )

    load_state_dict(
        local_state_dict_to_save,
        load_path,
        process_group,
        unique_id=unique_id,
        offload=offload,
        aoa_config=aoa_config,
        safetensors=safetensors,
    )

    # Update dictionary keys in place
    for key in list(
        local_state_dict_to_save.keys()
    ):  # Use list(data.keys()) to avoid runtime error
        if prefix and key.startswith(prefix):
            new_key = key[len(prefix) + 1 :]  # Remove the "str" prefix
            local_state_dict_to_save[new_key] = local_state_dict_to_save.pop(
                key
            )  # Add new key and remove the old one

    for key, value in local_state_dict_to_save.items():
        if isinstance(value, ShardedWeight):
            value_to_save = value.local_tensor
            local_state_dict_to_save[key] = value_to_save
    logger.info(
        f"rank :{rank} , SaveSafetensor.local_state_dict_to_save.size :{len(local_state_dict_to_save)}"
    )
    SaveSafetensor.save_single_safetenors(
        local_state_dict_to_save, paddle.distributed.get_rank()
    )
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
