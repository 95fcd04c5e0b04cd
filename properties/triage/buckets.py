"""Root-cause buckets: the failures of one bug share a bucket, whichever property, history rule or case met it.

A campaign stops shrinking a bug once it has one small case of it and counts every further case that falls in
its bucket, so properties go on looking for other bugs instead of re-finding the dominant one.

The bucket of a failure is read from its worst anomaly (the judgement's first, properties.model.verdicts.worst):

* An anomaly that quotes the SUT's error (a failed op, a dead or hung rank, an error only the SUT raised): the
  class (``error``, ``crash``, ``hang``), the exception type, the message with numbers, quoted names, hex values,
  paths and generated names (``eager_tmp_3``, uuids, temp names) abstracted, and the innermost frame of the
  traceback inside a third-party package (the SUT), e.g.
  ``paddle/distributed/flex_checkpoint/dcp/reshard_comm.py:communicate``. Which rule the error broke (a lost
  acknowledged checkpoint, a listed one that does not load) does not count: the error names the bug.
* Wrong bits (in a load, a version that is none of those saved, a resumed run) and a lost or mixed checkpoint:
  the verdict and, for wrong bits, ``wrong-data`` whichever checker met them (else the anomaly type) as the core,
  and as features the structural differences of the differing tensors (``dtype:F8_E5M2->I8``, ``shape``,
  ``missing``, ``unexpected``). What is shown in the title but splits no bucket: the value pattern of each
  tensor's first differing element (``zeros``, ``sign-of-zero``, ``nan-payload``, other ``bits``: one element is
  too easily zero by chance), the tensors' own features (dtype, layout kind, 0-d, zero-size), whether every
  element or only some differ, and the case's code-path tags (world-size change, async, file format: a shrunk
  case often keeps one it does not need, and a bug that flips a bit of whatever it loads would otherwise be a
  bucket per dtype, shape and path). A campaign keeps a bucket with the features of its *shrunk* case and counts
  a later failure as that bucket's when it has the same core and features comparable with those (one set holds
  the other).

When in doubt buckets split rather than merge: two buckets may turn out to be one bug (the report lists both,
each with a small case), but a bucket should not hide a second bug.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass

from properties.check.anomalies import (
    Anomaly,
    LoadedNoVersion,
    PersistenceOrder,
    ResumedRunDiffers,
    TensorDiffers,
    WrongVersion,
    cited_error,
)
from properties.model.case import Case

_ABSTRACT = [
    (re.compile(r"(?:[A-Za-z]:)?(?:/[\w.@+-]+){2,}/?"), "<path>"),
    (re.compile(r"0x[0-9a-fA-F]+"), "<hex>"),
    (re.compile(r"'[^']*'|\"[^\"]*\"|`[^`]*`"), "<name>"),
    # Names a run generates: uuids, digests, temp names, counters behind an underscore (eager_tmp_7, linear_3.w_0).
    (re.compile(r"\b[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}\b"), "<id>"),
    (re.compile(r"\b(?=[0-9a-fA-F]*\d)[0-9a-fA-F]{12,}\b"), "<hex>"),
    (re.compile(r"\btmp[a-z0-9_]{8}\b"), "<tmp>"),
    (re.compile(r"(?<=_)\d+\b"), "<n>"),
    (re.compile(r"\b\d+(?:\.\d+)?(?:e[+-]?\d+)?\b"), "<n>"),
    (re.compile(r"\s+"), " "),
]
#: Patterns read from one element's values: shown in a bucket's title, but too easily met by chance (a wrong
#: version's element that happens to be zero) to split buckets; a dtype, shape or missing tensor does.
VALUE_PATTERNS = frozenset({"bits", "zeros", "sign-of-zero", "nan-payload"})
_FRAME = re.compile(r'File "([^"]+)", line \d+, in (\S+)')
_PACKAGES = re.compile(r"[/\\](?:site|dist)-packages[/\\](.+)$")


@dataclass(frozen=True)
class Bucket:
    """A failure's root-cause bucket: ``core`` names the kind of failure, ``features`` what it showed (difference
    patterns, code-path tags); ``title`` is the line users read. A bucket found by shrinking keeps only the
    features its smallest case still shows, so it ``covers`` every later failure with the same core and at least
    those features (the same bug met through a bigger case)."""

    core: str
    features: frozenset[str] = frozenset()
    title: str = ""

    @property
    def id(self) -> str:
        return hashlib.sha1(f"{self.core}|{','.join(sorted(self.features))}".encode()).hexdigest()[:10]

    def covers(self, other: Bucket) -> bool:
        """The same core, and features one of the two shows all of (a shrunk case may keep a tag it did not need,
        a bigger case shows more than the bug needs)."""
        return self.core == other.core and (self.features <= other.features or other.features <= self.features)


def abstract(message: str, limit: int = 160) -> str:
    """The message with what varies between cases of one bug (numbers, names, paths, addresses) abstracted."""
    for pattern, repl in _ABSTRACT:
        message = pattern.sub(repl, message)
    return message.strip()[:limit]


def innermost_frame(traceback: str | None) -> str | None:
    """The innermost frame of ``traceback`` in an installed package (the SUT's code, not the harness's), as
    ``package/path.py:function``; None when there is none."""
    frames = [(m.group(1), m.group(2)) for m in _FRAME.finditer(traceback or "")]
    for path, func in reversed(frames):
        inside = _PACKAGES.search(path)
        if inside is not None:
            return f"{inside.group(1).replace(chr(92), '/')}:{func}"
    return None


def bucket_of(case: Case, anomalies: Sequence[Anomaly], tracebacks: dict[int, str] | None = None) -> Bucket | None:
    """The bucket of a failure given its anomalies (worst first) and the cited traceback of each op that failed
    (op index -> traceback); None for a judgement without anomalies."""
    if not anomalies:
        return None
    first = anomalies[0]
    error = cited_error(first)
    if error is not None:
        cls = error.failure if error.failure in ("crash", "hang") else "error"
        # A death or a hang says nothing in its own words (the harness wrote them, logs included): only where.
        message = abstract(error.message or "") if cls == "error" else ""
        at = getattr(first, "at", None)
        frame = innermost_frame((tracebacks or {}).get(at.op)) if at is not None else None
        title = f"{cls}: {error.error_type}: {message}" + (f" (at {frame})" if frame else "")
        return Bucket(f"{cls}|{error.error_type}|{message}|{frame}", frozenset(), title)
    if isinstance(first, PersistenceOrder):  # the rule, and which kinds of file: which step or rank says nothing
        what = f"{first.rule}|{first.record}|{first.path}"
        return Bucket(f"{first.verdict.value}|{first.kind}|{what}", frozenset(),
                      f"{first.verdict.value}: {first.rule}: " + (f"{first.record} before {first.path}"
                                                                   if first.record else first.path))
    if isinstance(first, WrongVersion):  # a whole other version: which one says more than how its bits differ
        return Bucket(f"{first.verdict.value}|wrong-version|{first.relation}", frozenset(),
                      f"{first.verdict.value}: load gave another version whole ({first.relation})")
    patterns = sorted({_pattern(d.difference) for d in _differences(first)})
    tensors = sorted({d.difference.tensor for d in _differences(first)})
    tags = _case_tags(case)
    features = sorted({t for name in tensors for t in _tensor_tags(case, name)})
    title = f"{first.verdict.value}: {first.kind}" + (f" ({', '.join(patterns)})" if patterns else "") + (
        f" [{', '.join(tags + features)}]" if tags or features else "")
    structural = {p.split("/")[0] for p in patterns if p.split("/")[0] not in VALUE_PATTERNS}
    # Wrong bits are one kind of failure whether the oracle met them in a load, the history checker in a version
    # that is none of those saved, or a resumed run: which one depends on the case, not on the bug.
    kind = "wrong-data" if _differences(first) else first.kind
    return Bucket(f"{first.verdict.value}|{kind}", frozenset(structural), title)


def _differences(anomaly: Anomaly) -> tuple[TensorDiffers, ...]:
    if isinstance(anomaly, TensorDiffers):
        return (anomaly,)
    if isinstance(anomaly, (LoadedNoVersion, ResumedRunDiffers)):
        return anomaly.differences
    return ()


def _pattern(difference) -> str:
    """How one tensor differs, as a pattern that does not depend on its values."""
    what = difference.what
    if what == "dtype":
        return f"dtype:{difference.expected}->{difference.got}"
    if what != "bits":
        return what
    extent = "all" if difference.count == difference.size else "some"
    expected, got = int(difference.expected_bits, 16), int(difference.got_bits, 16)
    width = 4 * (len(difference.got_bits) - 2)
    sign = 1 << (width - 1)
    if width < 16 or bin(expected ^ got).count("1") == 1:
        kind = "bits"  # a byte or a flipped bit says nothing of the cause: any wrong value may look like that
    elif got | expected == sign:
        kind = "sign-of-zero"
    elif got == 0:
        kind = "zeros"
    elif difference.expected_value == difference.got_value == "nan":
        kind = "nan-payload"
    else:
        kind = "bits"
    return f"{kind}/{extent}"


def _case_tags(case: Case) -> list[str]:
    tags = []
    worlds = {_world(lay) for lay in case.save_layout.values()}, {_world(lay) for lay in case.load_layout.values()}
    if worlds[0] != worlds[1]:
        tags.append("world-change")
    if any(op.use_async for op in case.ops):
        tags.append("async")
    if "format" in case.options:
        tags.append(f"format:{case.options['format']}")
    return tags


def _tensor_tags(case: Case, name: str) -> list[str]:
    tensor = next((t for t in case.tensors if t.name == name), None)
    if tensor is None:
        return []
    tags = [tensor.dtype, f"layout:{case.save_layout.get(name, {}).get('kind', '?')}"]
    if len(tensor.shape) == 0:
        tags.append("0-d")
    elif 0 in tensor.shape:
        tags.append("zero-size")
    return tags


def _world(layout: dict) -> int:
    shape = layout.get("mesh", {}).get("shape", [1])
    out = 1
    for n in shape:
        out *= n
    return out
