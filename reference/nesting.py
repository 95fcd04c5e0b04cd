"""Nested state dicts: what saving ``{"model": {"layers.0": {"w": t}}}`` means, independent of any framework.

A case asks for nesting with ``options["nested"]``: the separator at which its tensor names split into a path of
dict keys ("model/layers.0/w" with "/" is ``state["model"]["layers.0"]["w"]``). ``options["empty_dicts"]`` adds
sub-dicts with nothing in them. A checkpoint stores each leaf under its path joined with "." (the rule of Paddle's
flex checkpoint and of torch.distributed.checkpoint), so a key may hold the join character inside it; a load into
the same nesting gives every leaf back at its path, and empty sub-dicts stay empty. Two leaves whose paths join to
one stored key, or a path that is both a leaf and a dict, make no well-defined checkpoint: NestingError.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .errors import LayoutError

NESTED = "nested"  # the case option: the separator of nesting in tensor names
EMPTY_DICTS = "empty_dicts"  # the case option: paths (joined with the separator) of empty sub-dicts
JOIN = "."


class NestingError(LayoutError):
    """The nesting asked for is ambiguous: two leaves would be stored under one key, or a path is leaf and dict."""


def path_of(name: str, sep: str) -> tuple[str, ...]:
    return tuple(name.split(sep))


def stored_key(name: str, sep: str) -> str:
    """The key a nested leaf is stored under: its path joined with "."."""
    return JOIN.join(path_of(name, sep))


def check(names: Iterable[str], sep: str, empty: Iterable[str] = ()) -> None:
    """Raise NestingError unless ``names`` (leaves) and ``empty`` (empty sub-dicts) nest without ambiguity."""
    if not isinstance(sep, str) or not sep:
        raise NestingError(f"option {NESTED!r} must be a non-empty separator string, got {sep!r}")
    leaves = {path_of(n, sep): n for n in names}
    stored: dict[str, str] = {}
    for path, name in sorted(leaves.items()):
        if any(part == "" for part in path):
            raise NestingError(f"{name!r}: an empty key in its path")
        other = stored.setdefault(JOIN.join(path), name)
        if other != name:
            raise NestingError(f"{other!r} and {name!r} are both stored as {JOIN.join(path)!r}")
        if any(path[:i] in leaves for i in range(1, len(path))):
            raise NestingError(f"{name!r}: a prefix of its path is a leaf too")
    for name in empty:
        path = path_of(name, sep)
        if any(path[:i] in leaves for i in range(1, len(path) + 1)):
            raise NestingError(f"empty dict {name!r}: its path holds a leaf")
        if any(leaf[:len(path)] == path for leaf in leaves):
            raise NestingError(f"empty dict {name!r} holds leaves")


def build(leaves: Mapping[str, Any], sep: str, empty: Iterable[str] = ()) -> dict:
    """The nested dict holding each ``leaves`` value at its name's path, and the empty sub-dicts."""
    check(leaves, sep, empty)
    root: dict = {}
    for name in empty:
        node = root
        for part in path_of(name, sep):
            node = node.setdefault(part, {})
    for name, value in leaves.items():
        *parents, last = path_of(name, sep)
        node = root
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return root


def leaf(tree: Mapping, name: str, sep: str) -> Any:
    """The value at ``name``'s path (KeyError naming the path where it is missing)."""
    node: Any = tree
    for part in path_of(name, sep):
        if not isinstance(node, Mapping) or part not in node:
            raise KeyError(f"{name!r}: no {part!r} at its path")
        node = node[part]
    return node


def empty_dicts_lost(tree: Mapping, empty: Iterable[str], sep: str) -> list[str]:
    """The empty sub-dicts that are no longer empty dicts after a load (none: the load kept them)."""
    lost = []
    for name in empty:
        try:
            node = leaf(tree, name, sep)
        except KeyError:
            node = None
        if node != {}:
            lost.append(name)
    return lost


def by_name(stored: Mapping[str, Any], names: Iterable[str], key: Callable[[str], str]) -> dict[str, Any]:
    """Entries a checkpoint lists by stored key, keyed by the case's tensor names again (``key``: the key a name
    is stored under; keys no name stores as are kept as they are)."""
    names_of = {key(n): n for n in names}
    return {names_of.get(k, k): value for k, value in stored.items()}
