"""Starting ranks and cleaning up after them: every process the harness starts is bounded and reaped.

Each launch runs in its own session so the whole tree (framework launcher, ranks, async writers they spawned)
can be found and killed with psutil, whatever state it is in.
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from faults.procs import popen

REPO_ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).resolve().parent / "worker.py"


def rank_pythonpath(existing: str | None = None) -> str:
    """The PYTHONPATH of every launched process: this repository first (the ranks run this harness), then the
    caller's working directory and each ``sys.path`` entry of the caller that exists, in the caller's order, then
    what ``existing`` held; the first of duplicates is kept. Ranks start in the repository root, so without this
    an external adapter the caller imports from its working directory (``--sut mypkg.mod:Class``, docs/design.md
    §4) would not import on them. Deterministic: the same caller gives the same value."""
    caller = [os.getcwd(), *(os.path.abspath(p) for p in sys.path if isinstance(p, str))]  # "" is the cwd
    entries = [str(REPO_ROOT), *(p for p in caller if os.path.exists(p)), *(existing or "").split(os.pathsep)]
    return os.pathsep.join(dict.fromkeys(p for p in entries if p))  # "" would be the rank's cwd: the repo, first


COLLECTIVE_TIMEOUT_MS = 60_000  # half the default op bound (harness.ranks.runners.OP_TIMEOUT, 120 s)


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a launched process (framework launcher or rank): the caller's, with ``rank_pythonpath``
    and defaults for shared GPU machines, then ``extra``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = rank_pythonpath(env.get("PYTHONPATH"))
    env.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast off on shared GPU machines
    env.setdefault("GLOG_minloglevel", "2")
    # One hash seed for every launched process: where the SUT orders its work by a set of names, a case replays the
    # same way each time, and real and virtual ranks agree on it.
    env.setdefault("PYTHONHASHSEED", "0")
    # Paddle's NCCL groups give up after PADDLE_PG_TIMEOUT ms (default 30 min): well inside the harness's op bound
    # instead, so a rank left in a collective raises rather than being killed at the bound (gloo: fixed 30 s).
    env.setdefault("PADDLE_PG_TIMEOUT", str(COLLECTIVE_TIMEOUT_MS))
    env.update(extra or {})
    return env


SOCKET_PATH_MAX = 107  # bytes of a Unix socket's path (sun_path, less its NUL)


def short_tempdir(prefix: str, room: int) -> str:
    """A fresh temp folder whose path leaves ``room`` bytes for the socket names made under it: under $TMPDIR
    where that fits, else under /tmp (a long $TMPDIR, as a CI runner's may be, would make ``bind`` fail)."""
    base = tempfile.gettempdir()
    fits = len(base) + 1 + len(prefix) + 8 + room <= SOCKET_PATH_MAX
    return tempfile.mkdtemp(prefix=prefix, dir=base if fits else "/tmp")


PORT_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
RENDEZVOUS_PORTS = 12_000  # how many ports below the kernel's ephemeral range a rendezvous port is drawn from


def free_port() -> int:
    """A free loopback port for a rendezvous (never a fixed number), drawn below the kernel's ephemeral range.
    A rank that retries ``connect`` to a store nobody listens on yet is given ephemeral source ports; where one
    equals the store's port, TCP's simultaneous open connects the socket to itself, and the rank reads its own
    request as the store's reply (Paddle: "Stop_waiting response is expected"). A port outside that range can
    never be a source port. Where the range cannot be read, the kernel's pick."""
    low = _ephemeral_low()
    if low is not None and low - RENDEZVOUS_PORTS >= 1024:
        draw = random.SystemRandom()
        for _ in range(64):
            port = draw.randrange(low - RENDEZVOUS_PORTS, low)
            if _bindable(port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _ephemeral_low() -> int | None:
    try:
        return int(PORT_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def worker_argv(control: str, sut: str, options_json: str) -> list[str]:
    """The arguments of ``harness.ranks.worker``, however the rank is started."""
    return ["--control", control, "--sut", sut, "--options", options_json]


def launch_commands(
    launcher: str, world: int, control: str, sut: str, options_json: str, log_dir: Path, gpus: int = 0,
    nnodes: int = 1,
) -> list[tuple[list[str], dict[str, str]]]:
    """The processes to start for one pool: one per rank (plain), or one framework launcher per node (paddle,
    torchrun). ``nnodes`` > 1 starts that many launchers on this machine, each with world / nnodes ranks, meeting
    over loopback at a free port: a multi-node job in miniature."""
    worker_args = worker_argv(control, sut, options_json)
    if nnodes < 1 or world % nnodes:
        raise ValueError(f"{world} ranks cannot be split evenly over {nnodes} nodes")
    per_node = world // nnodes
    if launcher == "plain":
        return [
            (
                [sys.executable, "-m", "harness.ranks.worker", *worker_args],
                child_env({"RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_RANK": str(r % per_node)}),
            )
            for r in range(world)
        ]
    if launcher == "paddle":
        cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(per_node)]
        if gpus:
            cmd += ["--gpus", ",".join(str(i) for i in range(per_node))]
        if nnodes == 1:
            return [([*cmd, "--log_dir", str(log_dir), str(WORKER), *worker_args], child_env())]
        master = f"127.0.0.1:{free_port()}"
        return [
            ([*cmd, "--nnodes", str(nnodes), "--master", master, "--rank", str(node), "--log_dir",
              str(log_dir / f"node{node}"), str(WORKER), *worker_args], child_env())
            for node in range(nnodes)
        ]
    if launcher == "torchrun":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(per_node)]
        env = child_env({"OMP_NUM_THREADS": "1"})
        if nnodes == 1:
            return [([*cmd, "--standalone", str(WORKER), *worker_args], env)]
        endpoint = f"127.0.0.1:{free_port()}"
        return [
            ([*cmd, "--nnodes", str(nnodes), "--node_rank", str(node), "--rdzv_backend", "c10d",
              "--rdzv_endpoint", endpoint, "--rdzv_id", Path(control).parent.name, "--local_addr", "127.0.0.1",
              str(WORKER), *worker_args], env)
            for node in range(nnodes)
        ]
    raise ValueError(f"unknown launcher {launcher!r}")


def start(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "ab") as out:
        return popen(cmd, env=env, cwd=str(REPO_ROOT), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
