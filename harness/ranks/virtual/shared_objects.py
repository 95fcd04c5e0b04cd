"""One unpickled object per gathered payload, copied for each virtual rank only where a rank could change it.

In ``all_gather_object`` every real rank unpickles every rank's bytes, so W virtual ranks in one process would
unpickle W² payloads; at 256 ranks that was a third of a load. What Paddle gathers is lists and dicts of strings,
numbers, tuples and frozen dataclasses (``LocalTensorIndex``, ``ReadItem``): the leaves can never change, only the
containers can. So each distinct payload of a gather is unpickled once, a *recipe* says which parts of it are
mutable, and every rank gets fresh containers around the shared immutable leaves — equal to what it would have
unpickled, and nothing one rank does to its copy reaches another's. Anything the recipe cannot prove immutable (an
array, an object with a ``__dict__``, a dataclass that is not frozen) makes the whole payload unpickled per rank,
as before. Knows no checkpoint format: types only.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import functools
import operator
import pickle
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterable, Iterator
from types import ModuleType
from typing import Any

import numpy as np

ATOMS = (type(None), bool, int, float, complex, str, bytes, range, type(Ellipsis), np.generic, np.dtype, enum.Enum)
SHARE: Any = ()  # the recipe of an immutable part: hand out the same object
UNSHAREABLE: Any = None  # a part the recipe cannot prove immutable: unpickle the payload per rank
_MAPPINGS = (dict, OrderedDict, defaultdict)
_PLAIN = frozenset({type(None), bool, int, float, complex, str, bytes})  # exact types: a set lookup, no isinstance
_FIELDS: dict[type, tuple[str, ...] | None] = {}


def recipe(obj: Any) -> Any:
    """SHARE, UNSHAREABLE, or how to rebuild ``obj``'s mutable containers: ``(type, [part recipes])`` for a list,
    set or tuple holding mutable parts, ``(type, {key: value recipe})`` for a mapping (keys must be immutable)."""
    kind = type(obj)
    if kind in _PLAIN or isinstance(obj, ATOMS):
        return SHARE
    if kind in (tuple, frozenset, list, set):
        if _PLAIN.issuperset(map(type, obj)):  # the common case, checked at C speed
            return SHARE if kind in (tuple, frozenset) else (kind, None)
        parts = [recipe(x) for x in obj]
        if any(p is UNSHAREABLE for p in parts):
            return UNSHAREABLE
        if kind in (tuple, frozenset) and all(p is SHARE for p in parts):
            return SHARE
        return kind, (None if all(p is SHARE for p in parts) else parts)
    if kind in _MAPPINGS:
        if kind is defaultdict and not (obj.default_factory is None or isinstance(obj.default_factory, type)):
            return UNSHAREABLE
        if any(recipe(k) is not SHARE for k in obj):
            return UNSHAREABLE
        values = {k: recipe(v) for k, v in obj.items()}
        if any(v is UNSHAREABLE for v in values.values()):
            return UNSHAREABLE
        return kind, (None if all(v is SHARE for v in values.values()) else values)
    names = _frozen_fields(kind)
    if names is None or len(getattr(obj, "__dict__", names)) != len(names):
        return UNSHAREABLE  # not a frozen dataclass, or one with attributes beyond its fields
    for name in names:
        value = getattr(obj, name)
        kind = type(value)
        if kind in _PLAIN or (kind is tuple and _PLAIN.issuperset(map(type, value))):
            continue  # a number, a string, an offset: no call
        if recipe(value) is not SHARE:
            return UNSHAREABLE
    return SHARE


def _frozen_fields(kind: type) -> tuple[str, ...] | None:
    """The field names of a frozen dataclass (None: the class is none), once per class."""
    if kind not in _FIELDS:
        params = getattr(kind, "__dataclass_params__", None)
        frozen = params is not None and params.frozen and not issubclass(kind, type)
        _FIELDS[kind] = tuple(f.name for f in dataclasses.fields(kind)) if frozen else None
    return _FIELDS[kind]


def build(obj: Any, how: Any) -> Any:
    """A copy of ``obj`` with fresh mutable containers, following ``recipe(obj)`` (never UNSHAREABLE)."""
    if how is SHARE:
        return obj
    kind, parts = how
    if kind in _MAPPINGS:
        items = obj.items() if parts is None else ((k, build(v, parts[k])) for k, v in obj.items())
        if kind is defaultdict:
            return defaultdict(obj.default_factory, items)
        return kind(items)
    if parts is None:
        return kind(obj)
    return kind(build(x, p) for x, p in zip(obj, parts))


def _made_once(made: dict, key: Any, make: Callable[[], Any]) -> Any:
    """What ``make`` gives, made once per key of ``made``: the first result is kept untouched and every caller gets
    fresh containers around its immutable leaves; a result that cannot be proven immutable is made for each caller."""
    entry = made.get(key)
    if entry is None:
        pristine = make()
        how = recipe(pristine)
        made[key] = (None, UNSHAREABLE) if how is UNSHAREABLE else (pristine, how)
        if how is UNSHAREABLE:
            return pristine
        entry = made[key]
    elif entry[1] is UNSHAREABLE:
        return make()
    return build(*entry)


class GatherCopies:
    """The payloads of the gather now in progress: each unpickled once, each rank given its own copy. ``epoch``
    names the gather (ranks between the same two collectives are in the same one); a new epoch drops the last.
    Payloads are kept per sending rank even when two are equal: objects of two payloads are never the same object,
    as after a real unpickle (pickling them together would otherwise write one as a reference to the other)."""

    def __init__(self) -> None:
        self._epoch: int | None = None
        # (sender, gathered buffer, payload size) -> (pristine object, recipe)
        self._made: dict[tuple[int, bytes, int], tuple[Any, Any]] = {}

    def loads(self, data: bytes, epoch: int, sender: int = 0, size: int | None = None) -> Any:
        """The object pickled in the first ``size`` bytes of ``data`` (all of it: None), a gathered buffer padded
        to the largest payload. Every rank reads the same buffer object, whose hash is computed once, so a rank
        after the first finds its payload without copying or hashing the bytes again."""
        if epoch != self._epoch:
            self._epoch, self._made = epoch, {}
        size = len(data) if size is None else size
        return _made_once(self._made, (sender, data, size), lambda: pickle.loads(memoryview(data)[:size]))


class SharedCalls:
    """Pure functions (their result a function of their arguments' values alone, no side effects) computed once
    for every rank that calls them with the same immutable arguments between the same two collectives.

    Paddle plans a load on every rank over every rank's read items: W virtual ranks would each redo a plan that
    depends on the gathered items alone. Arguments match by identity of immutable objects (a gather's leaves are
    shared, GatherCopies), so a match is the same values; each rank gets fresh containers around the result's
    immutable leaves. A call whose arguments or result cannot be proven immutable is made as it would be."""

    def __init__(self, epoch: Callable[[], int]) -> None:
        self._epoch_of, self._epoch = epoch, None
        self._made: dict[tuple, tuple[Any, Any]] = {}  # (function, keyword names, _SameObjects) -> (result, recipe)

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def shared(*args: Any, **kwargs: Any) -> Any:
            key = self._key(fn, args, kwargs)
            if key is None:
                return fn(*args, **kwargs)
            return _made_once(self._made, key, lambda: fn(*args, **kwargs))
        return shared

    def _key(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> tuple | None:
        """The call's key, equal to an earlier call's when every argument is the same object (element by element
        for a list or tuple) as one proven immutable then; None when an argument cannot be proven immutable."""
        epoch = self._epoch_of()
        if epoch != self._epoch:
            self._epoch, self._made = epoch, {}
        key = (fn, tuple(kwargs), _SameObjects((*args, *kwargs.values())))
        if key in self._made:
            return key
        return key if all(recipe(x) is SHARE for x in key[2].objects()) else None


_ONE, _SEQ = "one", "sequence"


class _SameObjects:
    """Call arguments that equal others when they are the same objects, a list or tuple element by element (the
    elements of a gather's lists are shared, GatherCopies, so the same objects are the same values). A snapshot of
    each sequence is kept: the caller may change its list afterwards, and the objects held stay alive, so no other
    object can take their ids within the epoch. Compared at C speed: a 256-rank load passes every rank the whole
    job's read items (a tuple of their ids and a set lookup of each cost 4 times as much)."""

    __slots__ = ("_hash", "parts")

    def __init__(self, values: tuple) -> None:
        self.parts = tuple((_SEQ, type(v), tuple(v)) if type(v) in (list, tuple) else (_ONE, v, ()) for v in values)
        self._hash = hash(tuple((tag, id(obj), len(seq), id(seq[0]) if seq else 0, id(seq[-1]) if seq else 0)
                                for tag, obj, seq in self.parts))

    def objects(self) -> Iterator[Any]:
        """Every argument, a sequence's elements in its place."""
        for tag, obj, seq in self.parts:
            yield from seq if tag is _SEQ else (obj,)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _SameObjects) and len(self.parts) == len(other.parts) and all(
            a[0] is b[0] and a[1] is b[1] and len(a[2]) == len(b[2]) and all(map(operator.is_, a[2], b[2]))
            for a, b in zip(self.parts, other.parts))


def frozen_classes(modules: Iterable[ModuleType]) -> list[type]:
    """The frozen dataclasses the modules define that leave copying to ``copy`` (no ``__deepcopy__`` of their own)."""
    found = []
    for module in modules:
        for value in vars(module).values():
            params = getattr(value, "__dataclass_params__", None)
            if isinstance(value, type) and value.__module__ == module.__name__ and params is not None \
                    and params.frozen and "__deepcopy__" not in vars(value) and value not in found:
                found.append(value)
    return found


def deepcopy_keeping_immutable(x: Any, memo: dict) -> Any:
    """``copy.deepcopy`` of a frozen dataclass: the object itself where every attribute is immutable (as deepcopy
    keeps a tuple of numbers), else the copy deepcopy would make."""
    if recipe(x) is SHARE:
        return x
    return copy._reconstruct(x, memo, *x.__reduce_ex__(4))  # type: ignore[attr-defined]
