"""PaddleFormers' Unified Checkpoint (UC), driven through its Trainer, as a system under test.

A case's tensors are a trainer's state (docs/design.md §4): ``model/<p>`` is parameter ``<p>`` of a small
``PretrainedModel`` built from the names (``layers.0.qkv`` nests), ``optimizer/<p>.m1`` / ``.m2`` are AdamW's
moments of it and ``master/<p>`` its FP32 master weight (AdamW with ``multi_precision``: BF16/F16 parameters have
one). A save sets those values into the live model and optimizer and calls ``Trainer._save_checkpoint`` at
``global_step`` N (``step-N`` -> ``checkpoint-N``), so everything UC and the Trainer write — index files before
shards, async writer processes fed through shared memory, done-signal files, trainer state, RNG, scheduler and the
rotation of ``save_total_limit`` — happens as in a training job. A load is a resume in a fresh Trainer: the calls
``Trainer.train`` makes before its first step (model, DataParallel wrap, optimizer and scheduler, trainer state),
with "latest" resolved by ``trainer_utils.get_last_checkpoint``, the Trainer's own selector.

What it cannot hold, and why (the capabilities say so, so strategies never draw it):
* sharded or flattened layouts: on CPU, UC's tensor-parallel merge raises NotImplementedError for most models
  (measured on 1.2.0), and pure data parallelism keeps whole tensors on every rank; only replicated layouts;
* EMA, RNG words and a step counter as tensors: UC keeps no EMA (that is Zero-Cost Checkpointing's), and its RNG
  and step files hold framework state, not case bits; they are still written and read, and their errors count;
* dtypes other than F32/BF16/F16 for parameters (AdamW's), F32 for moments and master weights.
Evidence and the code path of each finding: docs/paddleformers-notes.md.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from harness.sut._paddle_common import PaddleAdapter, add_nested_parameter, from_paddle, to_paddle, trailing_int
from harness.sut.base import RankTensor
from reference import master_weights
from reference.layout import Box, Region
from reference.tensor import Tensor

PARAM_DTYPES = ("F32", "BF16", "F16")
# AsyncCheckpointHandler's writers: (state kind, its flag, its process); flag 1 = a file is being written.
_WRITERS = (("model_weight", "_shared_save_model_flag", "_process_model_weight"),
            ("master_weight", "_shared_save_master_weight_flag", "_process_master_weight"),
            ("optimizer_weight", "_shared_save_optimizer_flag", "_process_optimizer_weight"))
_FILES = {"model": "model.safetensors.index.json", "master": "master_weights.safetensors.index.json",
          "optimizer": "optimizer.safetensors.index.json"}
_MOMENTS = {"m1": "moment1", "m2": "moment2"}
WRITER_TIMEOUT = 60.0  # seconds an async writer may take to finish a tiny checkpoint before wait() gives up


# unified_checkpoint_config flags a case may turn on besides async_save (which every job here allows).
# skip_save_model_weight and remove_master_weight save one of a weight and its master in place of the other, which
# a resume restores by a cast (reference.master_weights says what the load gives). Pairs the job cannot run:
# PaddleFormers' TrainingArguments refuses skip_save_model_weight with ignore_merge_optimizer, and with
# remove_master_weight as well neither a weight nor its master would be saved.
UC_FLAGS = ("master_weight_compatible", "ignore_merge_optimizer", *master_weights.FLAGS)
_EXCLUSIVE = ((master_weights.SKIP_MODEL_WEIGHT, "ignore_merge_optimizer"),
              (master_weights.SKIP_MODEL_WEIGHT, master_weights.REMOVE_MASTER_WEIGHT))


def uc_config(options: dict) -> str:
    """The job's ``unified_checkpoint_config``: async saves allowed, and the case's flags."""
    return " ".join(["async_save", *(f for f in UC_FLAGS if options.get(f))])


class UcStateError(ValueError):
    """The case's tensors are not a trainer's state this adapter can hold; the message names the tensor."""


@dataclass(frozen=True)
class ParamSpec:
    name: str  # structured name, e.g. "layers.0.qkv"
    dtype: str  # reference dtype code
    shape: tuple[int, ...]


def param_specs(names: dict[str, Tensor]) -> list[ParamSpec]:
    """The model's parameters from a state's tensors; raises UcStateError for a tensor UC has no place for."""
    params: dict[str, ParamSpec] = {}
    others: list[str] = []
    for key, t in sorted(names.items()):
        family, _, rest = key.partition("/")
        if family == "model":
            if t.dtype.name not in PARAM_DTYPES:
                raise UcStateError(f"{key}: AdamW parameters are {'/'.join(PARAM_DTYPES)}, not {t.dtype.name}")
            params[rest] = ParamSpec(rest, t.dtype.name, tuple(t.shape))
        else:
            others.append(key)
    for key in others:
        family, param, _ = _slot(key)
        spec = params.get(param)
        if spec is None:
            raise UcStateError(f"{key}: UC keeps {family} state only for a parameter, and model/{param} is not in "
                               "the state")
        if names[key].dtype.name != "F32" or tuple(names[key].shape) != spec.shape:
            raise UcStateError(f"{key}: must be F32 of shape {list(spec.shape)} like its parameter's")
        if family == "master" and spec.dtype == "F32":
            raise UcStateError(f"{key}: AdamW keeps no master weight for the F32 parameter model/{param}")
    return list(params.values())


def _slot(key: str) -> tuple[str, str, str]:
    """("optimizer", "w", "moment1") for "optimizer/w.m1"; ("master", "w", "") for "master/w"."""
    family, _, rest = key.partition("/")
    if family == "master":
        return family, rest, ""
    if family == "optimizer":
        param, _, moment = rest.rpartition(".")
        if moment in _MOMENTS:
            return family, param, _MOMENTS[moment]
    raise UcStateError(f"{key}: UC holds model/<p>, optimizer/<p>.m1|.m2 and master/<p>; it has no place for {key!r}")


@dataclass
class Job:
    """One case's training job on this rank: a Trainer over the case's model."""

    trainer: Any
    params: dict[str, Any]  # structured name -> paddle parameter


@dataclass
class SaveHandle:
    tensors: list[Any]  # the live tensors the save read (P-ASYNC-ISOLATION scribbles over them)
    job: Job


class PaddleFormersUcSut(PaddleAdapter):
    name = "paddleformers-uc"
    framework = "paddleformers"
    capabilities: ClassVar[frozenset[str]] = frozenset(
        {"trainer_state", "replicated", "reshard", "async", "zero_size", "repeat", "latest", "rotate",
         "kill_writer", "keep_last", "flag:pdc"}
        | {f"flag:{f}" for f in UC_FLAGS}
        | {f"exclusive:{a},{b}" for a, b in _EXCLUSIVE}
        | {f"dtype:{d}" for d in PARAM_DTYPES}
    )

    def __init__(self) -> None:
        self._job: Job | None = None

    @classmethod
    def refuses(cls, case: Any) -> str | None:
        """A layout other than whole tensors everywhere, a pair of flags the job cannot run (_EXCLUSIVE), or a saved
        state that is no Trainer's (param_specs)."""
        refused = super().refuses(case)
        both = [pair for pair in _EXCLUSIVE if all(case.options.get(f) for f in pair)]
        if refused is None and both:
            return f"unified_checkpoint_config {' with '.join(both[0])}"
        if refused is not None or case.training is not None:  # the training loop's state is always one
            return refused
        for version in sorted({op.version for op in case.ops if op.kind == "save"}):
            try:
                param_specs(case.state(version))
            except UcStateError as exc:
                return str(exc)
        return None

    def setup(self, rank: int, world_size: int, options: dict) -> list[str]:
        import paddle

        paddle.set_device("cpu")  # CPU wheels only here (docs/gpu.md); TrainingArguments inits the collective
        _register_new_segments()
        return []

    # --- the Trainer ------------------------------------------------------------------------------------------

    def _trainer(self, root: Path, specs: list[ParamSpec], options: dict,
                 accumulators: bool = True) -> tuple[Any, dict[str, Any]]:
        """A fresh Trainer over a fresh model; with ``accumulators``, its AdamW holds every moment (and master weight)
        as after a first step. A resuming job has none yet: they are created, from what was loaded, at its first
        step."""
        from paddleformers.trainer import Trainer, TrainingArguments

        args = TrainingArguments(
            output_dir=str(root), unified_checkpoint=True, save_checkpoint_format="unified_checkpoint",
            load_checkpoint_format="unified_checkpoint", unified_checkpoint_config=uc_config(options),
            save_total_limit=options.get("keep_last"), amp_master_grad=False, sharding="", report_to="none",
            disable_tqdm=True, max_steps=1, save_steps=1, logging_steps=1, per_device_train_batch_size=1,
            seed=int(options.get("seed", 0)),
            # As a user configures BF16/F16 training: AMP O2, so the Trainer builds AdamW with multi_precision
            # (FP32 master weights), and the bf16 flag UC reads to decide that master weights are needed.
            **({"bf16": True, "fp16_opt_level": "O2"} if any(s.dtype != "F32" for s in specs) else {}),
        )
        model = _build_model(specs)
        params = dict(model.named_parameters())
        trainer = Trainer(model=model, args=args)
        trainer.create_optimizer_and_scheduler(num_training_steps=1)
        if accumulators:
            _first_step_accumulators(trainer.optimizer, params)
        return trainer, params

    def _job_for(self, root: Path, state: dict[str, Tensor], options: dict) -> Job:
        if self._job is None:
            trainer, params = self._trainer(root, param_specs(state), options)
            self._job = Job(trainer, params)
        return self._job

    # --- save ------------------------------------------------------------------------------------------------

    def save(self, root: Path, name: str, tensors: dict[str, RankTensor], *, use_async: bool, options: dict) -> Any:
        with _pdc(options):
            return self._save(root, name, tensors, use_async=use_async, options=options)

    def _save(self, root: Path, name: str, tensors: dict[str, RankTensor], *, use_async: bool, options: dict) -> Any:
        _whole(tensors)
        state = {key: rt.local.tensor for key, rt in tensors.items()}
        job = self._job_for(root, state, options)
        trainer = job.trainer
        live = _slots(trainer, job.params, state)
        for key, target in live.items():
            target.set_value(to_paddle(state[key]))
        trainer.state.global_step = trailing_int(name)
        config = trainer.args.unified_checkpoint_config
        trainer.is_in_train = True
        try:
            if not use_async:  # as the Trainer's final save_model does: the async option off for this save
                trainer.args.unified_checkpoint_config = [c for c in config if c != "async_save"]
            trainer._save_checkpoint(trainer.model, metrics=None)
        finally:
            trainer.args.unified_checkpoint_config = config
        return SaveHandle(list(live.values()), job)

    def wait(self, handle: SaveHandle) -> None:
        """Until every async writer of the job has finished its file (the Trainer itself only waits at the next
        save of a type or at the end of training); a dead writer raises, as UC's own wait does."""
        handler = _async_handler(handle.job.trainer)
        if handler is None:
            return
        deadline = time.monotonic() + WRITER_TIMEOUT
        for kind, flag_attr, process_attr in _WRITERS:
            flag, process = getattr(handler, flag_attr, None), getattr(handler, process_attr, None)
            while flag is not None and flag[0] > 0:
                if process is None or not process.is_alive():
                    raise RuntimeError(f"the UC process that saves {kind} died before finishing its file")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the UC {kind} writer did not finish within {WRITER_TIMEOUT:.0f} s")
                time.sleep(0.01)

    def writer_pids(self, handle: Any) -> list[int]:
        """UC's writers are long-lived processes, started by the first async save and fed through shared flags."""
        return [p.pid for p in _writer_processes(handle.job.trainer) if p.is_alive()]

    def kill_pending(self, handles: list[Any]) -> None:
        for job in {id(h.job): h.job for h in handles}.values():
            for process in _writer_processes(job.trainer):
                if process.is_alive():
                    os.kill(process.pid, signal.SIGKILL)
                process.join(10)

    def rotate(self, root: Path, keep: int) -> None:
        """The Trainer's rotation (``_rotate_checkpoints`` by mtime), on the rank that rotates after a save."""
        job = self._job
        if job is None:
            trainer, _ = self._trainer(root, [], {})
        else:
            trainer = job.trainer
        if trainer.args.should_save_model_state and trainer.args.local_rank in (0, -1):
            limit = trainer.args.save_total_limit
            trainer.args.save_total_limit = keep
            try:
                trainer._rotate_checkpoints(use_mtime=True, output_dir=str(root))
            finally:
                trainer.args.save_total_limit = limit

    # --- load ------------------------------------------------------------------------------------------------

    def load(self, root: Path, name: str | None, targets: dict[str, RankTensor], *, options: dict) -> dict[str, Tensor]:
        with _pdc(options):
            return self._load(root, name, targets, options=options)

    def _load(self, root: Path, name: str | None, targets: dict[str, RankTensor], *,
              options: dict) -> dict[str, Tensor]:
        _whole(targets)
        zeros = {key: rt.local.tensor for key, rt in targets.items()}
        path = checkpoint_to_resume(root, name)
        trainer, params = self._trainer(root, param_specs(zeros), options, accumulators=False)
        _resume(trainer, str(path))
        # The first step creates moments (and masters) from what set_state_dict kept; a value UC did not restore
        # comes out as a fresh zero moment, never a stale one.
        _first_step_accumulators(trainer.optimizer, params)
        live = _slots(trainer, params, zeros)
        return {key: from_paddle(target, tuple(zeros[key].shape)) for key, target in live.items()}

    def end_case(self) -> None:
        job, self._job = self._job, None
        if job is not None:
            _stop_writers(job.trainer)

    @classmethod
    def complete(cls, root: Path, names: Collection[str], options: dict) -> list[str]:
        """Names whose ``checkpoint-N`` directory ``get_last_checkpoint`` would take as finished: only one holding
        ``.checkpoint_done`` with option ``pdc`` (the adapter runs manual parallel, so the async signal-file count is
        never consulted); otherwise any such directory (it checks nothing), unless some directory under the root
        holds the marker, which stock code writes only on PDC: then, as the fixed selector reads a marked folder,
        one with the marker or an async writer's done signal."""
        paths = {}
        for n in names:
            try:
                paths[n] = Path(root) / _dir_name(n)
            except ValueError:  # no trailing step number: UC could never have written it
                continue
        marked = any((p / ".checkpoint_done").is_file() for p in Path(root).glob("checkpoint-*"))
        out = []
        for n, path in paths.items():
            if not path.is_dir():
                continue
            done = (path / ".checkpoint_done").is_file()
            if options.get("pdc") and not done:
                continue
            if marked and not done and not any(".done." in f.name for f in path.iterdir()):
                continue
            out.append(n)
        return sorted(out)

    @classmethod
    def written(cls, root: Path, name: str) -> dict[str, tuple[tuple[int, ...], list[Region]]] | None:
        """Every tensor UC's index files list and its shard holds, with its shape from the safetensors header, as
        the case names it."""
        import json

        from safetensors import safe_open

        path = Path(root) / _dir_name(name)
        if not (path / _FILES["model"]).is_file():
            return None
        out: dict[str, tuple[tuple[int, ...], list[Region]]] = {}
        for family, index in _FILES.items():
            if not (path / index).is_file():
                continue
            weight_map = json.loads((path / index).read_text())["weight_map"]
            for key, file in weight_map.items():
                case_key = _case_key(family, key)
                if case_key is None:
                    continue
                try:
                    with safe_open(str(path / file), framework="numpy") as f:
                        shape = tuple(f.get_slice(key).get_shape())
                except Exception:  # listed before it landed (UC writes indexes first), or damaged: not written
                    continue
                regions = out.get(case_key, (shape, []))[1]
                out[case_key] = (shape, [*regions, Box((0,) * len(shape), shape)])
        return out


