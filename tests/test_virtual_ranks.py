"""Virtual ranks (harness.ranks.virtual.paddle_world): Paddle's own flex checkpoint on W threads of one process, held
to a
real launch by a differential test, and run at world sizes no machine here launches."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from harness.judging.fidelity import differences, run_side, run_sides
from harness.judging.judge import Judge
from harness.ranks.runners import Runners
from harness.ranks.virtual_pool import VirtualPool
from harness.sut import adapter_class
from properties.model.case import Case, Op, TensorCase
from properties.registry import REGISTRY, property_cases
from properties.triage.known import explanations, read_known
from reference.layout import Mesh, Replicate, Shard, Sharded

SUT = "paddle-dcp"
CAPS = adapter_class(SUT).capabilities
# The data-path properties: one save and loads, seconds per case. The job-life properties (async writers spawned
# per rank, training loops) take tens of seconds a case on both sides: the nightly run draws them too.
QUICK = ("P-ROUNDTRIP", "P-RESHARD", "P-EDGE", "P-COVER", "P-MOE", "P-FLAT", "P-REPEAT", "P-DIFF")
FAULT_FREE = tuple(p for p, spec in REGISTRY.items() if not spec.fault and spec.skip_reason(CAPS) is None)


@pytest.fixture(scope="module")
def virtual_sides():
    real, virtual = Runners(SUT, "pool"), Runners(SUT, "virtual")
    real.fast_failures = virtual.fast_failures = True  # a fuzzing judge's regime on both sides
    yield real, virtual
    real.close()
    virtual.close()


def _cases(props: tuple[str, ...], ranks: int) -> st.SearchStrategy[Case]:
    """Cases the virtual world plays: any other runs on real ranks on both sides, a comparison of nothing."""
    return st.sampled_from(props).flatmap(lambda p: property_cases(p, SUT, ranks, CAPS, worlds="drawn")).filter(
        adapter_class(SUT).virtual_plays)


def _same(sides, case: Case, runs: int = 8) -> None:
    """No difference between the sides, unless the SUT shows it against itself: where it is not deterministic
    (safetensors' loader yields a file's tensors from a Rust HashMap seeded per thread, so which of two broken
    tensors a load names first varies per run on either side), some real run must match some virtual run within
    ``runs`` more of each side."""
    real, virtual = sides
    reals, virtuals = map(list, zip(run_sides(case, real, virtual)))
    found = differences(reals[0], virtuals[0])
    for _ in range(runs if found else 0):
        reals.append(run_side(case, real))
        virtuals.append(run_side(case, virtual))
        varies = any(differences(reals[0], r) for r in reals[1:]) or \
            any(differences(virtuals[0], v) for v in virtuals[1:])
        if varies and any(not differences(r, v) for r in reals for v in virtuals):
            found = []
            break
    assert found == []


_SETTINGS = {"deadline": None, "suppress_health_check": list(HealthCheck), "phases": [Phase.explicit, Phase.generate],
             "database": None}


@settings(max_examples=4, derandomize=True, **_SETTINGS)
@given(case=_cases(QUICK, 3))
def test_virtual_ranks_give_what_real_ranks_give(virtual_sides, case: Case) -> None:
    """Same bits on every rank, same exceptions on the same ranks, same listing, same files
    (harness.judging.fidelity)."""
    _same(virtual_sides, case)


@pytest.mark.nightly
@settings(max_examples=300, **_SETTINGS)
@given(case=_cases(FAULT_FREE, 4))
def test_virtual_ranks_give_what_real_ranks_give_nightly(virtual_sides, case: Case) -> None:
    _same(virtual_sides, case)


def _case(prop: str, tensors: tuple[TensorCase, ...], save: dict, load: dict, **options) -> Case:
    return Case(prop, SUT, tensors, save, load, (Op("save", "step-1"), Op("load", "step-1")), options, 1)


def test_a_dtype_gloo_cannot_carry_ends_the_rank_as_on_real_ranks(virtual_sides) -> None:
    """Paddle's gloo glue calls exit(-1) for an int16 buffer: the rank dies on both sides, not an exception."""
    mesh = Mesh((2,))
    save = {"w": Sharded(mesh, (Shard(0),)).to_json()}
    load = {"w": Sharded(mesh, (Replicate(),)).to_json()}
    case = _case("P-RESHARD", (TensorCase("w", "I16", (4, 2), 3),), save, load)
    _same(virtual_sides, case)
    assert run_side(case, virtual_sides[1]).records[1].failure == "crash"


