"""Checks what ZCC wrote against the live state the probe captured, bit for bit.

  python compare.py OUT                 every OUT/checkpoint-N against the live state the probe saved after step N
                                        (OUT/live-N.rank<r>.npz), and the EMA against one recomputed from the live
                                        master weights / FP32 parameters of the steps the EMA saw (it starts at 0)
  python compare.py OUT --resumed RES   also a job RES resumed from one of OUT's checkpoints: what RES held as its
                                        first step began vs OUT's live state at that step, RES's later live states
                                        and its checkpoints vs OUT's at the same step
OUT and RES are probe output dirs (run.sh prints them). ZCC_EMA and ZCC_EMA_INTERVAL: the run's values (defaults 0.5
and 1). When a rank's checkpoint, or a resumed job's state, differs from the live state of its step, the step of OUT
whose live state it matches best is named: a torn checkpoint names a later step, a resume that lost its step a
different one. Exit status 0 when everything matches bit for bit.
"""

from __future__ import annotations

import functools
import glob
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

STATIC = {"w": "probe_model_0.w_0", "v": "probe_model_0.w_1", "g": "probe_model_0.w_2"}
FP32_PARAMS = {"g"}
EVERY = int(os.environ.get("ZCC_EMA_INTERVAL", "1"))
COEF = float(os.environ.get("ZCC_EMA", "0.5"))
SLOTS = ("moment1", "moment2", "beta1_pow_acc", "beta2_pow_acc")


@dataclass
class Entry:
    """One saved tensor and how to compute what it should hold at a given step (None: nothing to compare)."""

    label: str
    got: np.ndarray
    expect: Callable[[int], np.ndarray | None]


def same(got: np.ndarray, want: np.ndarray | None) -> bool:
    """Bitwise equality of two tensors as flat FP32 (the probe's BF16 values are exact in FP32)."""
    if want is None:
        return False
    a, b = np.asarray(got, np.float32).reshape(-1), np.asarray(want, np.float32).reshape(-1)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def describe(got: np.ndarray, want: np.ndarray | None) -> str:
    """How far apart two tensors are, for a mismatch line."""
    if want is None:
        return "no live value to compare with"
    a, b = np.asarray(got, np.float32).reshape(-1), np.asarray(want, np.float32).reshape(-1)
    if a.shape != b.shape:
        return f"shape {a.shape} vs {b.shape}"
    return f"max|diff|={float(np.max(np.abs(a - b))):.3g} got[:3]={a[:3]} want[:3]={b[:3]}"


@functools.cache
def live(out: str, step: int | str, rank: int) -> dict[str, np.ndarray] | None:
    """The live state the probe saved for this step and rank, or None when the probe saved none."""
    path = os.path.join(out, f"live-{step}.rank{rank}.npz")
    if not os.path.exists(path):
        return None
    with np.load(path) as z:
        return {k: z[k] for k in z}


def live_steps(out: str) -> list[int]:
    """The steps that out holds live states of."""
    found = {int(m.group(1)) for f in os.listdir(out) if (m := re.fullmatch(r"live-(\d+)\.rank\d+\.npz", f))}
    return sorted(found)


def load(path: str) -> dict[str, np.ndarray]:
    """A paddle.load'ed file (a .distcp shard), as numpy."""
    import paddle

    return {k: v.numpy() for k, v in paddle.load(path).items()}


def flex_live_key(key: str) -> str:
    """A flex-checkpoint key (w, w.w_0, w.moment1_0, g.beta1_pow_acc_0, ...) -> the live state's key it stands for."""
    struct, _, kind = key.partition(".")
    static = STATIC[struct]
    if not kind:
        return f"param/{struct}"
    if kind == "w_0":
        return f"master/{static}"
    owner = static if struct in FP32_PARAMS else f"{static}_fp32_master_0"
    return f"acc/{kind.removesuffix('_0')}/{owner}"


def sio_items(path: str) -> list[tuple[str, np.ndarray, str]]:
    """A sharding-IO file (model_state / optimizer / ema .shardNN) -> [(its key, array, the live state's key)]."""
    import paddle

    items = []
    for k, v in paddle.load(path).items():
        if k == "master_weights":
            items += [(f"master_weights/{mk}", mv.numpy(), f"master/{mk}") for mk, mv in v.items()]
        elif k in STATIC:
            items.append((k, v.numpy(), f"param/{k}"))
        else:
            m = re.fullmatch(r"(.*)_({})_0".format("|".join(SLOTS)), k)
            items.append((k, v.numpy(), f"acc/{m.group(2)}/{m.group(1)}"))
    return items