# --- helpers ---------------------------------------------------------------------------------------------------

@contextlib.contextmanager
def _pdc(options: dict) -> Any:
    """``options["pdc"]``: run as on PaddleCloud (``FLAG_LLM_PDC=True``), where sync saves end with a
    ``.checkpoint_done`` marker and ``get_last_checkpoint`` skips directories without one. The Trainer reads the
    variable at each call, so it is set around each save and load only."""
    previous = os.environ.get("FLAG_LLM_PDC")
    os.environ["FLAG_LLM_PDC"] = "True" if options.get("pdc") else "False"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("FLAG_LLM_PDC", None)
        else:
            os.environ["FLAG_LLM_PDC"] = previous


def checkpoint_to_resume(root: Path, name: str | None) -> Path:
    """The ``checkpoint-N`` directory a resume reads: ``name``'s, or (None) the one the Trainer's own selector,
    ``trainer_utils.get_last_checkpoint``, picks."""
    from paddleformers.trainer.trainer_utils import get_last_checkpoint

    if name is not None:
        return Path(root) / _dir_name(name)
    found = get_last_checkpoint(str(root))
    if found is None:
        raise FileNotFoundError(f"get_last_checkpoint found no checkpoint-N under {root}")
    return Path(found)


def _dir_name(name: str) -> str:
    return f"checkpoint-{trailing_int(name)}"


