"""The commit protocol of the reference engine: staging, atomic publish, ``latest``, rotation, crash leftovers.

Crashes are simulated in-process: ``save_rank`` for only some ranks and no ``commit`` is what a job killed
between its rank step and its coordinator step leaves behind.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import reference as R
from reference import CheckpointExists, CheckpointIncomplete, CheckpointNotFound, Mesh, Replicate, Shard, Sharded
from reference.disk.commit import PROTOCOLS, committed_checkpoints, pointer_text, read_latest, rotate, set_latest

MESH4 = Mesh((2, 2), ("dp", "tp"))
LAYOUTS4 = {
    "w": Sharded(MESH4, (Shard(0), Shard(1))),
    "v": Sharded(MESH4, (Replicate(), Shard(0))),
    "b": Sharded(MESH4, (Replicate(), Replicate())),
    **R.flat_group(MESH4, "dp", [("m1", (5, 3)), ("m2", (4,))], align=2),
}
MESH2 = Mesh((2,))
LAYOUTS2 = {"w": Sharded(MESH2, (Shard(0),)), "b": Sharded(MESH2, (Replicate(),))}


def make_state(seed: int) -> dict[str, R.Tensor]:
    rng = np.random.default_rng(seed)
    return {
        "w": R.Tensor.from_array(rng.standard_normal((6, 5)).astype(np.float32)),
        "v": R.Tensor.from_array(rng.integers(-(2**40), 2**40, (7, 2), dtype=np.int64)),
        "b": R.Tensor.from_array(rng.standard_normal(3).astype(np.float64)),
        "m1": R.Tensor.from_array(rng.standard_normal((5, 3)).astype(np.float16)),
        "m2": R.Tensor.from_array(rng.integers(0, 255, 4, dtype=np.uint8)),
    }


def state2(seed: int) -> dict[str, R.Tensor]:
    s = make_state(seed)
    return {"w": s["w"], "b": s["b"]}


def specs(state: dict[str, R.Tensor]) -> dict[str, tuple[str, tuple[int, ...]]]:
    return {k: (v.dtype.name, v.shape) for k, v in state.items()}


def assert_same(expected: dict[str, R.Tensor], actual: dict[str, R.Tensor]) -> None:
    assert R.diff_states(expected, actual) == []


def listing(root: Path) -> list[str]:
    return sorted(os.listdir(root))


def stage(root: Path, name: str, save_id: str, state, layouts, ranks, world: int, **kwargs) -> None:
    for rank in ranks:
        R.save_rank(root, name, save_id, rank, world, R.local_tensors(state, layouts, rank), **kwargs)


def ckpt_files(world: int, protocol: str = "rename") -> list[str]:
    files = ["index.json"]
    for rank in range(world):
        files += [f"rank-{rank:05d}.manifest.json", f"rank-{rank:05d}.safetensors"]
    if protocol == "marker":
        files.append("COMMITTED")
    return sorted(files)


# --- successful saves --------------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["rename", "marker"])
def test_root_holds_only_checkpoints_and_latest(tmp_path: Path, protocol: str) -> None:
    root = tmp_path / "root"
    states = {}
    for i, name in enumerate(["step-1", "step-2", "step-3"]):
        states[name] = make_state(i)
        info = R.save(root, states[name], LAYOUTS4, name=name, commit_protocol=protocol, meta={"step": i})
        assert (info.name, info.path, info.seq, info.world_size) == (name, root / name, i, 4)
        assert read_latest(root) == name
        assert listing(root) == sorted([*states, "latest"])
        assert listing(root / name) == ckpt_files(4, protocol)
    assert (root / "latest").read_text() == pointer_text("step-3")
    assert committed_checkpoints(root) == {"step-1": 0, "step-2": 1, "step-3": 2}
    assert_same(states["step-3"], R.load_global(root))
    assert R.read_meta(root) == {"step": 2}
    for name, state in states.items():
        assert_same(state, R.load_global(root, name=name))


def test_multi_rank_flow_save_rank_then_commit(tmp_path: Path) -> None:
    root = tmp_path / "root"
    state = make_state(7)
    sid = R.new_save_id()
    stage(root, "ck", sid, state, LAYOUTS4, [3, 1, 2, 0], 4)  # rank order does not matter
    assert listing(root) == [f".staging-ck-{sid}"]
    info = R.commit(root, "ck", sid, 4, meta={"step": 10})
    assert (info.name, info.seq, info.save_id, info.world_size) == ("ck", 0, sid, 4)
    assert listing(root) == ["ck", "latest"]
    assert_same(state, R.load_global(root))
    for rank in range(4):
        expected = {k: lt.tensor for k, lt in R.local_tensors(state, LAYOUTS4, rank).items()}
        assert_same(expected, R.load_rank(root, specs(state), LAYOUTS4, rank))
    # Reshard onto a different world size: 3 ranks, row-sharded.
    three = Mesh((3,))
    other = {k: Sharded(three, (Shard(0),)) for k in state}
    for rank in range(3):
        expected = {k: lt.tensor for k, lt in R.local_tensors(state, other, rank).items()}
        assert_same(expected, R.load_rank(root, specs(state), other, rank))


# --- crashes -----------------------------------------------------------------------------------------------


def test_crash_between_rank_step_and_commit(tmp_path: Path) -> None:
    root = tmp_path / "root"
    first, second, third = make_state(1), make_state(2), make_state(3)
    R.save(root, first, LAYOUTS4, name="a")
    sid = R.new_save_id()
    stage(root, "b", sid, second, LAYOUTS4, [0, 2], 4)  # ranks 1 and 3 died; nobody committed
    assert listing(root) == [f".staging-b-{sid}", "a", "latest"]
    assert read_latest(root) == "a"
    assert committed_checkpoints(root) == {"a": 0}
    assert_same(first, R.load_global(root))  # the stale staging dir is ignored
    for rank in range(4):
        expected = {k: lt.tensor for k, lt in R.local_tensors(first, LAYOUTS4, rank).items()}
        assert_same(expected, R.load_rank(root, specs(first), LAYOUTS4, rank))
    with pytest.raises(CheckpointNotFound):
        R.load_global(root, name="b")
    info = R.save(root, third, LAYOUTS4, name="c")  # the next save collects the leftovers
    assert info.seq == 1
    assert listing(root) == ["a", "c", "latest"]
    assert_same(third, R.load_global(root))
    assert_same(first, R.load_global(root, name="a"))


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_commit_keeps_staging_of_a_save_the_coordinator_has_not_joined(tmp_path: Path, protocol: str) -> None:
    """A fast rank stages the next save while the coordinator still commits this one: that staging is in flight,
    not debris (collecting it left the next commit waiting for a manifest that was deleted). Staging the
    coordinator wrote into and did not commit is over, and goes."""
    root = tmp_path / "root"
    first, second = make_state(1), make_state(2)
    abandoned, a, b = R.new_save_id(), R.new_save_id(), R.new_save_id()
    stage(root, "old", abandoned, first, LAYOUTS4, [0, 1], 4, commit=protocol)  # ranks 2, 3 died; never committed
    stage(root, "a", a, first, LAYOUTS4, range(4), 4, commit=protocol)
    stage(root, "b", b, second, LAYOUTS4, [1, 3], 4, commit=protocol)  # ahead of the coordinator
    R.commit(root, "a", a, 4, commit=protocol)
    stale = "old" if protocol == "marker" else f".staging-old-{abandoned}"
    ahead = "b" if protocol == "marker" else f".staging-b-{b}"
    assert stale not in listing(root) and ahead in listing(root)
    stage(root, "b", b, second, LAYOUTS4, [0, 2], 4, commit=protocol)
    assert R.commit(root, "b", b, 4, commit=protocol).seq == 1
    assert_same(second, R.load_global(root))


def test_crash_after_index_before_rename(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The coordinator wrote the index into staging and died before the rename: still not a checkpoint."""
    root = tmp_path / "root"
    first = state2(1)
    R.save(root, first, LAYOUTS2, name="a")

    def die(staging: Path, final: Path) -> None:
        raise KeyboardInterrupt("simulated crash before rename")

    monkeypatch.setattr(PROTOCOLS["rename"], "finalize", die)
    with pytest.raises(KeyboardInterrupt):
        R.save(root, state2(2), LAYOUTS2, name="b")
    monkeypatch.undo()
    (staging,) = [p for p in root.iterdir() if p.name.startswith(".staging-b-")]
    assert (staging / "index.json").is_file()
    assert read_latest(root) == "a"
    assert committed_checkpoints(root) == {"a": 0}
    assert_same(first, R.load_global(root))
    R.save(root, state2(3), LAYOUTS2, name="c")
    assert listing(root) == ["a", "c", "latest"]


