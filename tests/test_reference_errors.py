"""Typed errors of the reference engine on bad, incomplete and hostile checkpoints.

Every test starts from a good checkpoint saved by the reference, tampers with it on disk, and asserts the exact
error class (not merely a superclass) and that the message names the offending file or checkpoint and the problem.
"""

from __future__ import annotations

import ast
import json
import os
import pickle
import shutil
import struct
import threading
import zlib
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy
from safetensors import safe_open

import reference as R
from reference import (
    Box,
    CheckpointExists,
    CheckpointIncomplete,
    CheckpointNotFound,
    ChecksumMismatch,
    CorruptCheckpoint,
    FlatRange,
    HeaderTooLarge,
    MalformedMetadata,
    Mesh,
    MissingSlices,
    MissingTensor,
    OverlappingSlices,
    Replicate,
    Shard,
    Sharded,
    Target,
    TargetMismatch,
    Tensor,
    UnsafePath,
    UnsupportedFormatVersion,
    flat_group,
)
from reference.disk.commit import pointer_text
from reference.disk.index import encode_index
from reference.disk.stio import SafetensorsReader

MESH2 = Mesh((2,))
LAYOUTS = {"w": Sharded(MESH2, (Shard(0),)), "b": Sharded(MESH2, (Replicate(),))}
RANK0 = "rank-00000.safetensors"
RANK1 = "rank-00001.safetensors"


def make_state() -> dict[str, Tensor]:
    return {
        "w": Tensor.from_array(np.arange(32, dtype=np.float32).reshape(8, 4) * 0.5),
        "b": Tensor.from_array(np.arange(6, dtype=np.int64) - 3),
    }


def specs(state: dict[str, Tensor]) -> dict[str, tuple[str, tuple[int, ...]]]:
    return {k: (v.dtype.name, v.shape) for k, v in state.items()}


def assert_same(expected: dict[str, Tensor], actual: dict[str, Tensor]) -> None:
    assert R.diff_states(expected, actual) == []


def raises_exactly(exc_type: type[BaseException], fn, *needles: str) -> BaseException:
    """Call ``fn``; it must raise exactly ``exc_type`` (not a sub- or superclass) whose text holds ``needles``."""
    with pytest.raises(exc_type) as info:
        fn()
    err = info.value
    assert type(err) is exc_type, f"expected {exc_type.__name__}, got {type(err).__name__}: {err}"
    for needle in needles:
        assert needle in str(err), f"{needle!r} not in {str(err)!r}"
    return err


@pytest.fixture
def good(tmp_path: Path) -> tuple[Path, Path, dict[str, Tensor]]:
    """A committed two-rank checkpoint ``a`` under ``root``: (root, checkpoint dir, saved state)."""
    root = tmp_path / "root"
    state = make_state()
    info = R.save(root, state, LAYOUTS, name="a")
    assert info.path == root / "a"
    assert_same(state, R.load_global(root))  # the untampered checkpoint is good
    return root, root / "a", state


def read_index(ckpt: Path) -> dict:
    """The index body (index.json is a checksummed envelope around it)."""
    return json.loads((ckpt / "index.json").read_bytes())["body"]


def write_index(ckpt: Path, data: dict) -> None:
    """Rewrite the index with a valid checksum, so only the edited content is wrong."""
    (ckpt / "index.json").write_bytes(encode_index(data))


def slice_record(index: dict, key: str) -> dict:
    (rec,) = [s for s in index["slices"] if s["key"] == key]
    return rec


def flip_bit(path: Path, offset: int, bit: int = 0) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ (1 << bit)]))


# --- CheckpointIncomplete ----------------------------------------------------------------------------------


def test_deleted_data_file_is_incomplete(good) -> None:
    root, ckpt, state = good
    (ckpt / RANK1).unlink()
    raises_exactly(CheckpointIncomplete, lambda: R.load_global(root), str(ckpt / RANK1), "missing")
    # A rank whose targets live only in the surviving file still loads: only needed files are opened.
    loaded = R.load_rank(root, specs(state), LAYOUTS, 0)
    assert_same({"w": R.extract(state["w"], Box((0, 0), (4, 4))), "b": state["b"]}, loaded)


