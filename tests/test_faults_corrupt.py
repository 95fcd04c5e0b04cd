"""The corruption injectors do exactly what their spec says, deterministically, and never outside the checkpoint
dir; and, as a usefulness check, the reference engine meets P-CORRUPT under every kind of them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

import reference
from faults.corrupt import (
    HEAD_BYTES,
    KINDS,
    MARKER_NAMES,
    REGIONS,
    TAIL_BYTES,
    Corruption,
    FaultSpecError,
    apply,
    copy_tree,
    eligible_files,
    enumerate_corruptions,
    garbage,
    plan,
    snapshot,
)

SEEDS = range(6)


def _tree(root: Path, seed: int = 0) -> Path:
    """A small directory of random files: one big enough that head and tail regions differ, one nested, one empty."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    (root / "big.bin").write_bytes(rng.bytes(3 * HEAD_BYTES + 123))
    (root / "small.json").write_bytes(rng.bytes(57))
    (root / "sub").mkdir()
    (root / "sub" / "nested.dat").write_bytes(rng.bytes(300))
    (root / "empty").write_bytes(b"")
    return root


def _read_all(root: Path) -> dict[str, bytes]:
    return {rel: (root / rel).read_bytes() for rel, _ in eligible_files(root)}


# --- each kind does exactly what it says ---------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("region", REGIONS)
@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_changes_exactly_what_it_says(tmp_path: Path, kind: str, region: str, seed: int) -> None:
    root = _tree(tmp_path / "d")
    before = _read_all(root)
    c = plan(root, kind, seed, region)
    assert c.kind == kind
    apply(root, c)
    after = _read_all(root)
    others = set(before) - {c.path}
    assert {k: after.get(k) for k in others} == {k: before[k] for k in others}, "another file changed"
    old, new = before.get(c.path), after.get(c.path)
    if kind == "bitflip":
        assert len(new) == len(old)
        diff = np.unpackbits(np.frombuffer(old, np.uint8) ^ np.frombuffer(new, np.uint8))
        assert diff.sum() == 1
        assert np.flatnonzero(diff)[0] == c.offset * 8 + (7 - c.bit)  # unpackbits is MSB first
    elif kind == "truncate":
        assert c.length < len(old) and new == old[: c.length]
    elif kind == "append":
        assert new == old + garbage(c.seed, c.length) and c.length >= 1
    elif kind == "delete":
        assert old is not None and new is None
    elif kind == "stale_marker":
        assert old is None and new == c.content.encode() and c.path in MARKER_NAMES
    elif kind == "zero_range":
        assert len(new) == len(old) and c.length >= 1
        assert new == old[: c.offset] + bytes(c.length) + old[c.offset + c.length :]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("kind", ["bitflip", "truncate", "zero_range"])
def test_region_bounds(tmp_path: Path, kind: str, seed: int) -> None:
    root = _tree(tmp_path / "d")
    sizes = dict(eligible_files(root))
    for region in ("head", "tail"):
        c = plan(root, kind, seed, region)
        size = sizes[c.path]
        pos = c.length if kind == "truncate" else c.offset
        assert 0 <= pos < size
        if region == "head":
            assert pos < HEAD_BYTES
        else:
            assert pos >= size - TAIL_BYTES
        if kind == "zero_range":
            assert c.offset + c.length <= size


def test_plan_skips_empty_files_and_symlinks(tmp_path: Path) -> None:
    root = _tree(tmp_path / "d")
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"x" * 100)
    os.symlink(outside, root / "link.bin")
    os.symlink(tmp_path, root / "linkdir")
    listed = [rel for rel, _ in eligible_files(root)]
    assert listed == ["big.bin", "empty", "small.json", "sub/nested.dat"]
    for kind in ("bitflip", "truncate", "zero_range"):
        assert {plan(root, kind, s).path for s in range(40)} <= {"big.bin", "small.json", "sub/nested.dat"}


# --- determinism and replay ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_same_seed_same_corruption_same_bytes(tmp_path: Path, kind: str) -> None:
    a, b = _tree(tmp_path / "a"), _tree(tmp_path / "b")
    for seed in range(3):  # three changes, each on the result of the last; leaves a file for every kind
        ca, cb = plan(a, kind, seed), plan(b, kind, seed)
        assert ca == cb
        replay = Corruption.from_json(json.loads(json.dumps(ca.to_json())))
        apply(a, ca)
        apply(b, replay)
        assert _read_all(a) == _read_all(b)
    assert enumerate_corruptions(a) == enumerate_corruptions(b)


