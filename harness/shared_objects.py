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

import dataclasses
import enum
import pickle
from collections import OrderedDict, defaultdict
from typing import Any

import numpy as np

ATOMS = (type(None), bool, int, float, complex, str, bytes, range, type(Ellipsis), np.generic, np.dtype, enum.Enum)
SHARE: Any = ()  # the recipe of an immutable part: hand out the same object
UNSHAREABLE: Any = None  # a part the recipe cannot prove immutable: unpickle the payload per rank
_MAPPINGS = (dict, OrderedDict, defaultdict)


def recipe(obj: Any) -> Any:
    """SHARE, UNSHAREABLE, or how to rebuild ``obj``'s mutable containers: ``(type, [part recipes])`` for a list,
    set or tuple holding mutable parts, ``(type, {key: value recipe})`` for a mapping (keys must be immutable)."""
    kind = type(obj)
    if isinstance(obj, ATOMS):
        return SHARE
    if kind in (tuple, frozenset, list, set):
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
    if _frozen_dataclass(obj):
        return SHARE
    return UNSHAREABLE


def _frozen_dataclass(obj: Any) -> bool:
    """A frozen dataclass instance whose every attribute is immutable (a frozen one may still hold a list)."""
    params = getattr(type(obj), "__dataclass_params__", None)
    if params is None or not params.frozen or isinstance(obj, type):
        return False
    names = {f.name for f in dataclasses.fields(obj)}
    extra = getattr(obj, "__dict__", {}).keys() - names
    return not extra and all(recipe(getattr(obj, name)) is SHARE for name in names)


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


class GatherCopies:
    """The payloads of the gather now in progress: each unpickled once, each rank given its own copy. ``epoch``
    names the gather (ranks between the same two collectives are in the same one); a new epoch drops the last."""

    def __init__(self) -> None:
        self._epoch: int | None = None
        self._made: dict[bytes, tuple[Any, Any]] = {}  # payload -> (the pristine object, its recipe)

    def loads(self, data: bytes, epoch: int) -> Any:
        if epoch != self._epoch:
            self._epoch, self._made = epoch, {}
        made = self._made.get(data)
        if made is None:
            pristine = pickle.loads(data)
            how = recipe(pristine)
            if how is UNSHAREABLE:
                self._made[data] = (None, UNSHAREABLE)
                return pristine
            made = self._made[data] = (pristine, how)
        pristine, how = made
        if how is UNSHAREABLE:
            return pickle.loads(data)
        return build(pristine, how)
