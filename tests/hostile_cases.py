"""Hostile checkpoints built from one valid checkpoint, and the child process that loads them under limits.

Each case is a function that damages a fresh copy of a valid checkpoint root. ``python -m tests.hostile_cases
CASES.json`` (run by tests/test_hostile_checkpoints.py) loads every case with ``load_global`` and ``load_rank`` for
each rank under an address-space limit of the interpreter's own baseline plus 256 MiB, times every load and
measures its peak RSS, and prints one JSON line per load: a typed error, bitwise-correct data, or what went wrong.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import struct
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

import reference as R
from reference.disk.commit import pointer_text
from reference.disk.index import encode_index

MESH = R.Mesh((2,))
RANKS = 2
RANK0, RANK1 = "rank-00000.safetensors", "rank-00001.safetensors"
BUDGET = 256 << 20  # the memory bound, on top of the interpreter's baseline
DEEP = 50_000  # nesting that made json.loads raise RecursionError


def state() -> dict[str, R.Tensor]:
    return {
        "w": R.Tensor.from_array(np.arange(32, dtype=np.float32).reshape(8, 4) * 0.5),
        "b": R.Tensor.from_array(np.arange(6, dtype=np.int64) - 3),
        "p": R.Tensor.from_array(np.arange(15, dtype=np.float32).reshape(3, 5)),
        "q": R.Tensor.from_array(np.arange(7, dtype=np.int32)),
        "z": R.Tensor.from_array(np.zeros((0, 5), np.float32)),
        "s": R.Tensor.from_array(np.array(2.5, np.float64)),
    }


def layouts() -> dict[str, R.TensorLayout]:
    out: dict[str, R.TensorLayout] = {"w": R.Sharded(MESH, (R.Shard(0),)), "b": R.Sharded(MESH, (R.Replicate(),))}
    out.update(R.flat_group(MESH, 0, [("p", (3, 5)), ("q", (7,))], align=4))
    return out


def build_valid(root: Path) -> None:
    """Two checkpoints: ``old`` and the newest, ``new`` (which every load below must give or refuse)."""
    R.save(root, {k: R.Tensor.from_array(v.values() * 0) for k, v in state().items()}, layouts(), name="old")
    R.save(root, state(), layouts(), name="new", meta={"step": 7})


# --- editing helpers ---------------------------------------------------------------------------------------


def index_body(ckpt: Path) -> dict:
    return json.loads((ckpt / "index.json").read_bytes())["body"]


def put_index(ckpt: Path, body: object) -> None:
    (ckpt / "index.json").write_bytes(encode_index(body))  # type: ignore[arg-type]


def put_index_text(ckpt: Path, text: bytes) -> None:
    """Seal arbitrary body bytes (not necessarily JSON) with a correct checksum: only the parser stands guard."""
    (ckpt / "index.json").write_bytes(b'{"crc32":"%08x","body":%s}\n' % (zlib.crc32(text), text))


def edit_index(fn: Callable[[dict], object]) -> Callable[[Path], None]:
    def damage(root: Path) -> None:
        body = index_body(root / "new")
        result = fn(body)
        put_index(root / "new", body if result is None else result)

    return damage


def edit_index_text(fn: Callable[[bytes], bytes]) -> Callable[[Path], None]:
    def damage(root: Path) -> None:
        body = json.dumps(index_body(root / "new"), separators=(",", ":")).encode()
        put_index_text(root / "new", fn(body))

    return damage


def slice_of(body: dict, key: str) -> dict:
    return next(s for s in body["slices"] if s["key"] == key)


def put_header(root: Path, file: str, header: bytes, keep_length: bool = False) -> None:
    """Replace a data file's safetensors header (data bytes kept) and record the new header's size and checksum
    in the index, so only the header's content is wrong."""
    path = root / "new" / file
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    if keep_length:
        header = header.ljust(length)[:length]
    prefix = struct.pack("<Q", len(header)) + header
    path.write_bytes(prefix + raw[8 + length :])
    body = index_body(root / "new")
    body["files"][file] = {"size": len(prefix) + len(raw) - 8 - length, "header_crc32": zlib.crc32(prefix)}
    for s in body["slices"]:
        if s["file"] == file:
            s["offset"] += len(header) - length
    put_index(root / "new", body)


def header_of(root: Path, file: str) -> dict:
    raw = (root / "new" / file).read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + length])


