"""A fleet plan (``ckpt-harness fleet --plan PLAN.toml``): which campaigns a night runs, read once and checked
before any cluster is touched, so a typo costs one line (exit 2), not a night.

```toml
[fleet]
slack = 120          # seconds past its time and its campaign's shrink room (start-up, reports) before it is overrun
retries = 1          # a shard that dies or overruns runs again this many times

[[shard]]
name = "paddle-dcp"  # default: the SUT
sut = "paddle-dcp"   # a registered SUT or package.module:ClassName
ranks = 2
device = "cpu"       # cpu | gpu | auto; gpu reserves `ranks` GPUs of one node (a placement group)
launch = "pool"      # pool | fresh | in-process | virtual
faults = false
properties = []      # default: fuzz's default set (with the fault properties when faults = true)
seeds = [1, 2]       # one shard run per seed, each its own campaign
cpus = 1             # CPUs the shard reserves (default 1)
time = 300           # optional: this shard's seconds instead of --time
fixes = "all"        # optional: fuzz --fixes for this shard (all | none | ids), instead of fleet --fixes
explore = "share"    # with faults: the explorer's share of the time (share), none (off), or all of it (only:
                     # an exploration shard); the seeds split the explorer's shapes, each keeping its place
python = ""          # optional: the interpreter the campaign runs under, where the SUT's framework lives in an
                     # environment of its own (PaddleFormers: .ci/paddleformers-env); relative to the checkout
```
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.fixes import FixError, resolve
from harness.ranks.runners import DEVICES, MODES
from harness.sut import REGISTRY
from properties import registry as catalogue

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the fleet extra installs tomli, tomllib's origin
    import tomli as tomllib

FLEET_KEYS = {"slack": float, "retries": int}
SHARD_KEYS = ("name", "sut", "ranks", "device", "launch", "faults", "properties", "seeds", "cpus", "time",
              "op_timeout", "fixes", "explore", "python")
EXPLORE = ("share", "off", "only")
_EXTERNAL = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
DEFAULT_SLACK = 120.0


class PlanError(Exception):
    """A plan that cannot run: the message names the file, the shard and the field, in one line."""


@dataclass(frozen=True)
class ShardRun:
    """One campaign of a night: one shard of the plan with one of its seeds."""

    id: str  # "<shard name>-<seed>": its folder under DIR/shards/
    shard: str
    sut: str
    ranks: int
    device: str
    launch: str
    faults: bool
    properties: tuple[str, ...]
    seed: int
    cpus: float
    time: float | None
    op_timeout: float | None
    fixes: str = "all"  # fuzz --fixes
    explore: str = "share"  # the explorer's time in a fault shard: share, off or only (EXPLORE)
    explore_part: tuple[int, int] = (0, 1)  # the explorer's part of the shapes: this seed's, of the shard's seeds
    python: str = ""  # the campaign's interpreter (an environment with the SUT's framework); "": the driver's

    def gpus(self) -> int:
        """GPUs to reserve on one node: one per rank for a GPU shard (docs/gpu.md)."""
        return self.ranks if self.device == "gpu" else 0

    def fuzz_argv(self, seconds: float, out: str) -> list[str]:
        """The ordinary ``fuzz`` command this shard is (its corpus flags are added by the shard runner)."""
        argv = ["fuzz", "--sut", self.sut, "--ranks", str(self.ranks), "--time", str(self.time or seconds),
                "--out", out, "--seed", str(self.seed), "--launch", self.launch, "--device", self.device,
                "--fixes", self.fixes]
        for prop in self.properties:
            argv += ["--property", prop]
        if self.faults:
            argv.append("--faults")
            argv += {"share": [], "off": ["--no-explore"], "only": ["--explore-only"]}[self.explore]
            if self.explore_part[1] > 1:
                argv += ["--explore-part", f"{self.explore_part[0]}/{self.explore_part[1]}"]
        if self.op_timeout is not None:
            argv += ["--op-timeout", str(self.op_timeout)]
        return argv


@dataclass(frozen=True)
class Plan:
    path: Path
    runs: tuple[ShardRun, ...]
    slack: float = DEFAULT_SLACK
    retries: int = 1


def read_plan(path: Path, fixes: str = "all") -> Plan:
    """Parse and check a plan file; every problem is a ``PlanError`` naming where it is. ``fixes``: the shards'
    ``fuzz --fixes`` where a shard names none."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PlanError(f"{path}: no such plan file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PlanError(f"{path}: cannot read the plan ({exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise PlanError(f"{path}: not TOML ({exc})") from None
    unknown = set(data) - {"fleet", "shard"}
    if unknown:
        raise PlanError(f"{path}: unknown table(s) {sorted(unknown)}; a plan has [fleet] and [[shard]]")
    fleet = data.get("fleet", {})
    if not isinstance(fleet, dict):
        raise PlanError(f"{path}: [fleet] must be a table")
    for key in set(fleet) - set(FLEET_KEYS):
        raise PlanError(f"{path}: [fleet]: unknown field {key!r} (known: {', '.join(FLEET_KEYS)})")
    slack = _number(fleet.get("slack", DEFAULT_SLACK), f"{path}: [fleet]: field 'slack'", low=0.0)
    retries = _integer(fleet.get("retries", 1), f"{path}: [fleet]: field 'retries'", low=0)
    shards = data.get("shard")
    if not isinstance(shards, list) or not shards:
        raise PlanError(f"{path}: no [[shard]] entries; a plan runs at least one shard")
    runs: list[ShardRun] = []
    names: set[str] = set()
    for n, raw in enumerate(shards):
        for run in _shard(path, n, raw, fixes):
            if run.id in names:
                raise PlanError(f"{path}: shard {n}: shard run {run.id!r} appears twice (names and seeds must differ)")
            names.add(run.id)
            runs.append(run)
    return Plan(path, tuple(runs), slack, retries)


def _shard(path: Path, n: int, raw: Any, fixes: str) -> list[ShardRun]:
    if not isinstance(raw, dict):
        raise PlanError(f"{path}: shard {n}: must be a table")
    where = f"{path}: shard {n}" + (f" ({raw['name']!r})" if isinstance(raw.get("name"), str) else "")
    for key in set(raw) - set(SHARD_KEYS):
        raise PlanError(f"{where}: unknown field {key!r} (known: {', '.join(SHARD_KEYS)})")
    sut = raw.get("sut")
    if not isinstance(sut, str) or not (sut in REGISTRY or _EXTERNAL.match(sut)):
        raise PlanError(f"{where}: field 'sut': {sut!r} is not a registered SUT ({', '.join(sorted(REGISTRY))}) "
                        "or package.module:ClassName")
    name = raw.get("name", sut.rsplit(":", 1)[-1])
    if not isinstance(name, str) or not _NAME.match(name):
        raise PlanError(f"{where}: field 'name': {name!r} must be letters, digits, '.', '_' or '-'")
    device = _choice(raw.get("device", "cpu"), DEVICES, f"{where}: field 'device'")
    launch = _choice(raw.get("launch", "pool"), MODES, f"{where}: field 'launch'")
    faults = raw.get("faults", False)
    if not isinstance(faults, bool):
        raise PlanError(f"{where}: field 'faults': expected true or false, got {faults!r}")
    props = raw.get("properties", [])
    if not isinstance(props, list) or not all(isinstance(p, str) for p in props):
        raise PlanError(f"{where}: field 'properties': expected a list of property IDs, got {props!r}")
    unknown = [p for p in props if p not in catalogue.REGISTRY]
    if unknown:
        raise PlanError(f"{where}: field 'properties': unknown property IDs {unknown}; see `ckpt-harness list`")
    needs = [p for p in props if catalogue.REGISTRY[p].fault and not faults]
    if needs:
        raise PlanError(f"{where}: field 'properties': {needs} inject faults: set faults = true")
    seeds = raw.get("seeds")
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                                                          for s in seeds):
        raise PlanError(f"{where}: field 'seeds': expected a non-empty list of integers >= 0, got {seeds!r}")
    ranks = _integer(raw.get("ranks", 2), f"{where}: field 'ranks'", low=1)
    cpus = _number(raw.get("cpus", 1), f"{where}: field 'cpus'", low=0.0)
    time = raw.get("time")
    time = None if time is None else _number(time, f"{where}: field 'time'", low=1.0)
    op_timeout = raw.get("op_timeout")
    op_timeout = None if op_timeout is None else _number(op_timeout, f"{where}: field 'op_timeout'", low=1.0)
    fixes = _fixes(raw.get("fixes", fixes), f"{where}: field 'fixes'")
    explore = _choice(raw.get("explore", "share"), EXPLORE, f"{where}: field 'explore'")
    if explore != "share" and not faults:
        raise PlanError(f"{where}: field 'explore': {explore!r} is about the explorer of a fault campaign: set "
                        "faults = true")
    if explore == "only" and props:
        raise PlanError(f"{where}: field 'properties': an exploration shard (explore = 'only') runs no property")
    # The seeds of a fault shard split its explorer's shapes, each run keeping its own place in the corpus (the
    # explorer's order is fixed: two runs of one part would judge the same points).
    parts = len(seeds) if faults and explore != "off" else 1
    python = raw.get("python", "")
    if not isinstance(python, str) or "\0" in python:
        raise PlanError(f"{where}: field 'python': expected the path of an interpreter, got {python!r}")
    return [ShardRun(f"{name}-{seed}", name, sut, ranks, device, launch, faults, tuple(props), seed, cpus, time,
                     op_timeout, fixes, explore, (n % parts, parts), python) for n, seed in enumerate(seeds)]


def missing_interpreters(plan: Plan, root: Path) -> list[str]:
    """The shards whose ``python`` is no interpreter here (relative paths from ``root``, the checkout): on a
    cluster of this machine alone, they could never run."""
    return [f"{run.id}: python {run.python!r} is not an executable file under {root}" for run in plan.runs
            if run.python and not _executable(root / run.python)]


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _fixes(value: Any, where: str) -> str:
    """A ``--fixes`` value every shard run will accept: all, none or known fix ids."""
    if not isinstance(value, str):
        raise PlanError(f"{where}: expected 'all', 'none' or fix ids separated by commas, got {value!r}")
    try:
        resolve(value)
    except FixError as exc:
        raise PlanError(f"{where}: {exc}") from None
    return value


def _choice(value: Any, allowed: tuple[str, ...], where: str) -> str:
    if value not in allowed:
        raise PlanError(f"{where}: {value!r} is not one of {', '.join(allowed)}")
    return value


def _integer(value: Any, where: str, low: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise PlanError(f"{where}: expected an integer >= {low}, got {value!r}")
    return value


def _number(value: Any, where: str, low: float) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or value < low:
        raise PlanError(f"{where}: expected a number >= {low:g}, got {value!r}")
    return float(value)