def _case_key(family: str, key: str) -> str | None:
    """The case's name for a key in UC's index (None: a key the case does not hold, e.g. beta powers)."""
    if family == "model":
        return f"model/{key}"
    if family == "master":
        return f"master/{key}"
    param, _, slot = key.rpartition("/")
    moment = {v + "_0": k for k, v in _MOMENTS.items()}.get(slot)
    return f"optimizer/{param}.{moment}" if moment else None


def _whole(tensors: dict[str, RankTensor]) -> None:
    for key, rt in tensors.items():
        if tuple(rt.local.region.shape) != tuple(rt.local.global_shape):
            raise UcStateError(f"{key}: UC under data parallelism holds whole tensors on every rank; this rank holds "
                               f"a piece {rt.local.region} of {list(rt.local.global_shape)}")


def _build_model(specs: list[ParamSpec]) -> Any:
    """A PretrainedModel whose parameters are exactly ``specs`` (dotted names become nested sub-layers)."""
    from paddleformers.transformers import PretrainedConfig, PretrainedModel

    class HarnessConfig(PretrainedConfig):
        model_type = "ckpt_harness"

    class HarnessModel(PretrainedModel):
        config_class = HarnessConfig
        base_model_prefix = "harness"

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("the harness never trains this model")

    model = HarnessModel(HarnessConfig())
    for spec in specs:
        add_nested_parameter(model, spec.name, spec.shape, spec.dtype)
    return model