def live_at(out: str, rank: int, key: str, size: int) -> Callable[[int], np.ndarray | None]:
    """step -> the live value of key at that step, cut to the saved size (the saved tensor drops the padding)."""

    def at(step: int) -> np.ndarray | None:
        state = live(out, step, rank)
        if state is None or key not in state:
            return None
        return state[key].reshape(-1)[:size]

    return at


def ema_at(out: str, rank: int, key: str, size: int) -> Callable[[int], np.ndarray | None]:
    """step -> ZCC's EMA at that step: c*ema + (1-c)*value from 0, over the live values of every EMA step so far."""

    def at(step: int) -> np.ndarray | None:
        ema = np.zeros(size, np.float32)
        for t in range(EVERY, step + 1, EVERY):
            value = live_at(out, rank, key, size)(t)
            if value is None:
                return None
            ema = np.float32(COEF) * ema + np.float32(1 - COEF) * value.astype(np.float32)
        return ema

    return at


def checkpoint_entries(out: str, ck: str) -> dict[int, list[Entry]]:
    """Every tensor of one checkpoint, in either format, by the rank that wrote it."""
    by_rank: dict[int, list[Entry]] = {}
    name = os.path.basename(ck)
    for f in sorted(glob.glob(f"{ck}/*.shard*.pd*")):
        rank = int(re.search(r"shard(\d+)", f).group(1))
        of = ema_at if os.path.basename(f).startswith("ema") else live_at
        for key, got, lk in sio_items(f):
            by_rank.setdefault(rank, []).append(Entry(f"{name}/{os.path.basename(f)} {key}", got,
                                                      of(out, rank, lk, got.size)))
    for part in ("model_state", "optimizer_state", "master_weight", "ema_state"):
        for f in sorted(glob.glob(f"{ck}/{part}/*_0.distcp")):
            rank = int(os.path.basename(f).split("_")[0])
            of = ema_at if part == "ema_state" else live_at
            for key, got in load(f).items():
                by_rank.setdefault(rank, []).append(Entry(f"{name}/{part}/{rank} {key}", got,
                                                          of(out, rank, flex_live_key(key), got.size)))
    return by_rank


def best_step(entries: list[Entry], steps: list[int]) -> tuple[int, int]:
    """(hits, step): the step whose expected values the entries match most often, and how many they match."""
    return max(((sum(same(e.got, e.expect(s)) for e in entries), s) for s in steps), default=(0, -1))


def matches(entries: list[Entry], steps: list[int]) -> str:
    """Names the step whose live state the entries match best, for a report line."""
    hits, step = best_step(entries, steps)
    return f"matches step {step}'s live state in {hits}/{len(entries)} tensors" if hits else "matches no step"


def checkpoints_vs_live(out: str) -> int:
    """Compares every checkpoint of out with the live state of its step; returns the number of mismatches."""
    bad = 0
    steps = live_steps(out)
    for ck in sorted(glob.glob(f"{out}/checkpoint-*"), key=lambda p: int(p.rsplit("-", 1)[1])):
        step = int(ck.rsplit("-", 1)[1])
        by_rank = checkpoint_entries(out, ck)
        for rank, entries in sorted(by_rank.items()):
            wrong = [e for e in entries if not same(e.got, e.expect(step))]
            for e in wrong:
                other = [s for s in steps if s != step and same(e.got, e.expect(s))]
                seen = f"holds step {other[0]}'s value" if other else describe(e.got, e.expect(step))
                print(f"  MISMATCH {e.label}: {seen}")
            if wrong:
                print(f"  rank {rank}'s {os.path.basename(ck)}: {len(wrong)} of {len(entries)} tensors differ from "
                      f"step {step}'s live state; it {matches(entries, steps)}")
            bad += len(wrong)
        print(f"{os.path.basename(ck)}: {sum(map(len, by_rank.values()))} tensors compared")
    return bad


def padding_only(key: str, *states: dict[str, np.ndarray]) -> bool:
    """Whether key is a beta-power accumulator of a parameter whose moments are all 0 on this rank in every state:
    the rank's slice of that parameter is padding, so the accumulator changes no element."""
    m = re.fullmatch(r"acc/beta[12]_pow_acc/(.*)", key)
    if not m:
        return False
    moments = [st.get(f"acc/{slot}/{m.group(1)}") for st in states for slot in ("moment1", "moment2")]
    return all(v is not None and not np.any(v) for v in moments)


