"""Async save: snapshot into host memory, return, and let a background writer process write and commit.

The snapshot is a copy into a memfd-backed buffer that the writer process maps (no pickling, no second copy).
A saver reuses its buffer across saves, as training loops do with pinned staging memory, and waits for the
previous writer before overwriting it. ``wait()`` surfaces the writer's error, or its death by signal.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from . import errors
from .engine import CheckpointInfo, LocalTensor, local_tensors, new_save_id, world_size_of
from .errors import AsyncWriterError
from .index import check_safe_name
from .layout import TensorLayout
from .stio import DEFAULT_BLOCK
from .tensor import Tensor

_ALIGN = 64


class AsyncSave:
    """Handle of one in-flight async save."""

    def __init__(self, proc: subprocess.Popen, job: bytes, on_done) -> None:
        self._proc = proc
        self._on_done = on_done
        self._result: CheckpointInfo | None = None
        self._error: BaseException | None = None
        self._finished = False
        self._out: list[bytes] = []
        # Feed the job and drain output on a thread so a large job never blocks the caller.
        self._io = threading.Thread(target=self._pump, args=(job,), daemon=True)
        self._io.start()

    def _pump(self, job: bytes) -> None:
        try:
            out, _ = self._proc.communicate(job)
            self._out.append(out)
        except (OSError, ValueError):
            self._proc.wait()

    @property
    def pid(self) -> int:
        return self._proc.pid

    def done(self) -> bool:
        return self._proc.poll() is not None

    def wait(self, timeout: float | None = None) -> CheckpointInfo | None:
        """Block until the writer ends; return the committed checkpoint (None for a writer that only staged
        its ranks' files) or raise AsyncWriterError."""
        if not self._finished:
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                raise AsyncWriterError(f"async writer (pid {self._proc.pid}) still running after {timeout} s") from None
            self._io.join()
            self._finished = True
            self._on_done()
            self._result, self._error = _outcome(self._proc.returncode, b"".join(self._out), self._proc.pid)
        if self._error is not None:
            raise self._error
        return self._result

    def kill(self) -> None:
        """Test hook: SIGKILL the writer (what a crash does)."""
        if self._proc.poll() is None:
            self._proc.kill()


def _outcome(code: int, out: bytes, pid: int) -> tuple[CheckpointInfo | None, BaseException | None]:
    if code < 0:
        name = signal.Signals(-code).name
        return None, AsyncWriterError(f"async writer (pid {pid}) was killed by {name} before committing")
    try:
        report = json.loads(out.decode() or "{}")
    except (UnicodeDecodeError, json.JSONDecodeError):
        report = {}
    if code == 0 and report.get("result") == {"staged": True}:
        return None, None  # a non-coordinator rank's writer: staged, the coordinator commits
    if code == 0 and "result" in report:
        r = report["result"]
        return CheckpointInfo(r["name"], Path(r["path"]), r["seq"], r["save_id"], r["world_size"]), None
    kind, message = report.get("error_type", "unknown"), report.get("message", f"writer exited with status {code}")
    cause_cls = getattr(errors, kind, None)
    err = AsyncWriterError(f"async writer failed: {kind}: {message}")
    if isinstance(cause_cls, type) and issubclass(cause_cls, Exception):
        with contextlib.suppress(TypeError):
            err.__cause__ = cause_cls(message)
    return None, err


class AsyncSaver:
    """Issues async saves for one process, reusing one staging buffer across them."""

    def __init__(self, one_shot: bool = False) -> None:
        self._one_shot = one_shot
        self._fd: int | None = None
        self._map: mmap.mmap | None = None
        self._size = 0
        self._inflight: AsyncSave | None = None

    def _buffer(self, size: int) -> mmap.mmap:
        if self._map is not None and self._size >= size:
            return self._map
        self.close()
        self._fd = os.memfd_create("ckpt-snapshot", os.MFD_CLOEXEC)
        self._size = max(size, 1)
        os.ftruncate(self._fd, self._size)
        self._map = mmap.mmap(self._fd, self._size)
        return self._map

    def save_local(
        self,
        root: str | Path,
        name: str,
        save_id: str,
        world_size: int,
        ranks: Mapping[int, Mapping[str, LocalTensor]],
        *,
        commit: bool,
        meta: Mapping | None = None,
        keep_last: int | None = None,
        block: int = DEFAULT_BLOCK,
        commit_protocol: str = "rename",
        commit_timeout: float = 60.0,
    ) -> AsyncSave:
        """Snapshot the given ranks' local tensors and write them in the background; the coordinator's writer
        (``commit=True``) then waits for every rank's manifest and commits."""
        check_safe_name(name, "checkpoint name", root)
        check_safe_name(save_id, "save id", root)
        if self._inflight is not None:
            self._inflight.wait()  # the buffer is still being written from
        layout, size = [], 0
        for rank, tensors in ranks.items():
            for tname, lt in tensors.items():
                if not (lt.saves and lt.tensor.nbytes):
                    layout.append((rank, tname, lt, None))  # replicas and empty slices carry no bytes
                    continue
                size = -(-size // _ALIGN) * _ALIGN
                layout.append((rank, tname, lt, size))
                size += lt.tensor.nbytes
        buf = self._buffer(size)
        items = []
        for rank, tname, lt, offset in layout:
            if offset is not None:
                dst = np.frombuffer(buf, lt.tensor.dtype.bits_dtype, lt.tensor.bits.size, offset)
                np.copyto(dst.reshape(lt.tensor.shape), lt.tensor.bits)
            items.append(
                {
                    "rank": rank,
                    "name": tname,
                    "dtype": lt.tensor.dtype.name,
                    "shape": list(lt.tensor.shape),
                    "global_shape": list(lt.global_shape),
                    "region": lt.region.to_json(),
                    "saves": lt.saves,
                    "offset": offset,
                }
            )
        job = json.dumps(
            {
                "root": str(root),
                "name": name,
                "save_id": save_id,
                "world_size": world_size,
                "ranks": sorted(ranks),
                "items": items,
                "commit": commit,
                "meta": dict(meta or {}),
                "keep_last": keep_last,
                "block": block,
                "commit_protocol": commit_protocol,
                "commit_timeout": commit_timeout,
                "size": self._size,
            }
        ).encode()
        assert self._fd is not None
        proc = subprocess.Popen(
            [sys.executable, "-m", "reference.async_writer", str(self._fd)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            pass_fds=(self._fd,),
            cwd=os.getcwd(),
            env=_writer_env(),
        )
        handle = AsyncSave(proc, job, on_done=self._finished)
        self._inflight = handle
        return handle

    def _finished(self) -> None:
        self._inflight = None
        if self._one_shot:
            self.close()

    def save(
        self,
        root: str | Path,
        state: Mapping[str, Tensor],
        layouts: Mapping[str, TensorLayout] | None = None,
        *,
        name: str,
        meta: Mapping | None = None,
        keep_last: int | None = None,
        block: int = DEFAULT_BLOCK,
        commit_protocol: str = "rename",
        save_id: str | None = None,
    ) -> AsyncSave:
        """In-process async save of a global state, playing every rank (like ``engine.save``)."""
        layouts = dict(layouts or {})
        world = world_size_of(layouts)
        ranks = {r: local_tensors(state, layouts, r) for r in range(world)}
        return self.save_local(
            root,
            name,
            save_id or new_save_id(),
            world,
            ranks,
            commit=True,
            meta=meta,
            keep_last=keep_last,
            block=block,
            commit_protocol=commit_protocol,
        )

    def close(self) -> None:
        if self._inflight is not None:
            with contextlib.suppress(AsyncWriterError):
                self._inflight.wait()
        if self._map is not None:
            self._map.close()
            self._map = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._size = 0

    def __enter__(self) -> AsyncSaver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _writer_env() -> dict[str, str]:
    """The writer must import this package even when it is not installed (tests, a checkout on PYTHONPATH)."""
    env = dict(os.environ)
    here = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = here + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def async_save(
    root: str | Path, state: Mapping[str, Tensor], layouts: Mapping[str, TensorLayout] | None = None, **kwargs
) -> AsyncSave:
    """One-off async save; the snapshot buffer is released once the writer has finished."""
    return AsyncSaver(one_shot=True).save(root, state, layouts, **kwargs)
