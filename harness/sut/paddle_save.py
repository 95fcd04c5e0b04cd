"""``paddle.save`` / ``paddle.load`` of each rank's local pieces as a system under test.

The plain, non-distributed baseline: every rank writes its own pieces (replicas included, no dedup) to
``root/name/rank-KKKKK.pdparams`` (pickle) or ``.safetensors`` and reads the same file back, so it never reshards.
``use_async`` goes through ``paddle.async_save``, which writes from a thread and takes no snapshot first; it cannot
write safetensors. Quirks and evidence: docs/paddle-notes.md.
"""

from __future__ import annotations

import threading
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from harness.sut._paddle_common import SUPPORTED_DTYPES, PaddleAdapter, from_paddle, to_paddle
from harness.sut.base import RankTensor
from reference.tensor import Tensor

_thread_errors: dict[threading.Thread, BaseException] = {}
_hook_installed = False


def _watch_thread_errors() -> None:
    """``paddle.async_save`` threads die silently (threading.excepthook prints and forgets); remember the error
    per thread so ``wait`` can raise it. Chains to the previous hook; installed once per process."""
    global _hook_installed
    if _hook_installed:
        return
    previous = threading.excepthook

    def hook(args: threading.ExceptHookArgs) -> None:
        if args.thread is not None and args.exc_value is not None:
            _thread_errors[args.thread] = args.exc_value
        previous(args)

    threading.excepthook = hook
    _hook_installed = True


@dataclass
class SaveHandle:
    tensors: list[Any]
    thread: threading.Thread | None = None


class PaddleSaveSut(PaddleAdapter):
    name = "paddle-save"
    capabilities: ClassVar[frozenset[str]] = frozenset(
        {"async", "zero_size", "flat", "moe", "repeat", "empty_state", "format:pickle", "format:safetensors"}
        | {f"dtype:{d}" for d in SUPPORTED_DTYPES}
    )

    def __init__(self) -> None:
        self._rank = 0
        self._pending: list[SaveHandle] = []

    def setup(self, rank: int, world_size: int, options: dict) -> list[str]:
        self._rank = rank
        _watch_thread_errors()
        return super().setup(rank, world_size, options)

    def _file(self, root: Path, name: str, options: dict) -> Path:
        suffix = "safetensors" if options.get("format") == "safetensors" else "pdparams"
        return Path(root) / name / f"rank-{self._rank:05d}.{suffix}"

    def save(self, root: Path, name: str, tensors: dict[str, RankTensor], *, use_async: bool, options: dict) -> Any:
        import paddle
        from paddle.framework import io

        state = {tname: to_paddle(rt.local.tensor) for tname, rt in tensors.items()}
        path = self._file(root, name, options)
        handle = SaveHandle(list(state.values()))
        if not use_async:
            paddle.save(state, str(path), safetensors=options.get("format") == "safetensors")
            return handle
        # Passed through even though Paddle 3.3.1 ignores it (it always pickles): the load then shows the effect.
        paddle.async_save(state, str(path), safetensors=options.get("format") == "safetensors")
        handle.thread = io.async_save_queue[-1]
        self._pending.append(handle)
        return handle

    def wait(self, handle: SaveHandle) -> None:
        if handle.thread is None:
            return
        handle.thread.join()
        error = _thread_errors.pop(handle.thread, None)
        if error is not None:
            raise RuntimeError(f"paddle.async_save thread failed: {error!r}") from error

    def load(self, root: Path, name: str | None, targets: dict[str, RankTensor], *, options: dict) -> dict[str, Tensor]:
        import paddle

        if name is None:
            raise ValueError("paddle-save has no notion of a latest checkpoint")
        path = self._file(root, name, options)
        if not targets:
            return {}  # nothing to read on this rank (it may hold no piece of any tensor)
        loaded = paddle.load(str(path), safetensors=options.get("format") == "safetensors")
        out = {}
        for tname, rt in targets.items():
            if tname not in loaded:
                raise KeyError(f"{tname!r} is not in {path}")
            out[tname] = from_paddle(loaded[tname])
            if out[tname].shape != rt.local.tensor.shape:
                raise ValueError(f"{tname!r}: {path} holds shape {out[tname].shape}, target is {rt.local.tensor.shape}")
        return out

    @classmethod
    def complete(cls, root: Path, names: Collection[str], options: dict) -> list[str] | None:
        """None: paddle.save has no notion of a finished checkpoint to read. It writes each file in place under
        its final name (``_open_file_buffer(path, "wb")``: no temporary name, no rename, no marker, no index) and
        records nowhere how many rank files make a checkpoint, so "a rank file exists" — the only thing a listing
        could go by — holds from the first byte of a torn file on: listing it would hold Paddle to a claim it
        never makes (false ``listed-incomplete`` data loss at every crash point inside a save). What it does
        claim stays judged: an acknowledged save must load bitwise (see paddle-save-power-loss-after-save.json)."""
        return None

    def end_case(self) -> None:
        for handle in self._pending:
            if handle.thread is not None:
                handle.thread.join()
                _thread_errors.pop(handle.thread, None)
        self._pending.clear()