def test_leftover_trash_and_pointer_temp_files_are_collected(tmp_path: Path) -> None:
    root = tmp_path / "root"
    R.save(root, state2(1), LAYOUTS2, name="a")
    (root / ".trash-old-deadbeef").mkdir()
    (root / ".trash-old-deadbeef" / "rank-00000.safetensors").write_bytes(b"x")
    (root / ".latest-deadbeef.tmp").write_text("old\n")
    R.save(root, state2(2), LAYOUTS2, name="b")
    assert listing(root) == ["a", "b", "latest"]


def test_commit_with_missing_rank_names_it(tmp_path: Path) -> None:
    root = tmp_path / "root"
    R.save(root, make_state(0), LAYOUTS4, name="a")
    sid = R.new_save_id()
    stage(root, "b", sid, make_state(1), LAYOUTS4, [0, 2], 4)
    with pytest.raises(CheckpointIncomplete) as info:
        R.commit(root, "b", sid, 4)
    assert type(info.value) is CheckpointIncomplete
    assert "ranks [1, 3] did not finish" in str(info.value)
    assert str(root / f".staging-b-{sid}") in str(info.value)
    assert read_latest(root) == "a"
    assert committed_checkpoints(root) == {"a": 0}
    assert_same(make_state(0), R.load_global(root))


