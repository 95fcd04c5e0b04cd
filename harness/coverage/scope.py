"""Which of the frameworks' code a campaign's coverage is about: their checkpoint code, named by path under the
directory a framework is installed in, so a rank on another machine (a fleet) reports the same names.

A scope is located with ``importlib.util.find_spec`` on the framework's top package, which finds it without
importing it: the controller of a campaign never imports a framework it does not run.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from functools import cache
from pathlib import Path

FORMAT = 1  # the version of the files recordings of these scopes are written in (measure, merge)


@dataclass(frozen=True)
class Scope:
    """One body of checkpoint code: its name in reports, its framework's top package and its files (globs under
    the directory the top package is installed in)."""

    name: str
    package: str
    globs: tuple[str, ...]

    def root(self) -> Path | None:
        """The directory the framework is installed in (``site-packages``), or None where it is not installed."""
        return install_root(self.package)

    def files(self) -> list[str]:
        """The scope's source files, as paths relative to that directory (sorted); none where not installed."""
        root = self.root()
        if root is None:
            return []
        return sorted({p.relative_to(root).as_posix() for g in self.globs for p in root.glob(g)
                       if p.is_file() and "__pycache__" not in p.parts})


SCOPES: tuple[Scope, ...] = (
    Scope("flex checkpoint", "paddle", ("paddle/distributed/flex_checkpoint/**/*.py",)),
    Scope("paddle.framework.io", "paddle", ("paddle/framework/io.py", "paddle/framework/io_utils.py")),
    Scope("unified checkpoint", "paddleformers", ("paddleformers/trainer/unified_checkpoint/**/*.py",)),
    Scope("trainer checkpoint", "paddleformers", (
        "paddleformers/trainer/utils/zero_cost_checkpoint.py", "paddleformers/trainer/utils/sharding_io.py",
        "paddleformers/trainer/utils/async_save.py", "paddleformers/trainer/utils/reshard/**/*.py")),
    Scope("torch dcp", "torch", ("torch/distributed/checkpoint/**/*.py",)),
)


@cache
def install_root(package: str) -> Path | None:
    """Where ``package`` is installed (the directory holding it), without importing it."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or spec.origin in ("built-in", "frozen"):
        return None
    return Path(spec.origin).resolve().parent.parent


def scope_of(relpath: str) -> Scope | None:
    """The scope a file (relative to its install root) belongs to."""
    for scope in SCOPES:
        if any(Path(relpath).match(g) or _under(relpath, g) for g in scope.globs):
            return scope
    return None


def _under(relpath: str, glob: str) -> bool:
    """``a/b/**/*.py`` holds ``a/b/c.py`` too (``Path.match`` wants at least one directory for ``**``)."""
    head, sep, tail = glob.partition("/**/")
    return bool(sep) and relpath.startswith(head + "/") and Path(relpath).match(tail)


# The frameworks whose checkpoint code a SUT of a framework runs (PaddleFormers saves through Paddle's too).
RUNS = {"paddleformers": ("paddleformers", "paddle")}


def installed(framework: str | None = None) -> list[Scope]:
    """The scopes whose framework is installed here (of the code ``framework``'s SUTs run, where given)."""
    packages = RUNS.get(framework, (framework,)) if framework else None
    return [s for s in SCOPES if s.root() is not None and (packages is None or s.package in packages)]


def relative(path: str) -> str | None:
    """A measured file's name relative to its framework's install root, if it is in some installed scope."""
    resolved = Path(path).resolve()
    for scope in installed():
        root = scope.root()
        assert root is not None
        try:
            rel = resolved.relative_to(root).as_posix()
        except ValueError:
            continue
        if scope_of(rel) is scope:
            return rel
    return None
