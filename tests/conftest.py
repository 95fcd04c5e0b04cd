"""Test-suite wiring: Hypothesis profiles, the nightly switch, and a guard that no test leaks processes."""

from __future__ import annotations

import psutil
import pytest

from properties.profiles import register

PROFILE = register()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-nightly", action="store_true", help="run tests marked nightly (long fuzzing)")


def pytest_report_header(config: pytest.Config) -> str:
    return f"ckpt-harness: hypothesis profile {PROFILE!r}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--run-nightly") or PROFILE == "nightly":
        return
    skip = pytest.mark.skip(reason="nightly only: pass --run-nightly or use the nightly profile")
    for item in items:
        if "nightly" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def no_leaked_processes():
    """Every test must reap what it starts (async writers included)."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    leaked = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    for proc in leaked:
        proc.kill()
    assert not leaked, f"test left processes behind: {[p.pid for p in leaked]}"