def test_a_rank_gloo_kills_reads_as_the_same_known_bug_on_both_sides(virtual_sides) -> None:
    """Each virtual rank writes its own workerlog, so the log tails a crash quotes end where a real rank's do: the
    known finding whose signature reads them (a rank died right after reshard_comm's last line) explains both
    sides, and the virtual host's own note on the exit stays in its log."""
    mesh = Mesh((2,))
    save = {"w": Sharded(mesh, (Shard(0),)).to_json()}
    load = {"w": Sharded(mesh, (Replicate(),)).to_json()}
    case = _case("P-RESHARD", (TensorCase("w", "I16", (4, 2), 3),), save, load)
    known = read_known(Path(__file__).parent / "regressions")
    found = []
    for runners in virtual_sides:
        judgement, _ = Judge(runners, exploring=True)(case)
        found.append(explanations(known, SUT, judgement))
    assert found == [["paddle-dcp-int16-reshard-kills-rank.json"]] * 2
    message = judgement.anomalies[0].to_json()["message"]
    # "...; logs: NAME: tail; NAME: tail": the host's log may hold other lines first (Paddle's import warnings
    # where the host was launched rather than forked)
    tails = dict(re.findall(r"(virtual-host\.log|workerlog\.\d+): (.*?)(?=; (?:virtual-host\.log|workerlog\.\d+): |$)",
                            message.split("; logs: ", 1)[1]))
    assert "workerlog.0" in tails and "virtual rank 0 exits with status 255" in tails["virtual-host.log"]


def test_a_rank_that_raises_leaves_its_peers_stuck_on_both_sides(virtual_sides) -> None:
    """fp8 has no CPU full_like kernel: receiving ranks raise before the broadcast, the sender dies in it."""
    mesh = Mesh((3,))
    save = {"w": Sharded(mesh, (Shard(0),)).to_json()}
    load = {"w": Sharded(mesh, (Replicate(),)).to_json()}
    _same(virtual_sides, _case("P-RESHARD", (TensorCase("w", "F8_E4M3", (3, 2), 4),), save, load))


@pytest.mark.parametrize("world", [5, 7, 13])
def test_paddle_runs_at_world_sizes_no_machine_here_launches(world: int) -> None:
    """Odd and prime worlds, saved on one size and loaded on another: every rank gets its exact piece."""
    save_mesh, load_mesh = Mesh((world,)), Mesh((world - 2,))
    tensors = (TensorCase("model/w", "F32", (2 * world, 3), 5), TensorCase("model/b", "BF16", (world,), 6))
    row, whole = Sharded(save_mesh, (Shard(0),)).to_json(), Sharded(load_mesh, (Replicate(),)).to_json()
    save = {"model/w": row, "model/b": row}
    load = {"model/w": Sharded(load_mesh, (Shard(1),)).to_json(), "model/b": whole}
    judge = Judge(Runners(SUT, "virtual"))
    try:
        judgement, outcome = judge(_case("P-RESHARD", tensors, save, load))
    finally:
        judge.close()
    assert judgement.ok, judgement.details
    assert {rank for rec in outcome.records for rank in rec.loaded} >= set(range(world - 2))


def test_each_rank_keeps_its_own_copy_of_paddles_module_state() -> None:
    """A cache Paddle keeps at module level, filled on one rank, is not seen by another (a shared copy would make
    one rank read another's file list and report false bugs); identities are per rank."""
    import paddle.distributed as dist

    world = adapter_class(SUT).virtual_world(3)
    module = sys.modules["paddle.distributed.flex_checkpoint.dcp.load_state_dict"]
    try:
        def task(rank: int) -> tuple:
            cache = module.PATH_TO_CHECKPOINT_FILES
            before = dict(cache)
            cache[f"/ckpt/{rank}"] = [f"{rank}_0.distcp"]
            return dist.get_rank(), dist.get_world_size(), before, sorted(cache)

        results = world.run([lambda r=r: task(r) for r in range(3)])
        assert [value for _, value in results] == [(r, 3, {}, [f"/ckpt/{r}"]) for r in range(3)]
        again = world.run([lambda: sorted(module.PATH_TO_CHECKPOINT_FILES) for _ in range(3)])
        assert [value for _, value in again] == [[f"/ckpt/{r}"] for r in range(3)]
    finally:
        world.close()


