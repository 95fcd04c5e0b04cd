"""Hypothesis against the metadata of a valid checkpoint: mutated bytes and mutated JSON structure of the index,
the safetensors headers and ``latest`` must give a typed CheckpointError or bitwise-correct data, never anything
else; and single-bit flips of ``index.json`` (a sample here, every bit in bench/index_bitflips.py) never load.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import uuid
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import reference as R
from tests.hostile_cases import MODES, RANK0, RANK1, build_valid, expected, index_body, load, put_index

JSON_LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8),
)
JSON_VALUES = st.recursive(JSON_LEAVES, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)), max_leaves=12)
TARGETS = ("index", RANK0, RANK1, "latest")


@pytest.fixture(scope="module")
def valid_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fuzz-valid") / "root"
    build_valid(root)
    return root


def _paths(node: object, prefix: tuple = ()) -> list[tuple]:
    """Every path to a value inside decoded JSON."""
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


def _mutate_tree(tree: object, data: st.DataObject) -> object:
    """Replace, delete or wrap one value anywhere in the tree (or the whole tree)."""
    path = data.draw(st.sampled_from(_paths(tree)), label="path")
    action = data.draw(st.sampled_from(["replace", "delete", "wrap"]), label="action")
    if not path:
        return data.draw(JSON_VALUES) if action != "wrap" else [tree]
    parent = tree
    for key in path[:-1]:
        parent = parent[key]  # type: ignore[index]
    if action == "delete":
        del parent[path[-1]]  # type: ignore[union-attr]
    elif action == "wrap":
        parent[path[-1]] = {"x": parent[path[-1]]} if data.draw(st.booleans()) else [parent[path[-1]]]  # type: ignore[index]
    else:
        parent[path[-1]] = data.draw(JSON_VALUES, label="value")  # type: ignore[index]
    return tree


def _mutate_bytes(raw: bytes, data: st.DataObject) -> bytes:
    """Flip, overwrite, insert, delete or truncate a few bytes."""
    buf = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 3), label="edits")):
        at = data.draw(st.integers(0, max(0, len(buf) - 1)), label="at")
        kind = data.draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]), label="kind")
        if kind == "flip" and buf:
            buf[at] ^= 1 << data.draw(st.integers(0, 7))
        elif kind == "set" and buf:
            buf[at] = data.draw(st.sampled_from(b'{}[]":,0123456789 \\\n\x00\xff-eE.tfn'))
        elif kind == "insert":
            buf[at:at] = data.draw(st.sampled_from([b"[", b"{", b'"a":1,', b"0" * 30, b"\x00", b"\n", b",,"]))
        elif kind == "delete":
            del buf[at : at + data.draw(st.integers(1, 8))]
        else:
            del buf[at:]
    return bytes(buf)


def _header_parts(path: Path) -> tuple[bytes, bytes]:
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    return raw[8 : 8 + length], raw[8 + length :]


def _apply(root: Path, target: str, data: st.DataObject) -> None:
    ckpt = root / "new"
    structural = data.draw(st.booleans(), label="structural")
    if target == "latest":
        (root / "latest").write_bytes(_mutate_bytes((root / "latest").read_bytes(), data))
    elif target == "index" and structural:
        put_index(ckpt, _mutate_tree(index_body(ckpt), data))  # type: ignore[arg-type]
    elif target == "index":
        (ckpt / "index.json").write_bytes(_mutate_bytes((ckpt / "index.json").read_bytes(), data))
    else:
        header, rest = _header_parts(ckpt / target)
        if structural:
            header = json.dumps(_mutate_tree(json.loads(header), data)).encode()
        else:
            header = _mutate_bytes(header, data)
        prefix = struct.pack("<Q", len(header)) + header
        (ckpt / target).write_bytes(prefix + rest)
        if data.draw(st.booleans(), label="forge index"):  # the index agrees: only the header parser stands guard
            body = index_body(ckpt)
            body["files"][target] = {"size": len(prefix) + len(rest), "header_crc32": zlib.crc32(prefix)}
            put_index(ckpt, body)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow], deadline=None)
@given(st.sampled_from(TARGETS), st.data())
def test_mutated_metadata_gives_typed_error_or_exact_data(valid_root: Path, tmp_path: Path, target: str,
                                                          data: st.DataObject) -> None:
    root = tmp_path / uuid.uuid4().hex
    shutil.copytree(valid_root, root)
    try:
        _apply(root, target, data)
        for mode in MODES:
            try:
                got = load(root, mode)
            except R.CheckpointError as exc:
                note(f"{mode}: {type(exc).__name__}: {exc}")
                continue
            assert R.diff_states(expected(mode), got) == [], f"{mode} loaded wrong data"
    finally:
        shutil.rmtree(root)


def flip_outcomes(root: Path, bits: list[int]) -> dict[str, int]:
    """Load the latest checkpoint once per flipped bit of its index.json (flipped in place, then restored):
    outcome → count, where the outcome is the error type or "loaded"."""
    path = root / "new" / "index.json"
    counts: dict[str, int] = {}
    fd = os.open(path, os.O_RDWR)
    try:
        for bit in bits:
            (byte,) = os.pread(fd, 1, bit // 8)
            os.pwrite(fd, bytes([byte ^ (1 << bit % 8)]), bit // 8)
            try:
                R.load_global(root)
                outcome = "loaded"
            except R.CheckpointError as exc:
                outcome = type(exc).__name__
            finally:
                os.pwrite(fd, bytes([byte]), bit // 8)
            counts[outcome] = counts.get(outcome, 0) + 1
    finally:
        os.close(fd)
    return counts


def test_index_bit_flips_never_load(valid_root: Path, tmp_path: Path) -> None:
    """Every bit of the envelope and all 8 bits of every 4th body byte: a typed error each time."""
    root = tmp_path / "root"
    shutil.copytree(valid_root, root)
    size = (root / "new" / "index.json").stat().st_size
    edge = {*range(28), size - 2, size - 1}
    bits = [b for b in range(size * 8) if b // 8 in edge or (b // 8) % 4 == 0]
    counts = flip_outcomes(root, bits)
    assert "loaded" not in counts and sum(counts.values()) == len(bits), counts
    assert set(counts) <= {"MalformedMetadata", "UnsupportedFormatVersion"}, counts
