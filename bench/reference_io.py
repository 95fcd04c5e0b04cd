"""Benchmark of the reference engine's I/O against what the disk and memory can do (docs/design.md §10).

Prints ratios, each the median over ``--repeat`` paired runs (reference and baseline run back to back in
every repeat, so drift in disk or cache state hits both alike; within a repeat, loads and async timings are the
best of ``--tries``, because first-touch page faults of fresh memory on a VM add large one-sided noise):

- ``save_vs_raw``: ``reference.save`` throughput / one sequential ``os.write`` + ``fsync`` of the same bytes
  into a new file in the same directory (target >= 0.8).
- ``load_vs_raw``: ``reference.load_global`` throughput / one sequential ``preadv`` of the raw file into a fresh
  buffer, both files just written and fsynced, so both reads hit the page cache (target >= 0.8).
- ``async_block_vs_copy``: time ``async_save`` (fresh staging buffer) blocks the caller / a copy of the state
  into fresh memory (target <= 1.2); ``async_block_reused_vs_copy`` is the same through one ``AsyncSaver``
  whose staging buffer is reused from a previous save.

Run from the repo root: ``python bench/reference_io.py [--size-mib 1024] [--repeat 3] [--dir PATH]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # works without installing the package

from reference import AsyncSave, AsyncSaver, Tensor, async_save, load_global, save

MIB = 1 << 20
_CHUNK = 64 * MIB  # raw I/O chunk, the same as the reference's


def make_state(size_mib: int, count: int, seed: int) -> dict[str, Tensor]:
    """``count`` tensors (alternating F32 and BF16 bits) of random content totalling ~``size_mib`` MiB.

    Random bits so nothing on the path (page cache, filesystem) can shortcut zero pages."""
    rng = np.random.default_rng(seed)
    per = size_mib * MIB // count
    state = {}
    for i in range(count):
        name, itemsize = ("F32", 4) if i % 2 == 0 else ("BF16", 2)
        n = per // itemsize
        rows = 256 if n % 256 == 0 else 1
        bits = rng.integers(0, 1 << (8 * itemsize), size=n, dtype=np.uint32 if itemsize == 4 else np.uint16)
        state[f"layer{i:02d}.weight"] = Tensor.from_array(bits.reshape(rows, -1), name)
    return state


def _views(state: dict[str, Tensor]) -> list[memoryview]:
    return [memoryview(t.bits).cast("B") for t in state.values()]


def raw_write(path: Path, state: dict[str, Tensor]) -> None:
    """The baseline a checkpoint writer cannot beat: every byte once, sequentially, then fsync."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        for view in _views(state):
            for pos in range(0, len(view), _CHUNK):
                chunk = view[pos : pos + _CHUNK]
                while chunk:
                    chunk = chunk[os.write(fd, chunk) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def raw_read(path: Path, nbytes: int) -> np.ndarray:
    """The baseline a loader cannot beat: one sequential read into freshly allocated memory (no checks)."""
    out = np.empty(nbytes, np.uint8)
    view = memoryview(out)
    fd = os.open(path, os.O_RDONLY)
    try:
        for pos in range(0, nbytes, _CHUNK):
            target = view[pos : pos + _CHUNK]
            if os.preadv(fd, [target], pos) != len(target):
                raise OSError(f"short read of {path}")
    finally:
        os.close(fd)
    return out


def timed(fn: Callable[[], object]) -> float:
    """Seconds ``fn`` takes; its result is dropped before returning so at most one extra copy is ever alive."""
    t0 = time.perf_counter()
    result = fn()
    elapsed = time.perf_counter() - t0
    del result
    return elapsed


def async_blocked(start: Callable[[], AsyncSave]) -> float:
    """Seconds the caller is blocked in ``start``; the writer is waited for outside the timing."""
    t0 = time.perf_counter()
    handle = start()
    elapsed = time.perf_counter() - t0
    handle.wait()
    return elapsed


def bench(state: dict[str, Tensor], work: Path, repeat: int, tries: int) -> dict[str, list[float]]:
    """Every figure once per repeat, baseline and reference back to back. Within a repeat, cheap or noisy
    timings are the best of ``tries`` (fresh-memory page faults on a VM add large one-sided noise)."""
    nbytes = sum(t.nbytes for t in state.values())
    figures: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        figures.setdefault(key, []).append(value)

    for r in range(repeat):
        raw, root = work / f"raw-{r}.bin", work / f"sync-{r}"
        t_raw_w = t_ref_w = 0.0
        # Writes: alternate which goes first, so writeback or disk-cache state left by one never favours the other.
        for is_raw in (r % 2 == 0, r % 2 != 0):
            if is_raw:
                t_raw_w = timed(lambda: raw_write(raw, state))  # noqa: B023 (called at once)
            else:
                t_ref_w = timed(lambda: save(root, state, name="step-1"))  # noqa: B023
        # Loads: both files just written and fsynced, so both reads hit the page cache; alternate the order.
        t_raw_r, t_ref_r = [], []
        for i in range(tries):
            for is_raw in (i % 2 == r % 2, i % 2 != r % 2):
                if is_raw:
                    t_raw_r.append(timed(lambda: raw_read(raw, nbytes)))  # noqa: B023
                else:
                    t_ref_r.append(timed(lambda: load_global(root)))  # noqa: B023
        raw.unlink()
        shutil.rmtree(root)
        add("save_vs_raw", t_raw_w / t_ref_w)
        add("load_vs_raw", min(t_raw_r) / min(t_ref_r))
        add("raw_write_MBps", nbytes / t_raw_w / 1e6)
        add("ref_save_MBps", nbytes / t_ref_w / 1e6)
        add("raw_read_MBps", nbytes / min(t_raw_r) / 1e6)
        add("ref_load_MBps", nbytes / min(t_ref_r) / 1e6)

        t_copy, t_async, t_reused = [], [], []
        reused = work / f"reused-{r}"
        with AsyncSaver() as saver:
            saver.save(reused, state, name="warmup").wait()  # allocates and faults in the buffer
            for i in range(tries):
                t_copy.append(timed(lambda: {k: v.bits.copy() for k, v in state.items()}))
                one_off = work / f"async-{r}-{i}"
                t_async.append(async_blocked(lambda: async_save(one_off, state, name="step-1")))  # noqa: B023
                shutil.rmtree(one_off)
                t_reused.append(async_blocked(lambda: saver.save(reused, state, name=f"step-{i}")))  # noqa: B023
        shutil.rmtree(reused)
        add("async_block_vs_copy", min(t_async) / min(t_copy))
        add("async_block_reused_vs_copy", min(t_reused) / min(t_copy))
        add("copy_ms", min(t_copy) * 1e3)
        add("async_block_ms", min(t_async) * 1e3)
        add("async_block_reused_ms", min(t_reused) * 1e3)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024, help="state size in MiB (default 1024)")
    parser.add_argument("--tensors", type=int, default=24, help="number of tensors (default 24)")
    parser.add_argument("--repeat", type=int, default=3, help="repeats; each figure is the median (default 3)")
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a fresh temp dir)")
    parser.add_argument("--tries", type=int, default=3, help="best-of within a repeat for loads and async (3)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    state = make_state(args.size_mib, args.tensors, args.seed)
    nbytes = sum(t.nbytes for t in state.values())
    base = args.dir if args.dir is not None else Path(tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="reference-io-", dir=base))  # ours alone, removed even on error
    try:
        figures = bench(state, work, args.repeat, args.tries)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    order = ["save_vs_raw", "load_vs_raw", "async_block_vs_copy", "async_block_reused_vs_copy"]
    for key in order + [k for k in figures if k not in order]:
        print(f"{key}: {statistics.median(figures[key]):.3f}")
    print(f"# state: {len(state)} tensors (F32/BF16 bits), {nbytes / MIB:.0f} MiB; medians of {args.repeat} repeats")
    print(f"# disk: {base} (raw baseline and checkpoints in the same directory)")
    print(
        f"# load cache state: warm (both files just written+fsynced, in the page cache); best of {args.tries} "
        "alternated reads, each into fresh memory"
    )
    print(
        f"# async: caller-blocked time until save() returns, best of {args.tries}; copy = state into fresh memory, "
        f"best of {args.tries}; writers waited for outside the timing"
    )
    for key in order:
        print(f"# {key} per repeat: {', '.join(f'{v:.3f}' for v in figures[key])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