def test_each_rank_registers_only_its_own_process_meshes() -> None:
    """Every ProcessMesh registers itself in process-wide lists (the default DistributedContext's meshes, process
    group 0's ranks): a real rank's lists hold its own meshes only, and so must a virtual rank's. Each rank starts
    from what the host process held (a test process may have made meshes before) and adds its own alone."""
    import paddle.distributed as dist
    from paddle.distributed.auto_parallel.static.dist_context import get_default_distributed_context
    from paddle.distributed.auto_parallel.static.process_group import get_process_group

    before = [m.process_ids for m in get_default_distributed_context().process_meshes]
    ranks_before = set(get_process_group(0).ranks)
    world = adapter_class(SUT).virtual_world(3)
    try:
        def task(rank: int) -> tuple:
            dist.ProcessMesh([rank], dim_names=["x"])
            meshes = get_default_distributed_context().process_meshes
            return [m.process_ids for m in meshes], sorted(get_process_group(0).ranks)

        results = world.run([lambda r=r: task(r) for r in range(3)])
        own = [(before + ([] if [r] in before else [[r]]), sorted(ranks_before | {r})) for r in range(3)]
        assert [value for _, value in results] == own
    finally:
        world.close()


def _virtual_campaign(tmp_path, ranks: int, seconds: int) -> dict:
    from harness.cli import main

    code = main(["fuzz", "--sut", SUT, "--launch", "virtual", "--ranks", str(ranks), "--time", str(seconds),
                 "--seed", "1", "--property", "P-ROUNDTRIP", "--property", "P-RESHARD", "--out", str(tmp_path),
                 "--no-repro"])  # the campaign is under test here; repros: tests/test_repro.py
    assert code in (0, 1), (tmp_path / "report.md").read_text()
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["launch_mode"] == "virtual" and sum(summary["cases_run"].values()) > 0
    for finding in (tmp_path / "findings").glob("*.json"):  # every virtual finding says where it stands on real ranks
        assert json.loads(finding.read_text())["confirmed_real"] in ("yes", "no", "virtual-only")
    return summary


def test_a_virtual_campaign_reaches_64_ranks(tmp_path) -> None:
    _virtual_campaign(tmp_path, 64, 20)


@pytest.mark.nightly
def test_a_virtual_campaign_reaches_256_ranks(tmp_path) -> None:
    _virtual_campaign(tmp_path, 256, 1200)


def test_what_the_virtual_world_does_not_emulate_is_the_harness_s_failure_not_a_finding() -> None:
    """A rank that meets a call virtual ranks do not emulate (a sub-group) raises VirtualUnsupported out of the op,
    so a campaign counts a harness error and replay exits 2: never a finding."""
    from harness.ranks.virtual.gloo import VirtualUnsupported
    from harness.ranks.virtual_pool import VirtualPool

    pool = VirtualPool("tests.suts.buggy:NewGroupSut", 2, {"shims": True, "device": "auto"})
    try:
        mesh = Mesh((2,))
        case = _case("P-ROUNDTRIP", (TensorCase("w", "F32", (2,), 1),), {"w": Sharded(mesh, (Shard(0),)).to_json()},
                     {"w": Sharded(mesh, (Shard(0),)).to_json()})
        pool.begin(case.to_json(), "/nonexistent-root")
        with pytest.raises(VirtualUnsupported, match="new_group"):
            pool.op(0, 60)
    finally:
        pool.close(False)


def test_a_dead_group_fails_later_ops_as_real_gloo_does(virtual_sides) -> None:
    """3 ranks: a failed load poisons the next one on rank 0 alone (KeyError), its peers wait out gloo's timeout,
    and every later collective fails at once: "pair closure" on the ranks that timed out, in every later op, and
    a pair.cc TIMEOUT naming its ring's left-hand neighbour on the rank that arrives after the timeout. Virtual
    campaigns met this chain as a new bucket (the ranks' errors read as fresh 30 s timeouts) until the emulation
    kept which ranks had timed out across ops."""
    real, virtual = virtual_sides
    case = Case.from_json(json.loads((Path(__file__).parent / "fidelity_cases" / "dead-group-later-ops.json")
                                     .read_text()))
    with real.waiting(), virtual.waiting():
        real_side, virtual_side = run_sides(case, real, virtual)
    assert differences(real_side, virtual_side) == []
    last = virtual_side.records[-1]
    assert "pair.cc" in last.errors[0][1] and last.errors[1][1] == last.errors[2][1] == \
        "Application timeout caused pair closure"