def test_dir_without_index_is_incomplete(good) -> None:
    root, ckpt, _ = good
    (ckpt / "index.json").unlink()
    raises_exactly(CheckpointIncomplete, lambda: R.load_global(root, name="a"), str(ckpt), "never committed")
    # ``latest`` still names it: loading the latest says the same thing about the latest pointer.
    raises_exactly(
        CheckpointIncomplete, lambda: R.load_global(root), str(root), "'a'", "latest pointer target", "never committed"
    )


def test_root_with_only_staging_dir_has_no_checkpoint(tmp_path: Path) -> None:
    """A first save that crashed before commit leaves only a hidden staging dir: there is no committed
    checkpoint at all (CheckpointNotFound), and the staging dir itself cannot be named (UnsafePath)."""
    root = tmp_path / "root"
    state = make_state()
    sid = R.new_save_id()
    for rank in range(2):
        R.save_rank(root, "a", sid, rank, 2, R.local_tensors(state, LAYOUTS, rank))
    assert sorted(os.listdir(root)) == [f".staging-a-{sid}"]
    raises_exactly(CheckpointNotFound, lambda: R.load_global(root), str(root), "no committed checkpoint")
    raises_exactly(CheckpointNotFound, lambda: R.load_global(root, name="a"), "'a'")
    raises_exactly(UnsafePath, lambda: R.load_global(root, name=f".staging-a-{sid}"), "not a plain name")


def test_staging_dir_renamed_without_index_is_incomplete(tmp_path: Path) -> None:
    root = tmp_path / "root"
    state = make_state()
    sid = R.new_save_id()
    for rank in range(2):
        R.save_rank(root, "a", sid, rank, 2, R.local_tensors(state, LAYOUTS, rank))
    os.rename(root / f".staging-a-{sid}", root / "a")
    raises_exactly(CheckpointIncomplete, lambda: R.load_global(root, name="a"), str(root / "a"), "never committed")


def test_latest_naming_missing_dir_is_incomplete(good) -> None:
    root, _, _ = good
    (root / "latest").write_text(pointer_text("gone"))  # a well-formed pointer to nothing
    raises_exactly(
        CheckpointIncomplete,
        lambda: R.load_global(root),
        str(root),
        "'gone'",
        "latest pointer target",
        "does not exist",
    )


def test_latest_naming_uncommitted_marker_dir_is_incomplete(tmp_path: Path) -> None:
    root = tmp_path / "root"
    state = make_state()
    R.save(root, state, LAYOUTS, name="m", commit_protocol="marker")
    assert_same(state, R.load_global(root))
    (root / "m" / "COMMITTED").unlink()
    raises_exactly(
        CheckpointIncomplete, lambda: R.load_global(root), str(root), "'m'", "latest pointer target", "never committed"
    )
    raises_exactly(CheckpointIncomplete, lambda: R.load_global(root, name="m"), str(root / "m"), "never committed")


# --- ChecksumMismatch --------------------------------------------------------------------------------------


def test_flipped_bit_in_data_is_checksum_mismatch(good) -> None:
    root, ckpt, state = good
    rec = slice_record(read_index(ckpt), "w#1")
    flip_bit(ckpt / RANK1, rec["offset"] + 5, 3)
    raises_exactly(ChecksumMismatch, lambda: R.load_global(root), str(ckpt / RANK1), "'w#1'", "block 0")
    # Rank 0 needs nothing from the corrupted slice.
    loaded = R.load_rank(root, specs(state), LAYOUTS, 0)
    assert_same({"w": R.extract(state["w"], Box((0, 0), (4, 4))), "b": state["b"]}, loaded)


