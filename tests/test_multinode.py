"""Multi-node launches in miniature: two launchers on one machine, one "node" each, meeting over loopback at a
port the kernel hands out (torchrun with a c10d rendezvous endpoint, paddle.distributed.launch with --master, the
harness's own launcher for the reference). A resharding round trip must pass across the two nodes."""

from __future__ import annotations

import importlib.util

import pytest

from harness.judging.judge import Judge
from harness.ranks.launch import launch_commands
from harness.ranks.pool import RankPool
from harness.ranks.runners import Runners
from properties.model.case import Case, Op, TensorCase
from reference.layout import Mesh, Shard, Sharded, replicated

FRAMEWORK = {"reference": None, "torch-dcp": "torch", "paddle-dcp": "paddle"}


def _reshard_case(sut: str) -> Case:
    mesh = Mesh((2,))
    tensors = (TensorCase("model/w", "F32", (5, 3), 1), TensorCase("model/b", "BF16", (3,), 2))
    save = {"model/w": Sharded(mesh, (Shard(0),)).to_json(), "model/b": replicated(mesh).to_json()}
    load = {"model/w": Sharded(mesh, (Shard(1),)).to_json(), "model/b": replicated(mesh).to_json()}
    return Case("P-RESHARD", sut, tensors, save, load, (Op("save", "a", 0), Op("load", "a", 0)), {})


@pytest.mark.multirank
@pytest.mark.parametrize("sut", sorted(FRAMEWORK))
def test_two_nodes_over_loopback(sut: str) -> None:
    framework = FRAMEWORK[sut]
    if framework and importlib.util.find_spec(framework) is None:
        pytest.skip(f"{sut} needs {framework}")
    runners = Runners(sut, mode="pool", nnodes=2)
    try:
        judgement, outcome = Judge(runners)(_reshard_case(sut))
        (pool,) = runners._runners.values()
        assert isinstance(pool, RankPool) and pool.nnodes == 2 and len(pool.procs) == 2  # two launchers
        assert sorted(pool.pids) == [0, 1]
    finally:
        runners.close()
    assert judgement.ok, judgement.details
    assert all(r.ok for r in outcome.records)


@pytest.mark.parametrize("launcher", ["torchrun", "paddle"])
def test_each_node_gets_its_share_and_one_rendezvous(launcher: str, tmp_path) -> None:
    commands = launch_commands(launcher, 4, "/x/ctl", "s", "{}", tmp_path, nnodes=2)
    assert len(commands) == 2
    texts = [" ".join(cmd) for cmd, _ in commands]
    assert all("--nproc_per_node 2" in t for t in texts)
    flag = "--rdzv_endpoint" if launcher == "torchrun" else "--master"
    endpoints = {cmd[cmd.index(flag) + 1] for cmd, _ in commands}
    assert len(endpoints) == 1 and next(iter(endpoints)).startswith("127.0.0.1:")
    with pytest.raises(ValueError, match="cannot be split evenly"):
        launch_commands(launcher, 3, "/x/ctl", "s", "{}", tmp_path, nnodes=2)


def test_a_rendezvous_port_can_never_be_a_connecting_rank_s_source_port() -> None:
    """A rank retrying connect before the store listens is given ephemeral source ports; the store's port lies
    below that range, so the socket can never connect to itself (Paddle then reads its own request as the reply)."""
    import socket

    from harness.ranks.launch import PORT_RANGE_FILE, free_port

    low = int(PORT_RANGE_FILE.read_text().split()[0])
    ports = {free_port() for _ in range(20)}
    assert all(1024 <= p < low for p in ports) and len(ports) > 1
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))
