"""Loads read only the checksum blocks they need: never a whole file for one slice."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import reference.disk.stio as stio
from properties.model.case import seeded_tensor
from reference import DTYPES, Box, FlatRange, Mesh, Shard, Sharded, Target, load, save


@pytest.fixture
def bytes_read(monkeypatch) -> list[int]:
    counts: list[int] = []
    real = os.preadv

    def counting(fd, buffers, offset):
        n = real(fd, buffers, offset)
        counts.append(n)
        return n

    monkeypatch.setattr(stio.os, "preadv", counting)
    return counts


def test_one_row_of_a_large_slice_reads_one_block(tmp_path: Path, bytes_read: list[int]) -> None:
    t = seeded_tensor(DTYPES["F32"], (256, 64), 3)  # 64 KiB, one slice on one rank
    save(tmp_path, {"w": t}, name="a", block=1024)
    got = load(tmp_path, {"w": Target(DTYPES["F32"], (256, 64), Box((100, 0), (1, 64)))})
    assert np.array_equal(got["w"].bits[0], t.bits[100])
    assert sum(bytes_read) == 1024  # the 256-byte row lies inside one 1 KiB block


def test_column_slice_reads_every_block_once(tmp_path: Path, bytes_read: list[int]) -> None:
    t = seeded_tensor(DTYPES["BF16"], (64, 64), 4)
    save(tmp_path, {"w": t}, name="a", block=512)
    got = load(tmp_path, {"w": Target(DTYPES["BF16"], (64, 64), Box((0, 10), (64, 3)))})
    assert np.array_equal(got["w"].bits, t.bits[:, 10:13])
    assert sum(bytes_read) == t.nbytes  # needs a piece of every row, so every block, but each exactly once


def test_reshard_reads_only_overlapping_slices(tmp_path: Path, bytes_read: list[int]) -> None:
    t = seeded_tensor(DTYPES["I32"], (8, 1024), 5)
    mesh = Mesh((8,))
    save(tmp_path, {"w": t}, {"w": Sharded(mesh, (Shard(0),))}, name="a", block=4096)  # one 4 KiB row per rank file
    got = load(tmp_path, {"w": Target(DTYPES["I32"], (8, 1024), Box((2, 0), (2, 1024)))})
    assert np.array_equal(got["w"].bits, t.bits[2:4])
    assert sum(bytes_read) == 2 * 4096


def test_flat_target_reads_only_its_range(tmp_path: Path, bytes_read: list[int]) -> None:
    t = seeded_tensor(DTYPES["U8"], (4096,), 6)
    save(tmp_path, {"w": t}, name="a", block=256)
    got = load(tmp_path, {"w": Target(DTYPES["U8"], (4096,), FlatRange(1000, 1300))})
    assert np.array_equal(got["w"].bits, t.bits[1000:1300])
    assert sum(bytes_read) == 3 * 256  # blocks 3, 4 and 5
