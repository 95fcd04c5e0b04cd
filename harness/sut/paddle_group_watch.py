"""Which communication a Paddle call made over the world's process group while it was given a group of its own.

``save_state_dict`` and ``load_state_dict`` take a ``process_group``; a call given one that moves data over the
world's group instead is wrong even where it returns the right bits. The ranks outside the group take no part in
that traffic, so on gloo the world group's per-group tag counters part between those ranks and the ones that did
(the next point-to-point pair of them waits forever), and a job whose other ranks run their own collectives on the
world meanwhile meets them out of order. Watching the world group's process group object during the call sees
every such operation, whatever layer of Paddle issued it, without depending on the backend to misbehave.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

# ProcessGroup attributes that read the group, moving nothing
_INSPECTING = frozenset({"name", "rank", "size"})


class _Recording:
    """Stands in for the world group's ProcessGroup: forwards everything, notes each communicating method called."""

    def __init__(self, real: Any, used: list[str]) -> None:
        self._real, self._used = real, used

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._real, name)
        if name in _INSPECTING or name.startswith("_") or not callable(value):
            return value

        def recorded(*args: Any, **kwargs: Any) -> Any:
            self._used.append(name)
            return value(*args, **kwargs)

        return recorded


@contextlib.contextmanager
def world_group_use() -> Iterator[list[str]]:
    """The names of the ProcessGroup operations made over the world's group while the block runs, in order."""
    from paddle.distributed.communication.group import _get_global_group

    world = _get_global_group()
    real, used = world._pg, []
    world._pg = _Recording(real, used)
    try:
        yield used
    finally:
        world._pg = real


def check_own_group(call: str, members: tuple[int, ...], used: list[str]) -> None:
    """Raise where ``call``, given the process group of ``members``, communicated over the world's group."""
    if used:
        raise RuntimeError(f"{call}(process_group=<ranks {list(members)}>) communicated over the world's process "
                           f"group ({', '.join(sorted(set(used)))}), in which the ranks outside its group take no "
                           "part")