def test_small_blocks_verify_only_what_is_read(tmp_path: Path) -> None:
    """With 8-byte checksum blocks, corrupting one block fails exactly the loads that need that block."""
    root = tmp_path / "root"
    m = Tensor.from_array(np.arange(64, dtype=np.float32).reshape(8, 8) + 0.25)
    state = {"m": m}
    R.save(root, state, name="small", block=8)  # no layout: one slice of the whole tensor on rank 0
    index = read_index(root / "small")
    rec = slice_record(index, "m#0")
    assert index["block"] == 8 and len(rec["crc32"]) == 256 // 8
    # Element (3, 6) is flat element 30, bytes 120..124 of the slice: checksum block 15 (bytes 120..128).
    flip_bit(root / "small" / RANK0, rec["offset"] + 30 * 4 + 2, 6)

    column_split = {"m": Sharded(MESH2, (Shard(1),))}
    left = R.load_rank(root, specs(state), column_split, 0)  # columns 0..4 only: blocks 0,1 of each row
    assert_same({"m": R.extract(m, Box((0, 0), (8, 4)))}, left)
    head = R.load(root, {"m": Target(m.dtype, m.shape, FlatRange(0, 30))})
    assert_same({"m": R.extract(m, FlatRange(0, 30))}, head)
    tail = R.load(root, {"m": Target(m.dtype, m.shape, Box((4, 0), (4, 8)))})
    assert_same({"m": R.extract(m, Box((4, 0), (4, 8)))}, tail)

    path = str(root / "small" / RANK0)
    raises_exactly(ChecksumMismatch, lambda: R.load_rank(root, specs(state), column_split, 1), path, "block 15")
    raises_exactly(
        ChecksumMismatch, lambda: R.load(root, {"m": Target(m.dtype, m.shape, FlatRange(30, 31))}), path, "block 15"
    )
    raises_exactly(ChecksumMismatch, lambda: R.load_global(root), path, "'m#0'", "block 15 (bytes 120..128)")


# --- MissingSlices / OverlappingSlices ---------------------------------------------------------------------


def test_dropped_slice_is_missing_slices(good) -> None:
    root, ckpt, _ = good
    index = read_index(ckpt)
    index["slices"] = [s for s in index["slices"] if s["key"] != "w#1"]
    write_index(ckpt, index)
    raises_exactly(MissingSlices, lambda: R.load_global(root), str(ckpt / "index.json"), "'w'", "16 of 32")


def test_duplicated_slice_is_overlapping(good) -> None:
    root, ckpt, _ = good
    index = read_index(ckpt)
    index["slices"].append(dict(slice_record(index, "w#0")))
    write_index(ckpt, index)
    raises_exactly(OverlappingSlices, lambda: R.load_global(root), str(ckpt / "index.json"), "'w'", "overlap")


def test_shifted_box_is_overlapping(good) -> None:
    root, ckpt, _ = good
    index = read_index(ckpt)
    rec = slice_record(index, "w#1")
    assert rec["region"] == {"box": {"offsets": [4, 0], "shape": [4, 4]}}
    rec["region"] = {"box": {"offsets": [3, 0], "shape": [4, 4]}}  # same bytes and volume: only the cover is wrong
    write_index(ckpt, index)
    raises_exactly(OverlappingSlices, lambda: R.load_global(root), str(ckpt / "index.json"), "'w'", "overlap at [3, 0]")


@pytest.fixture
def flat_ckpt(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "root"
    state = {
        "p": Tensor.from_array(np.arange(15, dtype=np.float32).reshape(3, 5)),
        "q": Tensor.from_array(np.arange(7, dtype=np.int32)),
    }
    layouts = flat_group(MESH2, 0, [("p", (3, 5)), ("q", (7,))], align=4)
    R.save(root, state, layouts, name="f")
    assert_same(state, R.load_global(root))
    index = read_index(root / "f")
    assert sorted(s["region"]["flat"] for s in index["slices"] if s["tensor"] == "p") == [[0, 12], [12, 15]]
    return root, root / "f"


def test_flat_dropped_slice_is_missing_slices(flat_ckpt) -> None:
    root, ckpt = flat_ckpt
    index = read_index(ckpt)
    index["slices"] = [s for s in index["slices"] if not (s["tensor"] == "p" and s["region"]["flat"][0] == 12)]
    write_index(ckpt, index)
    raises_exactly(MissingSlices, lambda: R.load_global(root), str(ckpt / "index.json"), "'p'", "element 12")


def test_flat_duplicated_slice_is_overlapping(flat_ckpt) -> None:
    root, ckpt = flat_ckpt
    index = read_index(ckpt)
    index["slices"].append(dict(next(s for s in index["slices"] if s["tensor"] == "p")))
    write_index(ckpt, index)
    raises_exactly(OverlappingSlices, lambda: R.load_global(root), str(ckpt / "index.json"), "'p'", "saved twice")


# --- UnsupportedFormatVersion ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [("version", 999, "version 999"), ("format", "some-other-format", "'some-other-format'"), ("version", "1", "'1'")],
)
def test_unknown_format_or_version(good, field: str, value: object, needle: str) -> None:
    root, ckpt, _ = good
    index = read_index(ckpt)
    index[field] = value
    write_index(ckpt, index)
    raises_exactly(UnsupportedFormatVersion, lambda: R.load_global(root), str(ckpt / "index.json"), needle)


