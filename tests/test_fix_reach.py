"""What a run reaches of the fixes (harness.fixes.reach): an edit counts once its replaced lines run, or at every call
where that cannot be seen; recorders are transparent, reach forked and spawned processes and threads, and come off
again."""

from __future__ import annotations

import importlib
import inspect
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from harness.fixes import CARRIED_VAR, FIXES, REACH_VAR, prepare
from harness.fixes.patch import Fix, Hunk, source_digest
from harness.fixes.reach import WATCHED_ATTR, reached, reached_keys, watch

SOURCE = '''
def pick(x):
    if x > 0:
        return "pos"
    return "neg"


def branch(x):
    if x > 0:
        y = "pos"
    else:
        y = "neg"
    return y


def outer(x):
    return pick(x) + "!"


def sign(x,
         scale=1):
    return x * scale


def countdown(x):
    while x > 0:
        yield x
        x -= 1
    if x < 0:
        yield "below"


class Box:
    def get(self, x):
        return [v for v in range(x) if v > 2]
'''


@pytest.fixture
def toy(tmp_path: Path):
    """A module of its own per test (a fresh import), gone from sys.modules after."""
    name = f"reach_toy_{os.getpid()}_{abs(hash(tmp_path)) % 10**8}"
    home = tmp_path.parent / f"{tmp_path.name}-module"  # beside the directory the recorders write to
    home.mkdir()
    (home / f"{name}.py").write_text(SOURCE)
    sys.path.insert(0, str(home))
    try:
        yield importlib.import_module(name)
    finally:
        sys.path.remove(str(home))
        sys.modules.pop(name, None)


def _fix(module, fix_id: str, qualname: str, old: str, new: str) -> Fix:
    func = module
    for part in qualname.split("."):
        func = getattr(func, part)
    hunk = Hunk(module.__name__, qualname, source_digest(inspect.getsource(func)), ((old, new),))
    return Fix(fix_id, "fix", "toy", "0", "a test's fix", (hunk,), ())


def _watched(fixes: list[Fix]) -> list:
    return [(f.id, h.module, h.qualname, h.edits) for f in fixes for h in f.hunks]


def _fixes(toy) -> list[Fix]:
    return [_fix(toy, "pos", "pick", '        return "pos"\n', '        return "POS"\n'),
            _fix(toy, "neg", "pick", '    return "neg"\n', '    return "NEG"\n'),
            _fix(toy, "outer", "outer", '    return pick(x) + "!"\n', '    return pick(x) + "?"\n'),
            _fix(toy, "default", "sign", "         scale=1):\n", "         scale=2):\n"),
            _fix(toy, "below", "countdown", '        yield "below"\n', '        yield "BELOW"\n'),
            _fix(toy, "inner", "Box.get", "if v > 2]", "if v > 3]"),
            _fix(toy, "else", "branch", '        y = "pos"\n    else:\n', '        y = "pos"\n    elif x < 0:\n')]


def test_an_edit_counts_only_once_its_lines_run(toy, tmp_path: Path) -> None:
    """A branch not taken is not reached, one taken is, from a nested recorded call too; comprehension lines are
    traced in their own frames."""
    fixes = _fixes(toy)
    unwatch = watch(_watched(fixes), str(tmp_path))
    try:
        assert toy.outer(1) == "pos!" and toy.Box().get(2) == []
        assert reached(tmp_path) == ("inner", "outer", "pos")
        assert toy.pick(-1) == "neg"
        assert reached(tmp_path) == ("inner", "neg", "outer", "pos")
    finally:
        unwatch()


def test_an_edit_of_an_else_counts_at_every_call(toy, tmp_path: Path) -> None:
    """An ``else:`` has no line event of its own, and turned into an ``if`` it runs after the branch before it
    falls through, where no event of the replaced lines shows: the edit counts at every call, even one that takes
    only the first branch."""
    fixes = _fixes(toy)
    unwatch = watch(_watched(fixes), str(tmp_path))
    try:
        assert toy.branch(1) == "pos"
        assert reached(tmp_path) == ("else",)
    finally:
        unwatch()


