"""Async save of the reference engine: snapshot isolation, background commit, writer death and errors.

Every handle is waited on, so no writer process outlives its test (the conftest fixture checks).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

import reference as R
from reference import (
    AsyncSaver,
    AsyncWriterError,
    CheckpointExists,
    CheckpointIncomplete,
    Mesh,
    Replicate,
    Shard,
    Sharded,
    Tensor,
    async_save,
)
from reference.disk.commit import committed_checkpoints, read_latest
from reference.engine import local_tensors

MESH2 = Mesh((2,))
LAYOUTS2 = {"w": Sharded(MESH2, (Shard(0),)), "b": Sharded(MESH2, (Replicate(),)), "e": Sharded(MESH2, (Shard(0),))}


def make_state(seed: int, rows: int = 6) -> dict[str, Tensor]:
    rng = np.random.default_rng(seed)
    nan_payload = np.array([0x7FC00123, 0x80000000, 0x00000001], np.uint32).view(np.float32)  # NaN, -0.0, subnormal
    return {
        "w": Tensor.from_array(
            np.concatenate([rng.standard_normal(rows * 4 - 3).astype(np.float32), nan_payload]).reshape(rows, 4)
        ),
        "b": Tensor.from_array(rng.integers(-(2**50), 2**50, 5, dtype=np.int64)),
        "e": Tensor.from_array(np.zeros((0, 3), np.float16)),  # empty tensor: no bytes on any rank
        "h": Tensor.from_array(rng.integers(0, 2**16, (3, 3), dtype=np.uint16), "BF16"),  # no layout: rank 0 only
    }


def specs(state: dict[str, Tensor]) -> dict[str, tuple[str, tuple[int, ...]]]:
    return {k: (v.dtype.name, v.shape) for k, v in state.items()}


def assert_same(expected: dict[str, Tensor], actual: dict[str, Tensor]) -> None:
    assert R.diff_states(expected, actual) == []


def snapshot(state: dict[str, Tensor]) -> dict[str, Tensor]:
    return {k: v.copy() for k, v in state.items()}


def test_round_trip_is_bitwise(tmp_path: Path) -> None:
    root = tmp_path / "root"
    state = make_state(0)
    handle = async_save(root, state, LAYOUTS2, name="a", meta={"step": 3}, block=8)
    assert handle.pid > 0
    info = handle.wait(timeout=120)
    assert handle.done()
    assert info is not None
    assert (info.name, info.path, info.seq, info.world_size) == ("a", root / "a", 0, 2)
    assert handle.wait() is info  # waiting again returns the same outcome
    assert read_latest(root) == "a"
    assert sorted(p.name for p in root.iterdir()) == ["a", "latest"]
    assert_same(state, R.load_global(root))
    assert R.read_meta(root) == {"step": 3}
    for rank in range(2):
        expected = {k: lt.tensor for k, lt in local_tensors(state, LAYOUTS2, rank).items()}
        assert_same(expected, R.load_rank(root, specs(state), LAYOUTS2, rank))


def test_caller_may_mutate_right_after_save_returns(tmp_path: Path) -> None:
    """P-ASYNC-ISOLATION: the snapshot is taken before ``async_save`` returns; later writes to the caller's
    arrays (here shared with the saved tensors, no defensive copy in between) never reach the checkpoint."""
    root = tmp_path / "root"
    weights = np.arange(24, dtype=np.float32).reshape(6, 4) + 0.5
    counts = np.arange(5, dtype=np.int64) * 7
    state = {
        "w": Tensor(R.dtype("F32"), weights.view(np.uint32)),  # aliases ``weights``
        "c": Tensor(R.dtype("I64"), counts.view(np.uint64)),  # aliases ``counts``
    }
    expected = snapshot(state)
    handle = async_save(root, state, name="a")  # no layouts: rank 0 holds (and snapshots) the caller's arrays
    weights[...] = -1.0
    counts[:] = 99
    assert state["w"].bits[0, 0] == np.float32(-1.0).view(np.uint32)  # the mutation is visible to the caller
    handle.wait(timeout=120)
    assert_same(expected, R.load_global(root))


def test_local_tensors_mutated_after_save_local(tmp_path: Path) -> None:
    root = tmp_path / "root"
    state = make_state(1)
    ranks = {r: local_tensors(state, LAYOUTS2, r) for r in range(2)}
    expected = snapshot(state)
    with AsyncSaver() as saver:
        handle = saver.save_local(root, "a", R.new_save_id(), 2, ranks, commit=True)
        for tensors in ranks.values():
            for lt in tensors.values():
                lt.tensor.bits[...] = 0
        handle.wait(timeout=120)
    assert_same(expected, R.load_global(root))


def test_killed_writer_leaves_previous_checkpoint(tmp_path: Path) -> None:
    root = tmp_path / "root"
    first = make_state(2)
    R.save(root, first, LAYOUTS2, name="a")
    handle = async_save(root, make_state(3, rows=4000), LAYOUTS2, name="b")
    handle.kill()
    with pytest.raises(AsyncWriterError) as info:
        handle.wait(timeout=120)
    assert type(info.value) is AsyncWriterError
    assert "SIGKILL" in str(info.value) and str(handle.pid) in str(info.value)
    with pytest.raises(AsyncWriterError):
        handle.wait()  # the error sticks
    assert read_latest(root) == "a"
    assert committed_checkpoints(root) == {"a": 0}
    assert_same(first, R.load_global(root))
    # Whatever the writer left behind is collected by the next save.
    third = make_state(4)
    async_save(root, third, LAYOUTS2, name="c").wait(timeout=120)
    assert sorted(p.name for p in root.iterdir()) == ["a", "c", "latest"]
    assert_same(third, R.load_global(root))


def test_writer_error_is_reraised_with_its_type(tmp_path: Path) -> None:
    """The writer's error (here: the marker protocol refusing to save a committed name again) comes back from
    ``wait`` as an AsyncWriterError caused by the writer's own type, and nothing of the refused save is visible."""
    root = tmp_path / "root"
    first = make_state(5)
    async_save(root, first, LAYOUTS2, name="a", commit_protocol="marker").wait(timeout=120)
    handle = async_save(root, make_state(6), LAYOUTS2, name="a", commit_protocol="marker")
    with pytest.raises(AsyncWriterError) as info:
        handle.wait(timeout=120)
    err = info.value
    assert type(err) is AsyncWriterError
    assert "CheckpointExists" in str(err) and "already committed" in str(err) and str(root / "a") in str(err)
    assert type(err.__cause__) is CheckpointExists
    with pytest.raises(AsyncWriterError):
        handle.wait()
    assert read_latest(root) == "a"
    assert_same(first, R.load_global(root))