def edit_header(file: str, fn: Callable[[dict], object]) -> Callable[[Path], None]:
    def damage(root: Path) -> None:
        header = header_of(root, file)
        result = fn(header)
        text = result if isinstance(result, bytes) else json.dumps(header).encode()
        put_header(root, file, text)

    return damage


def put_latest(data: bytes) -> Callable[[Path], None]:
    def damage(root: Path) -> None:
        (root / "latest").unlink()
        (root / "latest").write_bytes(data)

    return damage


def fifo(rel: str) -> Callable[[Path], None]:
    def damage(root: Path) -> None:
        path = root / rel
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
        os.mkfifo(path)

    return damage


def deep(n: int = DEEP) -> bytes:
    return b"[" * n + b"]" * n


def _set(path: list, value: object) -> Callable[[dict], None]:
    def fn(body: dict) -> None:
        node = body
        for key in path[:-1]:
            node = next(s for s in node if s["key"] == key) if isinstance(node, list) else node[key]
        node[path[-1]] = value

    return fn


def _without_latest(root: Path) -> None:
    (root / "latest").unlink()


def _sibling(damage: Callable[[Path], None]) -> Callable[[Path], None]:
    """A newer sibling (copy of ``new`` with a higher seq) that ``damage`` ruins; no ``latest`` pointer, so the
    load scans for the newest and must skip it."""

    def build(root: Path) -> None:
        (root / "latest").unlink()
        shutil.copytree(root / "new", root / "zzz")
        body = index_body(root / "zzz")
        body["name"], body["seq"] = "zzz", 99
        put_index(root / "zzz", body)
        damage(root / "zzz")

    return build


def _fifo_in(name: str) -> Callable[[Path], None]:
    def damage(ckpt: Path) -> None:
        (ckpt / name).unlink()
        os.mkfifo(ckpt / name)

    return damage


def _irregular(body: dict) -> None:
    """4000 one-element boxes in column 0 and 2000 two-row boxes in column 1 of a U8 tensor: no grid, an exact
    cover, and all-pairs would compare 18 million pairs. The recorded file is as large as they need."""
    body["tensors"]["g"] = {"dtype": "U8", "shape": [4000, 2]}
    body["files"]["rank-00002.safetensors"] = {"size": 20_000, "header_crc32": 0}  # absent: found after the cover
    boxes = [([i, 0], [1, 1]) for i in range(4000)] + [([2 * i, 1], [2, 1]) for i in range(2000)]
    for i, (offsets, shape) in enumerate(boxes):
        body["slices"].append({"tensor": "g", "file": "rank-00002.safetensors", "key": f"g{i}",
                               "region": {"box": {"offsets": offsets, "shape": shape}},
                               "offset": 8 + i * 2, "nbytes": shape[0], "crc32": [0]})


def _most_slices(body: dict) -> None:
    """As many slices as the container budget admits (6 containers each), a 1-d U8 tensor split in 1-byte flat
    ranges: the parse must stay well within the time bound; the file they name does not exist."""
    n = (1 << 16) // 6 - 20
    body["tensors"]["m"] = {"dtype": "U8", "shape": [n]}
    body["files"]["rank-00002.safetensors"] = {"size": n + 8, "header_crc32": 0}
    body["slices"] += [{"tensor": "m", "file": "rank-00002.safetensors", "key": f"m{i}", "region": {"box": {
        "offsets": [i], "shape": [1]}}, "offset": 8 + i, "nbytes": 1, "crc32": [0]} for i in range(n)]


def _tib(body: dict) -> None:
    """The ~200-byte edit that made load_global allocate a TiB: a tensor that claims 2**38 x 4 elements."""
    body["tensors"]["w"]["shape"] = [1 << 38, 4]
    slice_of(body, "w#1")["region"] = {"box": {"offsets": [4, 0], "shape": [(1 << 38) - 4, 4]}}
    slice_of(body, "w#1")["nbytes"] = ((1 << 38) - 4) * 16


def _alias(body: dict) -> None:
    """Two slices of ``w`` reading the same bytes (rows loaded twice, checksums copied along)."""
    a, b = slice_of(body, "w#0"), slice_of(body, "w#1")
    b.update(file=a["file"], key=a["key"], offset=a["offset"], crc32=a["crc32"])


def _alias_offset(body: dict) -> None:
    a, b = slice_of(body, "w#0"), slice_of(body, "w#1")
    b.update(file=a["file"], offset=a["offset"], crc32=a["crc32"])