# --- UnsafePath --------------------------------------------------------------------------------------------


def _rename_data_file(ckpt: Path, old: str, new: str) -> None:
    index = read_index(ckpt)
    index["files"][new] = index["files"].pop(old)
    for s in index["slices"]:
        if s["file"] == old:
            s["file"] = new
    write_index(ckpt, index)


@pytest.mark.parametrize("kind", ["dotdot", "absolute", "subdir"])
def test_hostile_data_file_names(good, kind: str) -> None:
    """The index names a data file outside the checkpoint; a copy of the real file waits there, so only the
    name check stands between the loader and reading it."""
    root, ckpt, _ = good
    if kind == "dotdot":
        name = "../x.safetensors"
        shutil.copy(ckpt / RANK1, root / "x.safetensors")
    elif kind == "absolute":
        outside = root.parent / "outside.safetensors"
        shutil.copy(ckpt / RANK1, outside)
        name = str(outside)
    else:
        name = f"sub/{RANK1}"
        (ckpt / "sub").mkdir()
        shutil.copy(ckpt / RANK1, ckpt / "sub" / RANK1)
    _rename_data_file(ckpt, RANK1, name)
    raises_exactly(UnsafePath, lambda: R.load_global(root), str(ckpt / "index.json"), repr(name), "not a plain name")


def test_latest_with_traversal_is_unsafe(good) -> None:
    root, _, state = good
    evil = root.parent / "evil"
    shutil.copytree(root / "a", evil)  # a perfectly loadable checkpoint outside the root
    (root / "latest").write_text(pointer_text("../evil"))  # checksummed, still refused
    raises_exactly(UnsafePath, lambda: R.load_global(root), str(root / "latest"), "'../evil'")
    assert_same(state, R.load_global(root, name="a"))  # naming a checkpoint explicitly bypasses the pointer


def test_latest_symlink_is_unsafe(good) -> None:
    root, _, _ = good
    (root / "pointer").write_text("a\n")
    (root / "latest").unlink()
    (root / "latest").symlink_to(root / "pointer")
    raises_exactly(UnsafePath, lambda: R.load_global(root), str(root / "latest"), "symlink")


def test_data_file_symlink_is_unsafe(good) -> None:
    root, ckpt, _ = good
    outside = root.parent / "outside.safetensors"
    shutil.copy(ckpt / RANK1, outside)  # byte-identical: only the link itself is wrong
    (ckpt / RANK1).unlink()
    (ckpt / RANK1).symlink_to(outside)
    raises_exactly(UnsafePath, lambda: R.load_global(root), str(ckpt / RANK1), "symbolic link")


def test_data_file_replaced_by_directory_is_unsafe(good) -> None:
    root, ckpt, _ = good
    (ckpt / RANK1).unlink()
    (ckpt / RANK1).mkdir()
    raises_exactly(UnsafePath, lambda: R.load_global(root), str(ckpt / RANK1), "not a regular file")


def test_data_file_replaced_by_fifo_is_unsafe_without_hanging(good) -> None:
    """A named pipe where a data file should be must be refused, not opened: opening a FIFO for reading blocks
    until some writer appears, so a hostile checkpoint would hang every loader."""
    root, ckpt, _ = good
    fifo = ckpt / RANK1
    fifo.unlink()
    os.mkfifo(fifo)
    outcome: list[BaseException | None] = []

    def attempt() -> None:
        try:
            R.load_global(root)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(10)
    hung = worker.is_alive()
    if hung:  # release the blocked open() so the thread ends, then report the hang
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        worker.join(10)
        os.close(fd)
    assert not hung, "load blocked for 10 s opening a FIFO planted as a data file"
    (err,) = outcome
    assert type(err) is UnsafePath and str(fifo) in str(err), err


