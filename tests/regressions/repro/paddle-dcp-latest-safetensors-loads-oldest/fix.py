"""paddle-dcp: silent-corruption in P-REPEAT (paddle-dcp-latest-safetensors-loads-oldest)

The candidate fix (paddle-dcp-max-id-safetensors, paddle-dcp-version-cache-key), written by ckpt-harness: ``bash
run.sh --with-fix`` runs the repro with it, repro.py calling ``apply()`` in every process before its first step.
fix.diff is the same change as a patch of the framework's source."""

import __future__

import hashlib
import importlib
import inspect
import linecache
import sys
import textwrap
import types
from collections.abc import Callable, Iterator


def source_digest(text: str) -> str:
    """The first 16 hex digits of the sha256 of a function's source, as ``inspect.getsource`` gives it."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def target(module: str, qualname: str) -> tuple[object, str, Callable]:
    """Where the function is bound in its own module (the module or the class), its name, and the function."""
    owner: object = importlib.import_module(module)
    *path, name = qualname.split(".")
    for part in path:
        owner = getattr(owner, part)
    return owner, name, inspect.getattr_static(owner, name)


def compiled(original: Callable, source: str, owner: object, filename: str) -> Callable:
    """``source`` (the function's whole text) compiled in ``original``'s module globals, so it sees what the original
    sees. A method calling super() closes over its class: it is compiled inside a function that binds ``__class__``
    to ``owner``. It is compiled under the original's own ``__future__`` annotations, so annotations the module leaves
    unevaluated stay so. ``filename`` names it in tracebacks, which show its lines."""
    body = textwrap.indent(textwrap.dedent(source), "    ")
    factory = f"def __ckpt_factory__(__class__):\n{body}    return {original.__name__}\n"
    linecache.cache[filename] = (len(factory), None, factory.splitlines(True), filename)
    namespace: dict = {}
    lazy = original.__code__.co_flags & __future__.annotations.compiler_flag
    exec(compile(factory, filename, "exec", flags=lazy, dont_inherit=True), original.__globals__, namespace)
    func = namespace["__ckpt_factory__"](owner)
    func.__qualname__, func.__module__ = original.__qualname__, original.__module__
    return func


def rebind(old: Callable, new: Callable) -> None:
    """Every module attribute and class attribute that is ``old`` becomes ``new``."""
    for namespace in _namespaces():
        for name, value in list(namespace.items()):
            if value is old:
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


def _set(namespace: dict, name: str, value: object) -> None:
    if isinstance(namespace, _ClassNamespace):
        setattr(namespace.cls, name, value)
    else:
        namespace[name] = value


# (module, function, sha256[:16] of the source it was written against, the patched function)
PATCHES = [
    ('paddle.distributed.flex_checkpoint.dcp.utils', 'get_max_id', '80193346889c3fc3',
     r'''def get_max_id(path):
    numbers = [0]
    pattern = re.compile(r"^(\d+)_(\d+)\.(distcp|safetensors)$")
    files = os.listdir(path)
    for file in files:
        match = pattern.match(file)
        if match:
            numbers.append(int(match.group(2)))
    return max(numbers) if numbers else None
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
        owner, _, original = target(module, qualname)
        found = source_digest(inspect.getsource(original))
        if found != digest:
            print(f"STALE FIX: {module}.{qualname} is not the source this fix was written against (sha256 {found}, "
                  f"expected {digest}): the installed framework changed there", flush=True)
            sys.exit(3)
        rebind(original, compiled(original, source, owner, f"<fix.py: {module}.{qualname}>"))
    _APPLIED.append(True)