def test_checkpoint_exists_leaves_previous_and_staging_is_collected(tmp_path: Path) -> None:
    """The marker protocol cannot replace a name atomically and refuses; the rename protocol swaps it in."""
    root = tmp_path / "root"
    R.save(root, state2(1), LAYOUTS2, name="a", commit_protocol="marker")
    with pytest.raises(CheckpointExists):
        R.save(root, state2(2), LAYOUTS2, name="a", commit_protocol="marker")
    assert read_latest(root) == "a"
    assert_same(state2(1), R.load_global(root))
    R.save(root, state2(3), LAYOUTS2, name="b")
    assert listing(root) == ["a", "b", "latest"]
    R.save(root, state2(4), LAYOUTS2, name="b")  # rename protocol: replaced by one atomic exchange
    assert_same(state2(4), R.load_global(root, name="b"))
    assert listing(root) == ["a", "b", "latest"]


@given(
    crashed=st.sets(st.integers(0, 3), min_size=1),
    order_seed=st.integers(0, 2**16),
    data_seed=st.integers(0, 2**16),
)
def test_any_crashed_subset_blocks_commit(tmp_path_factory, crashed: set[int], order_seed: int, data_seed: int):
    root = tmp_path_factory.mktemp("crash")
    prev, nxt = make_state(data_seed), make_state(data_seed + 1)
    R.save(root, prev, LAYOUTS4, name="prev")
    survivors = [r for r in np.random.default_rng(order_seed).permutation(4).tolist() if r not in crashed]
    sid = R.new_save_id()
    stage(root, "next", sid, nxt, LAYOUTS4, survivors, 4)
    with pytest.raises(CheckpointIncomplete) as info:
        R.commit(root, "next", sid, 4)
    assert f"ranks {sorted(crashed)} did not finish" in str(info.value)
    assert read_latest(root) == "prev"
    assert committed_checkpoints(root) == {"prev": 0}
    assert_same(prev, R.load_global(root))
    # The crashed ranks come back and finish; now the same save commits and ``latest`` moves.
    stage(root, "next", sid, nxt, LAYOUTS4, sorted(crashed), 4)
    assert R.commit(root, "next", sid, 4).seq == 1
    assert read_latest(root) == "next"
    assert listing(root) == ["latest", "next", "prev"]
    assert_same(nxt, R.load_global(root))
    assert_same(prev, R.load_global(root, name="prev"))


# --- rotation and repeat loads -----------------------------------------------------------------------------