def test_index_symlink_is_unsafe(good, tmp_path: Path) -> None:
    """index.json must not be a link out of the checkpoint, as data files and ``latest`` must not be."""
    root, ckpt, _ = good
    elsewhere = tmp_path / "elsewhere.json"
    shutil.copy(ckpt / "index.json", elsewhere)
    (ckpt / "index.json").unlink()
    (ckpt / "index.json").symlink_to(elsewhere)
    with pytest.raises(UnsafePath) as info:
        R.load_global(root, name="a")
    assert str(ckpt / "index.json") in str(info.value)


@pytest.mark.parametrize("name", ["../x", "/etc", "a/b", "..", ".hidden", ""])
def test_hostile_checkpoint_name_on_load(good, name: str) -> None:
    root, _, _ = good
    raises_exactly(UnsafePath, lambda: R.load_global(root, name=name), str(root), repr(name))
    raises_exactly(UnsafePath, lambda: R.load(root, {}, name=name), str(root), repr(name))


def test_hostile_checkpoint_name_on_save(tmp_path: Path) -> None:
    root = tmp_path / "root"
    raises_exactly(UnsafePath, lambda: R.save(root, make_state(), LAYOUTS, name="../x"), "'../x'")
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing was written, inside or outside the root


# --- HeaderTooLarge ----------------------------------------------------------------------------------------


def test_absurd_header_length(good) -> None:
    root, ckpt, _ = good
    with open(ckpt / RANK0, "r+b") as f:
        f.write(struct.pack("<Q", 1 << 62))
    raises_exactly(HeaderTooLarge, lambda: R.load_global(root), str(ckpt / RANK0), f"header claims {1 << 62} bytes")


def test_header_length_beyond_file_size(good) -> None:
    root, ckpt, _ = good
    size = (ckpt / RANK0).stat().st_size
    with open(ckpt / RANK0, "r+b") as f:
        f.write(struct.pack("<Q", size))  # fewer than the 100 MiB cap, more than the file holds after the prefix
    raises_exactly(
        HeaderTooLarge, lambda: R.load_global(root), str(ckpt / RANK0), f"claims {size} bytes", f"has {size}"
    )


# --- CorruptCheckpoint -------------------------------------------------------------------------------------


def test_truncated_data_file(good) -> None:
    root, ckpt, _ = good
    path = ckpt / RANK1
    size = path.stat().st_size
    os.truncate(path, size - 4)
    raises_exactly(CorruptCheckpoint, lambda: R.load_global(root), str(path), f"file is {size - 4} bytes", f"{size}")


def test_file_shorter_than_a_header(good) -> None:
    root, ckpt, _ = good
    os.truncate(ckpt / RANK1, 5)
    raises_exactly(CorruptCheckpoint, lambda: R.load_global(root), str(ckpt / RANK1), "file is 5 bytes")
    # Read without an index to compare with (its size check comes first), the header itself is too short.
    raises_exactly(CorruptCheckpoint, lambda: SafetensorsReader(ckpt / RANK1), str(ckpt / RANK1), "too short")


def test_appended_garbage(good) -> None:
    root, ckpt, _ = good
    path = ckpt / RANK1
    size = path.stat().st_size
    with open(path, "ab") as f:
        f.write(b"garbage!")
    raises_exactly(
        CorruptCheckpoint, lambda: R.load_global(root), str(path), f"file is {size + 8} bytes", f"says {size}"
    )


def test_header_json_garbage(good) -> None:
    root, ckpt, _ = good
    path = ckpt / RANK0
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    garbage = b"{not json" + b"#" * (length - 9)
    path.write_bytes(raw[:8] + garbage + raw[8 + length :])
    # The index's checksum of the header is verified before a byte of the header is parsed ...
    raises_exactly(CorruptCheckpoint, lambda: R.load_global(root), str(path), "header checksum mismatch")
    index = read_index(ckpt)
    index["files"][RANK0]["header_crc32"] = zlib.crc32(raw[:8] + garbage)
    write_index(ckpt, index)
    # ... and a header whose checksum was forged is still parsed strictly.
    raises_exactly(MalformedMetadata, lambda: R.load_global(root), str(path), "header is not valid JSON")


