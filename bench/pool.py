"""Warm rank pool vs a fresh launch per case, on real ranks, measured side by side in one run.

Prints ``pool_vs_fresh: R`` (cases per second through a warm pool ÷ through a fresh launch per case; target ≥ 20)
and ``sut_share: S`` (share of the warm pool's wall time spent inside SUT calls on the ranks; target ≥ 0.8),
then informative lines. The cases are small, fixed and drawn once, so both modes run identical work.

For a SUT whose rank 0 serves the others' rendezvous (``master_env``), it also prints
``forked_launch_together_vs_master_first: R``: the mean seconds of a pool forked from the fork server with every
rank at once ÷ with rank 0 first and the others once it listens, alternated launch by launch. On a 2-core machine
with Paddle 3.3.1: together 1.44 s (a third of the launches wait out the TCPStore client's retry, 3.4 s),
rank 0 first 0.58 s; ratio 2.5 (a later run of 6 launches each: 0.40 s both ways, ratio 1.00).

For a SUT of a framework with fixes (harness.fixes), ``forked_launch_fixes_in_rank_vs_zygote: R``: the mean
seconds of a forked pool whose ranks run with every fix, each rank applying them itself ÷ forked from a zygote that
applied them once. Same machine, Paddle 3.3.1 with its 30 fixes, 6 launches each: by each rank 3.68 s, from a zygote
0.45 s; ratio 8.2 (a pool that a fault case loses is replaced for about an eighth of the cost).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hypothesis import HealthCheck, given, settings
from hypothesis import seed as hypothesis_seed

from harness.fixes import resolve
from harness.judging.run import run_case
from harness.ranks.forkserver import ForkServer
from harness.ranks.runners import Runners
from harness.sut import adapter_class
from properties.check.oracle import check_oracle
from properties.generate.cases import cases
from properties.model.case import Case

# The healthy path: features every SUT here handles, so the figures measure the pool, not the relaunches that
# follow a finding (zero-size tensors, fp8/int16 and flat layouts fail on Paddle 3.3.1: see FINDINGS.md).
HEALTHY = frozenset({"dtype:F32", "dtype:BF16", "dtype:I32", "format:pickle"})


def draw_cases(sut: str, ranks: int, count: int, seed: int) -> list[Case]:
    """Small round-trip cases, drawn reproducibly (no Hypothesis in the timed loop)."""
    caps = HEALTHY & adapter_class(sut).capabilities
    out: list[Case] = []

    @settings(max_examples=count, database=None, suppress_health_check=list(HealthCheck), deadline=None)
    @given(cases("P-ROUNDTRIP", sut, ranks, caps))
    def collect(case: Case) -> None:
        if len(out) < count:
            out.append(case)

    hypothesis_seed(seed)(collect)()
    return out


def run(sut: str, mode: str, batch: list[Case]) -> tuple[float, float, int]:
    """Wall seconds, seconds inside SUT calls (slowest rank per op), launches — for one pass over ``batch``."""
    runners = Runners(sut, mode=mode)
    inside = 0.0
    try:
        if mode == "pool":  # warm up: the pool is launched once, before timing, as a fuzz campaign would
            check_oracle(batch[0], run_case(batch[0], runners))
        start = time.perf_counter()
        for case in batch:
            outcome = run_case(case, runners)
            verdict = check_oracle(case, outcome)
            if not verdict.ok:
                raise SystemExit(f"{sut} failed a benchmark case, so the figures would measure relaunches: "
                                 f"{verdict.details}")
            inside += outcome.sut_seconds
        wall = time.perf_counter() - start
    finally:
        launches = runners.launches
        runners.close()
    return wall, inside, launches


def forked_launches(sut: str, case: Case, count: int) -> tuple[float, float]:
    """Mean launch seconds of pools forked with rank 0 first and with every rank together, alternated so both
    settings see the same machine. Untimed: the real launch that teaches the fork server the pool's shape, and the
    first forked pool (it waits for the server to start)."""
    cls = adapter_class(sut)
    master_env, seconds = cls.master_env, {True: [], False: []}
    forks = ForkServer(sut)
    try:
        for n in range(2 * count + 2):
            first = n % 2 == 0
            cls.master_env = master_env if first else None
            runners = Runners(sut, mode="pool", forks=forks)
            runners.fork_pools = True
            try:
                run_case(case, runners)
                if n >= 2:
                    seconds[first].append(runners.recovery()["launch_seconds"])
            finally:
                runners.close()
    finally:
        cls.master_env = master_env
        forks.close()
    return statistics.mean(seconds[True]), statistics.mean(seconds[False])


def forked_launches_with_fixes(sut: str, case: Case, count: int) -> tuple[float, float]:
    """Mean launch seconds of forked pools whose ranks run with every fix of the SUT's framework, the fixes applied
    once in a zygote of the fork server, and applied by each rank, alternated pool by pool. Untimed as above."""
    fixes = resolve("all", adapter_class(sut).framework)
    servers = {True: ForkServer(sut, zygotes=True), False: ForkServer(sut, zygotes=False)}
    seconds: dict[bool, list[float]] = {True: [], False: []}
    try:
        for n in range(2 * count + 4):
            zygote = n % 2 == 0
            runners = Runners(sut, mode="pool", fixes=fixes, forks=servers[zygote])
            runners.fork_pools = True
            try:
                run_case(case, runners)
                if n >= 4:
                    seconds[zygote].append(runners.recovery()["launch_seconds"])
            finally:
                runners.close()
    finally:
        for server in servers.values():
            server.close()
    return statistics.mean(seconds[True]), statistics.mean(seconds[False])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sut", default="paddle-dcp", help="default paddle-dcp (falls back to reference if Paddle "
                        "is not installed)")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--pool-cases", type=int, default=40)
    parser.add_argument("--fresh-cases", type=int, default=4)
    parser.add_argument("--forked-launches", type=int, default=12, help="forked pools per setting (0: skip)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    sut = args.sut
    try:
        adapter_class(sut)
    except LookupError as exc:
        print(f"# {exc}; benchmarking the reference instead")
        sut = "reference"
    batch = draw_cases(sut, args.ranks, max(args.pool_cases, args.fresh_cases), args.seed)
    fresh_wall, _, fresh_launches = run(sut, "fresh", batch[: args.fresh_cases])
    pool_wall, pool_inside, pool_launches = run(sut, "pool", batch[: args.pool_cases])
    fresh_rate = args.fresh_cases / fresh_wall
    pool_rate = args.pool_cases / pool_wall
    print(f"pool_vs_fresh: {pool_rate / fresh_rate:.2f}")
    print(f"sut_share: {pool_inside / pool_wall:.3f}")
    print(f"pool_cases_per_s: {pool_rate:.2f}")
    print(f"fresh_cases_per_s: {fresh_rate:.3f}")
    print(f"# sut {sut}, {args.ranks} ranks; fresh: {args.fresh_cases} cases, {fresh_launches} launches; pool: "
          f"{args.pool_cases} cases, {pool_launches} launch(es) (warm-up case untimed)")
    if adapter_class(sut).master_env and args.forked_launches:
        first, together = forked_launches(sut, batch[0], args.forked_launches)
        print(f"forked_launch_together_vs_master_first: {together / first:.2f}")
        print(f"# forked launches, {args.forked_launches} each: rank 0 first {first:.2f} s, together {together:.2f} s")
    if adapter_class(sut).framework and args.forked_launches:
        zygote, in_rank = forked_launches_with_fixes(sut, batch[0], args.forked_launches)
        print(f"forked_launch_fixes_in_rank_vs_zygote: {in_rank / zygote:.2f}")
        print(f"# forked launches with every fix, {args.forked_launches} each: fixes applied in a zygote "
              f"{zygote:.2f} s, by each rank {in_rank:.2f} s")
    sizes = [sum(t.build().nbytes for t in c.tensors) for c in batch]
    print(f"# case state size: median {statistics.median(sizes):.0f} bytes, max {max(sizes)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
