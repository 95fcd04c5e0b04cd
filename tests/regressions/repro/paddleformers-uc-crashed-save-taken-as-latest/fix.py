"""paddleformers-uc: data-loss in P-LIVENESS (paddleformers-uc-crashed-save-taken-as-latest)

The candidate fix (paddleformers-uc-crashed-save-not-latest), written by ckpt-harness: ``bash run.sh --with-fix``
runs the repro with it, repro.py calling ``apply()`` in every process before its first step. fix.diff is the same
change as a patch of the framework's source."""

import __future__

import ast
import contextlib
import hashlib
import importlib
import inspect
import linecache
import sys
import textwrap
import types
from collections.abc import Callable, Iterator

EDITS_ATTR = "__ckpt_fixes__"  # on a patched function: ((fix id, edits), ...) in the order they were applied
ORIGINAL_ATTR = "__ckpt_original__"  # ... and the framework's own function it replaces


def source_digest(text: str) -> str:
    """The first 16 hex digits of the sha256 of a function's source, as ``inspect.getsource`` gives it."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def target(module: str, qualname: str) -> tuple[object, str, Callable]:
    """Where the function is bound in its own module (the module or the class), its name, and the function (a
    static method's own function: rebinding keeps it static)."""
    owner: object = importlib.import_module(module)
    *path, name = qualname.split(".")
    for part in path:
        owner = getattr(owner, part)
    func = inspect.getattr_static(owner, name)
    return owner, name, func.__func__ if isinstance(func, staticmethod) else func


def compiled(original: Callable, source: str, owner: object, filename: str, lines: list | None = None) -> Callable:
    """``source`` (the function's whole text) compiled in ``original``'s module globals, so it sees what the original
    sees. A method calling super() closes over its class: it is compiled inside a function that binds ``__class__``
    to ``owner``. It is compiled under the original's own ``__future__`` annotations, so annotations the module leaves
    unevaluated stay so. ``filename`` names it in tracebacks, which show its lines; with ``lines`` (the line of
    ``filename`` each line of ``source`` stands for), ``filename`` is the original's own file and the code reports
    those lines, so a line tracer (coverage) counts the patched function's run toward the framework's file."""
    inner = inspect.unwrap(original)  # a decorated function: its decorators are in ``source`` and apply again
    body = textwrap.indent(textwrap.dedent(source), "    ")
    factory = f"def __ckpt_factory__(__class__):\n{body}    return {inner.__name__}\n"
    tree = ast.parse(factory, filename)
    if lines:  # the factory's line n + 2 is the source's line n (from 0); its own two lines stand for the first
        def line(n: int) -> int:
            return lines[min(max(n - 2, 0), len(lines) - 1)]

        for node in ast.walk(tree):
            if getattr(node, "lineno", None) is None:
                continue
            node.lineno = line(node.lineno)
            if getattr(node, "end_lineno", None) is not None:  # an edit may fold a node's span onto one line
                node.end_lineno = max(line(node.end_lineno), node.lineno)
                if node.end_lineno == node.lineno and node.end_col_offset is not None:
                    node.end_col_offset = max(node.end_col_offset, node.col_offset)
    else:
        linecache.cache[filename] = (len(factory), None, factory.splitlines(True), filename)
    namespace: dict = {}
    lazy = inner.__code__.co_flags & __future__.annotations.compiler_flag
    exec(compile(tree, filename, "exec", flags=lazy, dont_inherit=True), inner.__globals__, namespace)
    func = namespace["__ckpt_factory__"](owner)
    func.__qualname__, func.__module__ = original.__qualname__, original.__module__
    return func


_pending: list | None = None  # inside batched(): the (old, new) pairs still to be bound beyond their owners


@contextlib.contextmanager
def batched() -> Iterator[None]:
    """Rebinds made inside take effect where each function is defined at once, and everywhere else in one scan of
    the loaded modules when the outermost block ends: with a framework loaded a scan costs tens of milliseconds,
    and a rank applies dozens of fixes."""
    global _pending
    if _pending is not None:
        yield
        return
    _pending = []
    try:
        yield
    finally:
        pending, _pending = _pending, None
        _rebind_all(pending)


def rebind(old: Callable, new: Callable, owner: object = None, name: str = "") -> None:
    """Every module attribute and class attribute that is ``old`` becomes ``new``; inside ``batched()``, where
    ``owner`` (the module or class defining it) holds it as ``name`` at once, and elsewhere when the block ends."""
    if _pending is None or owner is None:
        _rebind_all([(old, new)])
        return
    namespace = vars(owner) if isinstance(owner, types.ModuleType) else _ClassNamespace(owner)
    if _bound(namespace.get(name)) is old:
        _set(namespace, name, new)
    _pending.append((old, new))


def _rebind_all(pairs: list) -> None:
    """One scan binding each ``old`` of ``pairs`` to the last function it was replaced by (a function patched
    twice in a batch goes from the original to the second version)."""
    final: dict[int, Callable] = {}
    for old, new in pairs:  # the pairs hold every old function alive, so ids stay unique meanwhile
        for key, value in final.items():
            if value is old:
                final[key] = new
        final[id(old)] = new
    for namespace in _namespaces():
        for name, value in list(namespace.items()):
            new = final.get(id(_bound(value)))
            if new is not None and new is not _bound(value):
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


def _bound(value: object) -> object:
    """The function a name holds: a static method's own function, anything else as it is."""
    return value.__func__ if isinstance(value, staticmethod) else value


def _set(namespace: dict, name: str, value: object) -> None:
    if isinstance(namespace, _ClassNamespace):
        held = inspect.getattr_static(namespace.cls, name, None)
        setattr(namespace.cls, name, staticmethod(value) if isinstance(held, staticmethod) else value)
    else:
        namespace[name] = value


# (module, function, sha256[:16] of the source it was written against, the patched function)
PATCHES = [
    ('paddleformers.trainer.trainer', 'Trainer._save_checkpoint', 'ba937eef872f3b1a',
     r'''    def _save_checkpoint(self, model, metrics=None):
        # assert unwrap_model(model) is self.model, "internal model should be a reference to self.model"
        if self.args.enable_zero_cost_checkpoint:
            return

        self.runtime_timer.start("checkpoint saving time")

        # Save model checkpoint
        checkpoint_folder = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"

        run_dir = self.args.output_dir
        run_signal_dir = self.args.output_signal_dir

        output_dir = os.path.join(run_dir, checkpoint_folder)
        signal_dir = os.path.join(run_signal_dir, checkpoint_folder)

        if not self.args.enable_auto_parallel:
            if isinstance(self.model, LoRAModel) and (
                self.model.quantized or self.args.pipeline_model_parallel_size > 1
            ):
                self.save_model(output_dir)
            elif isinstance(self.model, LoRAModel):
                self.save_model(output_dir, True)
            else:
                self.save_model(output_dir)

        else:
            # Save model checkpoint
            if self.args.should_save or self.args.should_save_model_state:
                os.makedirs(output_dir, exist_ok=True)

            if self.args.should_save:
                logger.info(f"Saving checkpoinit files into {output_dir}")

                if self.args.should_save_model_state:
                    optim_state_dict = self.optimizer.state_dict()
                    optim_state_dict.pop("LR_Scheduler", None)
                    opt_state_keys = ["_moment1_0", "_moment2_0", "_beta1_pow_acc_0", "_beta2_pow_acc_0"]
                    for p_name, p in model.state_dict().items():
                        if paddle.distributed.get_rank() not in p.process_mesh.process_ids:
                            var_name = p.name
                            for key in opt_state_keys:
                                if (
                                    var_name + key in optim_state_dict
                                    and not optim_state_dict[var_name + key].is_dist()
                                ):
                                    optim_state_dict.pop(var_name + key)

                    state_dict = {
                        MODEL_NAME: model.state_dict(),
                        OPTIMIZER_NAME: optim_state_dict,
                    }

                    self._save(output_dir=output_dir, state_dict=state_dict)
                    # FIXME: maybe only save one copy
                    paddle.save(self.lr_scheduler.state_dict(), os.path.join(output_dir, SCHEDULER_NAME))

                    if self.do_grad_scaling:
                        paddle.save(self.scaler.state_dict(), os.path.join(output_dir, SCALER_NAME))

        # Determine the new best metric / best model checkpoint
        if metrics is not None and self.args.metric_for_best_model is not None:
            metric_to_check = self.args.metric_for_best_model
            if not metric_to_check.startswith("eval_"):
                metric_to_check = f"eval_{metric_to_check}"
            metric_value = metrics[metric_to_check]

            operator = np.greater if self.args.greater_is_better else np.less
            if (
                self.state.best_metric is None
                or self.state.best_model_checkpoint is None
                or operator(metric_value, self.state.best_metric)
            ):
                self.state.best_metric = metric_value
                self.state.best_model_checkpoint = output_dir

        # Save the Trainer state
        if self.args.should_save:
            self.state.save(os.path.join(output_dir, TRAINER_STATE_NAME))

        if self.args.save_rng_states:
            # Save RNG state in non-distributed training
            rng_states = {
                "python": random.getstate(),
                "numpy": np.random.get_state(),
                "cuda": paddle.get_rng_state(),
                "cpu": paddle.framework.core.default_cpu_generator().get_state(),
                "world_size": self.args.world_size,
            }
            if not self.args.enable_auto_parallel:
                if self.args.use_hybrid_parallel:
                    rng_states[
                        "hybrid_parallel_rng_state_tracker"
                    ] = fleet.meta_parallel.get_rng_state_tracker().get_states_tracker()
                rng_state_file = os.path.join(output_dir, f"rng_state_{dist.get_rank()}.pth")
                os.makedirs(output_dir, exist_ok=True)
                paddle.save(rng_states, rng_state_file)
            else:
                rng_states_list = []
                paddle.distributed.all_gather_object(rng_states_list, rng_states)
                if self.args.should_save:
                    os.makedirs(output_dir, exist_ok=True)
                    paddle.save(rng_states_list, os.path.join(output_dir, f"rng_state_{self.args.world_size}.pth"))

        if not self.args.enable_auto_parallel:
            # only save model state dict, ignore optimizer and scheduler
            if not self.args.ignore_save_lr_and_optim:
                optimizer_name = _add_variant(PADDLE_OPTIMIZER_NAME, self.args.optimizer_name_suffix)
                saved_signal_path = os.path.join(output_dir, f"saved_signal_{dist.get_rank()}")

                if self.args.use_hybrid_parallel:
                    if self.dp_group.rank <= 0 or self.args.use_expert_parallel:
                        os.makedirs(output_dir, exist_ok=True)
                        logger.info("Saving optimizer files.")
                        if self.args.save_checkpoint_format == "unified_checkpoint":
                            self.unified_checkpoint_handler.save_unified_optimizer(
                                self.model,
                                self.optimizer,
                                output_dir,
                                signal_dir,
                                self.args.optim_shard_num,
                            )
                        elif self.args.save_checkpoint_format == "flex_checkpoint":
                            self._save_flex_optimizer_state(output_dir)
                        else:
                            if self.dp_group.rank > 0:  # this should only work for MoE saving
                                self._save_ckpt_func(
                                    self._filter_moe_no_sync_optimizer_params(),
                                    os.path.join(output_dir, optimizer_name),
                                    saved_signal_path,
                                )
                            else:
                                state_dict = self.optimizer.state_dict()
                                save_path = os.path.join(output_dir, optimizer_name)
                                if self.args.use_async_save:
                                    assert not strtobool(
                                        os.getenv("FLAG_LLM_PDC", "False")
                                    ), "Dont support FLAG_LLM_PDC"
                                    self._async_optimizer_saver.run(
                                        state_dict, save_path, saved_signal_path=saved_signal_path
                                    )
                                else:
                                    self._save_ckpt_func(state_dict, save_path, saved_signal_path)
                    else:
                        if (
                            self.args.save_checkpoint_format == "unified_checkpoint"
                            and "async_save" in self.args.unified_checkpoint_config
                        ):
                            global_rank = (
                                paddle.distributed.get_rank() if paddle.distributed.get_world_size() > 1 else -1
                            )
                            os.makedirs(signal_dir, exist_ok=True)
                            paddle.save(global_rank, os.path.join(signal_dir, f".optimizer_weight.done.{global_rank}"))
                            if (
                                "skip_save_model_weight" not in self.args.unified_checkpoint_config
                                or "remove_master_weight" not in self.args.unified_checkpoint_config
                            ):
                                paddle.save(
                                    global_rank, os.path.join(signal_dir, f".master_weight.done.{global_rank}")
                                )
                if (
                    self.args.should_save
                    or self.args.use_expert_parallel
                    or (self.args.data_parallel_size > 1 and self.args.save_checkpoint_format == "flex_checkpoint")
                ):
                    if not self.args.use_hybrid_parallel:
                        logger.info("Saving optimizer files.")
                        if self.args.save_checkpoint_format == "unified_checkpoint":
                            self.unified_checkpoint_handler.save_unified_optimizer(
                                self.model,
                                self.optimizer,
                                output_dir,
                                signal_dir,
                            )
                        elif self.args.save_checkpoint_format == "flex_checkpoint":
                            self._save_flex_model_state(output_dir)
                            self._save_flex_optimizer_state(output_dir)
                        else:
                            if self.args.data_parallel_rank > 0 and self.args.use_expert_parallel:
                                self._save_ckpt_func(
                                    self._filter_moe_no_sync_optimizer_params(),
                                    os.path.join(output_dir, optimizer_name),
                                    saved_signal_path,
                                )
                            else:
                                self._save_ckpt_func(
                                    self.optimizer.state_dict(),
                                    os.path.join(output_dir, optimizer_name),
                                    saved_signal_path,
                                )
                    # FIXME: maybe only save one copy
                    paddle.save(self.lr_scheduler.state_dict(), os.path.join(output_dir, SCHEDULER_NAME))

                    if self.do_grad_scaling:
                        paddle.save(self.scaler.state_dict(), os.path.join(output_dir, SCALER_NAME))
                else:
                    if self.args.save_checkpoint_format == "unified_checkpoint" and not self.args.use_hybrid_parallel:
                        if "async_save" in self.args.unified_checkpoint_config:
                            global_rank = (
                                paddle.distributed.get_rank() if paddle.distributed.get_world_size() > 1 else -1
                            )
                            os.makedirs(signal_dir, exist_ok=True)
                            paddle.save(global_rank, os.path.join(signal_dir, f".optimizer_weight.done.{global_rank}"))
                            if (
                                "skip_save_model_weight" not in self.args.unified_checkpoint_config
                                or "remove_master_weight" not in self.args.unified_checkpoint_config
                            ):
                                paddle.save(
                                    global_rank, os.path.join(signal_dir, f".master_weight.done.{global_rank}")
                                )

            self.runtime_timer.stop()

            # Maybe delete some older checkpoints.
            # For hybrid parallel training, the checkpoint files maybe on different node.
            need_to_rotate_checkpoints = False
            if self.args.use_hybrid_parallel:
                if self.dp_group.rank <= 0 or self.args.use_expert_parallel:
                    need_to_rotate_checkpoints = True
            else:
                need_to_rotate_checkpoints = self.args.should_save_model_state

            # Delete only by one process
            need_to_rotate_checkpoints = need_to_rotate_checkpoints and self.args.local_rank in [0, -1]
            if need_to_rotate_checkpoints:
                self._rotate_checkpoints(use_mtime=True, output_dir=run_dir)
                self._rotate_checkpoints(use_mtime=True, output_dir=run_signal_dir)

        if not ("async_save" in self.args.unified_checkpoint_config) or paddle.distributed.get_world_size() <= 1:
            # save checkpoint_done file to ensure checkpoint is complete
            if self.args.should_save_model_state and self.args.should_save:
                # For ckpt integrity
                paddle.save(self.state.global_step, os.path.join(output_dir, ".checkpoint_done"))
'''),
    ('paddleformers.trainer.trainer_utils', 'get_last_checkpoint', '14d186a4949bc1ff',
     r'''def get_last_checkpoint(folder, signal_folder=None, uc_async_save=False):
    content = os.listdir(folder)
    checkpoints = [
        path
        for path in content
        if _re_checkpoint.search(path) is not None and os.path.isdir(os.path.join(folder, path))
    ]
    if len(checkpoints) == 0:
        return

    if uc_async_save:
        assert signal_folder is not None

    if strtobool(os.getenv("FLAG_LLM_PDC", "False")):
        for i in sorted(checkpoints, key=lambda x: int(_re_checkpoint.search(x).groups()[0]), reverse=True):
            current_path = os.path.join(folder, i)
            # make sure the checkpoint is valid
            if not uc_async_save:
                if os.path.exists(os.path.join(current_path, ".checkpoint_done")):
                    return current_path
            else:
                saving_info = paddle.load(distributed_file(os.path.join(current_path, ".saving_info")))
                current_signal_path = os.path.join(signal_folder, i)
                pre_world_size = saving_info.get("world_size", 1)
                ignore_save_lr_and_optim = saving_info.get("ignore_save_lr_and_optim", False)
                skip_save_model_weight = saving_info.get("skip_save_model_weight", False)
                remove_master_weight = saving_info.get("remove_master_weight", False)
                if _check_checkpoint_files(
                    current_signal_path,
                    pre_world_size,
                    ignore_save_lr_and_optim,
                    skip_save_model_weight,
                    remove_master_weight,
                ):
                    return current_path
        return
    else:
        # A sync save ends with .checkpoint_done and an async writer leaves .<kind>.done.<rank>: in a
        # folder whose saves are marked, a directory with neither is a save that never finished.
        newest_first = sorted(checkpoints, key=lambda x: int(_re_checkpoint.search(x).groups()[0]), reverse=True)
        marked = [os.path.exists(os.path.join(folder, i, ".checkpoint_done")) for i in newest_first]
        for i, done in zip(newest_first, marked):
            signals = [f for f in os.listdir(os.path.join(folder, i)) if ".done." in f]
            if done or signals or not any(marked):
                return os.path.join(folder, i)
        return
'''),
]


_APPLIED = []


def apply():
    """Bind every patched function where the framework holds the original (once per process). A stale fix (the
    installed framework's source is not what it was written against) stops the run with status 3 and says so."""
    if _APPLIED:
        return
    for module, qualname, digest, source in PATCHES:
        owner, _, current = target(module, qualname)
        original = getattr(current, ORIGINAL_ATTR, current)  # needs.py may have patched it first
        found = source_digest(inspect.getsource(original))
        if found != digest:
            print(f"STALE FIX: {module}.{qualname} is not the source this fix was written against (sha256 {found}, "
                  f"expected {digest}): the installed framework changed there", flush=True)
            sys.exit(3)
        patched = compiled(original, source, owner, f"<fix.py: {module}.{qualname}>")
        setattr(patched, ORIGINAL_ATTR, original)
        rebind(current, patched)
    _APPLIED.append(True)
