"""Background writer process of an async save (``python -m reference.async_writer FD``).

Reads its job as JSON on stdin, maps the snapshot buffer from the inherited memfd, runs the ordinary rank and
coordinator steps, and reports one JSON line on stdout: the committed checkpoint, or the error's type and text.
"""

from __future__ import annotations

import json
import mmap
import sys
import traceback

import numpy as np

from .dtypes import dtype
from .engine import LocalTensor, commit, save_rank
from .layout import region_from_json
from .tensor import Tensor


def run(fd: int, job: dict) -> dict:
    buf = mmap.mmap(fd, job["size"], prot=mmap.PROT_READ)
    ranks: dict[int, dict[str, LocalTensor]] = {r: {} for r in job["ranks"]}
    for item in job["items"]:
        dt = dtype(item["dtype"])
        shape = tuple(item["shape"])
        if item["offset"] is None:  # a replica or empty slice: metadata only, never written
            bits = np.broadcast_to(np.zeros((), dt.bits_dtype), shape)
        else:
            count = int(np.prod(shape, dtype=np.int64))
            bits = np.frombuffer(buf, dt.bits_dtype, count, item["offset"]).reshape(shape)
        global_shape = tuple(item["global_shape"])
        ranks[item["rank"]][item["name"]] = LocalTensor(
            global_shape, region_from_json(item["region"], global_shape), Tensor(dt, bits), item["saves"]
        )
    for rank, tensors in ranks.items():
        save_rank(
            job["root"],
            job["name"],
            job["save_id"],
            rank,
            job["world_size"],
            tensors,
            block=job["block"],
            commit=job["commit_protocol"],
        )
    if not job["commit"]:
        return {"staged": True}
    info = commit(
        job["root"],
        job["name"],
        job["save_id"],
        job["world_size"],
        meta=job["meta"],
        commit=job["commit_protocol"],
        keep_last=job["keep_last"],
        timeout=job["commit_timeout"],
        coordinator=None if len(ranks) == job["world_size"] else min(ranks),
    )
    return {
        "name": info.name,
        "path": str(info.path),
        "seq": info.seq,
        "save_id": info.save_id,
        "world_size": info.world_size,
    }


def main() -> int:
    try:
        job = json.loads(sys.stdin.buffer.read())
        result = run(int(sys.argv[1]), job)
    except Exception as exc:  # reported to the parent, which re-raises it from wait()
        sys.stdout.write(
            json.dumps({"error_type": type(exc).__name__, "message": str(exc), "traceback": traceback.format_exc()})
        )
        return 1
    sys.stdout.write(json.dumps({"result": result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