def step_offset(out: str, res: str) -> tuple[int, int]:
    """(the resumed job's first step, what to add to its step numbers to get the original's): the offset is not 0
    when the state the resumed job began with is the original's state at another step (a resume that lost its
    step). Rank 0 decides; the other ranks may differ in tensors the checkpoint dedups."""
    steps = live_steps(out)
    for f in sorted(glob.glob(f"{res}/live-resumed-*.rank0.npz")):
        begin = int(re.fullmatch(r"live-resumed-(\d+)\.rank0\.npz", os.path.basename(f)).group(1))
        got = live(res, f"resumed-{begin}", 0)
        entries = [Entry(k, v, live_at(out, 0, k, v.size)) for k, v in sorted(got.items())]
        hits, step = best_step(entries, steps)
        print(f"the resumed job began at global_step {begin}; what rank 0 held then {matches(entries, steps)}")
        if hits == len(entries) and step != begin and begin not in steps:
            return begin, step - begin
        return begin, 0
    return 0, 0


def resumed_vs_run(out: str, res: str) -> int:
    """Compares the resumed job res with the job out it resumed from; returns the number of mismatches."""
    begin, off = step_offset(out, res)
    bad = 0
    if off:
        bad += 1
        print(f"  MISMATCH the resumed job restarted its step count: its step {begin} is the original's step "
              f"{begin + off}, so its steps and checkpoints are compared with the original's {off} steps later")
    for f in sorted(glob.glob(f"{res}/live-*.rank*.npz")):
        m = re.fullmatch(r"live-(resumed-)?(\d+)\.rank(\d+)\.npz", os.path.basename(f))
        step, rank = int(m.group(2)), int(m.group(3))
        got = live(res, f"{m.group(1) or ''}{step}", rank)
        want = live(out, step + off, rank)
        if want is None:
            continue
        both = sorted(set(got) & set(want))
        for side, keys in (("original", sorted(set(want) - set(got))), ("resumed", sorted(set(got) - set(want)))):
            if keys:  # an optimizer creates its accumulators at its first step: absent as a resumed job begins
                print(f"  {os.path.basename(f)}: {len(keys)} tensors only in the {side} job: {keys[0]}, ...")
        for k in both:
            if same(got[k], want[k]):
                continue
            if padding_only(k, got, want):
                print(f"  benign: {os.path.basename(f)} {k} differs, but this rank's slice of the parameter is all "
                      f"padding (its moments are 0 in both jobs; the flex save keeps the scalar on one rank only)")
                continue
            bad += 1
            print(f"  MISMATCH {os.path.basename(f)} {k} vs the original's step {step + off}")
        print(f"{os.path.basename(f)} vs the original's step {step + off}: {len(both)} tensors compared")
    for ck in sorted(glob.glob(f"{res}/checkpoint-*")):
        name = f"checkpoint-{int(ck.rsplit('-', 1)[1]) + off}"
        n = 0
        for f in sorted(glob.glob(f"{ck}/*/*_0.distcp") + glob.glob(f"{ck}/*.shard*.pd*")):
            g = os.path.join(out, name, os.path.relpath(f, ck))
            if not os.path.exists(g):
                continue
            a, b = (load(f), load(g)) if f.endswith(".distcp") else (
                {k: v for k, v, _ in sio_items(f)}, {k: v for k, v, _ in sio_items(g)})
            for k in sorted(set(a) | set(b)):
                n += 1
                if k not in a or k not in b:
                    print(f"  {os.path.relpath(f, ck)}: {k} missing on one side")
                elif not same(a[k], b[k]):
                    bad += 1
                    print(f"  MISMATCH resumed {os.path.basename(ck)} vs original {name}: {os.path.relpath(f, ck)} {k}")
        if n:
            print(f"resumed {os.path.basename(ck)} vs the original's {name}: {n} tensors compared")
    return bad


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print(__doc__)
        return 2
    out = os.path.abspath(argv[0])
    bad = checkpoints_vs_live(out)
    if "--resumed" in argv:
        bad += resumed_vs_run(out, os.path.abspath(argv[argv.index("--resumed") + 1]))
    print("ALL MATCH" if bad == 0 else f"{bad} MISMATCH{'ES' if bad > 1 else ''}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
