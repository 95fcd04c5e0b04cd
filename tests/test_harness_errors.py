"""A harness failure never reads as a finding: an external adapter in the caller's directory imports on every
launched rank; an adapter the ranks cannot import, ranks that cannot start and the harness's own bugs are exit 2
and one line on stderr (exit 1 stays "findings / reproduces"); ``--debug`` re-raises for developers."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import cli
from harness.cli import main
from harness.ranks.launch import REPO_ROOT, child_env, launch_commands, rank_pythonpath
from harness.sut.shm import SHM_VAR
from properties.model.case import Case, Op, TensorCase
from reference.layout import Mesh, Shard, Sharded

ADAPTER = """from harness.sut.reference import ReferenceSut


class MySut(ReferenceSut):
    name = "mine"
"""
# Imports in the controller, raises on a launched rank (the pool puts SHM_VAR in every rank's environment).
RANK_ONLY_FAILURE = f"""import os

from harness.sut.reference import ReferenceSut

if os.environ.get({SHM_VAR!r}):
    raise RuntimeError("this adapter refuses to import on a rank")


class MySut(ReferenceSut):
    name = "rank-only-failure"
"""


@pytest.fixture
def private_tmp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A temp directory of the test's own for the controller and its ranks (short: it holds the pool's Unix
    socket), which must be empty when the test ends: nothing the harness made is left behind."""
    tmp = Path(tempfile.mkdtemp(prefix="ckh-t-"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setenv("TMPDIR", str(tmp))
    try:
        yield tmp
        assert not list(tmp.iterdir()), f"the harness left {sorted(p.name for p in tmp.iterdir())} behind"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def adapter_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The caller's working directory, where external adapter modules are written; sys.path and sys.modules are
    restored afterwards (adapter_class puts the working directory on sys.path)."""
    home = tmp_path / "caller"
    home.mkdir()
    monkeypatch.chdir(home)
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield home
    for name in set(sys.modules) - before:
        if name.startswith("ckh_ext_"):
            del sys.modules[name]


def _write_module(directory: Path, name: str, text: str) -> str:
    (directory / f"{name}.py").write_text(text, encoding="utf-8")
    import importlib

    importlib.invalidate_caches()
    return f"{name}:MySut"


def _one_line(err: str) -> str:
    assert err.count("\n") == 1 and err.startswith("ckpt-harness: error: ") and "Traceback" not in err, err
    return err


# -- ranks can import what the caller can -----------------------------------------------------------------------


def test_rank_pythonpath_puts_the_callers_view_ahead_of_what_was_there(tmp_path: Path, monkeypatch) -> None:
    extra, gone, kept = tmp_path / "extra", tmp_path / "gone", tmp_path / "kept-though-missing"
    extra.mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", ["", str(extra), str(gone), *sys.path])
    value = rank_pythonpath(os.pathsep.join([str(kept), str(extra), ""]))
    entries = value.split(os.pathsep)
    assert entries[:3] == [str(REPO_ROOT), str(tmp_path), str(extra)]  # repository, cwd, sys.path in order
    assert str(gone) not in entries and "" not in entries  # only entries that exist; "" is the rank's cwd
    assert entries[-1] == str(kept) and len(entries) == len(set(entries))  # what was there stays, once each
    assert rank_pythonpath(os.pathsep.join([str(kept), str(extra), ""])) == value  # deterministic


@pytest.mark.parametrize(("launcher", "nnodes"), [("plain", 1), ("paddle", 1), ("paddle", 2), ("torchrun", 1),
                                                  ("torchrun", 2)])
def test_every_launch_gives_the_ranks_the_callers_directory(tmp_path: Path, monkeypatch, launcher, nnodes) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", "/somewhere/else")
    commands = launch_commands(launcher, 2, "/x/ctl", "mymod:MySut", "{}", tmp_path, nnodes=nnodes)
    for _, env in commands:
        entries = env["PYTHONPATH"].split(os.pathsep)
        assert entries[:2] == [str(REPO_ROOT), str(tmp_path)] and entries[-1] == "/somewhere/else"
    assert child_env()["PYTHONPATH"] == commands[0][1]["PYTHONPATH"]


@pytest.mark.multirank
def test_an_adapter_in_the_callers_directory_runs_on_launched_ranks(adapter_dir: Path, private_tmp: Path,
                                                                    capsys) -> None:
    sut = _write_module(adapter_dir, "ckh_ext_mine", ADAPTER)
    out = adapter_dir / "out"
    code = main(["fuzz", "--sut", sut, "--ranks", "2", "--time", "3", "--out", str(out), "--property",
                 "P-ROUNDTRIP", "--seed", "1"])
    assert code == 0, capsys.readouterr()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["launch_mode"] == "pool" and summary["sut"] == sut and summary["harness_errors"] == []
    assert summary["cases_run"]["P-ROUNDTRIP"] > 0 and summary["launches"] >= 1
    case = adapter_dir / "case.json"  # replay: a fresh launch of the same external adapter
    mesh = Mesh((2,))
    layout = {"model/w": Sharded(mesh, (Shard(0),)).to_json()}
    case.write_text(json.dumps(Case("P-ROUNDTRIP", sut, (TensorCase("model/w", "F32", (4, 2), 1),), layout, layout,
                                    (Op("save", "a", 0), Op("load", "a", 0)), {}).to_json()))
    assert main(["replay", str(case)]) == 0, capsys.readouterr()


# -- harness errors are exit 2 and one line ---------------------------------------------------------------------


@pytest.mark.multirank
@pytest.mark.parametrize("launch", ["pool", "fresh"])
def test_an_adapter_the_ranks_cannot_import_is_exit_2_and_one_line(adapter_dir: Path, private_tmp: Path, capsys,
                                                                   launch: str) -> None:
    sut = _write_module(adapter_dir, f"ckh_ext_rank_only_{launch}", RANK_ONLY_FAILURE)
    out = adapter_dir / "out"
    code = main(["fuzz", "--sut", sut, "--ranks", "2", "--time", "30", "--out", str(out), "--launch", launch])
    err = _one_line(capsys.readouterr().err)
    assert code == 2
    assert "could not start ranks" in err and "RuntimeError: this adapter refuses to import on a rank" in err
    assert f"ckh_ext_rank_only_{launch}.py" in err  # the tail of the rank's log says where
    assert not out.exists()  # no case ran: no results that could read as a clean campaign


def test_ranks_that_cannot_start_end_the_campaign_at_once(tmp_path: Path) -> None:
    """The rule (harness/campaign/fuzz.py): a rank start-up failure is fatal at once; the cases before it stand."""
    from harness.campaign.fuzz import fuzz
    from harness.campaign.results import Campaign
    from harness.judging.judge import Judge
    from harness.ranks.runner import PoolFailure
    from harness.ranks.runners import Runners
    from harness.sut import adapter_class

    class CannotStart(Judge):
        calls = 0

        def __call__(self, case):
            CannotStart.calls += 1
            if CannotStart.calls >= 3:
                raise PoolFailure("setup", "a rank exited during start-up")
            return super().__call__(case)

    judge = CannotStart(Runners("reference", "in-process"))
    try:
        campaign = fuzz(judge, Campaign("reference", 1, ["P-ROUNDTRIP", "P-EDGE"], 30.0, 0, mode="in-process"),
                        frozenset(adapter_class("reference").capabilities))
    finally:
        judge.close()
    assert isinstance(campaign.fatal, PoolFailure) and CannotStart.calls == 3 and campaign.wall < 20
    assert sum(campaign.cases_run.values()) == 2 and len(campaign.harness_errors) == 1


def test_a_campaign_stopped_by_ranks_that_cannot_start_keeps_its_results_and_exits_2(tmp_path: Path, capsys,
                                                                                     monkeypatch) -> None:
    from harness.ranks.runner import PoolFailure

    def stopped(judge, campaign, capabilities, progress=False, exploration=None):
        campaign.cases_run["P-ROUNDTRIP"] = 2
        campaign.harness_errors.append("P-ROUNDTRIP: PoolFailure: rank 1 could not set up")
        campaign.fatal = PoolFailure("setup", "rank 1 could not set up the SUT adapter: OSError: no\nmore")
        return campaign

    monkeypatch.setattr("harness.cli.fuzz", stopped)
    code = main(["fuzz", "--sut", "reference", "--time", "5", "--out", str(tmp_path / "out")])
    captured = capsys.readouterr()
    err = _one_line(captured.err)
    assert code == 2 and "could not start ranks: rank 1 could not set up the SUT adapter: OSError: no / more" in err
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["cases_run"] == {"P-ROUNDTRIP": 2} and summary["harness_errors"]
    assert "2 cases, 0 findings" in captured.out


def _fails(monkeypatch: pytest.MonkeyPatch, target: str) -> None:
    def boom(*args, **kwargs):
        raise RuntimeError("harness bug\nsecond line")

    monkeypatch.setattr(target, boom)


@pytest.mark.parametrize(
    ("argv", "target"),
    [
        (["fuzz", "--sut", "reference", "--ranks", "1", "--time", "1", "--out", "{tmp}/out", "--launch", "in-process",
          "--property", "P-ROUNDTRIP"], "harness.cli.write_results"),
        (["fuzz", "--sut", "reference", "--time", "1", "--out", "{tmp}/out"], "harness.cli.Judge"),
        (["replay", "{tmp}/case.json"], "harness.cli.read_case_file"),
        (["crashpoints", "--exhaustive", "--sut", "reference"], "harness.campaign.explore.explore"),
        (["list"], "harness.cli.adapter_class"),
    ],
)
def test_an_unexpected_exception_in_the_harness_is_exit_2_and_one_line(tmp_path: Path, capsys, monkeypatch,
                                                                       argv: list[str], target: str) -> None:
    _fails(monkeypatch, target)
    monkeypatch.setattr("faults.strace.available", lambda: True)  # crashpoints gets as far as the exploration
    monkeypatch.delenv(cli.DEBUG_VAR, raising=False)
    code = main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    err = _one_line(capsys.readouterr().err)
    assert code == 2
    assert "internal error of the harness (not a finding): RuntimeError: harness bug / second line" in err


@pytest.mark.parametrize("how", ["flag before", "flag after", "env"])
def test_debug_re_raises_for_developers(tmp_path: Path, monkeypatch, how: str) -> None:
    _fails(monkeypatch, "harness.cli.read_case_file")
    argv = ["replay", str(tmp_path / "case.json")]
    if how == "env":
        monkeypatch.setenv(cli.DEBUG_VAR, "1")
    else:
        monkeypatch.delenv(cli.DEBUG_VAR, raising=False)
        argv = ["--debug", *argv] if how == "flag before" else [*argv, "--debug"]
    with pytest.raises(RuntimeError, match="harness bug"):
        main(argv)


def test_a_swarm_batch_the_sut_refuses_entirely_is_idle_not_a_harness_error(monkeypatch) -> None:
    """A batch's swarm configuration may leave only cases the SUT refuses on this world (a choice whose every
    value needs more ranks): Hypothesis then finds nothing to run. The batch counts as idle and the campaign goes
    on; it is no harness failure."""
    from hypothesis import strategies as st

    from harness.campaign import fuzz as fuzz_module
    from harness.campaign.fuzz import fuzz
    from harness.campaign.results import Campaign
    from harness.judging.judge import Judge
    from harness.ranks.runners import Runners
    from harness.sut import adapter_class
    from harness.sut.reference import ReferenceSut

    monkeypatch.setattr(ReferenceSut, "refuses", classmethod(lambda cls, case: "needs a world this run lacks"))
    one = Case("P-ROUNDTRIP", "reference", (), {}, {}, (Op("save", "a"), Op("load", "a")))
    monkeypatch.setattr(fuzz_module, "_drawn", lambda *args: st.just(one))  # drawing costs nothing here
    judge = Judge(Runners("reference", "in-process"))
    try:
        campaign = fuzz(judge, Campaign("reference", 1, ["P-ROUNDTRIP"], 1.0, 0, mode="in-process"),
                        frozenset(adapter_class("reference").capabilities))
    finally:
        judge.close()
    assert campaign.idle_batches["P-ROUNDTRIP"] >= 1
    assert sum(campaign.cases_run.values()) == 0 and campaign.harness_errors == [] and campaign.fatal is None
