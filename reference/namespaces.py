"""Training state in namespaces: model weights, optimizer moments, FP32 master weights, EMA, RNG and step.

Keys on disk are ``namespace/key`` so a loader can ask for one family (say, only EMA) and a checker can report
which family a bad tensor belongs to.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .errors import LayoutError
from .tensor import Tensor

NAMESPACES = ("model", "optimizer", "master", "ema", "rng")
STEP_KEY = "meta/step"


@dataclass
class TrainingState:
    model: dict[str, Tensor] = field(default_factory=dict)
    optimizer: dict[str, Tensor] = field(default_factory=dict)
    master: dict[str, Tensor] = field(default_factory=dict)
    ema: dict[str, Tensor] = field(default_factory=dict)
    rng: dict[str, Tensor] = field(default_factory=dict)
    step: int = 0

    def flatten(self) -> dict[str, Tensor]:
        out = {f"{ns}/{k}": t for ns in NAMESPACES for k, t in getattr(self, ns).items()}
        out[STEP_KEY] = Tensor.from_array(np.array(self.step, np.int64))
        return out

    @classmethod
    def unflatten(cls, flat: dict[str, Tensor]) -> TrainingState:
        state = cls()
        for key, tensor in flat.items():
            if key == STEP_KEY:
                state.step = int(tensor.values().reshape(-1)[0])
                continue
            ns, sep, rest = key.partition("/")
            if not sep or ns not in NAMESPACES or not rest:
                raise LayoutError(f"key {key!r} is in no known namespace ({', '.join(NAMESPACES)})")
            getattr(state, ns)[rest] = tensor
        return state


def namespace_of(key: str) -> str:
    return "meta" if key == STEP_KEY else key.partition("/")[0]