@pytest.mark.parametrize("keep", [1, 2, 3])
def test_rotation_keeps_newest(tmp_path: Path, keep: int) -> None:
    root = tmp_path / "root"
    names = [f"step-{i}" for i in range(5)]
    for i, name in enumerate(names):
        R.save(root, state2(i), LAYOUTS2, name=name, keep_last=keep)
        kept = names[max(0, i + 1 - keep) : i + 1]
        assert listing(root) == sorted([*kept, "latest"])
        assert read_latest(root) == name
    assert committed_checkpoints(root) == {n: names.index(n) for n in names[-keep:]}
    for name in names[-keep:]:
        assert_same(state2(names.index(name)), R.load_global(root, name=name))


def test_rotation_never_deletes_what_latest_names(tmp_path: Path) -> None:
    root = tmp_path / "root"
    for i, name in enumerate(["a", "b", "c", "d"]):
        R.save(root, state2(i), LAYOUTS2, name=name)
    set_latest(root, "a", "rollback")  # an operator rolled ``latest`` back to the oldest checkpoint
    assert rotate(root, 1, "rot") == ["c", "b"]
    assert listing(root) == ["a", "d", "latest"]
    assert read_latest(root) == "a"
    assert_same(state2(0), R.load_global(root))
    assert_same(state2(3), R.load_global(root, name="d"))
    with pytest.raises(R.CheckpointError):
        rotate(root, 0, "rot")


def test_loading_named_older_versions_repeats(tmp_path: Path) -> None:
    """P-REPEAT: each named version loads back as exactly what was saved under that name, any number of times,
    in any layout, however many newer versions exist."""
    root = tmp_path / "root"
    states = {f"v{i}": make_state(100 + i) for i in range(4)}
    for name, state in states.items():
        R.save(root, state, LAYOUTS4, name=name)
    for _ in range(2):
        for name, state in states.items():
            assert_same(state, R.load_global(root, name=name))
            for rank in range(4):
                expected = {k: lt.tensor for k, lt in R.local_tensors(state, LAYOUTS4, rank).items()}
                assert_same(expected, R.load_rank(root, specs(state), LAYOUTS4, rank, name=name))
    assert_same(states["v3"], R.load_global(root))


# --- marker protocol ---------------------------------------------------------------------------------------


def test_marker_protocol_uncommitted_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "root"
    first = make_state(1)
    R.save(root, first, LAYOUTS4, name="a", commit_protocol="marker")
    assert (root / "a" / "COMMITTED").is_file()

    def die(staging: Path, final: Path) -> None:
        raise KeyboardInterrupt("simulated crash before the marker")

    monkeypatch.setattr(PROTOCOLS["marker"], "finalize", die)
    with pytest.raises(KeyboardInterrupt):
        R.save(root, make_state(2), LAYOUTS4, name="b", commit_protocol="marker")
    monkeypatch.undo()
    assert (root / "b" / "index.json").is_file() and not (root / "b" / "COMMITTED").exists()
    assert read_latest(root) == "a"
    assert committed_checkpoints(root) == {"a": 0}
    assert_same(first, R.load_global(root))
    with pytest.raises(CheckpointIncomplete) as info:
        R.load_global(root, name="b")
    assert type(info.value) is CheckpointIncomplete and str(root / "b") in str(info.value)

    third = make_state(3)
    R.save(root, third, LAYOUTS4, name="c", commit_protocol="marker")  # collects the uncommitted "b"
    assert listing(root) == ["a", "c", "latest"]
    assert listing(root / "c") == ckpt_files(4, "marker")
    assert committed_checkpoints(root) == {"a": 0, "c": 1}
    assert_same(third, R.load_global(root))
    assert_same(first, R.load_global(root, name="a"))


def test_marker_protocol_crash_before_index(tmp_path: Path) -> None:
    root = tmp_path / "root"
    R.save(root, state2(1), LAYOUTS2, name="a", commit_protocol="marker")
    stage(root, "b", R.new_save_id(), state2(2), LAYOUTS2, [1], 2, commit="marker")
    assert listing(root / "b") == ["rank-00001.manifest.json", "rank-00001.safetensors"]
    with pytest.raises(CheckpointIncomplete):
        R.load_global(root, name="b")
    assert_same(state2(1), R.load_global(root))
    R.save(root, state2(3), LAYOUTS2, name="c", commit_protocol="marker", keep_last=1)
    assert listing(root) == ["c", "latest"]
    assert_same(state2(3), R.load_global(root))
