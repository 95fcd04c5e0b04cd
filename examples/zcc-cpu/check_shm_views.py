"""Checks the CPU shared-memory behaviour the ``ipc-shm`` shim relies on (CPU Paddle); exit status 0 when it holds.

1. ``_share_filename`` moves a tensor that is not yet in shared memory to a new allocation: a view made earlier with
   ``_share_buffer_to`` (how fusion_utils makes the moments and master weights views of the fused buffer) is cut off.
   Hence the shim moves the fused buffer to shared memory in ``FusionStorage.build_buffer``, before the views exist.
2. Moved before the views exist, the buffer keeps them: a second ``_share_filename`` returns the same segment, and a
   spawned process that opens it with ``_new_shared_filename`` (what ``_new_shared_cuda`` becomes) sees the rank's
   later in-place writes through the views, the way ZCC's worker reads the optimizer's updates.
"""

from __future__ import annotations

import multiprocessing as mp
import sys
from typing import Any


def child(meta: tuple, results: Any, go: Any) -> None:
    """The worker's side: open the segment, report what it holds now and after the parent's in-place update."""
    import paddle
    from paddle.base import core

    t = paddle.to_tensor(core.DenseTensor._new_shared_filename(meta))
    results.put(t.numpy().tolist())
    go.wait()
    results.put(t.numpy().tolist())


def main() -> int:
    import paddle

    paddle.set_device("cpu")

    buf = paddle.zeros([6], dtype="float32")
    view = paddle.zeros([3], dtype="float32")
    buf._slice(0, 3)._share_buffer_to(view)
    assert view._is_shared_buffer_with(buf), "a _share_buffer_to view shares its buffer"
    buf.value().get_tensor()._share_filename(False)
    assert not view._is_shared_buffer_with(buf), "_share_filename was expected to re-home the buffer"
    view.copy_(paddle.to_tensor([1.0, 2.0, 3.0]), False)
    assert buf.numpy().tolist() == [0.0] * 6, "a write through the old view must not reach the re-homed buffer"
    print("1. _share_filename re-homes a buffer and cuts off the views made before it: holds")

    buf = paddle.zeros([6], dtype="float32")
    first = buf.value().get_tensor()._share_filename(False)
    view = paddle.zeros([3], dtype="float32")
    buf._slice(0, 3)._share_buffer_to(view)
    view.copy_(paddle.to_tensor([1.0, 2.0, 3.0]), False)
    meta = buf.value().get_tensor()._share_filename(False)
    assert meta[0] == first[0], f"a buffer already in shared memory keeps its segment: {first} vs {meta}"
    assert view._is_shared_buffer_with(buf), "views made after the move stay views"
    ctx = mp.get_context("spawn")
    results, go = ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=child, args=(meta, results, go))
    proc.start()
    try:
        assert results.get(timeout=120) == [1.0, 2.0, 3.0, 0.0, 0.0, 0.0], "the child sees the parent's bytes"
        view.copy_(view * 10, False)  # in-place updates, as the optimizer makes them
        paddle.assign(paddle.to_tensor([7.0, 7.0, 7.0]), output=buf._slice(3, 6))
        go.set()
        seen = results.get(timeout=60)
        assert seen == [10.0, 20.0, 30.0, 7.0, 7.0, 7.0], f"the child must see the in-place updates, saw {seen}"
    finally:
        proc.join(timeout=60)
        if proc.is_alive():
            proc.kill()
    print("2. moved before its views exist, the buffer keeps them and a spawned reader sees in-place writes: holds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
