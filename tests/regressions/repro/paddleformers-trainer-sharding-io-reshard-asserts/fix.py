"""paddleformers-trainer: loud-failure in P-RESUME (paddleformers-trainer-sharding-io-reshard-asserts)

The candidate fix (paddleformers-sharding-v1-reshard), written by ckpt-harness: ``bash run.sh --with-fix`` runs the
repro with it, repro.py calling ``apply()`` in every process before its first step. fix.diff is the same change as a
patch of the framework's source."""

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
    ('paddleformers.trainer.utils.reshard.sharding_v1', 'shard', 'bc939956ca0f8797',
     r'''def shard(node_model_state, model, optimizer):
    cur_rank = max(node_model_state.group.rank, 0)
    unwrapped_optimizer = unwrap_optimizer(optimizer, DygraphShardingOptimizer)
    if unwrapped_optimizer is not None:
        optimizer = unwrapped_optimizer
        param2rank = optimizer._param2rank

        def filter_func(key):
            names = key
            param_name = names[1]
            assert param_name in param2rank
            dst_rank = param2rank[param_name]
            return dst_rank == cur_rank

    else:
        assert not is_sharding_opt(optimizer)
        filter_func = lambda key: True

    node_model_state.reshard(filter_func)
    return node_model_state
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
