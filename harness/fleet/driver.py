"""``ckpt-harness fleet``: a night of campaigns on Ray (docs/fleet.md).

Each shard run of the plan is a Ray task reserving what it needs (CPUs; a GPU shard its GPUs on one node through a
placement group) that runs the ordinary ``fuzz`` campaign (harness/fleet/shard.py) and returns its results as data; the
driver writes them under ``DIR/shards/<id>/`` and merges them (harness/fleet/merge.py). Nothing here waits unbounded: a
task reports when it starts (a small actor keeps the times), and one that is not done ``time + slack`` plus a
grace after it started, or never starts while the night could have run every shard twice, is cancelled with
``ray.cancel(force=True)``; a shard that failed, died or overran runs once more (``retries``). Without
``--address`` a local Ray instance is started for the night and shut down afterwards.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import os
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil

from harness.campaign.corpus import record_night, trends
from harness.coverage.merge import Measured, read_file, write_file
from harness.fleet.merge import busy_seconds, merge_buckets, merged_summary, pick_findings, write_fleet, write_shard
from harness.fleet.plan import Plan, PlanError, ShardRun, missing_interpreters
from harness.fleet.shard import (
    FLEET_VAR,
    TERM_GRACE,
    is_coverage,
    is_place,
    overrun_bound,
    pack_corpus,
    run_shard,
    sweep,
)
from harness.ranks.launch import REPO_ROOT, rank_pythonpath, short_tempdir
from harness.report.coverage import fleet_coverage

DRIVER_GRACE = TERM_GRACE + 30.0  # past a shard's own bound: the task's own termination had its chance
POLL_S = 2.0
LOCAL_OBJECT_STORE = 100 << 20  # bytes: shards return a few MB of text; leave /dev/shm to the ranks


class FleetError(Exception):
    """The fleet could not run at all (no Ray, a cluster that cannot be joined): one line, exit 2."""


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise FleetError("fleet needs Ray: pip install 'ckpt-harness[fleet]' (ray>=2.9)") from None
    return ray


@contextlib.contextmanager
def cluster(address: str | None) -> Iterator[dict]:
    """Ray for the night: join ``address``, or start a local instance (this machine's CPUs and GPUs, no dashboard,
    ports the OS picks, a temp dir of its own) and shut it down afterwards, whatever happened."""
    ray = _ray()
    began = time.monotonic()
    temp = None
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    try:
        if address is None:
            temp = _ray_temp()
            with _env(PYTHONPATH=rank_pythonpath(os.environ.get("PYTHONPATH"))):  # workers import this harness
                ray.init(num_cpus=os.cpu_count() or 1, include_dashboard=False, _temp_dir=temp,
                         object_store_memory=LOCAL_OBJECT_STORE, log_to_driver=False, configure_logging=False)
        else:
            ray.init(address=address, log_to_driver=False, configure_logging=False)
    except Exception as exc:
        with contextlib.suppress(Exception):
            ray.shutdown()
        if temp:
            shutil.rmtree(temp, ignore_errors=True)
        raise FleetError(f"could not {'start' if address is None else 'join'} Ray"
                         f"{'' if address is None else ' at ' + address}: {type(exc).__name__}: {exc}") from None
    info = {"ray": f"local ({os.cpu_count()} CPUs)" if address is None else address,
            "ray_start_s": round(time.monotonic() - began, 2), "resources": ray.cluster_resources()}
    try:
        yield info
    finally:
        ray.shutdown()
        _reap(before)
        if temp:
            shutil.rmtree(temp, ignore_errors=True)


def _reap(before: set[int], timeout: float = 15.0) -> None:
    """Wait for the processes Ray started here to end (shutdown signals them; they exit soon after), killing any
    left after ``timeout``: the night leaves nothing running."""
    mine = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    _, alive = psutil.wait_procs(mine, timeout=timeout)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=5.0)


def _ray_temp() -> str:
    """A temp folder for the local Ray, short enough for its Unix sockets (Ray's session and socket names take
    ~65 bytes under it)."""
    return short_tempdir("ckh-ray-", room=65)


@contextlib.contextmanager
def _env(**values: str) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class _Clock:
    """When each shard attempt started, as its task reports it (the driver's bound counts from there)."""

    def __init__(self) -> None:
        self.starts: dict[str, float] = {}

    def started(self, key: str) -> None:
        self.starts.setdefault(key, time.time())

    def get(self) -> dict[str, float]:
        return dict(self.starts)


def _task(run: ShardRun, seconds: float, slack: float, attempt: int, corpus: dict[str, bytes], fleet_token: str,
          driver_path: str, clock: Any) -> dict:
    """The Ray task: say it started, then run the shard (the driver's import path first, for external SUTs)."""
    clock.started.remote(f"{run.id}#{attempt}")
    return run_shard(run, seconds, slack, attempt, corpus, fleet_token, driver_path)


@dataclasses.dataclass
class _Attempt:
    run: ShardRun
    attempt: int
    submitted: float
    group: Any = None  # the placement group of a GPU shard

    @property
    def key(self) -> str:
        return f"{self.run.id}#{self.attempt}"


def infeasible(run: ShardRun, resources: dict) -> str | None:
    """Why the cluster can never run this shard (Ray would queue it forever), or None."""
    if run.cpus > resources.get("CPU", 0):
        return f"needs {run.cpus:g} CPUs; the cluster has {resources.get('CPU', 0):g}"
    if run.gpus() > resources.get("GPU", 0):
        return f"needs {run.gpus()} GPUs on one node; the cluster has {resources.get('GPU', 0):g} in all"
    return None


def run_fleet(plan: Plan, seconds: float, out: Path, address: str | None = None, corpus: Path | None = None,
              on_event: Callable[[str], None] = lambda _: None) -> dict:
    """Run the night; write ``out``/shards/<id>/, the merged findings, summary.json, report.md and report.html;
    return the merged summary. ``on_event`` sees a line per shard attempt as it ends."""
    began = time.time()
    missing = missing_interpreters(plan, REPO_ROOT) if address is None else []
    if missing:  # checked before any cluster is started: on this machine alone they could never run
        raise PlanError(f"{plan.path}: {'; '.join(missing)}")
    out.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex
    shipped = pack_corpus(corpus)
    results: dict[str, list[dict]] = {r.id: [] for r in plan.runs}
    try:
        with cluster(address) as info:
            _schedule(plan, seconds, token, shipped, info["resources"], results, on_event)
    finally:
        if address is None:
            sweep(FLEET_VAR, token)  # the last word on this machine: nothing of the night outlives it
    merge_began = time.time()
    shards, rows = [], []
    for run in plan.runs:
        final = results[run.id][-1] if results[run.id] else None
        if final is None:
            continue
        summary, found = write_shard(out, final)
        if summary is not None:
            shards.append((run.id, summary))
            rows += found
        if corpus is not None:
            _fold(corpus, final.get("corpus", {}))
    buckets = merge_buckets(shards)
    findings = pick_findings(buckets, rows, out)
    runs = [{**dataclasses.asdict(r), "attempts": results[r.id]} for r in plan.runs]
    inside = busy_seconds([(a["started"], a["ended"]) for r in runs for a in r["attempts"] if a.get("started")])
    fleet = {"ray": info["ray"], "ray_start_s": info["ray_start_s"], "inside_shards_s": round(inside, 1),
             "shard_seconds": round(sum(a.get("seconds") or 0 for r in runs for a in r["attempts"]), 1),
             "time_per_shard_s": seconds, "slack_s": plan.slack, "retries": plan.retries, "plan": str(plan.path)}
    summary = merged_summary(runs, shards, buckets, findings, fleet)
    summary["coverage"] = fleet_coverage(out, [(r.id, r.sut) for r in plan.runs], corpus)
    if corpus is not None:
        record_night(corpus, summary)
        summary["trends"] = trends(corpus)
    fleet["merge_s"] = round(time.time() - merge_began, 2)
    fleet["wall_s"] = round(time.time() - began, 1)
    fleet["overhead_s"] = round(fleet["wall_s"] - inside, 1)
    summary["wall_time_s"] = fleet["wall_s"]
    write_fleet(out, summary, findings)
    return summary


def _schedule(plan: Plan, seconds: float, token: str, shipped: dict[str, bytes], resources: dict,
              results: dict[str, list[dict]], on_event: Callable[[str], None]) -> None:
    """Submit every shard run, wait for each with bounds, retry what failed, cancel what overran."""
    ray = _ray()
    clock = ray.remote(num_cpus=0)(_Clock).remote()
    task = ray.remote(max_retries=0)(_task)
    driver_path = rank_pythonpath(os.environ.get("PYTHONPATH"))
    queue_bound = 2 * sum(overrun_bound(r.time or seconds, plan.slack) + DRIVER_GRACE for r in plan.runs) + 60.0
    pending: dict[Any, _Attempt] = {}

    def submit(run: ShardRun, attempt: int) -> None:
        why = infeasible(run, resources)
        if why is not None:
            results[run.id].append(_failed(run, attempt, "infeasible", why))
            on_event(f"shard {run.id}: infeasible: {why}")
            return
        a = _Attempt(run, attempt, time.monotonic())
        options: dict[str, Any] = {"num_cpus": run.cpus, "num_gpus": run.gpus()}
        if run.gpus():
            from ray.util.placement_group import placement_group
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            a.group = placement_group([{"CPU": run.cpus, "GPU": run.gpus()}], strategy="STRICT_PACK")
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(a.group)
        ref = task.options(**options).remote(run, seconds, plan.slack, attempt, shipped, token, driver_path, clock)
        pending[ref] = a

    def record_attempt(ref: Any, result: dict) -> None:
        a = pending.pop(ref)
        if a.group is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(a.group)
        results[a.run.id].append(result)
        on_event(f"shard {a.run.id} attempt {a.attempt}: {result['status']}"
                 + (f": {result['error']}" if result.get("error") else ""))
        if result["status"] != "ok" and a.attempt < plan.retries:
            submit(a.run, a.attempt + 1)

    for run in plan.runs:
        submit(run, 0)
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=POLL_S)
        for ref in ready:
            try:
                result = ray.get(ref)
            except Exception as exc:  # the worker died (its node went away, it was killed): the shard died
                a = pending[ref]
                result = _failed(a.run, a.attempt, "died", f"{type(exc).__name__}: {str(exc).splitlines()[0]}")
            record_attempt(ref, result)
        starts = ray.get(clock.get.remote())
        now_wall, now = time.time(), time.monotonic()
        for ref, a in list(pending.items()):
            started = starts.get(a.key)
            bound = overrun_bound(a.run.time or seconds, plan.slack) + DRIVER_GRACE
            if started is not None and now_wall - started > bound:
                why = f"no result {bound:.0f} s after it started: cancelled"
            elif started is None and now - a.submitted > queue_bound:
                why = f"not scheduled within {queue_bound:.0f} s: cancelled"
            else:
                continue
            ray.cancel(ref, force=True)
            record_attempt(ref, _failed(a.run, a.attempt, "overrun", why, started))


def _failed(run: ShardRun, attempt: int, status: str, error: str, started: float | None = None) -> dict:
    now = time.time()
    return {"id": run.id, "attempt": attempt, "status": status, "exit": None, "error": error, "files": {},
            "corpus": {}, "started": started, "ended": now if started else None,
            "seconds": round(now - started, 3) if started else 0.0, "node": None}


def _fold(corpus: Path, files: dict[str, str]) -> None:
    """A shard's new corpus files into the night's corpus (what is there already stays: first writer wins), and
    the explorer places it moved on (each shard of an exploration keeps its own)."""
    for rel, data in files.items():
        path = corpus / rel
        if ".." in Path(rel).parts or (path.exists() and not is_place(rel) and not is_coverage(rel)):
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if is_coverage(rel):  # every shard's recording adds to the night's total
            total = read_file(path)
            total.merge(Measured.from_json(json.loads(base64.b64decode(data)), rel))
            write_file(total, path)
        else:
            path.write_bytes(base64.b64decode(data))


def print_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