def _overlapping_header(header: dict) -> None:
    """Header entries sharing bytes (the safetensors library rejects this): one tensor read from another's."""
    w = header["w#0"]
    header["b#0"]["data_offsets"] = [w["data_offsets"][0], w["data_offsets"][0] + 48]


def _rename_file(new: str) -> Callable[[Path], None]:
    """Rename rank 1's file on disk and in the index: only the safe-name check stands between the load and it."""

    def damage(root: Path) -> None:
        os.rename(root / "new" / RANK1, root / "new" / new)
        body = index_body(root / "new")
        body["files"][new] = body["files"].pop(RANK1)
        for s in body["slices"]:
            if s["file"] == RANK1:
                s["file"] = new
        put_index(root / "new", body)

    return damage


def _reverse_flat(body: dict) -> None:
    rec = next(s for s in body["slices"] if "flat" in s["region"])
    rec["region"]["flat"] = rec["region"]["flat"][::-1]


def _huge_meta(body: dict) -> None:
    body["meta"] = {"ints": list(range(900_000))}  # within the value budget: must load, fast and small


def _many_objects(body: dict) -> None:
    body["meta"] = {"objs": [{} for _ in range(60_000)]}  # within the container budget


CASES: dict[str, tuple[bool, Callable[[Path], None]]] = {
    # name: (must the newest load fail?, damage)
    "index-deep-top": (True, edit_index_text(lambda b: deep())),
    "index-deep-meta": (True, edit_index_text(lambda b: b.replace(b'"meta":{', b'"meta":{"x":' + deep() + b","))),
    "index-deep-object": (True, edit_index_text(lambda b: b.replace(b'"meta":{', b'"meta":{"x":' + b'{"a":' * DEEP
                                                                     + b"1" + b"}" * DEEP + b","))),
    "index-long-int-meta": (True, edit_index_text(lambda b: b.replace(b'"step":7', b'"step":' + b"7" * 5000))),
    "index-long-int-seq": (True, edit_index(_set(["seq"], 10**400))),
    "index-tensors-list": (True, edit_index(_set(["tensors"], []))),
    "index-files-list": (True, edit_index(_set(["files"], [1, 2]))),
    "index-slice-list": (True, edit_index(lambda b: b["slices"].__setitem__(0, []))),
    "index-region-list": (True, edit_index(_set(["slices", "w#0", "region"], [0, 4]))),
    "index-box-list": (True, edit_index(_set(["slices", "w#0", "region"], {"box": [[0, 0], [4, 4]]}))),
    "index-body-list": (True, edit_index(lambda b: [b])),
    "index-block-0": (True, edit_index(_set(["block"], 0))),
    "index-block-7": (True, edit_index(_set(["block"], 7))),
    "index-block-huge": (True, edit_index(_set(["block"], 1 << 62))),
    "index-block-bool": (True, edit_index(_set(["block"], True))),
    "index-shape-absurd": (True, edit_index(_set(["tensors", "w", "shape"], [1 << 62, 1 << 62]))),
    "index-shape-64-dims": (True, edit_index(_set(["tensors", "w", "shape"], [1] * 64))),
    "index-shape-negative": (True, edit_index(_set(["tensors", "w", "shape"], [-8, 4]))),
    "index-shape-float": (True, edit_index(_set(["tensors", "w", "shape"], [8.0, 4]))),
    "index-zero-size-huge": (True, edit_index(_set(["tensors", "z", "shape"], [0, 1 << 62, 1 << 62]))),
    "index-tib-alloc": (True, edit_index(_tib)),
    "index-irregular-cover": (True, edit_index(_irregular)),
    "index-most-slices": (True, edit_index(_most_slices)),
    "index-alias-key": (True, edit_index(_alias)),
    "index-alias-bytes": (True, edit_index(_alias_offset)),
    "index-dup-key": (True, edit_index_text(lambda b: b.replace(b'"seq":', b'"seq":5,"seq":', 1))),
    "index-dup-key-slice": (True, edit_index_text(lambda b: b.replace(b'"offset":', b'"offset":0,"offset":', 1))),
    "index-version-true": (True, edit_index(_set(["version"], True))),
    "index-offset-bool": (True, edit_index(_set(["slices", "w#0", "region"], {"flat": [False, 16]}))),
    "index-seq-float": (True, edit_index(_set(["seq"], 1.0))),
    "index-nbytes-float": (True, edit_index(_set(["slices", "w#0", "nbytes"], 64.0))),
    "index-nan": (True, edit_index_text(lambda b: b.replace(b'"step":7', b'"step":NaN'))),
    "index-infinity": (True, edit_index_text(lambda b: b.replace(b'"step":7', b'"step":1e999'))),
    "index-name-newline": (True, _rename_file(RANK1 + "\n")),
    "index-name-traversal": (True, edit_index(_set(["slices", "w#1", "file"], "../old/" + RANK1))),
    "index-unknown-tensor": (True, edit_index(_set(["slices", "w#0", "tensor"], "nope"))),
    "index-unknown-field": (True, edit_index(_set(["extra"], 1))),
    "index-missing-field": (True, edit_index(lambda b: b.pop("world_size") and None)),
    "index-meta-list": (True, edit_index(_set(["meta"], [1]))),
    "index-commit-unknown": (True, edit_index(_set(["commit"], "xyz"))),
    "index-crc-count": (True, edit_index(_set(["slices", "w#0", "crc32"], [0] * 1000))),
    "index-past-eof": (True, edit_index(_set(["slices", "w#0", "offset"], 1 << 40))),
    "index-file-size-lie": (True, edit_index(lambda b: b["files"][RANK0].__setitem__("size", 1 << 40))),
    "index-region-outside": (True, edit_index(_set(["slices", "w#1", "region"],
                                                   {"box": {"offsets": [6, 0], "shape": [4, 4]}}))),
    "index-flat-reversed": (True, edit_index(_reverse_flat)),
    "index-not-utf8": (True, edit_index_text(lambda b: b.replace(b'"step"', b'"st\xffp"'))),
    "index-bom": (True, edit_index_text(lambda b: b"\xef\xbb\xbf" + b)),
    "index-bad-crc": (True, lambda root: (root / "new" / "index.json").write_bytes(
        (root / "new" / "index.json").read_bytes().replace(b'"step":7', b'"step":8'))),
    "index-v1": (True, lambda root: (root / "new" / "index.json").write_bytes(
        json.dumps({**index_body(root / "new"), "version": 1}).encode())),  # as version 1 wrote it: unsealed
    "index-huge": (True, lambda root: (root / "new" / "index.json").write_bytes(b" " * (20 << 20))),
    "index-empty": (True, lambda root: (root / "new" / "index.json").write_bytes(b"")),
    "index-fifo": (True, fifo("new/index.json")),
    "index-dir": (True, lambda root: ((root / "new" / "index.json").unlink(), (root / "new" / "index.json").mkdir())),
    "index-symlink": (True, lambda root: ((root / "new" / "index.json").unlink(),
                                          (root / "new" / "index.json").symlink_to(root / "old" / "index.json"))),
    "index-many-containers": (True, edit_index(_set(["meta"], {"x": [[] for _ in range(300_000)]}))),
    "latest-fifo": (True, fifo("latest")),
    "latest-huge": (True, put_latest(b"new\n" + b"x" * (10 << 20))),
    "latest-dir": (True, lambda root: ((root / "latest").unlink(), (root / "latest").mkdir())),
    "latest-garbage-tail": (True, put_latest(pointer_text("new").encode() + b"junk")),
    "latest-upper-hex": (True, put_latest(pointer_text("new").upper().replace("NEW", "new").encode())),
    "latest-not-utf8": (True, put_latest(b"n\xffw\n" + b"crc32:%08x\n" % zlib.crc32(b"n\xffw"))),
    "latest-traversal": (True, put_latest(pointer_text("../new").encode())),
    "latest-newline-name": (True, put_latest(b"new\n\n" + b"crc32:%08x\n" % zlib.crc32(b"new\n"))),
    "latest-empty": (True, put_latest(b"")),
    "header-deep": (True, edit_header(RANK0, lambda h: b'{"__metadata__":' + deep() + b"}")),
    "header-long-int": (True, edit_header(RANK0, lambda h: json.dumps(h).replace('"shape": [4, 4]', '"shape": [' + "4"
                                                                                 * 4400 + ', 4]', 1).encode())),
    "header-dup-key": (True, edit_header(RANK0, lambda h: json.dumps(h).replace('"shape"', '"shape": [1], "shape"',
                                                                                1).encode())),
    "header-list": (True, edit_header(RANK0, lambda h: b"[]")),
    "header-entry-list": (True, edit_header(RANK0, lambda h: h.__setitem__("w#0", [1, 2]))),
    "header-overlap": (True, edit_header(RANK0, _overlapping_header)),
    "header-gap": (True, edit_header(RANK0, lambda h: h["w#0"].__setitem__("data_offsets", [
        h["w#0"]["data_offsets"][0] + 8, h["w#0"]["data_offsets"][1] + 8]))),
    "header-shape-bool": (True, edit_header(RANK0, lambda h: h["w#0"].__setitem__("shape", [True, 4]))),
    "header-absurd-shape": (True, edit_header(RANK0, lambda h: h["w#0"].__setitem__("shape", [1 << 62, 1 << 62]))),
    "header-metadata-list": (True, edit_header(RANK0, lambda h: h.__setitem__("__metadata__", [1]))),
    "header-length-huge": (True, lambda root: (root / "new" / RANK0).write_bytes(
        struct.pack("<Q", 1 << 62) + (root / "new" / RANK0).read_bytes()[8:])),
    "data-fifo": (True, fifo("new/" + RANK1)),
    "data-sparse-tib": (True, lambda root: os.truncate(root / "new" / RANK1, 1 << 40)),
    "data-bitflip": (True, lambda root: (root / "new" / RANK0).write_bytes(
        (lambda raw: raw[:-3] + bytes([raw[-3] ^ 4]) + raw[-2:])((root / "new" / RANK0).read_bytes()))),
    # A bad sibling never stops the newest good checkpoint from loading.
    "sibling-deep-index": (False, _sibling(lambda c: put_index_text(c, deep()))),
    "sibling-fifo-index": (False, _sibling(_fifo_in("index.json"))),
    "sibling-garbage-index": (False, _sibling(lambda c: (c / "index.json").write_bytes(b"\x00" * 100))),
    "sibling-list-index": (False, _sibling(lambda c: put_index(c, []))),
    "sibling-index-dir": (False, _sibling(lambda c: ((c / "index.json").unlink(), (c / "index.json").mkdir()))),
    "no-latest": (False, _without_latest),
    "meta-900k-ints": (False, edit_index(_huge_meta)),
    "meta-60k-objects": (False, edit_index(_many_objects)),
}