def test_unsafe_name_is_refused_before_any_writer_starts(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with pytest.raises(R.UnsafePath):
        async_save(root, make_state(0), LAYOUTS2, name="../escape")
    assert not root.exists() and not (tmp_path / "escape").exists()


def test_saver_reuse_waits_for_the_previous_save(tmp_path: Path) -> None:
    root = tmp_path / "root"
    states = [make_state(10), make_state(11), make_state(12, rows=64), make_state(13, rows=2)]
    with AsyncSaver() as saver:
        handles = []
        for i, state in enumerate(states):
            handles.append(saver.save(root, state, LAYOUTS2, name=f"s{i}", keep_last=3))
            # Reusing the buffer: the previous writer must be done before the snapshot is overwritten.
            assert all(h.done() for h in handles[:-1])
        infos = [h.wait(timeout=120) for h in handles]
    assert [(i.name, i.seq) for i in infos] == [("s0", 0), ("s1", 1), ("s2", 2), ("s3", 3)]
    assert committed_checkpoints(root) == {"s1": 1, "s2": 2, "s3": 3}
    assert read_latest(root) == "s3"
    for i in (1, 2, 3):
        assert_same(states[i], R.load_global(root, name=f"s{i}"))


def test_two_rank_staged_flow(tmp_path: Path) -> None:
    """Each rank's saver writes only its own slices; the coordinator's writer waits for the other rank's
    manifest, then commits."""
    root = tmp_path / "root"
    prev = make_state(20)
    R.save(root, prev, LAYOUTS2, name="prev")
    state = make_state(21)
    sid = R.new_save_id()
    local = {r: local_tensors(state, LAYOUTS2, r) for r in range(2)}
    with AsyncSaver() as coordinator, AsyncSaver() as other:
        h0 = coordinator.save_local(root, "step-1", sid, 2, {0: local[0]}, commit=True, meta={"step": 1})
        time.sleep(1.0)
        assert not h0.done()  # still waiting for rank 1's manifest
        assert read_latest(root) == "prev"
        h1 = other.save_local(root, "step-1", sid, 2, {1: local[1]}, commit=False)
        assert h1.wait(timeout=120) is None  # staged only
        info = h0.wait(timeout=120)
    assert info is not None and (info.name, info.seq, info.world_size, info.save_id) == ("step-1", 1, 2, sid)
    assert read_latest(root) == "step-1"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "prev", "step-1"]
    assert R.read_meta(root) == {"step": 1}
    assert_same(state, R.load_global(root))
    for rank in range(2):
        expected = {k: lt.tensor for k, lt in local[rank].items()}
        assert_same(expected, R.load_rank(root, specs(state), LAYOUTS2, rank))
    assert_same(prev, R.load_global(root, name="prev"))


def test_coordinator_gives_up_on_a_missing_rank(tmp_path: Path) -> None:
    root = tmp_path / "root"
    prev = make_state(30)
    R.save(root, prev, LAYOUTS2, name="prev")
    state = make_state(31)
    with AsyncSaver() as saver:
        handle = saver.save_local(
            root, "next", R.new_save_id(), 2, {0: local_tensors(state, LAYOUTS2, 0)}, commit=True, commit_timeout=0.5
        )
        with pytest.raises(AsyncWriterError) as info:
            handle.wait(timeout=120)
    assert "CheckpointIncomplete" in str(info.value) and "ranks [1]" in str(info.value)
    assert type(info.value.__cause__) is CheckpointIncomplete
    assert read_latest(root) == "prev"
    assert_same(prev, R.load_global(root))