def _first_step_accumulators(optimizer: Any, params: dict[str, Any]) -> None:
    """What AdamW's first step creates: moments and beta powers, and master weights for BF16/F16 parameters (from
    a loaded state where set_state_dict left one)."""
    import paddle

    optimizer._create_accumulators(paddle.static.default_main_program().global_block(), list(params.values()))


def _slots(trainer: Any, params: dict[str, Any], state: dict[str, Tensor]) -> dict[str, Any]:
    """Case key -> the live paddle tensor that holds it (parameter, accumulator or master weight)."""
    optimizer = trainer.optimizer
    out: dict[str, Any] = {}
    for key in state:
        family, _, rest = key.partition("/")
        if family == "model":
            out[key] = params[rest]
            continue
        family, param, slot = _slot(key)
        master = optimizer._master_weights.get(params[param].name)
        if family == "master":
            out[key] = master
        else:  # AdamW keys a BF16/F16 parameter's moments by its master weight (UC also lists F32 ones there)
            low = master is not None and str(params[param].dtype) != "paddle.float32"
            out[key] = optimizer._accumulators[slot][(master if low else params[param]).name]
    return out


def _resume(trainer: Any, path: str) -> None:
    """What ``Trainer.train(resume_from_checkpoint=path)`` does before its first step on a data-parallel job."""
    from paddleformers.trainer.trainer_callback import TrainerState
    from paddleformers.trainer.utils.helper import distributed_file, distributed_isfile
    from paddleformers.utils.env import TRAINER_STATE_NAME

    trainer._load_from_checkpoint(path)
    trainer.model_wrapped = trainer._wrap_model(trainer.model_wrapped)
    trainer._load_optimizer_and_scheduler(path)
    state_path = os.path.join(path, TRAINER_STATE_NAME)
    if distributed_isfile(state_path):  # as the training loop: a missing trainer state is skipped silently
        state_path = distributed_file(state_path)
        trainer.state = (TrainerState.load_from_json(state_path) if state_path.endswith(".json")
                         else TrainerState.load(state_path))