# --- the child: load every case under limits -----------------------------------------------------------------


def expected(mode: str) -> dict[str, R.Tensor]:
    if mode == "global":
        return state()
    rank = int(mode.removeprefix("rank"))
    return {k: lt.tensor for k, lt in R.local_tensors(state(), layouts(), rank).items()}


def load(root: Path, mode: str) -> dict[str, R.Tensor]:
    if mode == "global":
        return R.load_global(root)
    specs = {k: (v.dtype.name, v.shape) for k, v in state().items()}
    return R.load_rank(root, specs, layouts(), int(mode.removeprefix("rank")))


MODES = ("global", *(f"rank{r}" for r in range(RANKS)))


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM: each load's own peak is measured


class Hang(Exception):
    """A load outlived the child's per-load alarm."""


def _alarm(signum: int, frame: object) -> None:
    raise Hang("load did not finish in 10 s")


def run_one(root: Path, mode: str) -> dict:
    """One load: its outcome (typed error, exact data, or what else happened), wall and CPU time, and its peak RSS
    above the RSS it started from."""
    _reset_peak()
    base_rss = _status("VmRSS")
    signal.alarm(10)
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        got = load(root, mode)
        outcome = "ok" if R.diff_states(expected(mode), got) == [] else "wrong-data"
    except R.CheckpointError as exc:
        outcome = f"typed:{type(exc).__name__}:{str(exc)[-160:]}"
    except BaseException as exc:  # anything else is what this suite exists to report
        outcome = f"untyped:{type(exc).__name__}:{str(exc)[:200]}"
    finally:
        signal.alarm(0)
    return {"outcome": outcome, "wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu,
            "peak": max(0, _status("VmHWM") - base_rss)}


def main(argv: list[str]) -> int:
    """Load every case listed in the JSON file ``argv[0]`` ({name: root}) in every mode; print JSON lines."""
    cases = json.loads(Path(argv[0]).read_text())
    signal.signal(signal.SIGALRM, _alarm)
    base_vm, base_rss = _status("VmSize"), _status("VmRSS")
    resource.setrlimit(resource.RLIMIT_AS, (base_vm + BUDGET, base_vm + BUDGET))
    print(json.dumps({"baseline_vm": base_vm, "baseline_rss": base_rss}), flush=True)
    for name, root in cases.items():
        for mode in MODES:
            print(json.dumps({"case": name, "mode": mode, **run_one(Path(root), mode)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