def test_what_a_tracer_cannot_see_counts_at_every_call(toy, tmp_path: Path) -> None:
    """A signature's default, a generator's body (it runs after the call returns), and any call while another
    tracer owns the thread: the edit counts as reached when its function is called, never missed."""
    fixes = _fixes(toy)
    unwatch = watch(_watched(fixes), str(tmp_path))
    try:
        assert toy.sign(3) == 3 and next(toy.countdown(2)) == 2
        assert reached(tmp_path) == ("below", "default")
        before = sys.gettrace()
        sys.settrace(lambda *a: None)
        try:
            toy.pick(-1)
        finally:
            sys.settrace(before)
        assert reached(tmp_path) == ("below", "default", "neg", "pos")
    finally:
        unwatch()


def test_recorders_reach_forked_processes_and_threads(toy, tmp_path: Path) -> None:
    fixes = _fixes(toy)
    unwatch = watch(_watched(fixes), str(tmp_path))
    try:
        thread = threading.Thread(target=toy.pick, args=(1,))
        thread.start()
        thread.join()
        pid = os.fork()
        if pid == 0:  # a writer process the framework forks
            try:
                toy.pick(-1)
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        assert reached(tmp_path) == ("neg", "pos")
        assert {p.name for p in tmp_path.iterdir()} == {str(os.getpid()), str(pid)}
        assert f"{toy.__name__}.pick" in reached_keys(tmp_path)
    finally:
        unwatch()


def test_recorders_are_transparent_and_come_off(toy, tmp_path: Path) -> None:
    """A watched function keeps its name and signature and the caller's view of it; a fix applied over a watched
    function patches the framework's own one; unwatching binds back what was there."""
    pick, get = toy.pick, toy.Box.get
    fixes = _fixes(toy)
    unwatch = watch(_watched(fixes), str(tmp_path))
    assert getattr(toy.pick, WATCHED_ATTR) is pick and toy.pick.__name__ == "pick"
    assert inspect.signature(toy.pick) == inspect.signature(pick)
    again = toy.pick
    watch(_watched(fixes), str(tmp_path))  # watching twice wraps nothing twice
    assert toy.pick is again
    unwatch()
    assert toy.pick is pick and toy.Box.get is get
    unwatch = watch(_watched(fixes), str(tmp_path))
    fixes[0].apply()
    try:
        assert toy.pick(1) == "POS"
    finally:
        fixes[0].revert()
        unwatch()
    assert toy.pick(1) == "pos" and toy.pick is pick


SPAWNED_FIX = "torch-dcp-writer-init-timeout"  # its functions live in a module a writer process imports


def test_a_process_a_rank_spawns_takes_the_watch_up_again(tmp_path: Path, monkeypatch) -> None:
    """A spawned process (Zero-Cost Checkpointing's workers, an async writer) starts from a fresh interpreter, so
    a fix whose edits only it runs would read as never reached: it watches what the rank watches."""
    pytest.importorskip("torch.distributed.checkpoint")
    for var in (CARRIED_VAR, REACH_VAR):
        monkeypatch.setenv(var, "")  # restored after: prepare sets them for the rank's children
    unwatch = prepare({"reach": {"dir": str(tmp_path), "fixes": [SPAWNED_FIX]}})
    try:
        env = dict(os.environ)
    finally:
        unwatch()
    hunk = FIXES[SPAWNED_FIX].hunks[0]
    child = ("from harness.fixes import apply_carried\n"
             "from harness.fixes.reach import WATCHED_ATTR\n"
             "from harness.fixes.rebind import target\n"
             "apply_carried()\n"
             f"print(getattr(target({hunk.module!r}, {hunk.qualname!r})[2], WATCHED_ATTR, None) is not None)\n")
    done = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True"]


def test_a_patched_function_s_run_counts_toward_its_own_file(toy) -> None:
    """A fix's function reports the original file's lines (an edit's lines as the first line it replaced), so the
    coverage of a round with fixes applied still counts the framework's lines its patched functions ran."""
    import coverage

    fix = _fix(toy, "pos", "pick", '        return "pos"\n', '        y = "POS"\n        return y\n')
    path = inspect.getsourcefile(toy)
    first = inspect.getsourcelines(toy.pick)[1]
    cov = coverage.Coverage(data_file=None, include=[path], config_file=False)
    fix.apply()
    try:
        cov.start()
        try:
            result = toy.pick(1)
        finally:
            cov.stop()
    finally:
        fix.revert()
    assert result == "POS"
    ran = set(cov.get_data().lines(path) or ())
    assert {first + 1, first + 2} <= ran and first + 3 not in ran  # the test, the replaced return; not the other