def test_header_rewritten_as_other_valid_json(good) -> None:
    root, ckpt, _ = good
    path = ckpt / RANK0
    raw = path.read_bytes()
    assert raw.count(b'"I64"') == 1
    path.write_bytes(raw.replace(b'"I64"', b'"U64"'))  # same length, still valid, lies about the dtype
    raises_exactly(CorruptCheckpoint, lambda: R.load_global(root), str(path), "header checksum mismatch")


def test_index_names_another_checkpoint(good) -> None:
    root, ckpt, _ = good
    os.rename(ckpt, root / "b")
    raises_exactly(CorruptCheckpoint, lambda: R.load_global(root, name="b"), str(root / "b"), "'a'")


def test_malformed_index_record(good) -> None:
    root, ckpt, _ = good
    index = read_index(ckpt)
    slice_record(index, "w#0")["nbytes"] = -1
    write_index(ckpt, index)
    raises_exactly(MalformedMetadata, lambda: R.load_global(root), str(ckpt / "index.json"), "nbytes = -1")


@pytest.mark.parametrize("by_name", [False, True])
def test_index_not_json_is_corrupt(good, by_name: bool) -> None:
    """A committed checkpoint (rename protocol: index.json present) whose index is not JSON is corrupt, not
    incomplete: it was committed, and its bytes are bad."""
    root, ckpt, _ = good
    (ckpt / "index.json").write_bytes(b"{this is not json")
    kwargs = {"name": "a"} if by_name else {}
    raises_exactly(
        MalformedMetadata, lambda: R.load_global(root, **kwargs), str(ckpt / "index.json"), "checksummed envelope"
    )


# --- TargetMismatch / MissingTensor / CheckpointNotFound / CheckpointExists --------------------------------


def test_target_with_wrong_dtype(good) -> None:
    root, ckpt, _ = good
    target = {"w": Target(R.dtype("F64"), (8, 4), Box((0, 0), (8, 4)))}
    raises_exactly(TargetMismatch, lambda: R.load(root, target), str(ckpt), "'w'", "F32[8, 4]", "F64[8, 4]")
    spec = {"w": ("I32", (8, 4))}
    raises_exactly(TargetMismatch, lambda: R.load_rank(root, spec, LAYOUTS, 1), str(ckpt), "I32[8, 4]")


def test_target_with_wrong_shape(good) -> None:
    root, ckpt, _ = good
    target = {"w": Target(R.dtype("F32"), (4, 8), Box((0, 0), (4, 8)))}
    raises_exactly(TargetMismatch, lambda: R.load(root, target), str(ckpt), "'w'", "F32[8, 4]", "F32[4, 8]")
    spec = {"b": ("I64", (7,))}
    raises_exactly(TargetMismatch, lambda: R.load_rank(root, spec, LAYOUTS, 0), str(ckpt), "'b'", "I64[7]")


@pytest.mark.parametrize("region", [Box((6, 0), (4, 4)), Box((-1, 0), (2, 4)), Box((0,), (8,)), FlatRange(30, 40),
                                    FlatRange(5, 3), Box((0, 0), (2**40, 4))])
def test_target_region_out_of_range_is_refused_before_allocating(good, region) -> None:
    """A caller's region outside the tensor (or of the wrong rank) is its mistake, said before any buffer is made
    (a 2**40-row region would otherwise allocate a TiB)."""
    root, ckpt, _ = good
    target = {"w": Target(R.dtype("F32"), (8, 4), region)}
    raises_exactly(TargetMismatch, lambda: R.load(root, target), str(ckpt), "'w'", "out of range")


def test_missing_tensor(good) -> None:
    root, ckpt, _ = good
    target = {"nope": Target(R.dtype("F32"), (2,), Box((0,), (2,)))}
    raises_exactly(MissingTensor, lambda: R.load(root, target), str(ckpt), "'nope'")
    raises_exactly(MissingTensor, lambda: R.load_global(root, names=["w", "nope"]), str(root), "'nope'")


