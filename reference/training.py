"""A miniature training loop, deterministic to the bit, that every rank runs on its own pieces and the oracle runs
on whole tensors (P-EMA, P-RESUME; docs/design.md §5).

Why a slice trained on its own equals that slice of the whole run, bit for bit: every update is elementwise
(Adam in FP32 master weights, the cast to the parameter's dtype, the EMA), float32 + − × ÷ √ are correctly rounded,
and the only inputs that are not elementwise — the loss and the gradients — are functions of the RNG state and of
an element's global position. So the loop needs no collectives, runs at any world size, and a checkpoint that
loses, misplaces or mixes up any family (parameters, master weights, moments, EMA, RNG, step) makes a resumed run
diverge from the uninterrupted one.

The EMA follows PaddleFormers: an FP32 buffer that, every ``ema_every`` steps, becomes ``decay·ema + (1−decay)·master``
unless the step's loss is not below ``loss_threshold``; both coefficients are FP32 roundings of the double-precision
``decay`` and ``1 − decay``, as a Python float times a Paddle tensor computes them. Zero-Cost Checkpointing's buffer
starts at zero (``ema_start`` "zero"); the Trainer's EMA without ZCC takes the first master weights it averages
(``ema_start`` "first"). A fresh job's master weights are the parameter's seeds (``master_init`` "exact"), or, as AMP O2
creates them, the parameter cast back to FP32 (``master_init`` "param").
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields

import numpy as np

from .dtypes import DTYPES
from .engine import LocalTensor, local_tensors
from .errors import LayoutError
from .layout import Box, TensorLayout
from .namespaces import STEP_KEY
from .tensor import Tensor

RNG_KEY = "rng/state"
PARAM_DTYPES = ("F32", "BF16", "F16")  # what a parameter may be; moments, master weights and EMA are FP32
_MASK64 = (1 << 64) - 1
_GRAD_BITS = 20  # gradients are k·2^-20 for |k| < 2^20: exact in float32
EMA_STARTS = ("zero", "first")
MASTER_INITS = ("exact", "param")
EMA_SEEN = ("live", "saved")


@dataclass(frozen=True)
class TrainingSpec:
    """The loop's hyper-parameters: plain JSON in a case file (floats round-trip exactly through JSON)."""

    lr: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    ema_every: int = 1
    ema_decay: float = 0.9
    loss_threshold: float | None = None  # EMA updates only while loss < threshold (None: always)
    seed: int = 0  # the RNG stream (data order, gradients, loss)
    ema_start: str = "zero"  # the EMA before its first update: "zero", or "first" (the first update copies master)
    master_init: str = "exact"  # a fresh job's master weights: "exact" (the seeds), or "param" (the cast parameter)
    # Where the EMA can be read: "live" (the training process holds it, so a train op shows it) or "saved" (another
    # process holds it, as Zero-Cost Checkpointing's worker does: only a checkpoint shows it)
    ema_seen: str = "live"

    def to_json(self) -> dict:
        """Every field, except ``ema_seen`` at its default (case files written before it existed stay canonical)."""
        data = asdict(self)
        if data["ema_seen"] == "live":
            del data["ema_seen"]
        return data

    @classmethod
    def from_json(cls, data: object) -> TrainingSpec:
        if not isinstance(data, dict):
            raise ValueError(f"training must be a JSON object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"training: unknown fields {unknown} (known: {', '.join(sorted(known))})")
        spec = cls(**data)
        spec.check()
        return spec

    def check(self) -> None:
        for name in ("lr", "beta1", "beta2", "eps", "weight_decay", "ema_decay"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                raise ValueError(f"training: {name} must be a finite number, got {value!r}")
        for name in ("beta1", "beta2", "ema_decay"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"training: {name} must be in [0, 1), got {getattr(self, name)!r}")
        if self.eps <= 0:
            raise ValueError(f"training: eps must be positive, got {self.eps!r}")
        for name in ("ema_every", "seed"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < (1 if name == "ema_every" else 0):
                raise ValueError(f"training: {name} must be a {'positive' if name == 'ema_every' else 'non-negative'} "
                                 f"integer, got {value!r}")
        for name, allowed in (("ema_start", EMA_STARTS), ("master_init", MASTER_INITS), ("ema_seen", EMA_SEEN)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"training: {name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        t = self.loss_threshold
        if t is not None and (not isinstance(t, (int, float)) or isinstance(t, bool) or not math.isfinite(t)):
            raise ValueError(f"training: loss_threshold must be a finite number or null, got {t!r}")


@dataclass(frozen=True)
class Param:
    """A model parameter: its dtype (the model's; master weights are FP32), global shape and init seed."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    seed: int = 0


def family_keys(name: str) -> dict[str, str]:
    """The state keys of one parameter, per family (namespaces as reference.namespaces lays them out)."""
    return {
        "model": f"model/{name}",
        "master": f"master/{name}",
        "m1": f"optimizer/{name}.m1",
        "m2": f"optimizer/{name}.m2",
        "ema": f"ema/{name}",
    }


def seen_live(spec: TrainingSpec, key: str) -> bool:
    """Whether a train op shows ``key``: the EMA only where the training process holds it (``ema_seen``)."""
    return spec.ema_seen == "live" or not key.startswith("ema/")


def state_keys(params: Iterable[Param]) -> list[str]:
    """Every key a full training checkpoint holds."""
    return sorted([k for p in params for k in family_keys(p.name).values()] + [RNG_KEY, STEP_KEY])


def check_params(params: Iterable[Param]) -> None:
    names = set()
    for p in params:
        if p.dtype not in PARAM_DTYPES:
            raise ValueError(f"parameter {p.name!r}: dtype {p.dtype} is not one of {', '.join(PARAM_DTYPES)}")
        if p.name in names or not p.name or "/" in p.name:
            raise ValueError(f"parameter name {p.name!r} is empty, repeated or contains '/'")
        names.add(p.name)


# --- the state ---------------------------------------------------------------------------------------------------


def initial_state(spec: TrainingSpec, params: Iterable[Param]) -> dict[str, Tensor]:
    """Step 0: master weights from each parameter's seed, the parameter cast from them, zero moments and EMA."""
    state: dict[str, Tensor] = {}
    for p in params:
        keys = family_keys(p.name)
        rng = np.random.default_rng([spec.seed, p.seed, zlib.crc32(p.name.encode())])
        master = (rng.integers(-(1 << 12), 1 << 12, math.prod(p.shape)) * 2.0**-12).astype(np.float32)
        master = master.reshape(p.shape)
        if spec.master_init == "param":
            master = decode_bits(cast_bits(master, p.dtype), p.dtype)
        state[keys["master"]] = Tensor.from_array(master, "F32")
        state[keys["model"]] = Tensor(DTYPES[p.dtype], cast_bits(master, p.dtype))
        for family in ("m1", "m2", "ema"):
            state[keys[family]] = Tensor.from_array(np.zeros(p.shape, np.float32), "F32")
    state[RNG_KEY] = Tensor.from_array(_seed_words(spec).view(np.int64), "I64")
    state[STEP_KEY] = Tensor.from_array(np.array(0, np.int64), "I64")
    return state


def trained_state(spec: TrainingSpec, params: Iterable[Param], step: int) -> dict[str, Tensor]:
    """The uninterrupted run's whole state after ``step`` steps (the oracle)."""
    params = tuple(params)
    pieces = local_tensors(initial_state(spec, params), {}, 0)  # no layouts: every tensor whole on rank 0
    train(spec, params, pieces, step)
    return {k: lt.tensor for k, lt in pieces.items()}


def initial_pieces(spec: TrainingSpec, params: Iterable[Param], layouts: Mapping[str, TensorLayout],
                   rank: int) -> dict[str, LocalTensor]:
    """What ``rank`` holds at step 0 under ``layouts`` (a fresh job initialises from the same seeds everywhere)."""
    return local_tensors(initial_state(spec, params), layouts, rank)


def current_step(pieces: Mapping[str, LocalTensor]) -> int:
    return int(_step_piece(pieces).tensor.bits.reshape(-1)[0].view(np.int64))


def train(spec: TrainingSpec, params: Iterable[Param], pieces: Mapping[str, LocalTensor], to_step: int) -> None:
    """Advance this rank's pieces, in place, from their step to ``to_step``."""
    families = {p.name: fam for p in params if (fam := _family_pieces(p, pieces)) is not None}
    rng_piece = pieces.get(RNG_KEY)
    if rng_piece is None or rng_piece.tensor.shape != (2,) or rng_piece.tensor.dtype.name != "I64":
        raise LayoutError(f"the training state has no whole {RNG_KEY} (I64, shape (2,)) on this rank")
    start = current_step(pieces)
    if not 0 <= start <= to_step:
        raise ValueError(f"cannot train from step {start} to step {to_step}")
    first = first_ema_step(spec, to_step) if spec.ema_start == "first" else None
    for t in range(start + 1, to_step + 1):
        out = _advance_rng(rng_piece.tensor.bits)
        update_ema: bool | str = "copy" if t == first else _updates_ema(spec, t, out)
        for name in sorted(families):
            _step_param(spec, families[name], t, out, update_ema)
        _step_piece(pieces).tensor.bits.reshape(-1)[0] = t


def _loss(out: int) -> float:
    """A step's loss from its RNG output: in [0, 2), the same on every rank, an FP32 value as a loss tensor holds."""
    return float(np.float32((out >> 11) * 2.0**-52))


def _updates_ema(spec: TrainingSpec, t: int, out: int) -> bool:
    return t % spec.ema_every == 0 and (spec.loss_threshold is None or _loss(out) < spec.loss_threshold)


def first_ema_step(spec: TrainingSpec, upto: int) -> int | None:
    """The first step (at most ``upto``) whose EMA update happens, from the seed's RNG stream: where the EMA starts
    from the first master weights it averages, that update copies them."""
    words = _seed_words(spec)
    return next((t for t in range(1, upto + 1) if _updates_ema(spec, t, _advance_rng(words))), None)


def step_loss(spec: TrainingSpec, t: int) -> float:
    """The loss of step ``t`` (from the seed's RNG stream), as the loop computes it."""
    return _loss(rng_output(spec, t))


def _family_pieces(p: Param, pieces: Mapping[str, LocalTensor]) -> dict[str, Param | LocalTensor] | None:
    """A parameter's pieces on this rank (None: it lives elsewhere, as an expert on another EP rank); all must cover
    the same region, since each rank updates only the elements it holds."""
    keys = family_keys(p.name)
    present = [k for k in keys.values() if k in pieces]
    if not present:
        return None
    if len(present) < len(keys):
        raise LayoutError(f"the training state on this rank has {present} but lacks "
                          f"{sorted(set(keys.values()) - set(present))}")
    out: dict = {family: pieces[key] for family, key in keys.items()}
    regions = {f: lt.region for f, lt in out.items()}
    if len(set(regions.values())) > 1:
        raise LayoutError(f"parameter {p.name!r}: its families hold different regions on this rank {regions}; "
                          "the loop has no collectives, so they must share one layout")
    if out["model"].tensor.dtype.name != p.dtype:
        raise LayoutError(f"parameter {p.name!r} is {out['model'].tensor.dtype.name} on this rank, not {p.dtype}")
    out["param"] = p
    return out


def _step_piece(pieces: Mapping[str, LocalTensor]) -> LocalTensor:
    piece = pieces.get(STEP_KEY)
    if piece is None or piece.tensor.shape != () or piece.tensor.dtype.name != "I64":
        raise LayoutError(f"the training state has no 0-d I64 {STEP_KEY} on this rank")
    return piece


def _step_param(spec: TrainingSpec, fam: dict, t: int, out: int, update_ema: bool | str) -> None:
    p = fam["param"]
    grad = _local(gradient(p, out), fam["master"])
    master, m1, m2, ema = (fam[f].tensor.bits.view(np.float32) for f in ("master", "m1", "m2", "ema"))
    adam_update(spec, t, grad, master, m1, m2)
    fam["model"].tensor.bits[...] = cast_bits(master, p.dtype)
    if update_ema == "copy":
        ema[...] = master
    elif update_ema:
        ema[...] = np.float32(spec.ema_decay) * ema + np.float32(1.0 - spec.ema_decay) * master


def adam_update(spec: TrainingSpec, t: int, grad: np.ndarray, master: np.ndarray, m1: np.ndarray,
                m2: np.ndarray) -> None:
    """Step ``t`` of Adam on FP32 arrays, in place (a SUT whose optimizer the harness stands in for runs this)."""
    f32 = np.float32
    b1, b2 = f32(spec.beta1), f32(spec.beta2)
    m1[...] = b1 * m1 + (f32(1) - b1) * grad
    m2[...] = b2 * m2 + (f32(1) - b2) * (grad * grad)
    bc1, bc2 = f32(1.0 - spec.beta1**t), f32(1.0 - spec.beta2**t)
    step = (m1 / bc1) / (np.sqrt(m2 / bc2) + f32(spec.eps))
    master[...] = master - f32(spec.lr) * (step + f32(spec.weight_decay) * master)


def _stream_at(spec: TrainingSpec, t: int) -> tuple[int, np.ndarray]:
    """Step ``t`` of the seed's RNG stream: its output (0 at step 0) and the state words after it."""
    words, out = _seed_words(spec), 0
    for _ in range(t):
        out = _advance_rng(words)
    return out, words


def rng_output(spec: TrainingSpec, t: int) -> int:
    """The RNG output of step ``t`` from the seed's stream (what drives that step's loss and gradients)."""
    return _stream_at(spec, t)[0]


def rng_state(spec: TrainingSpec, t: int) -> Tensor:
    """``rng/state`` after ``t`` steps of the seed's stream."""
    return Tensor.from_array(_stream_at(spec, t)[1].view(np.int64), "I64")


def gradient(p: Param, rng_out: int) -> np.ndarray:
    """The whole gradient of ``p`` at a step: a function of the step's RNG output and the parameter's name."""
    rng = np.random.default_rng([rng_out & 0xFFFFFFFF, rng_out >> 32, zlib.crc32(p.name.encode())])
    ints = rng.integers(-(1 << _GRAD_BITS), 1 << _GRAD_BITS, math.prod(p.shape))
    return (ints * 2.0**-_GRAD_BITS).astype(np.float32).reshape(p.shape)


def _local(whole: np.ndarray, piece: LocalTensor) -> np.ndarray:
    region = piece.region
    if isinstance(region, Box):
        return whole[tuple(slice(o, o + s) for o, s in zip(region.offsets, region.shape))]
    return whole.reshape(-1)[region.start:region.stop]


def decode_bits(bits: np.ndarray, dtype_name: str) -> np.ndarray:
    """The FP32 values of ``dtype_name`` bits (exact: every F16 and BF16 value is an FP32 value)."""
    if dtype_name == "F32":
        return np.asarray(bits, np.uint32).view(np.float32).copy()
    if dtype_name == "F16":
        return np.asarray(bits, np.uint16).view(np.float16).astype(np.float32)
    if dtype_name == "BF16":
        return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)
    raise ValueError(f"no decoding of {dtype_name}")


def cast_bits(values: np.ndarray, dtype_name: str) -> np.ndarray:
    """FP32 values as the bits of ``dtype_name`` (F32, F16, or BF16 rounded to nearest even, NaNs kept quiet)."""
    values = np.asarray(values, np.float32)
    if dtype_name == "F32":
        return values.view(np.uint32).copy()
    if dtype_name == "F16":
        with np.errstate(over="ignore"):  # overflow to ±inf is the cast's defined result
            return values.astype(np.float16).view(np.uint16)
    if dtype_name == "BF16":
        bits = values.view(np.uint32).astype(np.uint64)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
        quiet = ((bits >> 16) | 0x40).astype(np.uint16)
        return np.where(np.isnan(values), quiet, rounded)
    raise ValueError(f"no cast to {dtype_name}")


# --- the RNG: xorshift128+, state held as two I64 words ---------------------------------------------------------


def _seed_words(spec: TrainingSpec) -> np.ndarray:
    return np.array(_seed_rng(spec.seed), np.uint64)


def _seed_rng(seed: int) -> list[int]:
    words, x = [], seed & _MASK64
    for _ in range(2):  # splitmix64: never an all-zero state
        x = (x + 0x9E3779B97F4A7C15) & _MASK64
        z = x
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        words.append(z ^ (z >> 31))
    return words


def _advance_rng(bits: np.ndarray) -> int:
    """One xorshift128+ step on the state words, in place; returns the step's 64-bit output."""
    s1, s0 = int(bits[0]), int(bits[1])
    bits[0] = s0
    s1 = (s1 ^ (s1 << 23)) & _MASK64
    s1 = s1 ^ s0 ^ (s1 >> 17) ^ (s0 >> 26)
    bits[1] = s1
    return (s1 + s0) & _MASK64
