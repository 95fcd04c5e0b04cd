"""Pools forked from a process with the framework imported (harness.ranks.forkserver): only while exploring, only after
a real launch of the same shape taught them what the launcher gives each rank, and judged like launched ones."""

from __future__ import annotations

import importlib.util
import json
import os

import psutil
import pytest

from harness.fixes import resolve
from harness.judging.judge import Judge
from harness.ranks.forkserver import Template
from harness.ranks.runners import Runners
from properties.model.case import Case, Op, TensorCase
from reference.layout import Mesh, Shard, Sharded, replicated


def test_a_template_gives_every_pool_fresh_ports_and_its_own_directory(tmp_path) -> None:
    old = tmp_path / "ckh-pool-old"
    (old / "logs").mkdir(parents=True)
    backup = old / "logs" / "backup_env.0.json"
    backup.write_text(json.dumps({"PADDLE_MASTER": "127.0.0.1:4000", "LOG": str(old / "logs")}))
    launcher = {"PATH": "/bin", "TMPDIR": str(old / "tmp")}
    ranks = {r: {**launcher, "OMP_NUM_THREADS": "1", "PADDLE_MASTER": "127.0.0.1:4000",
                 "PADDLE_TRAINER_ENDPOINTS": "127.0.0.1:4001,127.0.0.1:4002",
                 "PADDLE_CURRENT_ENDPOINT": f"127.0.0.1:{4001 + r}", "PADDLE_TRAINER_ID": str(r),
                 "PADDLE_BACKUP_ENV_PATH": str(old / "logs" / f"backup_env.{r}.json")} for r in range(2)}
    ranks[1]["PADDLE_BACKUP_ENV_PATH"] = str(backup)  # one file for both: it is read, not named per rank here
    template = Template(launcher, ranks, str(old))
    assert template.common == {"OMP_NUM_THREADS": "1"}  # what the fork server itself runs with
    assert "PATH" not in template.ranks[0] and "TMPDIR" not in template.ranks[0]  # the launcher's own, not given
    new = str(tmp_path / "ckh-pool-new")
    envs, files = template.for_pool(new)
    master = envs[0]["PADDLE_MASTER"]
    assert master != "127.0.0.1:4000" and envs[1]["PADDLE_MASTER"] == master  # one new port for one old port
    endpoints = envs[0]["PADDLE_TRAINER_ENDPOINTS"].split(",")
    assert envs[1]["PADDLE_CURRENT_ENDPOINT"] == endpoints[1] and len({*endpoints, master}) == 3
    assert envs[0]["PADDLE_BACKUP_ENV_PATH"] == f"{new}/logs/backup_env.0.json"
    assert json.loads(files[f"{new}/logs/backup_env.0.json"]) == {"PADDLE_MASTER": master, "LOG": f"{new}/logs"}
    again, _ = template.for_pool(new)
    assert again[0]["PADDLE_MASTER"] != master  # every pool its own ports


def _roundtrip(sut: str) -> Case:
    mesh = Mesh((2,))
    save = {"w": Sharded(mesh, (Shard(0),)).to_json(), "b": replicated(mesh).to_json()}
    tensors = (TensorCase("w", "F32", (4, 3), 1), TensorCase("b", "F32", (5,), 2))
    return Case("P-ROUNDTRIP", sut, tensors, save, save, (Op("save", "step-0"), Op("load", "step-0")), {}, 0)


def _forked_pools(sut: str, fixes: tuple[str, ...] = ()) -> None:
    judge = Judge(Runners(sut, "pool", fixes=fixes), exploring=True)
    runners = judge.runners
    try:
        first = runners.get(2, {})
        first.ensure()
        assert not first.forked  # nothing taught the fork server yet: a real launch
        assert judge(_roundtrip(sut))[0].ok
        runners.discard(first, graceful=False)
        for _ in range(2):
            pool = runners.get(2, {})
            pool.ensure()
            assert pool.forked
            assert judge(_roundtrip(sut))[0].ok
            ranks = [psutil.Process(pid) for pid in pool.pids.values()]
            assert all(os.getsid(p.pid) == p.pid for p in ranks)  # each in a session of its own, like launched
            server, parents = runners.forks._proc.pid, {p.ppid() for p in ranks}
            # with fixes, forked from the server's zygote that applied them once; without, from the server itself
            expected = {server} if not fixes else {psutil.Process(pp).ppid() for pp in parents}
            assert (parents == {server}) != bool(fixes) and expected == {server}
            runners.discard(pool, graceful=False)
            assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in ranks)
        with runners.waiting():  # a replay under the strict rules launches for real
            pool = runners.get(2, {})
            pool.ensure()
            assert not pool.forked
    finally:
        judge.close()


def test_a_lost_pool_is_replaced_by_forked_ranks_while_exploring() -> None:
    _forked_pools("reference")


@pytest.mark.skipif(importlib.util.find_spec("paddle") is None, reason="needs Paddle")
def test_forked_paddle_ranks_get_what_paddles_launcher_gives() -> None:
    """Paddle's launcher hands each rank ports, ids and a file of its environment; forked ranks get the same, with
    ports of their own, set their process group up, and save and load bitwise; with every fix applied, the fixes
    were applied once, in the zygote the ranks were forked from."""
    _forked_pools("paddle-dcp")
    _forked_pools("paddle-dcp", resolve("all", "paddle"))


def test_a_pool_lost_while_exploring_is_replaced_by_a_spare_started_at_once() -> None:
    """The next case finds ranks started in the background when the last ones were lost; a replay under the strict
    rules never gets a spare that was forked for exploring."""
    runners = Runners("reference", "pool")
    runners.fast_failures = runners.spare_lost = True  # a campaign's runner set
    try:
        first = runners.get(2, {})
        first.ensure()
        runners.discard(first, graceful=False)
        spare = runners.get(2, {})
        assert spare is not first and spare.alive and spare.replacement  # started before anyone asked for it
        runners.discard(spare, graceful=False)
        with runners.waiting():
            strict = runners.get(2, {})
            assert not strict.alive  # launched when its op needs it, for real
    finally:
        runners.close()