def test_checkpoint_not_found(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    raises_exactly(CheckpointNotFound, lambda: R.load_global(empty), str(empty), "no committed checkpoint")
    absent = tmp_path / "absent"
    raises_exactly(CheckpointNotFound, lambda: R.load_global(absent), str(absent), "no committed checkpoint")
    R.save(empty, make_state(), LAYOUTS, name="a")
    raises_exactly(CheckpointNotFound, lambda: R.load_global(empty, name="zzz"), str(empty), "'zzz'")


def test_saving_a_name_again_replaces_it_atomically(tmp_path: Path) -> None:
    """A job resumed from an older step saves that step again: the rename protocol swaps the new checkpoint in by
    one atomic exchange (the old one is never overwritten in place, and nothing of it is left behind)."""
    root = tmp_path / "root"
    first = make_state()
    R.save(root, first, LAYOUTS, name="a")
    R.save(root, first, LAYOUTS, name="b")
    second = {k: Tensor.from_array(v.values() + 1) for k, v in first.items()}
    R.save(root, second, LAYOUTS, name="a")
    assert R.read_latest(root) == "a"
    assert_same(second, R.load_global(root))
    assert_same(second, R.load_global(root, name="a"))
    assert sorted(p.name for p in root.iterdir()) == ["a", "b", "latest"]


def test_the_marker_protocol_refuses_to_save_a_name_again(tmp_path: Path) -> None:
    """In place, published by a marker: replacing a name could not be atomic, so it is refused clearly."""
    root = tmp_path / "root"
    first = make_state()
    R.save(root, first, LAYOUTS, name="a", commit_protocol="marker")
    second = {k: Tensor.from_array(v.values() + 1) for k, v in first.items()}
    raises_exactly(
        CheckpointExists,
        lambda: R.save(root, second, LAYOUTS, name="a", commit_protocol="marker"),
        str(root / "a"),
        "already committed",
    )
    assert R.read_latest(root) == "a"
    assert_same(first, R.load_global(root))  # never overwritten in place


# --- manifests: the coordinator trusts nothing a rank wrote ------------------------------------------------


def _staged(tmp_path: Path) -> tuple[Path, str, Path]:
    """Two ranks staged, not committed: (root, save id, rank 1's manifest)."""
    root = tmp_path / "root"
    sid = R.new_save_id()
    for rank in range(2):
        R.save_rank(root, "a", sid, rank, 2, R.local_tensors(make_state(), LAYOUTS, rank))
    return root, sid, root / f".staging-a-{sid}" / "rank-00001.manifest.json"


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda raw: raw[:40] + bytes([raw[40] ^ 1]) + raw[41:], "fails its checksum"),
        (lambda raw: encode_index([1, 2]), "manifest is a list"),
        (lambda raw: encode_index({**json.loads(raw)["body"], "tensors": []}), "manifest.tensors is a list"),
        (lambda raw: encode_index({**json.loads(raw)["body"], "rank": 0}), "describes rank 0"),
        (lambda raw: encode_index({**json.loads(raw)["body"], "size": True}), "manifest.size is a boolean"),
        (lambda raw: b"[" * 100_000, "not a checksummed envelope"),
    ],
)
def test_hostile_manifest_fails_the_commit_typed(tmp_path: Path, edit, needle: str) -> None:
    root, sid, manifest = _staged(tmp_path)
    manifest.write_bytes(edit(manifest.read_bytes()))
    raises_exactly(MalformedMetadata, lambda: R.commit(root, "a", sid, 2), str(manifest), needle)
    assert R.committed_checkpoints(root) == {}


def test_meta_the_reader_would_refuse_is_refused_at_save(tmp_path: Path) -> None:
    """The commit parses its index back as a load reads it, so nothing unloadable is ever published."""
    root = tmp_path / "root"
    deep: dict = {}
    for _ in range(40):
        deep = {"x": deep}
    raises_exactly(MalformedMetadata, lambda: R.save(root, make_state(), LAYOUTS, name="a", meta=deep), "deeper")
    raises_exactly(MalformedMetadata, lambda: R.save(root, make_state(), LAYOUTS, name="a", meta={"n": 10**30}),
                   "digits")
    with pytest.raises(R.LayoutError, match="finite"):
        R.save(root, make_state(), LAYOUTS, name="a", meta={"loss": float("nan")})
    assert R.committed_checkpoints(root) == {}


# --- never unpickles ---------------------------------------------------------------------------------------


