"""Systems under test: one adapter per file, selected by name or by ``package.module:ClassName`` (docs/design.md
§4, a contract). Imports harness.ranks.virtual (Paddle's virtual ranks) and reference/, nothing above.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass


class UnknownSut(LookupError):
    """The SUT name is neither registered nor an importable ``package.module:ClassName``."""


@dataclass(frozen=True)
class SutInfo:
    name: str
    target: str  # "package.module:ClassName" of the adapter
    framework: str | None  # module whose presence the adapter needs, if any


REGISTRY: dict[str, SutInfo] = {
    "reference": SutInfo("reference", "harness.sut.reference:ReferenceSut", None),
    "paddle-dcp": SutInfo("paddle-dcp", "harness.sut.paddle_dcp:PaddleDcpSut", "paddle"),
    "paddle-save": SutInfo("paddle-save", "harness.sut.paddle_save:PaddleSaveSut", "paddle"),
    "torch-dcp": SutInfo("torch-dcp", "harness.sut.torch_dcp:TorchDcpSut", "torch"),
    "paddleformers-uc": SutInfo("paddleformers-uc", "harness.sut.paddleformers_uc:PaddleFormersUcSut", "paddleformers"),
    "paddleformers-trainer": SutInfo("paddleformers-trainer",
                                     "harness.sut.paddleformers_trainer:PaddleFormersTrainerSut", "paddleformers"),
    "paddleformers-zcc": SutInfo("paddleformers-zcc", "harness.sut.paddleformers_zcc:PaddleFormersZccSut",
                                 "paddleformers"),
}


def framework_available(info: SutInfo) -> bool:
    return info.framework is None or importlib.util.find_spec(info.framework) is not None


def adapter_class(name: str) -> type:
    """The adapter class for ``name``; raises UnknownSut with a message that says what to do."""
    info = REGISTRY.get(name)
    target = info.target if info else name
    if info is None and ":" not in name:
        raise UnknownSut(
            f"unknown SUT {name!r}: known SUTs are {', '.join(sorted(REGISTRY))}, or name an external adapter as "
            "package.module:ClassName"
        )
    if info is not None and not framework_available(info):
        how = {"paddle": "pip install -e '.[paddle]' (or paddlepaddle-gpu on a GPU runner)",
               "paddleformers": "run it from the environment `bash .ci/paddleformers-env` builds (README: "
                                "PaddleFormers)"}.get(info.framework, f"pip install -e '.[{info.framework}]'")
        raise UnknownSut(f"SUT {name!r} needs the Python package {info.framework!r}, which is not installed: {how}")
    module_name, _, class_name = target.partition(":")
    if info is None and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # external adapters may live in the user's working tree
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UnknownSut(f"cannot import SUT adapter module {module_name!r} ({exc})") from None
    cls = getattr(module, class_name, None)
    if not isinstance(cls, type):
        raise UnknownSut(f"module {module_name!r} has no adapter class {class_name!r}")
    return cls
