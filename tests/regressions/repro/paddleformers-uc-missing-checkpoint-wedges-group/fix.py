"""paddleformers-uc: data-loss in P-LIFECYCLE (paddleformers-uc-missing-checkpoint-wedges-group)

The candidate fix (paddleformers-uc-missing-checkpoint-all-ranks), written by ckpt-harness: ``bash run.sh --with-
fix`` runs the repro with it, repro.py calling ``apply()`` in every process before its first step. fix.diff is the
same change as a patch of the framework's source."""

import __future__

import hashlib
import importlib
import inspect
import linecache
import sys
import textwrap
import types
from collections.abc import Callable, Iterator


def source_digest(text: str) -> str:
    """The first 16 hex digits of the sha256 of a function's source, as ``inspect.getsource`` gives it."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def target(module: str, qualname: str) -> tuple[object, str, Callable]:
    """Where the function is bound in its own module (the module or the class), its name, and the function."""
    owner: object = importlib.import_module(module)
    *path, name = qualname.split(".")
    for part in path:
        owner = getattr(owner, part)
    return owner, name, inspect.getattr_static(owner, name)


def compiled(original: Callable, source: str, owner: object, filename: str) -> Callable:
    """``source`` (the function's whole text) compiled in ``original``'s module globals, so it sees what the original
    sees. A method calling super() closes over its class: it is compiled inside a function that binds ``__class__``
    to ``owner``. It is compiled under the original's own ``__future__`` annotations, so annotations the module leaves
    unevaluated stay so. ``filename`` names it in tracebacks, which show its lines."""
    body = textwrap.indent(textwrap.dedent(source), "    ")
    factory = f"def __ckpt_factory__(__class__):\n{body}    return {original.__name__}\n"
    linecache.cache[filename] = (len(factory), None, factory.splitlines(True), filename)
    namespace: dict = {}
    lazy = original.__code__.co_flags & __future__.annotations.compiler_flag
    exec(compile(factory, filename, "exec", flags=lazy, dont_inherit=True), original.__globals__, namespace)
    func = namespace["__ckpt_factory__"](owner)
    func.__qualname__, func.__module__ = original.__qualname__, original.__module__
    return func


def rebind(old: Callable, new: Callable) -> None:
    """Every module attribute and class attribute that is ``old`` becomes ``new``."""
    for namespace in _namespaces():
        for name, value in list(namespace.items()):
            if value is old:
                _set(namespace, name, new)


def _namespaces() -> Iterator[dict]:
    """The dicts of every loaded module and of the classes defined in them."""
    for module in list(sys.modules.values()):
        if not isinstance(module, types.ModuleType):
            continue
        try:
            namespace = vars(module)
        except TypeError:
            continue
        yield namespace
        for value in list(namespace.values()):
            if isinstance(value, type) and getattr(value, "__module__", None) == module.__name__:
                yield _ClassNamespace(value)


class _ClassNamespace(dict):
    """A class's attributes, read as a dict and written through ``setattr`` (a mappingproxy is read-only)."""

    def __init__(self, cls: type) -> None:
        super().__init__(vars(cls))
        self.cls = cls


def _set(namespace: dict, name: str, value: object) -> None:
    if isinstance(namespace, _ClassNamespace):
        setattr(namespace.cls, name, value)
    else:
        namespace[name] = value


# (module, function, sha256[:16] of the source it was written against, the patched function)
PATCHES = [
    ('paddleformers.trainer.trainer', 'Trainer._load_from_checkpoint', '9367baea027b0fe5',
     r'''    def _load_from_checkpoint(self, resume_from_checkpoint=None):
        """load state_dict from_checkpoint, Only load model state dict.

        Args:
            resume_from_checkpoint (`str` or `bool`, *optional*):
                If a `str`, local path to a saved checkpoint as saved by a previous instance of [`Trainer`]. If a
                `bool` and equals `True`, load the last checkpoint in *args.output_dir* as saved by a previous instance
                of [`Trainer`]. Only load model state dict.
        """
        self.runtime_timer.start("checkpoint loading time")
        resume_from_checkpoint = None if not resume_from_checkpoint else resume_from_checkpoint

        # Load potential model checkpoint
        if isinstance(resume_from_checkpoint, bool) and resume_from_checkpoint:
            uc_async_save = False
            if self.args.enable_auto_parallel:
                uc_async_save = (
                    self.args.load_checkpoint_format == "unified_checkpoint"
                    and "async_save" in self.args.unified_checkpoint_config
                )
            resume_from_checkpoint = get_last_checkpoint(
                self.args.output_dir, signal_folder=self.args.output_signal_dir, uc_async_save=uc_async_save
            )
            if resume_from_checkpoint is None:
                raise ValueError(f"No valid checkpoint found in output directory ({self.args.output_dir})")

        if self.args.enable_auto_parallel:
            if resume_from_checkpoint is not None:

                logger.info(f"Loading model from {resume_from_checkpoint} .")

                if not self.args.ignore_load_lr_and_optim:
                    with _exec_mode_guard("dynamic"):
                        if distributed_isfile(os.path.join(resume_from_checkpoint, SCHEDULER_NAME)):
                            self.lr_scheduler.set_state_dict(
                                paddle.load(distributed_file(os.path.join(resume_from_checkpoint, SCHEDULER_NAME)))
                            )
                        else:
                            raise ValueError(
                                f"scheduler-file not found, scheduler:{os.path.join(resume_from_checkpoint, SCHEDULER_NAME)}"
                            )

                        if self.do_grad_scaling and distributed_isfile(
                            os.path.join(resume_from_checkpoint, SCALER_NAME)
                        ):
                            self.scaler.load_state_dict(
                                paddle.load(
                                    distributed_file(os.path.join(resume_from_checkpoint, SCALER_NAME)),
                                    return_numpy=True,
                                )
                            )
                model_state_dict = self.model_wrapped.state_dict()
                optim_state_dict = self.optimizer.state_dict()
                optim_state_dict.pop("LR_Scheduler", None)
                if len(optim_state_dict) == 0:
                    self.optimizer._create_accumulators(
                        paddle.base.framework.default_main_program().global_block(), self.optimizer._parameter_list
                    )
                    optim_state_dict = self.optimizer.state_dict()
                    optim_state_dict.pop("LR_Scheduler", None)

                state_dict = {
                    MODEL_NAME: model_state_dict,
                    OPTIMIZER_NAME: optim_state_dict,
                }

                parameter_to_structured_name = {}

                for state_name, state_value in self.model_wrapped.state_dict().items():
                    parameter_to_structured_name[state_value.name] = state_name

                if self.args.auto_parallel_resume_form_hybrid_parallel:
                    CheckpointConverter(
                        resume_from_checkpoint, state_dict, parameter_to_structured_name, self.args
                    ).load_from_hybrid_parallel_checkpoint()
                else:
                    ckpt_path = os.path.join(resume_from_checkpoint, DIST_CKPT_PATH)
                    if not os.path.isdir(ckpt_path):
                        raise ValueError(f"Can't find a valid checkpoint at {resume_from_checkpoint}")
                    self._load_ckpt_func(state_dict, ckpt_path)

                # release memory
                del state_dict
            self.runtime_timer.stop()
        else:
            if self.args.load_checkpoint_format == "unified_checkpoint":
                if resume_from_checkpoint is not None:
                    use_unified_checkpoint = False
                    if self.is_unified_checkpoint(resume_from_checkpoint):
                        use_unified_checkpoint = True
                    else:
                        logger.info(
                            "Loading origin checkpoint, the next checkpoint will be saved as unified checkpoint"
                        )

                    if use_unified_checkpoint:
                        self.unified_checkpoint_handler.load_unified_checkpoint(
                            self.model,
                            resume_from_checkpoint,
                            convert_from_hf=self.args.convert_from_hf,
                        )
                        if isinstance(self.model, LoRAModel) and self.model.lora_config.loraga:
                            self.model.reinit_base_model = True
                        logger.info(f"Loading model from {resume_from_checkpoint} using unified checkpoint.")
                        self.runtime_timer.stop()
                        return

            if isinstance(self.model, LoRAModel):
                self._load_from_peft_checkpoint(resume_from_checkpoint)
                if isinstance(self.model, LoRAModel) and self.model.lora_config.loraga:
                    self.model.reinit_base_model = True
                self.runtime_timer.stop()
                return

            weight_name = PADDLE_WEIGHTS_NAME
            weight_index_name = (
                PADDLE_WEIGHTS_INDEX_NAME  # currently set paddle as default, do not support safetensors.
            )

            if self.args.should_load_sharding_stage1_model:
                state_dict = self.sharding_io.load_state_dict_from_checkpoint_with_reshard(
                    resume_from_checkpoint,
                    base_weight_name=weight_name,
                    model_wrapped=self.model_wrapped,
                )
                old_state_dict = self.model.state_dict()
                new_state_dict = {}
                for k, v in state_dict.items():
                    if k not in old_state_dict or id(v) != id(old_state_dict[k]):
                        new_state_dict[k] = v
                self.model.set_state_dict(new_state_dict)
            else:
                if resume_from_checkpoint is not None:
                    weights_file = os.path.join(
                        resume_from_checkpoint, _add_variant(weight_name, self.args.weight_name_suffix)
                    )
                    weights_index_file = os.path.join(
                        resume_from_checkpoint, _add_variant(weight_index_name, self.args.weight_name_suffix)
                    )

                    # Every rank checks, the ranks that do not load too: they would
                    # otherwise wait in the next collective until the group times out.
                    if not any(
                        distributed_isfile(f)
                        for f in [
                            weights_file,
                            weights_index_file,
                        ]
                    ):
                        raise ValueError(
                            f"Can't find a valid checkpoint at {resume_from_checkpoint} -- {weights_file}"
                        )

                if resume_from_checkpoint is not None and (
                    self.args.dataset_rank == 0 or self.args.use_expert_parallel
                ):
                    logger.info(f"Loading model from {resume_from_checkpoint} .")

                    if os.path.isfile(weights_file):
                        # We load the model state dict on the CPU to avoid an OOM error.
                        state_dict = paddle.load(weights_file, return_numpy=True)
                        # If the model is on the GPU, it still works!
                        self._set_state_dict_in_model(state_dict)
                        # release memory
                        del state_dict
                    else:
                        # We load the sharded checkpoint.
                        missing_keys, unexpected_keys = load_sharded_checkpoint(
                            self.model, resume_from_checkpoint, self.args.weight_name_suffix, prefer_safe=False
                        )
                        logger.info(f"set state_dict: {missing_keys, unexpected_keys}")

                elif resume_from_checkpoint is not None:
                    logger.info(f"not loading ckpt :{self.args.dataset_rank}")
            self.runtime_timer.stop()
'''),
]


_APPLIED = []


def apply():
    """Bind every patched function where the framework holds the original (once per process). A stale fix (the
    installed framework's source is not what it was written against) stops the run with status 3 and says so."""
    if _APPLIED:
        return
    for module, qualname, digest, source in PATCHES:
        owner, _, original = target(module, qualname)
        found = source_digest(inspect.getsource(original))
        if found != digest:
            print(f"STALE FIX: {module}.{qualname} is not the source this fix was written against (sha256 {found}, "
                  f"expected {digest}): the installed framework changed there", flush=True)
            sys.exit(3)
        rebind(original, compiled(original, source, owner, f"<fix.py: {module}.{qualname}>"))
    _APPLIED.append(True)