class _Trap:
    """Unpickling this opens (creates) ``path``: proof that a loader executed code from the checkpoint."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_never_unpickles(good, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, ckpt, state = good
    control = tmp_path / "control-sentinel"
    pickle.loads(pickle.dumps(_Trap(control))).close()  # the payload really does run when unpickled
    assert control.exists()

    sentinel = tmp_path / "sentinel"
    payload = pickle.dumps(_Trap(sentinel))
    for name in ("model.pdparams", "model.pdopt", "optimizer.pt", "state.pkl", "extra_state.bin"):
        (ckpt / name).write_bytes(payload)
    (root / "stray.pdparams").write_bytes(payload)

    def refuse(*args, **kwargs):
        raise AssertionError("the reference engine unpickled something")

    for attr in ("load", "loads", "Unpickler"):
        monkeypatch.setattr(pickle, attr, refuse)
    monkeypatch.setattr(np, "load", refuse)

    assert_same(state, R.load_global(root))
    assert_same(state, R.load_global(root, name="a"))
    for rank in range(2):
        expected = {k: lt.tensor for k, lt in R.local_tensors(state, LAYOUTS, rank).items()}
        assert_same(expected, R.load_rank(root, specs(state), LAYOUTS, rank))
    assert R.read_meta(root) == {}
    assert R.committed_checkpoints(root) == {"a": 0}
    # A data file replaced by a pickle is rejected as a corrupt safetensors file, never unpickled.
    (ckpt / RANK0).write_bytes(payload)
    with pytest.raises(CorruptCheckpoint) as info:
        R.load_global(root)
    assert str(ckpt / RANK0) in str(info.value)
    assert not sentinel.exists()


def test_reference_source_has_no_pickle() -> None:
    package = Path(R.__file__).parent
    sources = sorted(package.glob("*.py"))
    assert sources
    for source in sources:
        tree = ast.parse(source.read_text(), str(source))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                names = []
            assert not any(n.split(".")[0] in ("pickle", "cPickle", "dill", "cloudpickle", "torch") for n in names), (
                source
            )
            if isinstance(node, ast.keyword):
                assert node.arg != "allow_pickle", source


# --- interop with the safetensors library ------------------------------------------------------------------


def test_files_are_readable_by_safetensors(tmp_path: Path) -> None:
    root = tmp_path / "root"
    state = {
        "f32": Tensor.from_array(np.array([[1.5, -0.0], [np.inf, 3.0e-42]], dtype=np.float32)),
        "f16": Tensor.from_array(np.array([1.0, -2.5, 65504.0], dtype=np.float16)),
        "i64": Tensor.from_array(np.array([[-(2**62), 7, 0]], dtype=np.int64)),
        "u8": Tensor.from_array(np.arange(10, dtype=np.uint8)),
        "flag": Tensor.from_array(np.array([True, False, True])),
    }
    layouts = {"f32": Sharded(MESH2, (Shard(0),)), "i64": Sharded(MESH2, (Shard(1),))}
    R.save(root, state, layouts, name="interop")
    ckpt = root / "interop"
    seen: dict[str, np.ndarray] = {}
    for rank in range(2):
        path = ckpt / f"rank-{rank:05d}.safetensors"
        expected = {f"{k}#{rank}": lt.tensor for k, lt in R.local_tensors(state, layouts, rank).items() if lt.saves}
        whole = safetensors.numpy.load_file(str(path))
        assert sorted(whole) == sorted(expected)
        with safe_open(str(path), framework="np") as f:
            assert sorted(f.keys()) == sorted(expected)
            for key, tensor in expected.items():
                arr = f.get_tensor(key)
                assert arr.shape == tensor.shape
                assert arr.dtype.itemsize == tensor.dtype.itemsize
                assert np.ascontiguousarray(arr).tobytes() == tensor.bits.tobytes(), key
                assert whole[key].tobytes() == tensor.bits.tobytes(), key
                seen[key] = arr
    assert sorted(seen) == ["f16#0", "f32#0", "f32#1", "flag#0", "i64#0", "i64#1", "u8#0"]
    assert seen["f32#1"].dtype == np.float32 and np.signbit(seen["f32#0"][0, 1])
    assert seen["flag#0"].dtype == np.bool_
