"""Async save: snapshot into host memory, return, and let a background writer process write and commit.

The writer process maps a memfd-backed buffer holding the snapshot (no pickling). A saver reuses that buffer
across saves, as training loops do with pinned staging memory, and waits for the previous writer before
overwriting it. ``wait()`` surfaces the writer's error, or its death by signal.
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
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from .disk.index import check_safe_name
from .disk.stio import DEFAULT_BLOCK
from .engine import CheckpointInfo, LocalTensor, new_save_id, per_rank
from .errors import ERROR_TYPES, AsyncWriterError
from .layout import TensorLayout
from .tensor import Tensor

_ALIGN = 64


class AsyncSave:
    """Handle of one in-flight async save.

    A background thread finishes staging (fills the shared buffer when the caller's snapshot went to private
    memory first), starts the writer process, feeds it the job and collects its report.
    """

    def __init__(self, stage: Callable[[], tuple[subprocess.Popen, bytes]], on_done: Callable[[], None]) -> None:
        self._stage = stage
        self._on_done = on_done
        self._lock = threading.Lock()
        self._started = threading.Event()
        self._proc: subprocess.Popen | None = None
        self._killed = False
        self._stage_error: BaseException | None = None
        self._out = b""
        self._result: CheckpointInfo | None = None
        self._error: BaseException | None = None
        self._finished = False
        self._thread = threading.Thread(target=self._run, name="ckpt-async-save", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            with self._lock:
                if self._killed:
                    return
            proc, job = self._stage()
            with self._lock:
                self._proc = proc
                if self._killed:
                    proc.kill()
            self._started.set()
            try:
                self._out, _ = proc.communicate(job)
            except (OSError, ValueError):  # the writer died before reading its job
                proc.wait()
        except BaseException as exc:  # staging failed: surfaced by wait()
            self._stage_error = exc
        finally:
            self._started.set()

    @property
    def pid(self) -> int | None:
        """The writer's pid once it has started (None if it never did)."""
        self._started.wait()
        return self._proc.pid if self._proc is not None else None

    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> CheckpointInfo | None:
        """Block until the writer ends; return the committed checkpoint (None for a writer that only staged
        its ranks' files) or raise AsyncWriterError."""
        if not self._finished:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise AsyncWriterError(f"async writer (pid {self.pid}) still running after {timeout} s")
            self._finished = True
            self._on_done()
            self._result, self._error = self._judge()
        if self._error is not None:
            raise self._error
        return self._result

    def _judge(self) -> tuple[CheckpointInfo | None, BaseException | None]:
        if self._stage_error is not None:
            err = AsyncWriterError(
                f"async save failed while staging: {type(self._stage_error).__name__}: {self._stage_error}"
            )
            err.__cause__ = self._stage_error
            return None, err
        if self._proc is None:
            return None, AsyncWriterError("async save was killed before its writer started")
        return _outcome(self._proc.returncode, self._out, self._proc.pid)

    def kill(self) -> None:
        """Test hook: SIGKILL the writer (what a crash does); before it starts, it never will."""
        with self._lock:
            self._killed = True
            if self._proc is not None and self._proc.poll() is None:
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
    cause_cls = ERROR_TYPES.get(kind)
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
        self._release()
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
        (``commit=True``) then waits for every rank's manifest and commits.

        A buffer already touched by an earlier save is filled directly (its pages exist, so the copy runs at
        memory speed). A fresh buffer is not: first-touching shared memory costs several times a plain copy
        (shmem gets no huge pages), so the caller only copies into private memory and the background thread moves
        that into the shared buffer."""
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
        reuse = self._map is not None and self._size >= size
        pieces = [
            (offset, lt.tensor.bits if reuse else lt.tensor.bits.copy())
            for _, _, lt, offset in layout
            if offset is not None
        ]
        if reuse:
            self._fill(pieces)
        items = [
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
            for rank, tname, lt, offset in layout
        ]
        job = {
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
        }

        def stage() -> tuple[subprocess.Popen, bytes]:
            if not reuse:
                self._fill(pieces)
            job["size"] = self._size
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
            return proc, json.dumps(job).encode()

        handle = AsyncSave(stage, on_done=self._finished)
        self._inflight = handle
        return handle

    def _fill(self, pieces: list[tuple[int, np.ndarray]]) -> None:
        """Copy snapshot pieces into the shared buffer, dropping each private copy once it is in."""
        size = max((offset + bits.nbytes for offset, bits in pieces), default=0)
        buf = self._buffer(size)
        while pieces:
            offset, bits = pieces.pop(0)
            dst = np.frombuffer(buf, bits.dtype, bits.size, offset)
            np.copyto(dst.reshape(bits.shape), bits)

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
        world, ranks = per_rank(state, layouts)
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

    def drain(self) -> None:
        """Wait until the in-flight save (if any) has ended; its outcome stays with its handle's ``wait()``. A
        process's saves run one after another, sync ones included: the commit relies on it (a coordinator's own
        staging is never in flight while it commits, commit.collect_garbage)."""
        if self._inflight is not None:
            with contextlib.suppress(AsyncWriterError):
                self._inflight.wait()

    def close(self) -> None:
        if self._inflight is not None:
            with contextlib.suppress(AsyncWriterError):
                self._inflight.wait()
        self._release()

    def _release(self) -> None:
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