def test_messages_agree_whatever_address_the_allocator_gave_an_object() -> None:
    """An object's address in a repr is where the allocator put it: both sides agree on it as <address>, also where
    a long message was shortened in the middle of one (its head, then its tail after " ... ")."""
    from harness.judging.fidelity import normalise

    def said(head: str, tail: str) -> str:
        return normalise(f"<W object at 0x{head} ... x{tail}>, 'b': <W object at 0x{tail}>", Path("/no-root"))

    assert said("7f6d3", "7f6d34540050") == said("7f3", "7f361a412610") == said("", "7f0000000010")
    assert "7f" not in said("7f6d3", "7f6d34540050")


@pytest.fixture(scope="module")
def two_processes():
    """A process that shares between virtual ranks and one that does not, each running the same cases in the same
    order: Paddle's own process history (name counters, what a failed load leaves) is then the same on both sides.
    Both run under the hash seed of a launched rank (harness.ranks.launch.child_env): where Paddle walks a set of names,
    a failing load then names the same key on both sides. A worker Paddle aborts is replaced by its pool; every worker
    the pools ever had is killed here."""
    import multiprocessing

    import psutil

    from harness.ranks.launch import child_env

    ctx = multiprocessing.get_context("spawn")
    with pytest.MonkeyPatch.context() as env:  # held while the pools live: a replaced worker is spawned later
        env.setenv("PYTHONHASHSEED", child_env()["PYTHONHASHSEED"])
        pools = [ctx.Pool(1), ctx.Pool(1)]
        yield pools
    for pool in pools:
        pool.close()  # no worker is replaced from here on
    for pool in pools:  # SIGKILL, tree first: Paddle's SIGTERM handler can leave a worker that never exits
        for worker in pool._pool:
            with contextlib.suppress(psutil.Error):
                for proc in [*psutil.Process(worker.pid).children(recursive=True), psutil.Process(worker.pid)]:
                    proc.kill()
    for pool in pools:
        pool.join()
        # Its finalizer would take the task queue's read lock, which a worker killed while waiting for a task may
        # hold for ever: joined, the pool has nothing left for it to do.
        pool._terminate.cancel()


def _live_worker(pool):
    """The pool's worker once it is alive: after a crash the pool replaces its worker a moment later."""
    import time

    while not pool._pool or pool._pool[0].exitcode is not None:
        time.sleep(0.1)
    return pool._pool[0]


def _outcome(pool, worker, result) -> object:
    """What one side gave for a case: its records and files, or how its process died (a Paddle crash kills the
    process, and the pool starts another in its place), within the same bound as a rank op."""
    import time

    deadline = time.monotonic() + 300
    while not result.ready():
        if worker.exitcode is not None:
            pool._cache.pop(result._job, None)  # never answered: the pool would wait for it when it closes
            return f"process died with exit code {worker.exitcode}"
        assert time.monotonic() < deadline, "a side ran past 300 s"
        result.wait(0.5)
    return result.get()


@settings(max_examples=8, derandomize=True, **_SETTINGS)
@given(case=_cases(("P-RESHARD", "P-MOE", "P-FLAT", "P-ROUNDTRIP", "P-EDGE"), 12))
def test_what_virtual_ranks_share_changes_nothing(two_processes, case: Case) -> None:
    """From SHARE_FROM ranks on, gathered objects, pure planners and deep copies of immutable metadata are shared
    between virtual ranks (harness.ranks.virtual.shared_objects): every op gives the same records and the same files
    as the same world with nothing shared (a process Paddle aborts on one side only is a difference too)."""
    from hypothesis import assume

    from harness.judging.fidelity import max_world
    from harness.ranks.virtual.paddle_world import SHARE_FROM

    assume(max_world(case) >= SHARE_FROM)
    data = case.to_json()
    started = [(pool, _live_worker(pool), pool.apply_async(run_in_process, (data, share)))
               for pool, share in zip(two_processes, (True, False))]
    shared, alone = (_outcome(*side) for side in started)
    assert shared == alone


