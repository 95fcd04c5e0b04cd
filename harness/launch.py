"""Starting ranks and cleaning up after them: every process the harness starts is bounded and reaped.

Each launch runs in its own session so the whole tree (framework launcher, ranks, async writers they spawned)
can be found and killed with psutil, whatever state it is in.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

from faults.procs import kill_tree

REPO_ROOT = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).resolve().parent / "worker.py"


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast off on shared GPU machines
    env.setdefault("GLOG_minloglevel", "2")
    env.update(extra or {})
    return env


def paddle_gpus(world: int) -> int:
    """GPUs to give a Paddle launch: one per rank when Paddle has CUDA and enough devices, else 0 (CPU, gloo)."""
    with warnings.catch_warnings():  # Paddle warns about ccache on import; noise in a findings table
        warnings.simplefilter("ignore")
        import paddle  # only the controller of a paddle-launched SUT pays for this import

    if not paddle.is_compiled_with_cuda():
        return 0
    count = paddle.device.cuda.device_count()
    return world if count >= world else 0


def launch_commands(
    launcher: str, world: int, control: str, sut: str, options_json: str, log_dir: Path, gpus: int = 0
) -> list[tuple[list[str], dict[str, str]]]:
    """The processes to start for one pool: one per rank (plain) or one framework launcher (paddle)."""
    worker_args = ["--control", control, "--sut", sut, "--options", options_json]
    if launcher == "plain":
        return [
            (
                [sys.executable, "-m", "harness.worker", *worker_args],
                child_env({"RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_RANK": str(r)}),
            )
            for r in range(world)
        ]
    if launcher == "paddle":
        cmd = [
            sys.executable,
            "-m",
            "paddle.distributed.launch",
            "--nproc_per_node",
            str(world),
            "--log_dir",
            str(log_dir),
        ]
        if gpus:
            cmd += ["--gpus", ",".join(str(i) for i in range(world))]
        return [([*cmd, str(WORKER), *worker_args], child_env())]
    raise ValueError(f"unknown launcher {launcher!r}")


def start(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(
            cmd,
            env=env,
            cwd=str(REPO_ROOT),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def kill_trees(procs: list[subprocess.Popen]) -> None:
    """Kill every process started by ``procs`` (their whole trees and sessions) and reap them."""
    for proc in procs:
        kill_tree(proc)