def test_enumerate_is_deterministic_and_deduplicated(tmp_path: Path) -> None:
    root = _tree(tmp_path / "d")
    cs = enumerate_corruptions(root, KINDS, seeds_per_kind=6)
    assert cs == enumerate_corruptions(root, KINDS, seeds_per_kind=6)
    assert len(cs) == len(set(cs))
    assert {c.kind for c in cs} == set(KINDS)
    assert snapshot(root) == snapshot(_tree(tmp_path / "fresh")), "planning must not touch the directory"


# --- the spec: JSON and validation ---------------------------------------------------------------------------


def test_json_round_trip(tmp_path: Path) -> None:
    root = _tree(tmp_path / "d")
    for c in enumerate_corruptions(root, KINDS, seeds_per_kind=3):
        assert Corruption.from_json(c.to_json()) == c
        assert Corruption.from_json(json.dumps(c.to_json())) == c


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"kind": "melt", "path": "a"}, "kind"),
        ({"path": "a"}, "kind"),
        ({"kind": "delete"}, "path"),
        ({"kind": "delete", "path": "a", "colour": 1}, "colour"),
        ({"kind": "bitflip", "path": "a", "bit": 8}, "bit"),
        ({"kind": "bitflip", "path": "a", "offset": -1}, "offset"),
        ({"kind": "bitflip", "path": "a", "offset": "3"}, "offset"),
        ({"kind": "bitflip", "path": "a", "offset": True}, "offset"),
        ({"kind": "append", "path": "a", "length": 0}, "length"),
        ({"kind": "stale_marker", "path": "a", "content": 5}, "content"),
        ({"kind": "delete", "path": "../a"}, "path"),
        ({"kind": "delete", "path": "x/../../a"}, "path"),
        ({"kind": "delete", "path": "/etc/passwd"}, "path"),
        ({"kind": "delete", "path": ""}, "path"),
        ({"kind": "delete", "path": "./a"}, "path"),
        ({"kind": "delete", "path": "a//b"}, "path"),
        ({"kind": "delete", "path": 7}, "path"),
    ],
)
def test_malformed_spec_names_the_field(data: dict, field: str) -> None:
    with pytest.raises(FaultSpecError, match=f"'{field}'"):
        Corruption.from_json(data)
    assert issubclass(FaultSpecError, ValueError)


@pytest.mark.parametrize("text", ["{not json", "[1, 2]"])
def test_malformed_json_text(text: str) -> None:
    with pytest.raises(FaultSpecError):
        Corruption.from_json(text)


# --- refusals ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_refuses_symlinks_and_escapes(tmp_path: Path, kind: str) -> None:
    root = _tree(tmp_path / "d")
    outside_dir = tmp_path / "outside"
    outside_dir.mkdir()
    (outside_dir / "victim.bin").write_bytes(b"v" * 64)
    os.symlink(outside_dir / "victim.bin", root / "link.bin")
    os.symlink(outside_dir, root / "linkdir")
    guarded = snapshot(outside_dir), sorted(os.listdir(outside_dir))
    extra = {"length": 1} if kind in ("append", "zero_range") else {}
    for path in ("link.bin", "linkdir/victim.bin", "linkdir/new-marker"):
        with pytest.raises(FaultSpecError, match=r"symlink|not a regular file"):
            apply(root, Corruption(kind, path, **extra))
    with pytest.raises(FaultSpecError, match="'path'"):
        apply(root, Corruption.from_json({"kind": kind, "path": "../outside/victim.bin", **extra}))
    assert (snapshot(outside_dir), sorted(os.listdir(outside_dir))) == guarded
    assert os.path.islink(root / "link.bin")


def test_refuses_out_of_range_and_existing_marker(tmp_path: Path) -> None:
    root = _tree(tmp_path / "d")
    before = _read_all(root)
    bad = [
        Corruption("bitflip", "small.json", offset=57),
        Corruption("truncate", "small.json", length=57),
        Corruption("zero_range", "small.json", offset=50, length=8),
        Corruption("stale_marker", "small.json"),
        Corruption("delete", "missing"),
        Corruption("delete", "sub"),
    ]
    for c in bad:
        with pytest.raises(FaultSpecError):
            apply(root, c)
    with pytest.raises(FaultSpecError, match="checkpoint dir"):
        apply(tmp_path / "nope", Corruption("delete", "a"))
    assert _read_all(root) == before


