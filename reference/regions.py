"""Region arithmetic: contiguous runs, intersections, copies between regions, and exact cover.

Every region is a set of contiguous runs in the global tensor's row-major element order. A Box is many runs (one
per row of its non-full leading dims), a FlatRange is one. Box-to-box copies use numpy slicing; anything with a
flat side goes through runs, because a flat range cuts boxes mid-row.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from .errors import MissingSlices, OverlappingSlices, SliceOutOfRange, UnverifiableCover
from .layout import Box, FlatRange, Region

PAIR_BUDGET = 1 << 21  # box pairs an irregular (non-grid) cover may make the sweep compare
RUN_BUDGET = 1 << 21  # contiguous runs a cover mixing flat ranges and boxes may expand into
_PAIR_CHUNK = 1 << 18  # pairs compared per vectorised step (bounds the sweep's memory)


def strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, acc = [], 1
    for size in reversed(shape):
        out.append(acc)
        acc *= size
    return tuple(reversed(out))


def _run_split(box: Box, global_shape: tuple[int, ...]) -> tuple[int, int]:
    """(m, number of runs) of a non-empty box: dims after m are spanned fully, so a run is dims m.. of one row."""
    m = len(global_shape) - 1
    while m > 0 and box.offsets[m] == 0 and box.shape[m] == global_shape[m]:
        m -= 1
    return m, math.prod(box.shape[:m])


def box_runs(box: Box, global_shape: tuple[int, ...]) -> tuple[np.ndarray, int]:
    """Global start of every contiguous run of ``box`` (sorted) and the common run length, in elements."""
    if box.numel == 0:
        return np.zeros(0, np.int64), 0
    ndim = len(global_shape)
    if ndim == 0:
        return np.zeros(1, np.int64), 1
    # Merge trailing dims the box spans fully; the last partial dim is contiguous within a run.
    m, _ = _run_split(box, global_shape)
    st = strides(global_shape)
    run_len = box.shape[m] * st[m]
    base = sum(box.offsets[d] * st[d] for d in range(ndim))
    starts = np.full(1, base, np.int64)
    for d in range(m):
        steps = np.arange(box.shape[d], dtype=np.int64) * st[d]
        starts = (starts[:, None] + steps[None, :]).reshape(-1)
    return starts, run_len


def intersect_boxes(a: Box, b: Box) -> Box | None:
    lo = tuple(max(x, y) for x, y in zip(a.offsets, b.offsets))
    hi = tuple(min(x + s, y + t) for x, s, y, t in zip(a.offsets, a.shape, b.offsets, b.shape))
    if any(h <= l for l, h in zip(lo, hi)) and lo:
        return None
    return Box(lo, tuple(h - l for l, h in zip(lo, hi)))


def relative(box: Box, origin: Box) -> Box:
    """``box`` expressed in the frame of ``origin`` (both global)."""
    return Box(tuple(o - p for o, p in zip(box.offsets, origin.offsets)), box.shape)


def region_runs(region: Region, global_shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(global starts, lengths, local starts) of a region's runs; local = offset in the region's own order."""
    if isinstance(region, FlatRange):
        if region.numel == 0:
            empty = np.zeros(0, np.int64)
            return empty, empty, empty
        return np.array([region.start]), np.array([region.numel]), np.zeros(1, np.int64)
    starts, run_len = box_runs(region, global_shape)
    lengths = np.full(len(starts), run_len, np.int64)
    return starts, lengths, np.arange(len(starts), dtype=np.int64) * run_len


