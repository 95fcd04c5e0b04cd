"""``ckpt-harness fleet`` on a local Ray instance: shards run as Ray tasks and merge into one report; one bug found
by several shards is one bucket; a shard killed mid-run is reported and retried; a bad plan is one line, exit 2.
Each fleet starts and stops its own Ray (2 CPUs at most) and must leave no process behind (conftest's guard)."""

from __future__ import annotations

import importlib.util
import json
import os
import threading
import time
from pathlib import Path

import psutil
import pytest

from harness.cli import main
from harness.fleet.shard import SHARD_VAR

needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                               reason="Ray is not installed (pip install -e '.[fleet]'; CI installs it)")
BUGGY = "tests.suts.buggy:FlipsLastElementSut"


def _plan(path: Path, shards: list[dict], slack: int = 60) -> Path:
    lines = [f"[fleet]\nslack = {slack}\n"]
    for s in shards:
        lines.append("[[shard]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in s.items()))
    path.write_text("\n".join(lines))
    return path


@pytest.fixture(scope="module")
def night(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Path]:
    """One local fleet of four shard runs: the reference and a broken SUT, two seeds each, in-process ranks."""
    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray is not installed (pip install -e '.[fleet]'; CI installs it)")
    tmp = tmp_path_factory.mktemp("night")
    common = {"ranks": 2, "device": "cpu", "launch": "in-process", "properties": ["P-ROUNDTRIP"], "cpus": 0.5}
    plan = _plan(tmp / "plan.toml", [{"name": "ref", "sut": "reference", "seeds": [1, 2], **common},
                                     {"name": "flips", "sut": BUGGY, "seeds": [3, 4], **common}])
    code = main(["fleet", "--plan", str(plan), "--time", "4", "--out", str(tmp / "out"), "--corpus",
                 str(tmp / "corpus")])
    return code, tmp


@needs_ray
def test_reference_shards_find_nothing_and_write_one_merged_report(night: tuple[int, Path]) -> None:
    _, tmp = night
    summary = json.loads((tmp / "out" / "summary.json").read_text())
    shards = {s["id"]: s for s in summary["shards"]}
    assert set(shards) == {"ref-1", "ref-2", "flips-3", "flips-4"}
    assert all(s["status"] == "ok" and len(s["attempts"]) == 1 for s in shards.values())
    # where each ran: this node, and no GPUs for a CPU shard (a GPU shard names the ones Ray gave it)
    assert all(s["where"] == os.uname().nodename and s["attempts"][0]["gpus"] is None for s in shards.values())
    assert shards["ref-1"]["new_buckets"] == shards["ref-2"]["new_buckets"] == 0
    assert shards["ref-1"]["cases"] > 0 and shards["ref-2"]["cases"] > 0
    assert not any({"ref-1", "ref-2"} & set(b["shards"]) for b in summary["buckets"])
    for shard in shards:  # every shard's own results, beside the merged ones
        assert (tmp / "out" / "shards" / shard / "summary.json").is_file()
    assert {"report.md", "report.html", "summary.json"} <= {p.name for p in (tmp / "out").iterdir()}
    fleet = summary["fleet"]
    assert 0 <= fleet["overhead_s"] <= fleet["wall_s"] and fleet["inside_shards_s"] > 0
    assert "fleet overhead" in (tmp / "out" / "report.md").read_text()


@needs_ray
def test_one_bug_found_by_two_shards_is_one_bucket(night: tuple[int, Path]) -> None:
    code, tmp = night
    assert code == 1  # a new bucket
    summary = json.loads((tmp / "out" / "summary.json").read_text())
    (bucket,) = summary["buckets"]
    assert bucket["status"] == "new" and bucket["shards"] == ["flips-3", "flips-4"]
    per_shard = [json.loads((tmp / "out" / "shards" / s / "summary.json").read_text())["buckets"][0]["cases"]
                 for s in bucket["shards"]]
    assert bucket["cases"] == sum(per_shard)
    (finding,) = [json.loads(p.read_text()) for p in (tmp / "out" / "findings").glob("*.json")]
    assert finding["shards"] == ["flips-3", "flips-4"] and finding["verdict"] == "silent-corruption"
    assert str(tmp / "out" / "findings") in finding["replay"]
    # The corpus folded every shard's bucket case in, and the night is in its history.
    assert list((tmp / "corpus" / "buckets").rglob("*.json"))
    (night_line,) = (tmp / "corpus" / "nights.jsonl").read_text().splitlines()
    assert bucket["bucket"] in json.loads(night_line)["buckets"]
    assert summary["trends"][-1]["opened"] == [bucket["bucket"]]


def _kill_first_attempt(shard: str, stop: threading.Event, killed: list[int]) -> None:
    """SIGKILL the first attempt's campaign of ``shard`` once it has run a moment (a node losing the shard)."""
    while not stop.is_set():
        for p in psutil.process_iter():
            try:
                if p.environ().get(SHARD_VAR, "").startswith(f"{shard}#0:") and p.cmdline()[1:3] == ["-m",
                                                                                                   "harness.cli"]:
                    time.sleep(1.5)
                    p.kill()
                    killed.append(p.pid)
                    return
            except (psutil.Error, IndexError):
                continue
        time.sleep(0.2)


@needs_ray
def test_a_shard_killed_mid_run_is_reported_and_retried(tmp_path: Path, capsys) -> None:
    plan = _plan(tmp_path / "plan.toml", [{"name": "ref", "sut": "reference", "ranks": 2, "launch": "in-process",
                                           "properties": ["P-ROUNDTRIP"], "seeds": [5]}])
    stop, killed = threading.Event(), []
    killer = threading.Thread(target=_kill_first_attempt, args=("ref-5", stop, killed), daemon=True)
    killer.start()
    try:
        code = main(["fleet", "--plan", str(plan), "--time", "4", "--out", str(tmp_path / "out")])
    finally:
        stop.set()
        killer.join()
    assert killed, "the shard's campaign was never seen running"
    assert code == 0, capsys.readouterr().err
    (shard,) = json.loads((tmp_path / "out" / "summary.json").read_text())["shards"]
    assert [a["status"] for a in shard["attempts"]] == ["died", "ok"] and shard["status"] == "ok"
    assert "SIGKILL" in shard["attempts"][0]["error"]
    assert "attempt 0: died" in capsys.readouterr().err
    assert "ref-5 attempt 0: died" in (tmp_path / "out" / "report.md").read_text().replace("Shard ", "")


@pytest.mark.parametrize(
    ("plan", "message"),
    [
        (None, "no such plan file"),
        ("[[shard]\n", "not TOML"),
        ("[fleet]\nslack = 1\n", "no [[shard]] entries"),
        ("[[shard]]\nsut = 'nope'\nseeds = [1]\n", "field 'sut': 'nope' is not a registered SUT"),
        ("[[shard]]\nsut = 'reference'\nseeds = []\n", "field 'seeds'"),
        ("[[shard]]\nsut = 'reference'\nseeds = [1]\nranks = 0\n", "field 'ranks': expected an integer >= 1"),
        ("[[shard]]\nsut = 'reference'\nseeds = [1]\ndevice = 'tpu'\n", "field 'device': 'tpu' is not one of"),
        ("[[shard]]\nsut = 'reference'\nseeds = [1]\nlaunch = 'warp'\n", "field 'launch'"),
        ("[[shard]]\nsut = 'reference'\nseeds = [1]\nproperties = ['P-NOPE']\n", "unknown property IDs"),
        ("[[shard]]\nsut = 'reference'\nseeds = [1]\nproperties = ['P-ATOMIC']\n", "set faults = true"),
        ("[[shard]]\nsut = 'reference'\nseeds = [1]\ncolour = 'red'\n", "unknown field 'colour'"),
        ("[[shard]]\nsut = 'reference'\nseeds = [1, 1]\n", "appears twice"),
        ("[fleet]\nretries = -1\n[[shard]]\nsut = 'reference'\nseeds = [1]\n", "field 'retries'"),
        ("[[shard]]\nsut = 'reference'\nseeds = [1]\nfixes = 'no-such-fix'\n", "field 'fixes': unknown fixes"),
        ("[[shard]]\nsut = 'reference'\nseeds = [1]\nfixes = 1\n", "field 'fixes': expected 'all', 'none'"),
        ("[[shard]]\nsut = 'reference'\nseeds = [1]\nexplore = 'only'\n", "field 'explore': 'only' is about the"),
        ("[[shard]]\nsut = 'reference'\nseeds = [1]\nfaults = true\nexplore = 'all'\n", "field 'explore': 'all'"),
        ("[[shard]]\nsut = 'reference'\nseeds = [1]\nfaults = true\nexplore = 'only'\nproperties = ['P-ATOMIC']\n",
         "an exploration shard (explore = 'only') runs no property"),
        ("[[shard]]\nsut = 'reference'\nseeds = [1]\npython = 3\n", "field 'python': expected the path"),
        ("[[shard]]\nsut = 'reference'\nseeds = [1]\npython = 'no/such/python'\n",
         "reference-1: python 'no/such/python' is not an executable file"),
    ],
)
def test_a_bad_plan_is_one_line_exit_2(tmp_path: Path, capsys, plan: str | None, message: str) -> None:
    path = tmp_path / "plan.toml"
    if plan is not None:
        path.write_text(plan)
    code = main(["fleet", "--plan", str(path), "--time", "5", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()  # nothing ran


def test_the_example_plan_is_valid() -> None:
    from harness.fleet.plan import read_plan

    plan = read_plan(Path(__file__).resolve().parent.parent / "examples" / "nightly-cpu.toml")
    assert len(plan.runs) >= 2 and {r.sut for r in plan.runs} >= {"reference", "paddle-dcp"}
    assert all(r.device == "cpu" for r in plan.runs) and {r.ranks for r in plan.runs} == {2, 4}
    assert any(r.ranks == 4 and r.sut == "paddle-dcp" for r in plan.runs)  # parallel_broadcast needs a grid


def test_a_shard_runs_with_its_own_fixes_or_the_fleets(tmp_path: Path) -> None:
    from harness.fixes import FIXES
    from harness.fleet.plan import read_plan

    some = next(iter(FIXES))
    plan = _plan(tmp_path / "plan.toml", [{"sut": "paddle-dcp", "seeds": [1], "fixes": some},
                                          {"sut": "paddle-dcp", "name": "stock", "seeds": [1]}])
    argvs = [r.fuzz_argv(10, "out") for r in read_plan(plan, fixes="none").runs]
    assert [a[a.index("--fixes") + 1] for a in argvs] == [some, "none"]
    assert read_plan(plan).runs[1].fixes == "all"  # a campaign's default


def test_without_ray_the_fleet_is_one_line_exit_2(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "ray", None)  # import ray fails, as where it is not installed
    plan = _plan(tmp_path / "plan.toml", [{"sut": "reference", "seeds": [1]}])
    code = main(["fleet", "--plan", str(plan), "--time", "5", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "fleet needs Ray: pip install 'ckpt-harness[fleet]'" in err and err.count("\n") == 1


def test_the_seeds_of_a_fault_shard_split_its_explorer_and_each_keeps_its_place(tmp_path: Path) -> None:
    """An exploration shard's seeds take every n-th shape each (``--explore-part``), so they never judge the same
    point; a fault shard sharing its time does the same; ``off`` leaves the explorer out."""
    from harness.fleet.plan import read_plan

    plan = _plan(tmp_path / "plan.toml", [
        {"sut": "reference", "name": "explore", "seeds": [1, 2, 3], "faults": True, "explore": "only"},
        {"sut": "reference", "name": "faults", "seeds": [4], "faults": True},
        {"sut": "reference", "name": "plain", "seeds": [5], "faults": True, "explore": "off"}])
    argvs = {r.id: r.fuzz_argv(10, "out") for r in read_plan(plan).runs}
    for n, seed in enumerate((1, 2, 3)):
        argv = argvs[f"explore-{seed}"]
        assert "--explore-only" in argv and argv[argv.index("--explore-part") + 1] == f"{n}/3"
    assert "--explore-only" not in argvs["faults-4"] and "--explore-part" not in argvs["faults-4"]
    assert "--no-explore" in argvs["plain-5"]


def test_a_shard_hands_back_the_explorer_place_it_moved_and_the_night_keeps_the_newest(tmp_path: Path) -> None:
    """Corpus files are written once (first writer wins), but an explorer's place moves on every night: the shard
    returns it when it changed, and the night's corpus takes it."""
    import base64

    from harness.fleet.driver import _fold
    from harness.fleet.shard import _new_corpus

    shard = tmp_path / "shard"
    (shard / "explore").mkdir(parents=True)
    (shard / "buckets").mkdir()
    (shard / "explore" / "reference-2-stock-kill.json").write_text('{"shape": 3}')
    (shard / "buckets" / "b.json").write_text("new")
    shipped = {"explore/reference-2-stock-kill.json": b'{"shape": 1}', "buckets/b.json": b"old"}
    back = _new_corpus(shard, shipped)
    assert set(back) == {"explore/reference-2-stock-kill.json"}  # a bucket case is written once
    assert _new_corpus(shard, {"explore/reference-2-stock-kill.json": b'{"shape": 3}'}) == {
        "buckets/b.json": base64.b64encode(b"new").decode()}  # an unmoved place is not handed back
    night = tmp_path / "night"
    (night / "explore").mkdir(parents=True)
    (night / "explore" / "reference-2-stock-kill.json").write_text('{"shape": 1}')
    (night / "buckets").mkdir()
    (night / "buckets" / "b.json").write_text("old")
    _fold(night, {**back, "buckets/b.json": base64.b64encode(b"new").decode()})
    assert (night / "explore" / "reference-2-stock-kill.json").read_text() == '{"shape": 3}'
    assert (night / "buckets" / "b.json").read_text() == "old"


def test_a_shard_with_an_interpreter_of_its_own_runs_under_it_with_only_this_harness_added(tmp_path: Path) -> None:
    """A SUT whose framework lives in an environment of its own (PaddleFormers) runs its shard under that
    environment's interpreter, whose packages must win: the shard's PYTHONPATH is this harness alone."""
    import sys

    from harness.fleet.plan import read_plan
    from harness.fleet.shard import run_shard
    from harness.ranks.launch import REPO_ROOT

    seen = tmp_path / "seen"
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\necho "$PYTHONPATH" > {seen}\nexec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    plan = _plan(tmp_path / "plan.toml", [{"sut": "reference", "seeds": [1], "launch": "in-process",
                                           "properties": ["P-ROUNDTRIP"], "python": str(wrapper)}])
    run = read_plan(plan).runs[0]
    result = run_shard(run, 2.0, 60.0, 0, {}, pythonpath=os.pathsep.join(sys.path))
    assert result["status"] == "ok", result["error"]
    assert seen.read_text().strip() == str(REPO_ROOT)


def test_the_night_report_has_a_line_per_shard_explorer() -> None:
    from harness.fleet.merge import fleet_report, merged_summary

    explored = {"seconds": 290.0, "points": 120, "states": 300, "orders": 4, "points_per_minute": 24.8,
                "states_per_minute": 62.1, "failing": 0, "errors": [], "at": "max_len 2, shape ST op 1 kill #3",
                "passes": 0, "part": "1/2", "shapes": {"SR": {"op 0 kill": "40/40"}}}
    runs = [{"id": f"x-{n}", "sut": "reference", "ranks": 2, "device": "cpu", "launch": "pool", "seed": n,
             "faults": True, "attempts": [{"attempt": 0, "status": "ok", "seconds": 300.0}]} for n in (1, 2)]
    shards = [("x-1", {"exploration": explored, "cases_run": {}}), ("x-2", {"cases_run": {"P-ATOMIC": 3}})]
    fleet = {"wall_s": 310.0, "inside_shards_s": 300.0, "overhead_s": 10.0, "ray_start_s": 5.0, "merge_s": 0.1,
             "ray": "local"}
    summary = merged_summary(runs, shards, [], [], fleet)
    assert summary["exploration"] == {"x-1": explored}
    report = fleet_report(summary, [])
    assert "Shard x-1: Explorer: 4 saves' IO checked" in report and "(part 1/2 of the shapes)" in report, report
    assert "Shard x-2: Explorer" not in report