def test_no_eligible_file(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    for kind in ("bitflip", "truncate", "append", "delete", "zero_range"):
        with pytest.raises(FaultSpecError, match="no eligible file"):
            plan(empty, kind, 0)
    (empty / "zero").write_bytes(b"")
    os.symlink(tmp_path, empty / "link")
    for kind in ("bitflip", "truncate", "zero_range"):
        with pytest.raises(FaultSpecError, match="no eligible file"):
            plan(empty, kind, 0)
    assert plan(empty, "delete", 0).path == "zero"  # an empty file can still be deleted
    assert plan(empty, "stale_marker", 0).path in MARKER_NAMES  # markers need no existing file
    with pytest.raises(FaultSpecError, match="region"):
        plan(empty, "delete", 0, region="middle")
    with pytest.raises(FaultSpecError, match="not a directory"):
        plan(tmp_path / "nope", "delete", 0)


def test_copy_tree_keeps_the_original(tmp_path: Path) -> None:
    src = _tree(tmp_path / "src")
    os.symlink("big.bin", src / "rel-link")
    digest = snapshot(src)
    dst = copy_tree(src, tmp_path / "dst")
    assert os.readlink(dst / "rel-link") == "big.bin"
    assert snapshot(dst) == digest
    for kind in KINDS:
        apply(dst, plan(dst, kind, 1))
    assert snapshot(src) == digest and snapshot(dst) != digest


# --- usefulness: P-CORRUPT for the reference engine -----------------------------------------------------------


def _state() -> dict[str, reference.Tensor]:
    rng = np.random.default_rng(7)
    return {
        "w": reference.Tensor.from_array(rng.standard_normal((6, 5)).astype(np.float32)),
        "b": reference.Tensor.from_array(np.arange(7, dtype=np.int64)),
        "h": reference.Tensor.from_array(np.array([1.5, -0.0, np.nan], dtype=np.float16)),
        "s": reference.Tensor.from_array(np.array(3.25, dtype=np.float64)),
        "z": reference.Tensor.from_array(np.zeros((0, 3), dtype=np.float32)),
    }


@pytest.mark.parametrize("protocol", ["rename", "marker"])
@pytest.mark.parametrize("kind", KINDS)
def test_reference_meets_p_corrupt(tmp_path: Path, kind: str, protocol: str) -> None:
    """Every corruption of a committed checkpoint gives the saved data bitwise, or a CheckpointError.

    Bitwise-equal loads are legitimate: load reads only the index, the data files and their headers; bytes it
    never needs (the per-rank manifests used only while committing, an empty commit marker, save_id/seq/meta in
    the index) and new files it does not know (stale markers) cannot change the data. Everything it does read is
    covered by a checksum (block crc32s, header crc32, file size in the index) or by JSON/schema validation.
    """
    state = _state()
    root = tmp_path / "orig"
    reference.save(root, state, name="a", commit_protocol=protocol)
    digest = snapshot(root)
    cases = [c for region in REGIONS for c in enumerate_corruptions(root / "a", [kind], 8, region)]
    cases = list(dict.fromkeys(cases))
    outcomes: dict[str, int] = {}
    violations = []
    for i, c in enumerate(cases):
        work = copy_tree(root, tmp_path / f"copy{i}")
        apply(work / "a", c)
        try:
            got = reference.load_global(work)
        except reference.CheckpointError as exc:
            outcomes[type(exc).__name__] = outcomes.get(type(exc).__name__, 0) + 1
        except Exception as exc:
            violations.append(f"{c.describe()}: raised non-CheckpointError {type(exc).__name__}: {exc}")
        else:
            if set(got) != set(state) or any(not got[k].bitwise_equal(state[k]) for k in state):
                violations.append(f"{c.describe()}: silent wrong data {sorted(got)}")
            outcomes["equal"] = outcomes.get("equal", 0) + 1
    assert not violations, "\n".join(violations)
    assert snapshot(root) == digest, "the original checkpoint must stay intact"
    assert sum(outcomes.values()) == len(cases) >= 3
    if kind in ("bitflip", "truncate", "delete", "zero_range"):
        assert set(outcomes) - {"equal"}, f"no {kind} was ever detected: {outcomes}"
