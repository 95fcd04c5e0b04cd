"""Reference checkpoint engine: the framework-free oracle every system under test is judged against.

numpy + safetensors only. Public surface: the layout model, bitwise tensors, save/commit/load with reshard,
async save, typed errors.
"""

from .async_save import AsyncSave, AsyncSaver, async_save
from .disk.commit import Scan, checkpoint_dir, committed_checkpoints, read_latest, scan_checkpoints
from .dtypes import DTYPES, DType, dtype
from .engine import (
    CheckpointInfo,
    LocalTensor,
    Target,
    commit,
    extract,
    load,
    load_global,
    load_rank,
    local_tensors,
    new_save_id,
    open_checkpoint,
    read_meta,
    save,
    save_rank,
)
from .errors import (
    AsyncWriterError,
    CheckpointError,
    CheckpointExists,
    CheckpointIncomplete,
    CheckpointNotFound,
    ChecksumMismatch,
    CorruptCheckpoint,
    CoverError,
    HeaderTooLarge,
    LayoutError,
    MalformedMetadata,
    MissingSlices,
    MissingTensor,
    OverlappingSlices,
    TargetMismatch,
    UnsafePath,
    UnsupportedFormatVersion,
    UnverifiableCover,
)
from .layout import Box, Flat, FlatRange, Mesh, Replicate, Shard, Sharded, flat_group, replicated, split_range
from .namespaces import TrainingState
from .regions import check_exact_cover
from .tensor import Tensor, diff, diff_states

__all__ = [name for name in dir() if not name.startswith("_")]