def overlap_pieces(
    src: Region, dst: Region, global_shape: tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pieces shared by two regions where at least one is flat: (src local start, dst local start, length)."""
    if isinstance(src, FlatRange):
        flat, other, flat_is_src = src, dst, True
    else:
        flat, other, flat_is_src = dst, src, False
    g, n, local = region_runs(other, global_shape)
    lo = np.maximum(g, flat.start)
    hi = np.minimum(g + n, flat.stop)
    keep = hi > lo
    lo, hi, g, local = lo[keep], hi[keep], g[keep], local[keep]
    other_local = local + (lo - g)
    flat_local = lo - flat.start
    if flat_is_src:
        return flat_local, other_local, hi - lo
    return other_local, flat_local, hi - lo


def needed_runs(src: Region, dst: Region, global_shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Element runs (local starts, lengths) of ``src`` that ``dst`` needs, in ``src``'s own order."""
    if isinstance(src, Box) and isinstance(dst, Box):
        inter = intersect_boxes(src, dst)
        if inter is None or inter.numel == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        starts, run_len = box_runs(relative(inter, src), src.shape)
        return starts, np.full(len(starts), run_len, np.int64)
    s, _, n = overlap_pieces(src, dst, global_shape)
    return s, n


def copy_between(
    src: Region,
    src_bits: np.ndarray,
    src_base: int,
    dst: Region,
    dst_bits: np.ndarray,
    global_shape: tuple[int, ...],
) -> int:
    """Copy the overlap of ``src`` into ``dst``; returns elements copied.

    ``src_bits`` is a flat array holding src's elements from local index ``src_base`` on (a partial read);
    ``dst_bits`` is the full destination shaped as ``dst.shape``.
    """
    if isinstance(src, Box) and isinstance(dst, Box):
        inter = intersect_boxes(src, dst)
        if inter is None or inter.numel == 0:
            return 0
        rel_src = relative(inter, src)
        src_shape = src.shape
        if len(src_shape) == 0:
            dst_bits[()] = src_bits[0]
            return 1
        row = math.prod(src_shape[1:])
        first_row = src_base // row
        if src_base % row:
            raise ValueError("box reads must start on a row boundary")
        rows = rel_src.offsets[0] + rel_src.shape[0] - first_row
        view = src_bits[: rows * row].reshape((rows, *src_shape[1:]))
        sel = tuple(slice(o, o + s) for o, s in zip(rel_src.offsets, rel_src.shape))
        sel = (slice(sel[0].start - first_row, sel[0].stop - first_row), *sel[1:])
        rel_dst = relative(inter, dst)
        dsel = tuple(slice(o, o + s) for o, s in zip(rel_dst.offsets, rel_dst.shape))
        dst_bits[dsel] = view[sel]
        return inter.numel
    s, d, n = overlap_pieces(src, dst, global_shape)
    flat_dst = dst_bits.reshape(-1)
    for a, b, k in zip(s.tolist(), d.tolist(), n.tolist()):
        flat_dst[b : b + k] = src_bits[a - src_base : a - src_base + k]
    return int(n.sum())


def check_exact_cover(name: str, global_shape: tuple[int, ...], regions: list[Region], path: str | None = None) -> None:
    """Raise SliceOutOfRange / MissingSlices / OverlappingSlices unless ``regions`` cover the tensor exactly once.

    O(n log n) in the regions and independent of the tensor's size: boxes by a grid test (every layout saves a
    grid) or else a sort-based sweep with a bounded pair budget (UnverifiableCover beyond it); flat ranges by
    sorted intervals, boxes among them expanded into a bounded number of runs."""
    total = math.prod(global_shape)
    for region in regions:
        check_in_range(name, global_shape, region, path)
    regions = [r for r in regions if r.numel > 0]
    if all(isinstance(r, Box) for r in regions):
        _check_boxes(name, global_shape, regions, path)  # type: ignore[arg-type]
        return
    runs = sum(_run_split(r, global_shape)[1] if isinstance(r, Box) else 1 for r in regions)
    if runs > RUN_BUDGET:
        raise UnverifiableCover(f"tensor {name!r}: mixed flat and box slices make {runs} runs to check", path)
    starts, ends = [], []
    for region in regions:
        g, n, _ = region_runs(region, global_shape)
        starts.append(g)
        ends.append(g + n)
    s = np.concatenate(starts)
    e = np.concatenate(ends)
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    if len(s) > 1 and np.any(s[1:] < e[:-1]):
        i = int(np.argmax(s[1:] < e[:-1]))
        raise OverlappingSlices(f"tensor {name!r}: element {int(s[i + 1])} is saved twice", path)
    gaps = np.concatenate(([s[0] > 0], s[1:] > e[:-1], [e[-1] < total]))
    if np.any(gaps):
        i = int(np.argmax(gaps))
        first = 0 if i == 0 else int(e[i - 1])
        raise MissingSlices(f"tensor {name!r}: element {first} (flat index) is in no saved slice", path)


def check_in_range(name: str, global_shape: tuple[int, ...], region: Region, path: str | None = None) -> None:
    """Raise SliceOutOfRange for a region with a negative offset or extent, or one past the tensor's bounds (checked
    before any cover arithmetic, which would read a negative extent as an empty slice)."""
    if isinstance(region, FlatRange):
        bad = region.start < 0 or region.stop < region.start or region.stop > math.prod(global_shape)
        where = f"flat [{region.start}, {region.stop})"
    else:
        bad = (len(region.offsets) != len(global_shape) or len(region.shape) != len(global_shape)
               or any(o < 0 or n < 0 or o + n > d for o, n, d in zip(region.offsets, region.shape, global_shape)))
        where = f"offsets {list(region.offsets)} shape {list(region.shape)}"
    if bad:
        raise SliceOutOfRange(f"tensor {name!r} of shape {list(global_shape)}: slice at {where} is out of range", path)


def _check_boxes(name: str, global_shape: tuple[int, ...], boxes: list[Box], path: str | None) -> None:
    """Grid test first; else an overlap sweep, falling back on volume arithmetic where the sweep is over budget
    (volume above the tensor's proves an overlap, below it a gap; only equal volume stays unverifiable)."""
    if _is_grid(boxes, global_shape):
        return
    total, covered = math.prod(global_shape), sum(b.numel for b in boxes)
    try:
        pair = _overlapping_pair(name, boxes, path)
    except UnverifiableCover:
        if covered == total:
            raise
        pair = None
        if covered > total:
            raise OverlappingSlices(f"tensor {name!r}: slices cover {covered} elements of {total}", path) from None
    if pair is not None:
        a, b = pair
        inter = intersect_boxes(a, b)
        raise OverlappingSlices(
            f"tensor {name!r}: slices at {list(a.offsets)} and {list(b.offsets)} overlap at "
            f"{list(inter.offsets) if inter is not None else []}",
            path,
        )
    if covered != total:
        raise MissingSlices(f"tensor {name!r}: saved slices cover {covered} of {total} elements", path)


def _is_grid(boxes: list[Box], global_shape: tuple[int, ...]) -> bool:
    """Whether non-empty ``boxes`` are exactly the cells of a grid: per dim their extents partition [0, size), and
    there is one box per cell. Then they cover the tensor exactly once, proved in O(n log n)."""
    if not boxes:
        return math.prod(global_shape) == 0
    cells = 1
    for d, size in enumerate(global_shape):
        bounds = sorted({(b.offsets[d], b.offsets[d] + b.shape[d]) for b in boxes})
        if bounds[0][0] != 0 or bounds[-1][1] != size or any(x[1] != y[0] for x, y in itertools.pairwise(bounds)):
            return False
        cells *= len(bounds)
    return cells == len(boxes) == len({b.offsets for b in boxes})


def _overlapping_pair(name: str, boxes: list[Box], path: str | None) -> tuple[Box, Box] | None:
    """Two boxes that share an element, or None: a sweep along the dim where the fewest pairs overlap (sorted
    starts; each box meets only the boxes starting before it ends), checked in vectorised chunks."""
    n = len(boxes)
    if n < 2:
        return None
    if not boxes[0].offsets:  # 0-d: every box is the one element
        return boxes[0], boxes[1]
    first_at: dict[tuple[int, ...], Box] = {}
    for box in boxes:  # the commonest hostile edit, a duplicated slice, found without the sweep's budget
        if first_at.setdefault(box.offsets, box) is not box:
            return first_at[box.offsets], box
    lo = np.array([b.offsets for b in boxes], np.int64)
    hi = lo + np.array([b.shape for b in boxes], np.int64)
    best: tuple[int, np.ndarray, np.ndarray] | None = None
    for d in range(lo.shape[1]):
        order = np.argsort(lo[:, d], kind="stable")
        reach = np.searchsorted(lo[order, d], hi[order, d], "left")
        pairs = int((reach - np.arange(n) - 1).sum())
        if best is None or pairs < best[0]:
            best = (pairs, order, reach)
    assert best is not None
    pairs, order, reach = best
    if pairs > PAIR_BUDGET:
        raise UnverifiableCover(f"tensor {name!r}: {n} slices in no grid; {pairs} pairs to compare", path)
    lo, hi = lo[order], hi[order]
    counts = reach - np.arange(n) - 1
    i = 0
    while i < n:
        j = i + max(1, int(np.searchsorted(np.cumsum(counts[i:]), _PAIR_CHUNK, "right")))
        first = np.repeat(np.arange(i, j), counts[i:j])
        second = np.arange(len(first)) - np.repeat(np.cumsum(counts[i:j]) - counts[i:j], counts[i:j])
        second += first + 1
        hit = np.all((lo[second] < hi[first]) & (lo[first] < hi[second]), axis=1)
        if hit.any():
            k = int(np.argmax(hit))
            return boxes[int(order[first[k]])], boxes[int(order[second[k]])]
        i = j
    return None