def _async_handler(trainer: Any) -> Any:
    handler = getattr(trainer, "unified_checkpoint_handler", None)
    return getattr(handler, "async_handler", None)


def _writer_processes(trainer: Any) -> list[Any]:
    handler = _async_handler(trainer)
    if handler is None:
        return []
    return [p for p in (getattr(handler, attr, None) for _, _, attr in _WRITERS) if p is not None]


_segments: list[str] = []


def _register_new_segments() -> None:
    """UC's writers' shared memory outlives a rank killed mid-save (its resource tracker dies with the job), so
    every segment this process creates is listed for the pool to unlink when it closes. Bookkeeping only: the
    class UC instantiates behaves exactly as it does unpatched. Once per process."""
    from multiprocessing import shared_memory

    from harness.sut.shm import register_shm

    base = shared_memory.SharedMemory
    if getattr(base, "_ckpt_harness_registers", False):
        return

    class RegisteredSharedMemory(base):  # type: ignore[misc, valid-type]
        _ckpt_harness_registers = True

        def __init__(self, name: str | None = None, create: bool = False, size: int = 0, **kwargs: Any) -> None:
            super().__init__(name, create, size, **kwargs)
            if create:
                _segments.append(self.name)
                register_shm(_segments)

    shared_memory.SharedMemory = RegisteredSharedMemory


def _stop_writers(trainer: Any) -> None:
    """End the job's async writers and free their shared memory, whatever state they are in (UC's own
    ``unlink_shared_memory`` raises on a dead writer and then leaves the rest running)."""
    handler = _async_handler(trainer)
    if handler is None:
        return
    for _, flag_attr, _ in _WRITERS:
        flag = getattr(handler, flag_attr, None)
        if flag is not None:
            flag[0] = -1
    for process in _writer_processes(trainer):
        process.join(5)
        if process.is_alive():
            process.kill()
            process.join(5)
    for kind, _, _ in _WRITERS:
        shm = getattr(handler, f"_shm_{kind}", None)
        if shm is not None:
            shm.close()
            with contextlib.suppress(FileNotFoundError):
                shm.unlink()
            setattr(handler, f"_shm_{kind}", None)
