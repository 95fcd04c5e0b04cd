"""Shared-memory segments a framework makes on a rank: listed by the rank as it makes them, unlinked by the pool
that hosted it, since a rank killed by a fault cannot unlink its own."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

SHM_VAR = "CKPT_HARNESS_SHM_DIR"  # where ranks list the /dev/shm segments they create (register_shm)


def register_shm(names: list[str]) -> None:
    """Called on a rank: these shared-memory segments are this process's. A rank killed by a fault cannot unlink
    them, so the pool does when it closes (``release_shm``). Outside a pool it does nothing."""
    directory = os.environ.get(SHM_VAR)
    if directory and names:
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        (path / str(os.getpid())).write_text("\n".join(names) + "\n", encoding="utf-8")


def release_shm(directory: Path) -> None:
    """Unlink every segment the ranks registered that is still there (plain names only, under /dev/shm)."""
    if not directory.is_dir():
        return
    for listing in directory.iterdir():
        for name in listing.read_text(encoding="utf-8").split():
            if "/" not in name and name not in (".", ".."):
                with contextlib.suppress(FileNotFoundError):
                    (Path("/dev/shm") / name).unlink()
