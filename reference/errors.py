"""Typed errors of the reference engine.

Every error names the file (or checkpoint) and the problem so a harness report can quote it verbatim; the
harness maps these classes to verdicts, so they must stay distinguishable by type, not by message text.
"""

from __future__ import annotations

from pathlib import Path


class CheckpointError(Exception):
    """Base class: something about a checkpoint (or a request against one) is wrong."""

    def __init__(self, message: str, path: str | Path | None = None) -> None:
        self.path = str(path) if path is not None else None
        super().__init__(f"{self.path}: {message}" if self.path else message)


class CheckpointNotFound(CheckpointError):
    """No committed checkpoint exists under the given root or name."""


class CheckpointExists(CheckpointError):
    """A committed checkpoint of this name exists and cannot be replaced atomically here (the marker protocol, or a
    file system without an atomic exchange); names are never overwritten in place."""


class CheckpointIncomplete(CheckpointError):
    """The checkpoint was never committed, or files it lists are missing."""


class CorruptCheckpoint(CheckpointError):
    """Bytes on disk contradict the index: malformed header, wrong size, bad JSON."""


class MalformedMetadata(CorruptCheckpoint):
    """A metadata file (index, manifest, safetensors header, ``latest``) fails its checksum or its strict grammar:
    too large, too deep, duplicate keys, wrong types, fields missing or unknown. The message names file and field."""


class ChecksumMismatch(CorruptCheckpoint):
    """A data block's checksum differs from the one recorded at save time."""


class HeaderTooLarge(CorruptCheckpoint):
    """A safetensors header claims more bytes than the file (or a sane limit) holds."""


class UnsupportedFormatVersion(CheckpointError):
    """The index was written by an unknown format or version."""


class UnsafePath(CheckpointError):
    """A name in the checkpoint would escape its directory (path traversal, links, absolute paths)."""


class CoverError(CheckpointError):
    """The saved slices of a tensor do not cover it exactly once."""


class MissingSlices(CoverError):
    """Some elements of a tensor are covered by no saved slice."""


class OverlappingSlices(CoverError):
    """Some elements of a tensor are covered by more than one saved slice."""


class SliceOutOfRange(CoverError):
    """A slice has a negative offset or extent, or reaches past the tensor's shape (a split that went wrong, e.g. an
    extent of -1 for the last of uneven shards): whatever it covers, it does not describe data of the tensor."""


class UnverifiableCover(CoverError):
    """The slices of a tensor form no grid and so irregular a tiling that proving it exact would cost more than a
    bounded budget (only hostile indexes do this: every layout saves a grid)."""


class MissingTensor(CheckpointError):
    """The load target asks for a tensor the checkpoint does not contain."""


class TargetMismatch(CheckpointError):
    """The load target's dtype or global shape differs from the saved tensor."""


class LayoutError(ValueError):
    """A mesh, placement or layout request is inconsistent (caller bug, not a checkpoint problem)."""


class AsyncWriterError(CheckpointError):
    """The background writer of an async save failed or died; carries its own message."""


#: Every error type above by name: an async writer reports its error's type name, and the caller raises that type.
ERROR_TYPES: dict[str, type[Exception]] = {
    name: obj for name, obj in dict(globals()).items() if isinstance(obj, type) and issubclass(obj, Exception)
}
