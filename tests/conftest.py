"""Test-suite wiring: Hypothesis profiles, the nightly switch, and guards that no test leaks processes or temp
files."""

from __future__ import annotations

import os
import shutil
import tempfile

import psutil
import pytest

from properties.generate.profiles import register

PROFILE = register()
# Fixtures that keep a warm rank pool across tests (closed when their scope ends): the leak guard leaves them be.
POOL_FIXTURES = {"two_processes", "sut_judge", "torch_judge", "uc_judge", "trainer_judge", "zcc_judge", "virtual_sides",
                 "warm_runners"}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-nightly", action="store_true", help="run tests marked nightly (long fuzzing)")
    parser.addoption("--sut", default="reference", help="system under test for the property suite: a registered "
                     "name (reference, paddle-dcp, paddle-save, torch-dcp) or package.module:ClassName")
    parser.addoption("--ranks", type=int, default=2, help="world size of saves in the property suite")
    parser.addoption("--launch", default="pool", choices=("pool", "virtual"),
                     help="how the property suite's ranks run: a warm pool (default) or virtual ranks (paddle-dcp)")


def pytest_configure(config: pytest.Config) -> None:
    """Each test process (xdist worker) gets a temp directory of its own, inherited by everything it launches, so
    the leak guard sees exactly what this process's tests left behind."""
    private = tempfile.mkdtemp(prefix="ckh-tests-")
    os.environ["TMPDIR"] = tempfile.tempdir = private
    config.stash[_PRIVATE_TMP] = private


def pytest_unconfigure(config: pytest.Config) -> None:
    private = config.stash.get(_PRIVATE_TMP, None)
    if private is not None:
        shutil.rmtree(private, ignore_errors=True)


_PRIVATE_TMP = pytest.StashKey[str]()


def pytest_report_header(config: pytest.Config) -> str:
    return f"ckpt-harness: hypothesis profile {PROFILE!r}, SUT {config.getoption('--sut')!r}"


def gpu_count() -> int:
    """GPUs a CUDA build of torch or Paddle can see here (0 without either, or without GPUs). Only asked when
    a test is marked gpu, so CPU runs never import a framework for it."""
    import importlib.util

    if importlib.util.find_spec("torch") is not None:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.device_count()
    if importlib.util.find_spec("paddle") is not None:
        import paddle

        if paddle.is_compiled_with_cuda():
            return paddle.device.cuda.device_count()
    return 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if gpu_items and gpu_count() < 2:
        skip_gpu = pytest.mark.skip(reason="needs 2 or more GPUs and a CUDA build of torch or Paddle")
        for item in gpu_items:
            item.add_marker(skip_gpu)
    if config.getoption("--run-nightly") or PROFILE == "nightly":
        return
    skip = pytest.mark.skip(reason="nightly only: pass --run-nightly or use the nightly profile")
    for item in items:
        if "nightly" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def sut_judge(request: pytest.FixtureRequest):
    """A warm rank pool (per xdist worker) running the SUT chosen with --sut, closed at the end of the session."""
    from harness.judging.judge import Judge
    from harness.ranks.runners import Runners
    from harness.sut import UnknownSut

    name = request.config.getoption("--sut")
    try:
        judge = Judge(Runners(name, mode=request.config.getoption("--launch")), exploring=True)  # fuzzing draws
    except (UnknownSut, ValueError) as exc:  # ValueError: --launch virtual for a SUT without virtual ranks
        pytest.fail(f"--sut {name}: {exc}")
    yield judge
    judge.close()


class WarmRunners:
    """Rank runners kept warm across the tests of one xdist worker, by (SUT, launch, fixes): replaying the
    regression findings and proving their fixes on warm ranks instead of a launch per case. Only the few last used
    stay open (each holds rank processes with the framework loaded); a new one forks its ranks from one fork server
    per SUT once a real launch taught it the shape. The nightly run replays in fresh launches, as a maintainer
    would."""

    KEEP = 3

    def __init__(self, fresh: bool) -> None:
        self.fresh = fresh
        self._open: dict[tuple[str, str, tuple[str, ...]], object] = {}
        self._forks: dict[str, object] = {}  # per SUT: one fork server for the runner sets of every fix set

    def launch(self, recorded: str) -> str:
        """How a finding recorded with launch ``recorded`` replays here."""
        return "pool" if recorded == "fresh" and not self.fresh else recorded

    def get(self, sut: str, recorded: str = "fresh", fixes: tuple[str, ...] = ()):
        from harness.ranks.forkserver import ForkServer
        from harness.ranks.runners import Runners

        key = (sut, self.launch(recorded), tuple(fixes))
        runners = self._open.pop(key, None)
        if runners is None:
            forks = self._forks.setdefault(sut, ForkServer(sut)) if key[1] == "pool" else None
            runners = Runners(sut, key[1], fixes=key[2], forks=forks)
            runners.fork_pools = forks is not None
        self._open[key] = runners  # most recently used last
        while len(self._open) > self.KEEP:
            self._open.pop(next(iter(self._open))).close()
        return runners

    def close(self) -> None:
        for runners in self._open.values():
            runners.close()
        self._open.clear()
        for forks in self._forks.values():
            forks.close()
        self._forks.clear()


@pytest.fixture(scope="session")
def warm_runners(request: pytest.FixtureRequest):
    cache = WarmRunners(fresh=bool(request.config.getoption("--run-nightly")) or PROFILE == "nightly")
    yield cache
    cache.close()


@pytest.fixture(autouse=True)
def no_leaked_processes(request: pytest.FixtureRequest):
    """Every test must reap what it starts (async writers included) and remove the temp files it and its
    processes made (torch elastic's and multiprocessing's included); session pools are accounted for."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    temp_before = set(os.listdir(tempfile.gettempdir()))
    if POOL_FIXTURES & set(request.fixturenames):
        yield
        return
    yield
    leaked = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    for proc in leaked:
        proc.kill()
    assert not leaked, f"test left processes behind: {[p.pid for p in leaked]}"
    left = sorted(n for n in set(os.listdir(tempfile.gettempdir())) - temp_before if not n.startswith("pytest-of-"))
    assert not left, f"test left temp files behind: {left}"