def run_in_process(case_json: dict, share: bool) -> tuple[list, dict]:
    """Every rank op of the case on virtual ranks of this process (a world per op), and the files it left, as
    harness.judging.fidelity compares them (the root's path and Paddle's per-process name counters left out; a pickle as
    its opcodes, so an object written once and referenced twice differs from two equal objects)."""
    import shutil
    import tempfile

    from harness.judging.fidelity import file_form, normalise

    case = Case.from_json(case_json)
    root = Path(tempfile.mkdtemp(prefix="ckh-share-"))
    try:
        records = [_op_in_process(case, root, index, share) for index in range(len(case.ops))]
        files = {str(p.relative_to(root)): file_form(p.read_bytes(), root) for p in sorted(root.rglob("*"))
                 if p.is_file()}
        return json.loads(normalise(json.dumps(records, default=repr), root)), files
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _op_in_process(case: Case, root: Path, index: int, share: bool) -> list:
    from harness.ranks.rankops import RankExecutor
    from harness.ranks.virtual.paddle_world import PaddleWorld
    from harness.sut import _paddle_common

    cls, size = adapter_class(SUT), case.world_size(case.op_layouts(index))
    world = PaddleWorld(size, _paddle_common, share)
    try:
        adapters = [cls() for _ in range(size)]
        world.run([lambda a=a, r=r: a.setup(r, size, {"shims": True, "device": "auto"})
                   for r, a in enumerate(adapters)])
        executors = [RankExecutor(a, r, size) for r, a in enumerate(adapters)]
        for ex in executors:
            ex.begin(case, str(root))
        done = world.run([lambda ex=ex: ex.op(index) for ex in executors])
        world.run([lambda a=a: a.close() for a in adapters])
    finally:
        world.close()
    return [{k: v for k, v in rec.items() if k not in ("seconds", "traceback")} if ok else repr(rec)
            for ok, rec in done]


def _runner_of(runners: Runners, world: int) -> VirtualPool:
    return next(r for r in runners._runners.values() if r.world == world and isinstance(r, VirtualPool))


def test_a_host_that_lost_a_rank_starts_fresh_ranks_in_its_own_process(virtual_sides) -> None:
    """A rank's exit costs a real job its processes; the virtual host starts a fresh world in its own process (new
    rank threads, module state and adapters, as a relaunch would), and the next case runs on it exactly as on real
    ranks. Where a rank holds a detached save in flight, or no rank is left to ask, the host is killed and relaunched
    instead: a crash kills the writer with the process."""
    mesh = Mesh((3,))
    save = {"w": Sharded(mesh, (Shard(0),)).to_json()}
    load = {"w": Sharded(mesh, (Replicate(),)).to_json()}
    # the sender dies in gloo's broadcast, the others raise before it and are left stuck
    one_dies = _case("P-RESHARD", (TensorCase("w", "F8_E4M3", (3, 2), 4),), save, load)
    passing = _case("P-RESHARD", (TensorCase("w", "F32", (3, 2), 4),), save, load)
    virtual = virtual_sides[1]
    run_side(passing, virtual)
    host = _runner_of(virtual, 3)
    pids, rebuilds = set(host.pids.values()), host.rebuilds
    assert run_side(one_dies, virtual).records[1].failure == "hang"
    assert _runner_of(virtual, 3) is host and set(host.pids.values()) == pids and host.rebuilds == rebuilds + 1
    assert "exits with status" not in host._logs()  # the fresh ranks' logs: a later failure quotes only theirs
    _same(virtual_sides, passing)
    assert host.rebuilds == rebuilds + 1
    in_flight = dataclasses.replace(one_dies, ops=(Op("save", "step-1"), Op("save", "step-2", 0, True, detach=True),
                                                   Op("load", "step-1")))
    assert run_side(in_flight, virtual).records[2].failure == "hang"
    assert host.rebuilds == rebuilds + 1 and not host.procs  # refused: killed
    _same(virtual_sides, passing)
    assert set(_runner_of(virtual, 3).pids.values()) != pids


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=40), st.integers(0, 200))
def test_a_gathered_payload_is_padded_as_paddle_pads_it(data: bytes, extra: int) -> None:
    """all_gather_object pads each rank's pickle to the longest as Paddle does, with np.resize: repeated to fill,
    zeros after an empty one (the padding is gathered, so it is part of what a rank receives)."""
    import numpy as np

    from harness.ranks.virtual.paddle_world import _resized

    size = len(data) + extra
    assert _resized(data, size) == np.resize(np.frombuffer(data, np.uint8), [size]).tobytes()
